// replica-sim: run many simulated devices against a simulated cloud, inject faults, check invariants, and turn any
// failure into a minimal, byte-for-byte replayable trace.
//
// Exit codes: 0 every invariant held, 1 an invariant failed, 2 bad usage or bad scenario, 3 nondeterminism detected.
// The last line on stdout of run, explore and replay is one JSON object.

import Foundation
import Replica
import Synchronization
import ReplicaTesting

let usage = """
    usage: replica-sim <command> [options]

      run      --scenario NAME|PATH --seed N [--steps K] [--trace FILE] [--canary NAME]
               run one seed; print the verdict (and the witness of a failure)
      explore  [--scenario NAME|PATH|all] --seeds N [--from S] [--steps K] [--canary NAME] [--jobs J]
               [--shrink-budget B] [--shrink-first N (default 3)] [--no-save]
               run N seeds (from S) of a scenario (default: every built-in one); then shrink the first N failures
               of each invariant, save their traces under Simulations/failures/, count the rest; print a summary
      replay   TRACE
               re-execute a trace and compare it line by line; report the first divergence (exit 3)
      shrink   TRACE -o OUT [--budget B]
               shrink a failing trace to a minimal one that fails the same invariant
      list     [--json]
               the built-in scenarios and the canaries
      hunt     --canary NAME [--scenario NAME|PATH] [--seeds N] [--steps K] [--budget B] [-o OUT]
               run seeds (of the canary's hunting scenario) until the canary is caught, then shrink the failure
      fuzz     --target cloud-record|trace|scenario|store-file|all [--iterations N] [--seed S] [--from I]
               [--input-file PATH] [--iteration I]
               mutate and run inputs from outside (a typed error is fine, a trap is a failure); each input is written
               to --input-file before it runs, so a trap leaves it behind; --iteration I prints and runs one input
    \(soakUsage)

    exit codes: 0 every invariant held, 1 an invariant failed, 2 bad usage or bad scenario, 3 nondeterminism
    """

// Before anything opens a database: SQLite's memory statistics off (no global mutex per allocation; see SQLiteTuning).
SQLiteTuning.disableMemoryStatistics()

enum ExitCode: Int32 {
    case pass = 0, fail = 1, usage = 2, nondeterminism = 3
}

struct UsageError: Error {
    var message: String
}

func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

func emit(_ text: String) {
    print(text)
    fflush(nil)
}

/// Parsed `--option value` pairs and positional arguments.
struct Arguments {
    var options: [String: [String]] = [:]
    var flags = Set<String>()
    var positional: [String] = []

    init(_ arguments: ArraySlice<String>, valued: Set<String>, flags allowedFlags: Set<String>) throws {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            if valued.contains(argument) {
                guard let value = iterator.next() else { throw UsageError(message: "\(argument) needs a value") }
                options[argument, default: []].append(value)
            } else if allowedFlags.contains(argument) {
                flags.insert(argument)
            } else if argument.hasPrefix("-") && argument.count > 1 {
                throw UsageError(message: "unknown option \(argument)")
            } else {
                positional.append(argument)
            }
        }
    }

    func value(_ name: String) -> String? { options[name]?.last }

    func integer(_ name: String, in range: ClosedRange<Int>) throws -> Int? {
        guard let text = value(name) else { return nil }
        guard let number = Int(text), range.contains(number) else {
            throw UsageError(message: "\(name) needs an integer in \(range.lowerBound)...\(range.upperBound), not '\(text)'")
        }
        return number
    }

    func seed(_ name: String) throws -> UInt64? {
        guard let text = value(name) else { return nil }
        guard let seed = PropertyConfiguration.parseSeed(text) else { throw UsageError(message: "\(name) needs a seed (decimal or 0x hex), not '\(text)'") }
        return seed
    }
}

func canaryOptions(_ arguments: Arguments) throws -> Set<Canary> {
    var canaries = Set<Canary>()
    for name in arguments.options["--canary"] ?? [] {
        guard let canary = Canary(rawValue: name) else {
            throw UsageError(message: "unknown canary '\(name)' (known: \(Canary.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        canaries.insert(canary)
    }
    return canaries
}

func finalLine(scenario: String, seedKey: String, seed: String, steps: Int, verdict: String, invariant: String?,
               extra: (inout JSONLine) -> Void = { _ in }) -> String {
    var line = JSONLine()
    line.add("scenario", scenario)
    line.addRaw(seedKey, seed)
    line.add("steps", steps)
    line.add("verdict", verdict)
    line.add("invariant", invariant)
    extra(&line)
    return line.string
}

func printFailure(_ result: SimulationResult) {
    guard let violation = result.violation else { return }
    emit("FAIL \(violation.invariant.rawValue): \(violation.message)")
    emit("witness (\(result.steps) steps):")
    for line in result.witness { emit("  \(line)") }
}

func secondsSince(_ start: ContinuousClock.Instant) -> Double {
    let elapsed = ContinuousClock.now - start
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

// MARK: - Commands

/// `path`, checked before any work: its directory must exist and be a directory (so a long run or shrink does not end
/// in a file-system error). Returns `nil` for `nil`.
func outputPath(_ path: String?, for option: String) throws -> String? {
    guard let path else { return nil }
    let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
    var isDirectory: ObjCBool = false
    guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
        throw UsageError(message: "\(option) \(path): the directory \(directory) does not exist")
    }
    return path
}

/// Writes a trace to `path`, as a usage error naming the file when it cannot be written.
func writeTrace(_ text: String, to path: String, option: String) throws {
    do {
        try text.write(toFile: path, atomically: true, encoding: .utf8)
    } catch {
        throw UsageError(message: "\(option) \(path): cannot write the file (\((error as NSError).localizedDescription))")
    }
}

func runCommand(_ arguments: Arguments) throws -> ExitCode {
    guard let name = arguments.value("--scenario") else { throw UsageError(message: "run needs --scenario NAME|PATH") }
    guard let seed = try arguments.seed("--seed") else { throw UsageError(message: "run needs --seed N") }
    let scenario = try ScenarioCatalog.resolve(name)
    let options = SimulationOptions(canaries: try canaryOptions(arguments), steps: try arguments.integer("--steps", in: 1...100_000))
    let tracePath = try outputPath(arguments.value("--trace"), for: "--trace")
    let start = ContinuousClock.now
    let result = try Simulator.run(scenario, seed: seed, options: options)
    let seconds = secondsSince(start)
    if let path = tracePath {
        try writeTrace(result.traceText, to: path, option: "--trace")
        emit("trace: \(path) (\(result.trace.count) lines)")
    }
    emit("\(scenario.name) seed \(seed): \(result.verdict.uppercased()) after \(result.steps) steps, \(result.stats.deviceOperations) device operations, "
        + "\(result.stats.virtualMilliseconds / 1000) s virtual, \(String(format: "%.2f", seconds)) s")
    for skipped in result.stats.skippedChecks { emit("skipped: \(skipped)") }
    printFailure(result)
    emit(finalLine(scenario: scenario.name, seedKey: "seed", seed: String(seed), steps: result.steps, verdict: result.verdict,
                   invariant: result.violation?.invariant.rawValue) { line in
        line.add("trace_digest", result.traceDigest)
        line.add("device_ops", result.stats.deviceOperations)
        line.add("canaries", options.canaries.map(\.rawValue).sorted())
    })
    return result.violation == nil ? .pass : .fail
}

final class ProgressBar: @unchecked Sendable {
    let total: Int
    let label: String
    let enabled = isatty(2) == 1
    let lock = NSLock()

    init(total: Int, label: String) {
        self.total = total
        self.label = label
    }

    /// The last tenth reported when stderr is not a terminal (a log gets a line per 10 %, never silence).
    private var reportedTenth = -1

    func update(_ done: Int) {
        lock.lock()
        defer { lock.unlock() }
        guard enabled else {
            let tenth = total == 0 ? 10 : 10 * done / total
            if tenth > reportedTenth {
                reportedTenth = tenth
                FileHandle.standardError.write(Data("\(label): \(done)/\(total)\n".utf8))
            }
            return
        }
        let width = 30
        let filled = total == 0 ? width : width * done / total
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        FileHandle.standardError.write(Data("\r\(label) [\(bar)] \(done)/\(total)".utf8))
        if done == total { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

func exploreCommand(_ arguments: Arguments) throws -> ExitCode {
    guard let count = try arguments.integer("--seeds", in: 1...10_000_000) else { throw UsageError(message: "explore needs --seeds N") }
    let from = try arguments.seed("--from") ?? 0
    let name = arguments.value("--scenario") ?? "all"
    let scenarios = name == "all" ? try ScenarioCatalog.builtIn() : [try ScenarioCatalog.resolve(name)]
    guard !scenarios.isEmpty else { throw UsageError(message: "no built-in scenarios found (is there a Simulations/ directory?)") }
    let options = SimulationOptions(canaries: try canaryOptions(arguments), steps: try arguments.integer("--steps", in: 1...100_000),
                                    recordsTrace: false)
    let jobs = try arguments.integer("--jobs", in: 1...256) ?? ProcessInfo.processInfo.activeProcessorCount
    let budget = try arguments.integer("--shrink-budget", in: 0...1_000_000) ?? 2_000
    let shrinkFirst = try arguments.integer("--shrink-first", in: 0...1_000_000) ?? 3
    let save = !arguments.flags.contains("--no-save")
    let seeds = (0..<UInt64(count)).map { from &+ $0 }
    struct Row {
        var scenario: String
        var passed = 0
        var failed = 0
        var invariants: [String] = []
        var operations = 0
        var seconds = 0.0
        var wall = 0.0
    }
    var rows: [Row] = []
    var failures: [(scenario: String, outcome: Simulator.SeedOutcome, path: String?)] = []
    var maxSteps = 0
    for scenario in scenarios {
        maxSteps = max(maxSteps, options.steps ?? scenario.steps)
        let bar = ProgressBar(total: seeds.count, label: scenario.name)
        let start = ContinuousClock.now
        let shrinkBar = Mutex<ProgressBar?>(nil)
        let outcomes = Simulator.explore(scenario, seeds: seeds, options: options, jobs: jobs, shrinkBudget: budget,
                                         shrinkFirst: shrinkFirst, progress: { bar.update($0) },
                                         shrinking: { done, total in
                                             shrinkBar.withLock { shrinkBar in
                                                 if shrinkBar == nil { shrinkBar = ProgressBar(total: total, label: "\(scenario.name) shrinking") }
                                                 shrinkBar?.update(done)
                                             }
                                         },
                                         shrinkRuns: { seed, runs in
                                             // A heartbeat while one shrink takes long: a line every 100 runs.
                                             if runs % 100 == 0 {
                                                 FileHandle.standardError.write(Data("\(isatty(2) == 1 ? "\r" : "")\(scenario.name) shrinking seed \(seed): \(runs) runs\(isatty(2) == 1 ? "" : "\n")".utf8))
                                             }
                                         })
        var row = Row(scenario: scenario.name)
        row.wall = secondsSince(start)
        for outcome in outcomes {
            row.operations += outcome.result.stats.deviceOperations
            row.seconds += outcome.seconds
            guard let violation = outcome.result.violation else {
                row.passed += 1
                continue
            }
            row.failed += 1
            if !row.invariants.contains(violation.invariant.rawValue) { row.invariants.append(violation.invariant.rawValue) }
            var path: String?
            if save, let shrunk = outcome.shrunk, let directory = ScenarioCatalog.directory() {
                let folder = directory.appendingPathComponent("failures", isDirectory: true)
                try? FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
                let canary = options.canaries.isEmpty ? "" : "-" + options.canaries.map(\.rawValue).sorted().joined(separator: "+")
                let file = folder.appendingPathComponent("\(scenario.name)\(canary)-seed\(outcome.seed)-\(violation.invariant.rawValue).ndjson")
                // Never an empty file: a trace without lines could not be replayed or shrunk.
                if !shrunk.trace.isEmpty, (try? shrunk.traceText.write(to: file, atomically: true, encoding: .utf8)) != nil { path = file.path }
            }
            failures.append((scenario.name, outcome, path))
        }
        rows.append(row)
    }
    func pad(_ text: String, _ width: Int, left: Bool = false) -> String {
        let space = String(repeating: " ", count: max(0, width - text.count))
        return left ? text + space : space + text
    }
    emit("")
    emit(pad("scenario", 22, left: true) + pad("seeds", 7) + pad("pass", 7) + pad("fail", 6) + "  " + pad("failed invariants", 28, left: true)
        + pad("device ops", 12) + pad("ops/s/core", 12) + pad("cpu s", 8) + pad("wall s", 8))
    var totalOperations = 0
    var totalSeconds = 0.0
    for row in rows {
        totalOperations += row.operations
        totalSeconds += row.seconds
        let rate = row.seconds > 0 ? Int(Double(row.operations) / row.seconds) : 0
        emit(pad(row.scenario, 22, left: true) + pad(String(row.passed + row.failed), 7) + pad(String(row.passed), 7) + pad(String(row.failed), 6)
            + "  " + pad(row.invariants.isEmpty ? "-" : row.invariants.joined(separator: ","), 28, left: true)
            + pad(String(row.operations), 12) + pad(String(rate), 12) + pad(String(format: "%.1f", row.seconds), 8)
            + pad(String(format: "%.1f", row.wall), 8))
    }
    if !failures.isEmpty {
        emit("")
        let unshrunk = failures.filter { $0.outcome.shrunk == nil }.count
        emit(unshrunk == 0 ? "failures (shrunk):"
             : "failures (the first \(shrinkFirst) per invariant shrunk; \(unshrunk) more not shrunk, --shrink-first N to change):")
        for failure in failures.prefix(50) {
            let shrunk = failure.outcome.shrunk ?? failure.outcome.result
            emit("  \(failure.scenario) seed \(failure.outcome.seed): \(shrunk.violation?.description ?? "?") — \(shrunk.steps) steps"
                + (failure.path.map { " — \($0)" } ?? ""))
        }
    }
    let failed = failures.count
    let firstInvariant = failures.first?.outcome.result.violation?.invariant.rawValue
    emit(finalLine(scenario: name == "all" ? "all" : scenarios[0].name, seedKey: "seeds", seed: String(count), steps: maxSteps,
                   verdict: failed == 0 ? "pass" : "fail", invariant: firstInvariant) { line in
        line.add("from", from)
        line.add("scenarios", scenarios.map(\.name))
        line.add("failures", failed)
        line.add("device_ops", totalOperations)
        line.add("device_ops_per_second_per_core", totalSeconds > 0 ? Int(Double(totalOperations) / totalSeconds) : 0)
        line.add("canaries", options.canaries.map(\.rawValue).sorted())
    })
    return failed == 0 ? .pass : .fail
}

func replayCommand(_ arguments: Arguments) throws -> ExitCode {
    guard arguments.positional.count == 1, let path = arguments.positional.first else { throw UsageError(message: "replay needs one TRACE file") }
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw UsageError(message: "cannot read \(path)") }
    let outcome = try Simulator.replay(traceText: text, file: path)
    let result = outcome.result
    if let divergence = outcome.divergence {
        emit("NONDETERMINISM: \(path) diverges at line \(divergence.line)")
        emit("  recorded: \(divergence.recorded)")
        emit("  replayed: \(divergence.replayed)")
    } else {
        emit("replayed \(result.trace.count) lines: identical")
    }
    printFailure(result)
    // A replay re-executes the tape recorded in the header, not a fresh run of the seed: a shrunk trace (or one
    // recorded by another version) holds a different tape than the seed draws, so it can fail — deterministically —
    // while `run --seed` passes. Say which it is when the replay fails.
    var tapeOfSeed: Bool?
    if result.violation != nil, let seed = result.seed {
        let header = try TraceFormat.header(of: text, file: path)
        let fresh = try Simulator.run(header.scenario, seed: seed,
                                      options: SimulationOptions(canaries: Set(header.canaries.compactMap(Canary.init(rawValue:))), recordsTrace: false))
        tapeOfSeed = fresh.tape.choices == header.tape.choices
        if tapeOfSeed == false {
            emit("note: this trace's tape (\(header.tape.choices.count) choices) is not the tape seed \(seed) draws (\(fresh.tape.choices.count) choices): "
                + "it was shrunk or edited. replay re-executes the recorded tape, which fails\(outcome.divergence == nil ? " exactly as recorded" : "")"
                + "; `run --seed \(seed)` executes the seed's own tape and \(fresh.violation == nil ? "passes" : "fails (\(fresh.violation!.invariant.rawValue))").")
        }
    }
    emit(finalLine(scenario: result.scenario, seedKey: "seed", seed: result.seed.map { String($0) } ?? "null", steps: result.steps,
                   verdict: result.verdict, invariant: result.violation?.invariant.rawValue) { line in
        line.add("trace_digest", result.traceDigest)
        if let tapeOfSeed { line.add("tape_of_seed", tapeOfSeed) }
        line.add("deterministic", outcome.divergence == nil)
        if let divergence = outcome.divergence { line.add("divergent_line", divergence.line) } else { line.add("divergent_line", nil as String?) }
    })
    if outcome.divergence != nil { return .nondeterminism }
    return result.violation == nil ? .pass : .fail
}

func shrinkCommand(_ arguments: Arguments) throws -> ExitCode {
    guard arguments.positional.count == 1, let path = arguments.positional.first else { throw UsageError(message: "shrink needs one TRACE file") }
    guard let output = try outputPath(arguments.value("-o"), for: "-o") else { throw UsageError(message: "shrink needs -o OUT") }
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw UsageError(message: "cannot read \(path)") }
    let header = try TraceFormat.header(of: text, file: path)
    var canaries = Set<Canary>()
    for name in header.canaries {
        guard let canary = Canary(rawValue: name) else { throw UsageError(message: "\(path): unknown canary '\(name)'") }
        canaries.insert(canary)
    }
    let budget = try arguments.integer("--budget", in: 0...1_000_000) ?? 2_000
    let options = SimulationOptions(canaries: canaries)
    let original = try Simulator.run(header.scenario, tape: header.tape.choices, seed: header.seed, options: options)
    guard original.violation != nil else {
        emit("\(path) does not fail: nothing to shrink")
        emit(finalLine(scenario: original.scenario, seedKey: "seed", seed: original.seed.map { String($0) } ?? "null", steps: original.steps,
                       verdict: original.verdict, invariant: nil) { $0.add("trace_digest", original.traceDigest) })
        return .pass
    }
    let shrunk = try Simulator.shrink(header.scenario, tape: header.tape.choices, seed: header.seed, options: options, budget: budget)
    try writeTrace(shrunk.traceText, to: output, option: "-o")
    emit("shrunk \(original.steps) steps (\(original.tape.count) choices) to \(shrunk.steps) steps (\(shrunk.tape.count) choices): \(output)")
    printFailure(shrunk)
    emit(finalLine(scenario: shrunk.scenario, seedKey: "seed", seed: shrunk.seed.map { String($0) } ?? "null", steps: shrunk.steps,
                   verdict: shrunk.verdict, invariant: shrunk.violation?.invariant.rawValue) { $0.add("trace_digest", shrunk.traceDigest) })
    return shrunk.violation == nil ? .pass : .fail
}

func listCommand(_ arguments: Arguments) throws -> ExitCode {
    let paths = ScenarioCatalog.builtInPaths()
    var scenarios: [(String, Scenario)] = []
    for path in paths { scenarios.append((path, try Scenario.load(path: path))) }
    if arguments.flags.contains("--json") {
        let scenarioObjects = scenarios.map { path, scenario -> String in
            var line = JSONLine()
            line.add("name", scenario.name)
            line.add("description", scenario.description)
            line.add("path", path)
            line.add("schema", scenario.schemaSeeds)
            line.add("stores", scenario.stores.map { "\($0.name) (\($0.kind.rawValue))" })
            line.add("devices", scenario.devices.map { "\($0.name) v\($0.schemaVersion)" })
            line.add("storage", scenario.storage.rawValue)
            line.add("steps", scenario.steps)
            line.add("hash", scenario.hash)
            return line.string
        }
        let canaryObjects = CanaryCatalog.all.map { entry -> String in
            var line = JSONLine()
            line.add("name", entry.canary.rawValue)
            line.add("description", entry.summary)
            line.add("scenario", entry.scenario)
            return line.string
        }
        emit("{\"scenarios\":[\(scenarioObjects.joined(separator: ","))],\"canaries\":[\(canaryObjects.joined(separator: ","))]}")
        return .pass
    }
    emit("scenarios (\(ScenarioCatalog.directory()?.path ?? "no Simulations/ directory")):")
    for (_, scenario) in scenarios {
        emit("  \(scenario.name): \(scenario.devices.count) devices, stores \(scenario.stores.map { "\($0.name) (\($0.kind.rawValue))" }.joined(separator: ", ")), "
            + "\(scenario.storage.rawValue), \(scenario.steps) steps")
        if !scenario.description.isEmpty { emit("      \(scenario.description)") }
    }
    emit("canaries:")
    for entry in CanaryCatalog.all { emit("  \(entry.canary.rawValue): \(entry.summary) (hunted in \(entry.scenario))") }
    return .pass
}

func huntCommand(_ arguments: Arguments) throws -> ExitCode {
    let known = CanaryCatalog.all.map(\.canary.rawValue).joined(separator: ", ")
    guard let name = arguments.value("--canary") else { throw UsageError(message: "hunt needs --canary NAME (known: \(known))") }
    guard let entry = CanaryCatalog.entry(named: name) else { throw UsageError(message: "unknown canary '\(name)' (known: \(known))") }
    let huntOutput = try outputPath(arguments.value("-o"), for: "-o")
    let scenario = try ScenarioCatalog.resolve(arguments.value("--scenario") ?? entry.scenario)
    let seeds = try arguments.integer("--seeds", in: 1...1_000_000) ?? 1_000
    let options = SimulationOptions(canaries: [entry.canary], steps: try arguments.integer("--steps", in: 1...100_000), recordsTrace: false)
    let budget = try arguments.integer("--budget", in: 0...1_000_000) ?? 2_000
    let start = threadCPUSeconds()
    for seed in 0..<UInt64(seeds) {
        let result = try Simulator.run(scenario, seed: seed, options: options)
        guard let violation = result.violation else { continue }
        let huntSeconds = threadCPUSeconds() - start
        var traced = options
        traced.recordsTrace = true
        let shrunk = try Simulator.shrink(scenario, tape: result.tape.choices, seed: seed, options: traced, budget: budget)
        if let output = huntOutput { try writeTrace(shrunk.traceText, to: output, option: "-o") }
        emit("\(name): caught by \(scenario.name) seed \(seed) (\(violation.invariant.rawValue), \(result.steps) steps, "
            + "\(String(format: "%.1f", huntSeconds)) s); shrunk to \(shrunk.steps) steps (\(String(format: "%.1f", threadCPUSeconds() - start)) s cpu)")
        printFailure(shrunk)
        emit(finalLine(scenario: scenario.name, seedKey: "seed", seed: String(seed), steps: shrunk.steps, verdict: shrunk.verdict,
                       invariant: shrunk.violation?.invariant.rawValue) { line in
            line.add("canary", name)
            line.add("trace_digest", shrunk.traceDigest)
        })
        return .fail
    }
    emit("\(name): not caught in \(seeds) seeds of \(scenario.name)")
    emit(finalLine(scenario: scenario.name, seedKey: "seeds", seed: String(seeds), steps: options.steps ?? scenario.steps, verdict: "pass",
                   invariant: nil) { $0.add("canary", name) })
    return .pass
}

func fuzzCommand(_ arguments: Arguments) throws -> ExitCode {
    let known = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
    guard let name = arguments.value("--target") else { throw UsageError(message: "fuzz needs --target NAME (\(known), all)") }
    let targets: [FuzzTarget]
    if name == "all" {
        targets = FuzzTarget.allCases
    } else {
        guard let target = FuzzTarget(rawValue: name) else { throw UsageError(message: "unknown fuzz target '\(name)' (known: \(known), all)") }
        targets = [target]
    }
    let seed = try arguments.seed("--seed") ?? 1
    if let iteration = try arguments.integer("--iteration", in: 0...Int.max) {
        for target in targets {
            let input = Fuzzer.input(target, seed: seed, iteration: iteration)
            emit("\(target) seed \(seed) iteration \(iteration): \(input.count) bytes")
            emit(Fuzzer.hex(input))
            let outcome = Fuzzer.execute(target, input)
            emit(finalLine(scenario: target.rawValue, seedKey: "seed", seed: String(seed), steps: 1, verdict: "pass", invariant: nil) { line in
                line.add("iteration", iteration)
                if case let .refused(error) = outcome { line.add("refused", error) } else { line.add("refused", nil as String?) }
            })
        }
        return .pass
    }
    let iterations = try arguments.integer("--iterations", in: 1...100_000_000) ?? 1_000
    let first = try arguments.integer("--from", in: 0...Int.max) ?? 0
    let inputPath = try outputPath(arguments.value("--input-file"), for: "--input-file")
        ?? FileManager.default.temporaryDirectory.appendingPathComponent("replica-fuzz-input-\(ProcessInfo.processInfo.processIdentifier).bin").path
    for target in targets {
        let report = Fuzzer.run(target, seed: seed, iterations: iterations, first: first) { iteration, input in
            // Left behind by a trap: the input, and the iteration that reproduces it (best effort: the report names both).
            _ = FileManager.default.createFile(atPath: inputPath, contents: Data(input))
            _ = FileManager.default.createFile(atPath: inputPath + ".iteration", contents: Data("\(target) --seed \(seed) --iteration \(iteration)\n".utf8))
        }
        emit("\(target): \(report.iterations) inputs, \(report.accepted) accepted, \(report.refused) refused (typed errors), "
            + "\(String(format: "%.1f", report.seconds)) s cpu, no trap")
        emit(finalLine(scenario: target.rawValue, seedKey: "seed", seed: String(seed), steps: report.iterations, verdict: "pass", invariant: nil) { line in
            line.add("from", first)
            line.add("accepted", report.accepted)
            line.add("refused", report.refused)
        })
    }
    try? FileManager.default.removeItem(atPath: inputPath)
    try? FileManager.default.removeItem(atPath: inputPath + ".iteration")
    return .pass
}

// MARK: - Main

func main() -> Int32 {
    var arguments = CommandLine.arguments.dropFirst()
    guard let command = arguments.popFirst() else {
        printError(usage)
        return ExitCode.usage.rawValue
    }
    do {
        let code: ExitCode
        switch command {
        case "run":
            code = try runCommand(Arguments(arguments, valued: ["--scenario", "--seed", "--steps", "--trace", "--canary"], flags: []))
        case "explore":
            code = try exploreCommand(Arguments(arguments, valued: ["--scenario", "--seeds", "--from", "--steps", "--canary", "--jobs", "--shrink-budget", "--shrink-first"],
                                                flags: ["--no-save"]))
        case "replay":
            code = try replayCommand(Arguments(arguments, valued: [], flags: []))
        case "shrink":
            code = try shrinkCommand(Arguments(arguments, valued: ["-o", "--budget"], flags: []))
        case "hunt":
            code = try huntCommand(Arguments(arguments, valued: ["--canary", "--scenario", "--seeds", "--steps", "--budget", "-o"], flags: []))
        case "fuzz":
            code = try fuzzCommand(Arguments(arguments, valued: ["--target", "--iterations", "--seed", "--from", "--input-file", "--iteration"], flags: []))
        case "list":
            code = try listCommand(Arguments(arguments, valued: [], flags: ["--json"]))
        case "soak":
            code = try soakCommand(Arguments(arguments, valued: ["--cloud", "--owner", "--devices", "--duration", "--seed", "--directory",
                                                                 "--device", "--log", "--canary"], flags: ["--no-faults"]))
        case "help", "--help", "-h":
            emit(usage)
            code = .pass
        default:
            throw UsageError(message: "unknown command '\(command)'")
        }
        return code.rawValue
    } catch let error as UsageError {
        printError("replica-sim: \(error.message)\n\n\(usage)")
        return ExitCode.usage.rawValue
    } catch let error as ScenarioError {
        printError("replica-sim: \(error)")
        return ExitCode.usage.rawValue
    } catch let error as TraceError {
        printError("replica-sim: \(error)")
        return ExitCode.usage.rawValue
    } catch {
        printError("replica-sim: \(error)")
        return ExitCode.usage.rawValue
    }
}

exit(main())
