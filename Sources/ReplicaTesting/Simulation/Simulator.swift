// The simulator's public entry points: run a scenario from a seed or a tape, replay a trace, shrink a failure,
// explore many seeds.

import Foundation
import Replica
import Synchronization

/// Runs simulations (see `Simulations/README.md` and the `replica-sim` command).
///
/// A run is a function of the scenario, the canaries and the choice tape: the same seed gives a byte-identical
/// trace. Runs share nothing, so several may run in parallel.
public enum Simulator {
    /// The most choices one run may draw.
    public static let maxChoices = 1 << 22

    /// Runs `scenario` with the tape generated from `seed`.
    /// - Throws: ``SimulationError`` when the run draws more than ``maxChoices`` choices.
    public static func run(_ scenario: Scenario, seed: UInt64, options: SimulationOptions = SimulationOptions()) throws(SimulationError) -> SimulationResult {
        try execute(scenario, source: ChoiceSource(seed: seed, maxChoices: maxChoices), seed: seed, options: options).result
    }

    /// Runs `scenario` on a recorded tape (choices past its end are 0: no more steps, no faults).
    /// - Throws: ``SimulationError`` when the run draws more than ``maxChoices`` choices.
    public static func run(_ scenario: Scenario, tape: [UInt64], seed: UInt64?, options: SimulationOptions = SimulationOptions()) throws(SimulationError) -> SimulationResult {
        try execute(scenario, source: ChoiceSource(replaying: tape, maxChoices: maxChoices), seed: seed, options: options).result
    }

    static func execute(_ scenario: Scenario, source: consuming ChoiceSource, seed: UInt64?, options: SimulationOptions) throws(SimulationError)
        -> (result: SimulationResult, stepFlags: [Int]) {
        var scenario = scenario
        var options = options
        if let steps = options.steps {
            scenario.steps = steps
            options.steps = nil
        }
        let dice = Dice(source: source)
        let run = SimulationRun(scenario: scenario, options: options, dice: dice)
        let violation: InvariantViolation?
        do {
            violation = try run.execute()
        } catch {
            throw SimulationError(message: "the run drew more than \(maxChoices) choices")
        }
        let tape = dice.source.finish()
        var lines: [String] = []
        if options.recordsTrace {
            lines.append(TraceFormat.headerLine(scenario: scenario, seed: seed, tape: tape, canaries: options.canaryNames))
            lines += run.trace.lines
            lines.append(verdictLine(scenario: scenario, seed: seed, steps: run.step, violation: violation, witness: run.witness, stats: run.stats))
        }
        let result = SimulationResult(scenario: scenario.name, seed: seed, tape: tape, steps: run.step, violation: violation,
                                      trace: lines, stats: run.stats, witness: run.witness)
        return (result, run.stepFlagPositions)
    }

    static func verdictLine(scenario: Scenario, seed: UInt64?, steps: Int, violation: InvariantViolation?, witness: [String],
                            stats: SimulationStats) -> String {
        var line = JSONLine()
        line.add("type", "verdict")
        line.add("scenario", scenario.name)
        if let seed { line.add("seed", seed) } else { line.add("seed", nil as String?) }
        line.add("steps", steps)
        line.add("verdict", violation == nil ? "pass" : "fail")
        line.add("invariant", violation?.invariant.rawValue)
        line.add("message", violation?.message)
        line.add("witness", violation == nil ? [] : witness)
        line.add("workload_operations", stats.workloadOperations)
        line.add("sync_requests", stats.syncRequests)
        line.add("cloud_saves", stats.cloudSaves)
        line.add("crashes", stats.crashes)
        line.add("virtual_ms", stats.virtualMilliseconds)
        line.add("skipped_checks", stats.skippedChecks)
        return line.string
    }

    // MARK: Replay

    /// The outcome of replaying a trace.
    public struct ReplayOutcome: Sendable {
        /// The re-executed run.
        public var result: SimulationResult
        /// The first line that differs (1-based), with the recorded and the re-executed text; `nil` when the run
        /// reproduced the trace byte for byte.
        public var divergence: (line: Int, recorded: String, replayed: String)?
    }

    /// Re-executes a trace from its header (scenario, canaries, tape) and compares the new trace line by line.
    /// - Throws: ``TraceError`` for a file that is not a trace; ``SimulationError`` when the run cannot complete.
    public static func replay(traceText: String, file: String) throws -> ReplayOutcome {
        let header = try TraceFormat.header(of: traceText, file: file)
        var canaries = Set<Canary>()
        for name in header.canaries {
            guard let canary = Canary(rawValue: name) else { throw TraceError(file: file, problem: "unknown canary '\(name)'") }
            canaries.insert(canary)
        }
        let result = try run(header.scenario, tape: header.tape.choices, seed: header.seed,
                             options: SimulationOptions(canaries: canaries, recordsTrace: true))
        let recorded = traceText.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let recordedLines = recorded.last == "" ? Array(recorded.dropLast()) : recorded
        var divergence: (Int, String, String)?
        for index in 0..<max(recordedLines.count, result.trace.count) {
            let old = index < recordedLines.count ? recordedLines[index] : "(end of trace)"
            let new = index < result.trace.count ? result.trace[index] : "(end of trace)"
            if old != new {
                divergence = (index + 1, old, new)
                break
            }
        }
        return ReplayOutcome(result: result, divergence: divergence)
    }

    // MARK: Shrinking

    /// Shrinks a failing tape to a minimal one that fails the same invariant: first the shortest prefix of chaos
    /// steps that still fails, then the property engine's shrinker (delete and simplify steps, faults and choices).
    /// - Parameters:
    ///   - budget: the most executions the property engine's shrinker may spend.
    /// - Returns: the run of the shrunk tape, with its trace (or the original run when it does not fail).
    ///   - runs: called after every run the shrink makes, with the number of runs so far (a long shrink's heartbeat).
    public static func shrink(_ scenario: Scenario, tape: [UInt64], seed: UInt64?, options: SimulationOptions, budget: Int = 2_000,
                              runs: (Int) -> Void = { _ in }) throws(SimulationError)
        -> SimulationResult {
        var quiet = options
        quiet.recordsTrace = false
        var runCount = 0
        func counted<T>(_ result: T) -> T {
            runCount += 1
            runs(runCount)
            return result
        }
        let (original, flags) = try counted(execute(scenario, source: ChoiceSource(replaying: tape, maxChoices: maxChoices), seed: seed, options: quiet))
        guard let target = original.violation?.invariant else {
            return try run(scenario, tape: tape, seed: seed, options: options)
        }
        func fails(_ candidate: [UInt64]) -> Bool {
            counted((try? run(scenario, tape: candidate, seed: seed, options: quiet))?.violation?.invariant == target)
        }
        // The shortest failing prefix of steps (binary search; a prefix ends where its next "another step?" is).
        var best = original.tape.choices
        if flags.count > 1 {
            var low = 0, high = flags.count - 1
            while low < high {
                let middle = (low + high) / 2
                let candidate = Array(best.prefix(flags[middle]))
                if fails(candidate) { high = middle } else { low = middle + 1 }
            }
            let candidate = Array(best.prefix(flags[low]))
            if candidate.count < best.count && fails(candidate) { best = candidate }
        }
        // Delete whole chaos steps, latest first, while the run still fails (repeat until nothing goes).
        var changed = true
        while changed {
            changed = false
            var positions = counted((try? execute(scenario, source: ChoiceSource(replaying: best, maxChoices: maxChoices), seed: seed, options: quiet))?.stepFlags ?? [])
            var index = positions.count - 1
            while index >= 0 {
                let start = positions[index]
                let end = min(index + 1 < positions.count ? positions[index + 1] : best.count, best.count)
                var candidates: [[UInt64]] = []
                var plain = best
                plain.removeSubrange(start..<end)
                candidates.append(plain)
                // A step's span starts with "another step?" and its pause: keep the timeline by adding the pause
                // to the next step's.
                if start + 1 < end, end + 1 < best.count {
                    var merged = best
                    merged[end + 1] = min(merged[end + 1] + merged[start + 1], UInt64(scenario.timing.thinkTimeMs))
                    merged.removeSubrange(start..<end)
                    candidates.append(merged)
                }
                for candidate in candidates {
                    if let (result, flags) = counted(try? execute(scenario, source: ChoiceSource(replaying: candidate, maxChoices: maxChoices), seed: seed, options: quiet)),
                       result.violation?.invariant == target, ChoiceTape.shortlexPrecedes(result.tape.choices, best) {
                        best = result.tape.choices
                        positions = flags
                        changed = true
                        break
                    }
                }
                index = min(index - 1, positions.count - 1)
            }
        }
        // The property engine's shrinker, keeping the same failed invariant.
        let configuration = PropertyConfiguration(
            cases: 1, seed: 0, scale: 1,
            shrinkBudget: ShrinkBudget(maxExecutions: budget, maxDuration: .seconds(7 * 24 * 3600)),
            maxChoices: maxChoices,
            failureIdentity: { ($0 as? InvariantViolation)?.invariant.rawValue ?? PropertyFailure.defaultIdentity($0) },
            persistence: .disabled, replay: ChoiceTape(choices: best), environmentOverride: [:])
        let property = checkProperty("replica-sim \(scenario.name)", configuration: configuration) { source in
            let dice = Dice(source: ChoiceSource(replaying: []))
            swap(&source, &dice.source)
            defer { swap(&source, &dice.source) }
            let run = SimulationRun(scenario: scenario, options: quiet, dice: dice)
            defer { _ = counted(()) }
            if let violation = try run.execute() { throw violation }
        }
        if let shrunk = property.counterexample?.tape.choices, fails(shrunk) { best = shrunk }
        return try run(scenario, tape: best, seed: seed, options: options)
    }

    // MARK: Exploring

    /// The outcome of one seed of an exploration.
    public struct SeedOutcome: Sendable {
        public var seed: UInt64
        public var result: SimulationResult
        /// For a failure: the shrunk run, always with its trace (whether or not the exploration recorded traces).
        public var shrunk: SimulationResult?
        /// CPU seconds the seed's thread spent (run and shrink): per-core cost, whatever else the machine runs.
        public var seconds: Double
    }

    /// Runs `seeds` of `scenario` (on `jobs` threads), then shrinks the first failures of each invariant.
    ///
    /// Every seed runs first (without shrinking, so progress keeps moving however many seeds fail); then the first
    /// `shrinkFirst` failing seeds of each violated invariant, in seed order, are shrunk. Which seeds are shrunk
    /// depends only on the seeds and the scenario, never on thread timing. The other failures keep their unshrunk
    /// result (`shrunk == nil`) and are counted by the caller.
    /// - Parameters:
    ///   - shrinkBudget: the most executions one shrink may spend.
    ///   - shrinkFirst: how many failing seeds per invariant are shrunk (`Int.max`: all of them).
    ///   - progress: called after each seed with the number of seeds done (from worker threads, serialised).
    ///   - shrinking: called before the first shrink and after each one with (shrinks done, shrinks planned).
    ///   - shrinkRuns: called after every run of a shrink with its seed and the shrink's runs so far (from worker
    ///     threads), so that a caller can show that a long shrink is moving.
    /// - Returns: the outcomes in seed order.
    /// - Complexity: one run per seed plus at most `shrinkBudget` runs per shrunk failure.
    public static func explore(_ scenario: Scenario, seeds: [UInt64], options: SimulationOptions, jobs: Int = 1, shrinkBudget: Int = 2_000,
                               shrinkFirst: Int = .max,
                               progress: @escaping @Sendable (Int) -> Void = { _ in },
                               shrinking: @escaping @Sendable (Int, Int) -> Void = { _, _ in },
                               shrinkRuns: @escaping @Sendable (UInt64, Int) -> Void = { _, _ in }) -> [SeedOutcome] {
        precondition(shrinkFirst >= 0, "shrinkFirst must not be negative")
        var quietOptions = options
        quietOptions.recordsTrace = false
        let quiet = quietOptions
        var tracedOptions = options
        tracedOptions.recordsTrace = true
        let traced = tracedOptions
        let workers = max(1, min(jobs, seeds.count))
        var outcomes = inParallel(seeds.indices.map { $0 }, workers: workers, progress: progress) { index -> SeedOutcome in
            let seed = seeds[index]
            let start = threadCPUSeconds()
            let result: SimulationResult
            do {
                result = try run(scenario, seed: seed, options: quiet)
            } catch {
                result = SimulationResult(scenario: scenario.name, seed: seed, tape: ChoiceTape(), steps: 0,
                                          violation: InvariantViolation(.unexpectedError, error.message), trace: [],
                                          stats: SimulationStats(), witness: [])
            }
            return SeedOutcome(seed: seed, result: result, shrunk: nil, seconds: threadCPUSeconds() - start)
        }
        // The first `shrinkFirst` failures of each invariant, in seed order.
        var chosen: [Int] = []
        var perInvariant: [String: Int] = [:]
        for (index, outcome) in outcomes.enumerated() {
            guard let violation = outcome.result.violation, !outcome.result.tape.choices.isEmpty else { continue }
            let taken = perInvariant[violation.invariant.rawValue, default: 0]
            guard taken < shrinkFirst else { continue }
            perInvariant[violation.invariant.rawValue] = taken + 1
            chosen.append(index)
        }
        guard !chosen.isEmpty else { return outcomes }
        shrinking(0, chosen.count)
        let planned = chosen.count
        let tapes = outcomes.map(\.result.tape.choices)
        let shrunk = inParallel(chosen, workers: min(workers, chosen.count), progress: { shrinking($0, planned) }) { index -> (SimulationResult?, Double) in
            let start = threadCPUSeconds()
            // The shrunk run is what a caller saves and replays: it always records its trace (the runs that search
            // for it never do), whatever `options` says.
            let result = try? shrink(scenario, tape: tapes[index], seed: seeds[index], options: traced,
                                     budget: shrinkBudget, runs: { shrinkRuns(seeds[index], $0) })
            return (result, threadCPUSeconds() - start)
        }
        for (position, index) in chosen.enumerated() {
            outcomes[index].shrunk = shrunk[position].0
            outcomes[index].seconds += shrunk[position].1
        }
        return outcomes
    }

    /// Maps `items` on `workers` threads, returning the results in the order of `items`.
    private static func inParallel<Item: Sendable, Output: Sendable>(_ items: [Item], workers: Int,
                                                                     progress: @escaping @Sendable (Int) -> Void,
                                                                     _ body: @escaping @Sendable (Item) -> Output) -> [Output] {
        let results = Mutex<[Int: Output]>([:])
        let next = Atomic<Int>(0)
        let work: @Sendable () -> Void = {
            while true {
                let index = next.wrappingAdd(1, ordering: .relaxed).oldValue
                guard index < items.count else { return }
                let output = body(items[index])
                let done = results.withLock { results -> Int in
                    results[index] = output
                    return results.count
                }
                progress(done)
            }
        }
        if workers <= 1 {
            work()
        } else {
            DispatchQueue.concurrentPerform(iterations: workers) { _ in work() }
        }
        return results.withLock { results in items.indices.map { results[$0]! } }
    }
}

/// A simulation that could not complete (not an invariant failure).
public struct SimulationError: Error, CustomStringConvertible, Sendable {
    public var message: String
    public var description: String { message }
}

extension Error {
    var message: String { (self as? SimulationError)?.message ?? "\(self)" }
}

/// CPU time of the calling thread, in seconds.
public func threadCPUSeconds() -> Double {
    var spec = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
    return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
}
