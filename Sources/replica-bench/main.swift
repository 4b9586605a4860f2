// replica-bench: Replica against the raw sqlite3 / libsodium C API doing the same work (same SQL text, same PRAGMAs,
// same transaction boundaries), in one process, as ratios. See README.md, "Performance".
//
//   replica-bench [--quick] [--json] [--only B1,B3] [--reps N] [--warmups N] [--clock cpu|wall] [--side replica|raw]
//
// Each workload runs a warm-up and then N repetitions; within a repetition the two sides run back to back, the
// order alternating between repetitions, each on fresh state prepared outside the timed region. Reported: the
// median time of each side and the median of the per-repetition ratios.
import Foundation
import Replica

#if DEBUG
FileHandle.standardError.write(Data("replica-bench measures release builds only: run `swift run -c release replica-bench` or `make bench`.\n".utf8))
exit(2)
#else

func usage() -> Never {
    print("""
        usage: replica-bench [--quick] [--json] [--only B1,B3,...] [--reps N] [--warmups N] [--clock cpu|wall] [--side replica|raw]
          --quick     reduced sizes (1/5) and fewer repetitions: under two minutes
          --json      one JSON object per workload per line (instead of the table)
          --only      run only these workload IDs
          --reps      repetitions after the warm-up (default 7, quick 5)
          --warmups   warm-up runs per workload (default 1)
          --clock     cpu (thread CPU time, default: robust on a shared machine) or wall
          --side      run one side only (no ratio): whole-process instruction counts of workloads whose work runs on
                      several threads (B13), as the difference of two callgrind runs with different --reps
        """)
    exit(1)
}

// Before anything opens a database, for both sides alike: SQLite's memory statistics off (see SQLiteTuning).
SQLiteTuning.disableMemoryStatistics()

// A child process of B10 (see StreamWorkload.swift): `--child B10 replica|raw DIR N`.
if CommandLine.arguments.count == 6, CommandLine.arguments[1] == "--child", CommandLine.arguments[2] == "B10",
   let n = Int(CommandLine.arguments[5]) {
    streamChild(side: CommandLine.arguments[3], directory: URL(fileURLWithPath: CommandLine.arguments[4]), n: n)
}

// A child process of B1m (see StreamWorkload.swift): `--child B1m replica|raw DIR N`.
if CommandLine.arguments.count == 6, CommandLine.arguments[1] == "--child", CommandLine.arguments[2] == "B1m",
   let n = Int(CommandLine.arguments[5]) {
    largeSaveChild(side: CommandLine.arguments[3], directory: URL(fileURLWithPath: CommandLine.arguments[4]), n: n)
}

// The writer child of B15L (see ObservationWorkloads.swift): `--child B15L DIR N MS`.
if CommandLine.arguments.count == 6, CommandLine.arguments[1] == "--child", CommandLine.arguments[2] == "B15L",
   let n = Int(CommandLine.arguments[4]), let interval = Int(CommandLine.arguments[5]) {
    observationWriterChild(root: URL(fileURLWithPath: CommandLine.arguments[3]), count: n, interval: interval)
}

// A child process of B16u / B16d (see AssetWorkloads.swift): `--child B16m up|down DIR`.
if CommandLine.arguments.count == 5, CommandLine.arguments[1] == "--child", CommandLine.arguments[2] == "B16m" {
    largeAssetSyncChild(direction: CommandLine.arguments[3], directory: URL(fileURLWithPath: CommandLine.arguments[4]))
}

var options = Options()
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--quick": options.quick = true
    case "--json": options.json = true
    case "--only": options.only = Set((arguments.next() ?? "").split(separator: ",").map { String($0).uppercased() })
    case "--reps": options.repetitions = arguments.next().flatMap(Int.init) ?? { usage() }()
    case "--warmups": options.warmups = arguments.next().flatMap(Int.init) ?? { usage() }()
    case "--clock": options.clock = arguments.next().flatMap(ClockKind.init(rawValue:)) ?? { usage() }()
    case "--side":
        switch arguments.next() {
        case "replica": options.side = true
        case "raw": options.side = false
        default: usage()
        }
    case "-h", "--help": usage()
    default: usage()
    }
}

let workloads: [Workload] = [
    Workload(id: "B1", title: "insert 100k rows (10 columns), one transaction, typed path", target: .ratio(1.3),
             count: { $0.scaled(100_000) },
             replica: { size in try replicaInsertTrial(makeRecords(size.scaled(100_000)), tracksHistory: false, name: "B1-replica") },
             raw: { size in try rawInsertTrial(makeRecords(size.scaled(100_000)), history: false, name: "B1-raw") }),
    Workload(id: "B1m", title: "B1's 100k models in one save: peak memory (child process per side)", target: .peakRSSAbove(16),
             count: { $0.scaled(100_000) },
             replica: { size in try largeSaveTrial(size.scaled(100_000), side: "replica") },
             raw: { size in try largeSaveTrial(size.scaled(100_000), side: "raw") },
             measuresMemory: true, repetitions: (full: 3, quick: 3)),
    Workload(id: "B2", title: "B1 through the Codable convenience path (encode(to:))", target: .ratio(2.0),
             count: { $0.scaled(100_000) },
             replica: { size in try replicaInsertTrial(makeCodableRecords(size.scaled(100_000)), tracksHistory: false, name: "B2-replica") },
             raw: { size in try rawInsertTrial(makeRecords(size.scaled(100_000)), history: false, name: "B2-raw") }),
    Workload(id: "B3", title: "fetch 200k rows into models (FetchDescriptor, init(row:))", target: .ratio(1.3),
             count: { $0.scaled(200_000) },
             replica: { size in try replicaFetchTrial(size.scaled(200_000)) },
             raw: { size in try rawFetchTrial(size.scaled(200_000)) }),
    Workload(id: "B3d", title: "B3 through the Decodable path (synthesized init(from:))", target: .ratio(2.0),
             count: { $0.scaled(200_000) },
             replica: { size in try replicaDecodableFetchTrial(size.scaled(200_000)) },
             raw: { size in try rawFetchTrial(size.scaled(200_000)) }),
    // B4 as the issue sets it: the same insert with history on against history off, both through Replica (the
    // "Raw C s" column holds the history-off time); B4r compares it with raw C writing the same history rows.
    Workload(id: "B4", title: "B1 with history on ÷ the same insert with history off", target: .ratio(1.3),
             count: { $0.scaled(100_000) },
             replica: { size in try replicaInsertTrial(makeRecords(size.scaled(100_000)), tracksHistory: true, name: "B4-replica") },
             raw: { size in try replicaInsertTrial(makeRecords(size.scaled(100_000)), tracksHistory: false, name: "B4-off") }),
    Workload(id: "B4r", title: "B1 with history on vs raw C writing the same history rows", target: .comparison,
             count: { $0.scaled(100_000) },
             replica: { size in try replicaInsertTrial(makeRecords(size.scaled(100_000)), tracksHistory: true, name: "B4r-replica") },
             raw: { size in try rawInsertTrial(makeRecords(size.scaled(100_000)), history: true, name: "B4r-raw") }),
    Workload(id: "B5", title: "10k single-row save transactions (with history)", target: .ratio(1.15),
             count: { $0.scaled(10_000) },
             replica: { size in try replicaSingleSavesTrial(makeRecords(size.scaled(10_000))) },
             raw: { size in try rawSingleSavesTrial(makeRecords(size.scaled(10_000))) }),
    // B6 compares like with like (as B9 does): the raw side writes the same rows — entity, ledger and history rows —
    // with the same SQL, and seals and opens the same fields. B6r is the old comparison, whose raw side writes no
    // sync bookkeeping (for information, as B9r).
    Workload(id: "B6", title: "insert + fetch 100k records, two ~64-byte encrypted fields, same rows", target: .ratio(1.5),
             count: { $0.scaled(100_000) },
             replica: { size in try replicaEncryptedTrial(size.scaled(100_000)) },
             raw: { size in try rawEncryptedTrial(size.scaled(100_000), ledger: true) }, repetitions: (full: 5, quick: 3)),
    Workload(id: "B6r", title: "B6 against rows + history only (raw writes no ledger)", target: .comparison,
             count: { $0.scaled(100_000) },
             replica: { size in try replicaEncryptedTrial(size.scaled(100_000)) },
             raw: { size in try rawEncryptedTrial(size.scaled(100_000)) }, repetitions: (full: 5, quick: 3)),
    Workload(id: "B8", title: "read 100k history changes after a token", target: .ratio(1.3),
             count: { $0.scaled(100_000) },
             replica: { size in try replicaHistoryTrial(size.scaled(100_000)) },
             raw: { size in try rawHistoryTrial(size.scaled(100_000)) }),
    Workload(id: "B8T", title: "read the newest 5k transactions: 100k total ÷ 10k total", target: .ratio(1.3),
             count: { $0.scaled(5_000) },
             replica: { size in try historyTailTrial(total: size.scaled(100_000), tail: size.scaled(5_000)) },
             raw: { size in try historyTailTrial(total: size.scaled(10_000), tail: size.scaled(5_000)) }),
    Workload(id: "B9", title: "apply a 10k-record remote batch (merge + history), same SQL", target: .ratio(2.0),
             count: { $0.scaled(10_000) },
             replica: { size in try replicaMergeTrial(size.scaled(10_000)) },
             raw: { size in try rawMergeTrial(size.scaled(10_000)) }),
    Workload(id: "B9r", title: "B9 against rows + history only (raw writes no ledger)", target: .comparison,
             count: { $0.scaled(10_000) },
             replica: { size in try replicaMergeTrial(size.scaled(10_000)) },
             raw: { size in try rawMergeTrial(size.scaled(10_000), ledger: false) }),
    Workload(id: "B10", title: "enumerate 1M rows (child process per side)", target: .peakRSSAbove(50),
             count: { $0.scaled(1_000_000) },
             replica: { size in try streamTrial(size.scaled(1_000_000), side: "replica") },
             raw: { size in try streamTrial(size.scaled(1_000_000), side: "raw") },
             measuresMemory: true, repetitions: (full: 3, quick: 3)),
    Workload(id: "B11", title: "simulator, trips scenario, one core", target: .perSecond(20_000, units: "device-ops/s"),
             count: { _ in 0 },
             replica: { size in try simulatorTrial(seeds: size.scaled(200)) }, raw: nil,
             repetitions: (full: 3, quick: 1)),
    Workload(id: "B12", title: "property engine, 3 devices × 50 steps", target: .perSecond(100, units: "cases/s"),
             count: { $0.scaled(100, quickDivisor: 4) },
             replica: { size in propertyTrial(size.scaled(100, quickDivisor: 4)) }, raw: nil),
    // The PostgreSQL cloud (PostgresWorkloads.swift): a server from REPLICA_BENCH_POSTGRES_URL or a throwaway cluster.
    Workload(id: "B13", title: "PostgreSQL: upload 10k records (10 fields), fetch on a 2nd device", target: .ratio(1.3),
             count: { $0.scaled(10_000) },
             replica: { size in try postgresUploadFetchTrial(size.scaled(10_000)) },
             raw: { size in try rawUploadFetchTrial(size.scaled(10_000), codes: false) }, repetitions: (full: 5, quick: 3)),
    Workload(id: "B13c", title: "B13 against raw libpq that also codes the record bodies", target: .comparison,
             count: { $0.scaled(10_000) },
             replica: { size in try postgresUploadFetchTrial(size.scaled(10_000)) },
             raw: { size in try rawUploadFetchTrial(size.scaled(10_000), codes: true) }, repetitions: (full: 5, quick: 3)),
    Workload(id: "B14", title: "PostgreSQL: 8 devices sync 10k records concurrently", target: .perSecond(5_000, units: "records/s"),
             count: { $0.scaled(10_000) },
             replica: { size in try concurrentDevicesTrial(size.scaled(10_000), latencySamples: size.quick ? 50 : 200) }, raw: nil,
             repetitions: (full: 3, quick: 1)),
    // B15 as the issue sets it: a save with 1,000 live queries subscribed against the same save with none, both
    // through Replica (the "Raw C s" column holds the time without observers).
    Workload(id: "B15", title: "1,000 one-row saves, 1,000 live queries on 100k rows ÷ none", target: .ratio(1.5),
             count: { _ in 1000 },
             replica: { size in try observationSaveTrial(rows: size.scaled(100_000), saves: 1000, observed: true) },
             raw: { size in try observationSaveTrial(rows: size.scaled(100_000), saves: 1000, observed: false) }),
    Workload(id: "B15s", title: "B15 with a change-stream consumer too (as a sync runtime)", target: .comparison,
             count: { _ in 1000 },
             replica: { size in try observationSaveTrial(rows: size.scaled(100_000), saves: 1000, observed: true, streamed: true) },
             raw: { size in try observationSaveTrial(rows: size.scaled(100_000), saves: 1000, observed: false) }),
    Workload(id: "B15L", title: "another process's commit: commit → change-stream delivery", target: .atMostMilliseconds(50),
             count: { $0.scaled(100) },
             replica: { size in try otherProcessLatencyTrial(count: size.scaled(100), interval: 20) }, raw: nil,
             repetitions: (full: 3, quick: 1)),
    // Large data as assets (AssetWorkloads.swift).
    Workload(id: "B16", title: "save 200 × 1 MB .externalStorage values ÷ FileManager copying 200 files", target: .ratio(1.2),
             count: { $0.scaled(200) },
             replica: { size in try assetSaveTrial(size.scaled(200)) },
             raw: { size in try assetCopyTrial(size.scaled(200)) }, repetitions: (full: 5, quick: 3)),
    Workload(id: "B16s", title: "sync 200 × 1 MB assets: upload, then download on a 2nd device (SQLite-file cloud)", target: .reportedPerSecond(units: "MB/s"),
             count: { $0.scaled(200) },
             replica: { size in try assetSyncTrial(size.scaled(200)) }, raw: nil, repetitions: (full: 3, quick: 1)),
    Workload(id: "B16u", title: "upload one 200 MB asset: peak memory (child process)", target: .peakRSSAbove(32),
             count: { $0.scaled(200) },
             replica: { size in try largeAssetSyncTrial(size.scaled(200), direction: "up") }, raw: nil,
             measuresMemory: true, repetitions: (full: 3, quick: 1)),
    Workload(id: "B16d", title: "download one 200 MB asset: peak memory (child process)", target: .peakRSSAbove(32),
             count: { $0.scaled(200) },
             replica: { size in try largeAssetSyncTrial(size.scaled(200), direction: "down") }, raw: nil,
             measuresMemory: true, repetitions: (full: 3, quick: 1)),
    Workload(id: "B16l", title: "import, save and stream back one 200 MB value through ExternalData: peak memory (child process)",
             target: .peakRSSAbove(32), count: { $0.scaled(200) },
             replica: { size in try largeAssetLocalTrial(size.scaled(200)) }, raw: nil,
             measuresMemory: true, repetitions: (full: 3, quick: 1)),
    // The sync runtime (RuntimeWorkloads.swift): the issue's "≤ 5 ms plus the debounce" and "no CPU while idle".
    Workload(id: "B17", title: "CloudSync, in-memory cloud: save → sent, beyond a 20 ms debounce", target: .atMostMilliseconds(5),
             count: { $0.scaled(200) },
             replica: { size in try runtimeLatencyTrial(saves: size.scaled(200), debounce: 20, idleSeconds: size.quick ? 5 : 60) }, raw: nil,
             repetitions: (full: 1, quick: 1)),
]

let selected = workloads.filter { options.only?.contains($0.id.uppercased()) ?? true }
try? FileManager.default.createDirectory(at: benchRoot, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: benchRoot) }

func log(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

log("replica-bench: \(options.quick ? "quick" : "full") sizes, clock \(options.clock.rawValue), files under \(benchRoot.path)")
/// Writes one line to standard output at once (unbuffered, so a long run shows each row as it is measured).
func output(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

if !options.json { output(tableHeader(options.clock)) }
var results: [BenchResult] = []
for workload in selected {
    let result = run(workload, options: options, log: log)
    results.append(result)
    output(options.json ? jsonLine(result, options: options) : tableLine(result))
}
try? FileManager.default.removeItem(at: benchRoot)
let measured = results.filter { result in
    guard result.workload.notBuilt == nil else { return false }
    switch result.workload.target {
    case .comparison, .reportedPerSecond: return false
    default: return true
    }
}
log("replica-bench: \(measured.filter(\.met).count) of \(measured.count) measured workloads met their targets; "
    + "\(results.filter { $0.workload.notBuilt != nil }.count) not yet built")
exit(results.contains { $0.error != nil } ? 1 : 0)
#endif
