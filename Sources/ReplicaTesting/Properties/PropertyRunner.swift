// Running a property: generate cases, find a failure, shrink it, report it.

import Foundation

/// Where failing tapes are saved and replayed from.
public enum FailurePersistence: Sendable, Hashable {
    /// `$REPLICA_PROPERTY_FAILURES_DIR` if set, else `.replica-property-failures` in the
    /// current directory.
    case automatic
    /// Never read or write failing tapes.
    case disabled
    /// Use this directory (created on first save).
    case directory(String)
}

/// Settings for one property run. The defaults suit unit tests; environment variables can
/// override some of them for long or reproducing runs:
///
/// - `REPLICA_PROPERTY_SEED` (decimal or `0x` hex): the seed, when ``seed`` is `nil`.
/// - `REPLICA_PROPERTY_SCALE` (a positive number): multiplies ``cases``, when ``scale`` is `nil`.
/// - `REPLICA_PROPERTY_FAILURES_DIR`: the failure folder for ``FailurePersistence/automatic``.
public struct PropertyConfiguration: Sendable {
    /// Number of valid (non-discarded) cases to run before declaring success.
    public var cases: Int
    /// The master seed. `nil` means `$REPLICA_PROPERTY_SEED`, else a fixed seed derived from the
    /// property's name (so runs are reproducible by default).
    public var seed: UInt64?
    /// Multiplier for ``cases``. `nil` means `$REPLICA_PROPERTY_SCALE`, else 1.
    public var scale: Double?
    /// Limits on shrinking.
    public var shrinkBudget: ShrinkBudget
    /// Maximum choices one case may draw before it is discarded as too large.
    public var maxChoices: Int
    /// Maximum discarded cases before giving up. `nil` means `max(100, 10 × cases)`.
    public var maxDiscards: Int?
    /// Decides whether two failures are "the same" while shrinking.
    public var failureIdentity: @Sendable (any Error) -> String
    /// Where failing tapes are saved and replayed first.
    public var persistence: FailurePersistence
    /// When set, run only this tape (no generation, no persisted tapes), shrinking it if it
    /// fails. Use it to reproduce a reported counterexample.
    public var replay: ChoiceTape?
    /// Used instead of the process environment when set (for tests of the engine itself).
    public var environmentOverride: [String: String]?

    /// Creates a configuration; every parameter has a sensible default.
    public init(
        cases: Int = 100,
        seed: UInt64? = nil,
        scale: Double? = nil,
        shrinkBudget: ShrinkBudget = ShrinkBudget(),
        maxChoices: Int = 8192,
        maxDiscards: Int? = nil,
        failureIdentity: @escaping @Sendable (any Error) -> String = PropertyFailure.defaultIdentity,
        persistence: FailurePersistence = .automatic,
        replay: ChoiceTape? = nil,
        environmentOverride: [String: String]? = nil
    ) {
        self.cases = cases
        self.seed = seed
        self.scale = scale
        self.shrinkBudget = shrinkBudget
        self.maxChoices = maxChoices
        self.maxDiscards = maxDiscards
        self.failureIdentity = failureIdentity
        self.persistence = persistence
        self.replay = replay
        self.environmentOverride = environmentOverride
    }

    /// Environment variable names the engine reads.
    public enum EnvironmentKey {
        /// The master seed (decimal or `0x` hex).
        public static let seed = "REPLICA_PROPERTY_SEED"
        /// Multiplier for the number of cases.
        public static let scale = "REPLICA_PROPERTY_SCALE"
        /// Folder of saved failing tapes.
        public static let failuresDirectory = "REPLICA_PROPERTY_FAILURES_DIR"
    }

    func environmentValue(_ key: String) -> String? {
        if let environmentOverride { return environmentOverride[key] }
        return ProcessInfo.processInfo.environment[key]
    }

    /// Parses a seed written in decimal or as `0x` hexadecimal.
    public static func parseSeed(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "_", with: "")
        if trimmed.lowercased().hasPrefix("0x") { return UInt64(trimmed.dropFirst(2), radix: 16) }
        return UInt64(trimmed)
    }

    /// Formats a seed as 16 hex digits with a `0x` prefix, the form used in reports.
    public static func formatSeed(_ seed: UInt64) -> String {
        let hex = String(seed, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 16 - hex.count)) + hex
    }

    /// The seed this configuration uses for a property called `name`.
    public func resolvedSeed(for name: String) -> UInt64 {
        if let seed { return seed }
        if let text = environmentValue(EnvironmentKey.seed), let parsed = PropertyConfiguration.parseSeed(text) { return parsed }
        var mixer = SplitMix64(seed: PropertyHashing.fnv1a64(name))
        return mixer.next()
    }

    /// The number of cases after scaling (at least 1).
    public var resolvedCases: Int {
        let factor = scale ?? environmentValue(EnvironmentKey.scale).flatMap { Double($0) } ?? 1
        guard factor.isFinite, factor > 0 else { return max(1, cases) }
        return max(1, Int(min((Double(cases) * factor).rounded(), Double(Int32.max))))
    }

    /// The failure store this configuration uses, if any.
    public var resolvedFailureStore: PropertyFailureStore? {
        switch persistence {
        case .disabled: return nil
        case .directory(let path): return PropertyFailureStore(directory: path)
        case .automatic:
            return PropertyFailureStore(
                directory: environmentValue(EnvironmentKey.failuresDirectory) ?? ".replica-property-failures"
            )
        }
    }
}

/// Where a counterexample came from.
public enum CounterexampleOrigin: Sendable, Hashable, CustomStringConvertible {
    /// Found while generating case number `caseIndex` (0-based).
    case generated(caseIndex: Int)
    /// A tape saved by an earlier run that still fails.
    case persisted
    /// The tape given in ``PropertyConfiguration/replay``.
    case replayed

    public var description: String {
        switch self {
        case .generated(let index): "generated case #\(index)"
        case .persisted: "saved failure replayed"
        case .replayed: "replayed tape"
        }
    }
}

/// A shrunk failing case.
public struct PropertyCounterexample<Value> {
    /// The shrunk value (decoded from ``tape``).
    public var value: Value
    /// ``value`` described for people (strings quoted, dictionaries sorted by key).
    public var valueDescription: String
    /// Notes recorded with ``ChoiceSource/note(_:)`` while replaying the shrunk case.
    public var notes: [String]
    /// The shrunk tape; replay it with ``PropertyConfiguration/replay``.
    public var tape: ChoiceTape
    /// The tape that first failed, before shrinking.
    public var originalTape: ChoiceTape
    /// The failure identity kept constant while shrinking.
    public var failureIdentity: String
    /// The error thrown by the shrunk case.
    public var error: any Error
    /// Where the failure was found.
    public var origin: CounterexampleOrigin
    /// Number of accepted shrink steps (each made the tape strictly simpler).
    public var shrinkSteps: Int
    /// Number of candidate executions spent shrinking.
    public var shrinkExecutions: Int
    /// Why shrinking stopped.
    public var shrinkStopReason: ShrinkStopReason
}

extension PropertyCounterexample: Sendable where Value: Sendable {}

/// The outcome of checking a property.
public struct PropertyResult<Value> {
    /// The property's name.
    public var name: String
    /// The master seed used.
    public var seed: UInt64
    /// Cases requested after scaling.
    public var casesRequested: Int
    /// Valid cases executed (including a failing one).
    public var casesRun: Int
    /// Cases discarded by ``Property/assume(_:_:)``, filters or overruns.
    public var discarded: Int
    /// Saved failing tapes replayed before generating.
    public var persistedTapesReplayed: Int
    /// The shrunk counterexample, if the property failed.
    public var counterexample: PropertyCounterexample<Value>?
    /// Set when too many cases were discarded to trust a pass.
    public var gaveUpReason: String?
    /// Where the failing tape was saved, if it was.
    public var savedFailurePath: String?

    /// Whether the property held for every case (and did not give up).
    public var passed: Bool { counterexample == nil && gaveUpReason == nil }

    /// A line that reruns this property with the same seed, e.g.
    /// `REPLICA_PROPERTY_SEED=0x00000000000004d2`.
    public var seedReplayLine: String { "\(PropertyConfiguration.EnvironmentKey.seed)=\(PropertyConfiguration.formatSeed(seed))" }

    /// A multi-line report: what failed, the shrunk counterexample, seed, and how to replay.
    public var report: String { report(testFilter: nil) }

    /// The report, with `--filter <testFilter>` added to the seed replay command when given.
    func report(testFilter: String?) -> String {
        if let reason = gaveUpReason, counterexample == nil {
            return "Property '\(name)' gave up: \(reason) (seed \(PropertyConfiguration.formatSeed(seed)), \(casesRun) valid cases, \(discarded) discarded)."
        }
        guard let example = counterexample else {
            return "Property '\(name)' passed \(casesRun) cases (seed \(PropertyConfiguration.formatSeed(seed)), \(discarded) discarded)."
        }
        var lines: [String] = []
        lines.append("Property '\(name)' failed (\(example.origin), seed \(PropertyConfiguration.formatSeed(seed))).")
        if example.valueDescription.contains("\n") {
            lines.append("Counterexample:")
            for line in example.valueDescription.split(separator: "\n", omittingEmptySubsequences: false) {
                lines.append("  \(line)")
            }
        } else {
            lines.append("Counterexample: \(example.valueDescription)")
        }
        for note in example.notes { lines.append("  note: \(note)") }
        let errorText = "\(example.error)"
        let identity = errorText.contains(example.failureIdentity) ? "" : " [\(example.failureIdentity)]"
        lines.append("Failure\(identity): \(errorText)")
        lines.append(
            "Shrunk in \(example.shrinkSteps) steps / \(example.shrinkExecutions) executions "
                + "(\(example.shrinkStopReason)) from \(example.originalTape.count) to \(example.tape.count) choices."
        )
        let filter = testFilter.map { " --filter \($0)" } ?? ""
        lines.append("Replay: \(seedReplayLine) swift test\(filter)   — or pass replay: \"\(example.tape.encoded)\"")
        if let savedFailurePath { lines.append("Saved to \(savedFailurePath); it is replayed first on the next run.") }
        return lines.joined(separator: "\n")
    }
}

extension PropertyResult: Sendable where Value: Sendable {}

// MARK: - Public entry points

/// Checks that `body` holds for values drawn from `generator`.
///
/// Runs up to ``PropertyConfiguration/resolvedCases`` cases (after replaying saved failures),
/// stops at the first failure, shrinks it within the configured budget and returns the minimal
/// counterexample found. Never records Swift Testing issues; see ``propertyCheck(_:cases:seed:configuration:replay:_:fileID:function:sourceLocation:_:)``
/// for the test-facing variant.
/// - Parameters:
///   - name: Stable name, used for the default seed and the failure file.
///   - configuration: Cases, seed, budgets, persistence.
///   - generator: Draws the input of each case.
///   - body: The property; throw (e.g. with ``Property/require(_:_:kind:fileID:line:)``) to fail.
/// - Returns: The result, with the seed and, on failure, the shrunk counterexample.
/// - Complexity: At most `cases` + shrink-budget executions of `body`, plus a few for reporting.
public func checkProperty<Value>(
    _ name: String,
    configuration: PropertyConfiguration = PropertyConfiguration(),
    _ generator: Generator<Value>,
    _ body: (Value) throws -> Void
) -> PropertyResult<Value> {
    var captured: Value?
    return runPropertyEngine(name: name, configuration: configuration, test: { source in
        let value = try generator.generate(from: &source)
        captured = value
        try body(value)
    }, capture: { captured })
}

/// Checks a property written directly against the choice source (draw as you go, like
/// Hypothesis's `data.draw`). The counterexample's value is the list of notes recorded with
/// ``ChoiceSource/note(_:)`` on the final replay.
public func checkProperty(
    _ name: String,
    configuration: PropertyConfiguration = PropertyConfiguration(),
    test: (inout ChoiceSource) throws -> Void
) -> PropertyResult<[String]> {
    var captured: [String]?
    return runPropertyEngine(name: name, configuration: configuration, test: { source in
        defer { if source.collectsNotes { captured = source.notes } }
        try test(&source)
    }, capture: { captured })
}

// MARK: - The engine

/// Runs one test case on a source and classifies the outcome.
private func executeTestCase(
    _ test: (inout ChoiceSource) throws -> Void,
    source: consuming ChoiceSource,
    identity: (any Error) -> String
) -> (TapeExecutionOutcome, [String]) {
    let status: TapeExecutionOutcome.Status
    do {
        try test(&source)
        status = .passed
    } catch is PropertyDiscard {
        status = .discarded
    } catch is ChoiceOverrun {
        status = .discarded
    } catch {
        status = .failed(identity: identity(error), error: error)
    }
    let (tape, notes) = source.finishWithNotes()
    return (TapeExecutionOutcome(status: status, tape: tape), notes)
}

/// The engine shared by all entry points.
/// - Parameters:
///   - test: Runs one case against a source; throws to fail.
///   - capture: Returns the value built by the most recent run of `test` (read after the final
///     replay of the shrunk tape).
func runPropertyEngine<Value>(
    name: String,
    configuration: PropertyConfiguration,
    test: (inout ChoiceSource) throws -> Void,
    capture: () -> Value?
) -> PropertyResult<Value> {
    let seed = configuration.resolvedSeed(for: name)
    let cases = configuration.resolvedCases
    let maxChoices = configuration.maxChoices
    let identity = configuration.failureIdentity
    var result = PropertyResult<Value>(
        name: name, seed: seed, casesRequested: cases, casesRun: 0, discarded: 0,
        persistedTapesReplayed: 0, counterexample: nil, gaveUpReason: nil, savedFailurePath: nil
    )

    func replay(_ choices: [UInt64]) -> TapeExecutionOutcome {
        executeTestCase(test, source: ChoiceSource(replaying: choices, maxChoices: maxChoices), identity: identity).0
    }

    // Find a first failure.
    var failure: (outcome: TapeExecutionOutcome, origin: CounterexampleOrigin)?
    let store = configuration.replay == nil ? configuration.resolvedFailureStore : nil
    if let tape = configuration.replay {
        let outcome = replay(tape.choices)
        if case .failed = outcome.status { failure = (outcome, .replayed) }
        if case .discarded = outcome.status { result.discarded += 1 } else { result.casesRun += 1 }
    } else {
        if let store {
            for tape in store.load(name) {
                result.persistedTapesReplayed += 1
                let outcome = replay(tape.choices)
                if case .failed = outcome.status {
                    failure = (outcome, .persisted)
                    break
                }
            }
        }
        if failure == nil {
            var seeds = SplitMix64(seed: seed)
            let maxDiscards = configuration.maxDiscards ?? max(100, cases * 10)
            var attempt = 0
            while result.casesRun < cases {
                if result.discarded > maxDiscards {
                    result.gaveUpReason = "more than \(maxDiscards) cases were discarded"
                    break
                }
                let caseSeed = seeds.next()
                let source = ChoiceSource(seed: caseSeed, maxChoices: maxChoices)
                let (outcome, _) = executeTestCase(test, source: source, identity: identity)
                switch outcome.status {
                case .passed:
                    result.casesRun += 1
                case .discarded:
                    result.discarded += 1
                case .failed:
                    result.casesRun += 1
                    failure = (outcome, .generated(caseIndex: attempt))
                }
                attempt += 1
                if failure != nil { break }
            }
        }
    }
    guard let (firstFailure, origin) = failure,
          case .failed(let failureIdentity, let firstError) = firstFailure.status
    else { return result }

    // Shrink it.
    let shrunk: (tape: ChoiceTape, error: any Error, steps: Int, executions: Int, reason: ShrinkStopReason) =
        withoutActuallyEscaping(replay) { replay in
            var shrinker = TapeShrinker(
                initial: firstFailure.tape, error: firstError, identity: failureIdentity,
                budget: configuration.shrinkBudget, execute: replay
            )
            let reason = shrinker.shrink()
            return (shrinker.best, shrinker.bestError, shrinker.improvements, shrinker.executions, reason)
        }

    // Replay the minimal tape once more, collecting notes and the value.
    let (finalOutcome, notes) = executeTestCase(
        test, source: ChoiceSource(replaying: shrunk.tape.choices, maxChoices: maxChoices, collectsNotes: true),
        identity: identity
    )
    var finalError = shrunk.error
    if case .failed(_, let error) = finalOutcome.status { finalError = error }
    guard let value = capture() else { return result }
    result.counterexample = PropertyCounterexample(
        value: value,
        valueDescription: Property.describe(value),
        notes: notes,
        tape: shrunk.tape,
        originalTape: firstFailure.tape,
        failureIdentity: failureIdentity,
        error: finalError,
        origin: origin,
        shrinkSteps: shrunk.steps,
        shrinkExecutions: shrunk.executions,
        shrinkStopReason: shrunk.reason
    )
    if let store {
        result.savedFailurePath = try? store.save(shrunk.tape, for: name)
    }
    return result
}
