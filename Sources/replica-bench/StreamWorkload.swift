import CSQLite
import Foundation
import Replica

// B10 — enumerate 1M rows: `ModelContext.enumerate` over `FetchDescriptor<BenchRecord>()` (one statement stepped,
// models decoded a batch at a time) against the raw loop building the same models from `sqlite3_column_*`.
// Each side runs in a fresh child process (`replica-bench --child B10 replica|raw DIR N`), so that memory the parent
// freed earlier (other workloads, building the store) cannot hide an allocation: the child opens the store, takes
// its resident set size as the baseline, starts a new peak (`/proc/self/clear_refs`), enumerates, and reports the
// peak (`VmHWM`) above the baseline together with the thread CPU and wall time of the enumeration.

nonisolated(unsafe) private var streamStores: [Int: URL] = [:]

/// A store file with `n` bench records: the schema made by Replica, the rows inserted with raw SQLite calls
/// (streamed, so that building it needs no `n`-record array).
func streamStore(_ n: Int) throws -> URL {
    if let directory = streamStores[n] { return directory }
    let directory = trialDirectory("B10-data")
    _ = try makeStore(directory, [BenchRecord.self], tracksHistory: false)
    let raw = RawDB(path: storePath(directory))
    let environment = ReplicaEnvironment.seeded(seed: 10, directory: FileManager.default.temporaryDirectory)
    let begin = raw.prepare("BEGIN IMMEDIATE"), commit = raw.prepare("COMMIT")
    let insert = raw.prepare(BenchSQL.insert(BenchSQL.table))
    raw.done(begin)
    for i in 0..<n {
        bindRecord(insert, BenchRecord.make(i, id: environment.makeIdentifier())) {
            if sqlite3_step(insert) != SQLITE_DONE { raw.fail(-1, "insert") }
        }
        sqlite3_reset(insert)
    }
    raw.done(commit)
    for s in [begin, commit, insert] { sqlite3_finalize(s) }
    streamStores[n] = directory
    return directory
}

/// The path of this executable (to start children).
let benchExecutable: String = {
    (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
}()

/// Runs this executable with `arguments` and decodes the one-line report it prints last.
func childReport(_ arguments: [String], label: String) throws -> StreamReport {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: benchExecutable)
    process.arguments = arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0,
          let line = String(decoding: data, as: UTF8.self).split(separator: "\n").last,
          let decoded = try? JSONDecoder().decode(StreamReport.self, from: Data(line.utf8)) else {
        throw CheckFailed("\(label): the child failed (status \(process.terminationStatus))")
    }
    return decoded
}

/// What a B10 child reports on its one line of output.
struct StreamReport: Codable {
    var cpu: Double
    var wall: Double
    var baselineMB: Double
    var peakAboveBaselineMB: Double
    var count: Int
    var checksum: Int
}

nonisolated(unsafe) private var streamChecksums: [Int: Int] = [:]

/// One side of B10, measured in a child process.
func streamTrial(_ n: Int, side: String) throws -> Trial {
    let directory = try streamStore(n)
    var report: StreamReport?
    return Trial(run: {}, check: {
        guard let report else { throw CheckFailed("B10: the \(side) child reported nothing") }
        try require(report.count == n, "B10: \(side) enumerated \(report.count) records")
        if let known = streamChecksums[n] {
            try require(known == report.checksum, "B10: \(side)'s records differ from the other side's")
        } else {
            streamChecksums[n] = report.checksum
        }
    }, measured: {
        let decoded = try childReport(["--child", "B10", side, directory.path, String(n)], label: "B10 \(side)")
        report = decoded
        return Measurement(sample: Sample(cpu: decoded.cpu, wall: decoded.wall), peakMB: decoded.peakAboveBaselineMB, items: nil)
    }, note: {
        report.map { "child baseline \(format($0.baselineMB, 1)) MB" }
    })
}

/// The child's work: open, take the baseline, enumerate, report. Never returns.
func streamChild(side: String, directory: URL, n: Int) -> Never {
    do {
        var count = 0
        var checksum = n
        let baseline: Int
        let sample: Sample
        switch side {
        case "replica":
            let container = try makeStore(directory, [BenchRecord.self], tracksHistory: false)
            let context = ModelContext(container)
            try warm(context)
            baseline = Memory.residentBytes() ?? 0
            Memory.resetPeak()
            sample = try measure {
                try context.enumerate(FetchDescriptor<BenchRecord>()) { record in
                    count += 1
                    BenchRecord.fold(&checksum, record)
                }
            }
        case "raw":
            let raw = RawDB(path: storePath(directory))
            let s = raw.prepare(BenchSQL.selectAll(BenchSQL.table))
            baseline = Memory.residentBytes() ?? 0
            Memory.resetPeak()
            sample = measure {
                while sqlite3_step(s) == SQLITE_ROW {
                    let record = BenchRecord(
                        id: columnUUID(s, 0), name: columnString(s, 1), email: columnString(s, 2),
                        age: Int(sqlite3_column_int64(s, 3)), score: sqlite3_column_double(s, 4),
                        active: sqlite3_column_int64(s, 5) != 0,
                        created: Date(timeIntervalSince1970: sqlite3_column_double(s, 6)),
                        note: sqlite3_column_type(s, 7) == SQLITE_NULL ? nil : columnString(s, 7),
                        count: Int(sqlite3_column_int64(s, 8)), ratio: sqlite3_column_double(s, 9), tag: columnString(s, 10))
                    count += 1
                    BenchRecord.fold(&checksum, record)
                }
            }
            sqlite3_finalize(s)
        default:
            FileHandle.standardError.write(Data("replica-bench --child B10: unknown side \(side)\n".utf8))
            exit(2)
        }
        let peak = Memory.peakBytes() ?? 0
        let report = StreamReport(cpu: sample.cpu, wall: sample.wall, baselineMB: Double(baseline) / 1_048_576,
                                  peakAboveBaselineMB: Double(max(0, peak - baseline)) / 1_048_576,
                                  count: count, checksum: checksum)
        FileHandle.standardOutput.write(try JSONEncoder().encode(report) + Data("\n".utf8))
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("replica-bench --child B10 \(side): \(error)\n".utf8))
        exit(1)
    }
}

// B1m — peak memory of one large save: 100k models inserted through a context and saved in one `save()` (B1's
// typed path, history off), against the raw loop inserting the same rows in one transaction. Each side runs in a
// fresh child process (`replica-bench --child B1m replica|raw DIR N`): the child builds the data set, opens the
// store, takes its resident set size as the baseline, starts a new peak, inserts and saves, and reports the peak
// above the baseline. What the data set itself takes is in the baseline on both sides.

/// One side of B1m, measured in a child process.
func largeSaveTrial(_ n: Int, side: String) throws -> Trial {
    var report: StreamReport?
    let directory = trialDirectory("B1m-\(side)")
    return Trial(run: {}, check: {
        guard let report else { throw CheckFailed("B1m: the \(side) child reported nothing") }
        try require(report.count == n, "B1m: \(side) saved \(report.count) records")
    }, cleanup: {
        try? FileManager.default.removeItem(at: directory)
    }, measured: {
        try? FileManager.default.removeItem(at: directory)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let decoded = try childReport(["--child", "B1m", side, directory.path, String(n)], label: "B1m \(side)")
        report = decoded
        return Measurement(sample: Sample(cpu: decoded.cpu, wall: decoded.wall), peakMB: decoded.peakAboveBaselineMB, items: nil)
    }, note: {
        report.map { "child baseline \(format($0.baselineMB, 1)) MB" }
    })
}

/// The B1m child's work: build the records, open, take the baseline, insert and save, report. Never returns.
func largeSaveChild(side: String, directory: URL, n: Int) -> Never {
    do {
        let records = makeRecords(n)
        let baseline: Int
        let sample: Sample
        var count = 0
        switch side {
        case "replica":
            let container = try makeStore(directory, [BenchRecord.self], tracksHistory: false)
            let context = ModelContext(container)
            try warm(context)
            baseline = Memory.residentBytes() ?? 0
            Memory.resetPeak()
            sample = try measure {
                for record in records { context.insert(record) }
                try context.save()
            }
            count = RawDB(path: storePath(directory)).count("BenchRecord")
        case "raw":
            _ = try makeStore(directory, [BenchRecord.self], tracksHistory: false)
            let raw = RawDB(path: storePath(directory))
            baseline = Memory.residentBytes() ?? 0
            Memory.resetPeak()
            sample = measure {
                let begin = raw.prepare("BEGIN IMMEDIATE"), commit = raw.prepare("COMMIT")
                let insert = raw.prepare(BenchSQL.insert(BenchSQL.table))
                raw.done(begin)
                for record in records {
                    bindRecord(insert, record) {
                        if sqlite3_step(insert) != SQLITE_DONE { raw.fail(-1, "insert") }
                    }
                    sqlite3_reset(insert)
                }
                raw.done(commit)
                for s in [begin, commit, insert] { sqlite3_finalize(s) }
            }
            count = raw.count("BenchRecord")
        default:
            FileHandle.standardError.write(Data("replica-bench --child B1m: unknown side \(side)\n".utf8))
            exit(2)
        }
        let peak = Memory.peakBytes() ?? 0
        let report = StreamReport(cpu: sample.cpu, wall: sample.wall, baselineMB: Double(baseline) / 1_048_576,
                                  peakAboveBaselineMB: Double(max(0, peak - baseline)) / 1_048_576,
                                  count: count, checksum: 0)
        FileHandle.standardOutput.write(try JSONEncoder().encode(report) + Data("\n".utf8))
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("replica-bench --child B1m \(side): \(error)\n".utf8))
        exit(1)
    }
}
