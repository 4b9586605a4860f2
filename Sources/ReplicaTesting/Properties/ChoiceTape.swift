// The choice tape: every random decision of one test case, recorded as a bounded UInt64.
//
// A test case is fully described by its sequence of choices. Generators read choices from a
// `ChoiceSource`, which either draws them from a PRNG (generation) or reads them from a given
// tape (replay). Because every choice is bounded and a choice of 0 means "the simplest value",
// shrinking a test case is reduced to editing a list of integers (delete, zero, lower), and the
// result can always be replayed.

/// What a span of the tape stands for. Used by the shrinker to find meaningful units
/// (one array element, one state-machine step) and siblings that can be swapped.
///
/// Labels are plain 32-bit values, so creating one costs nothing. Library labels use small
/// values; pick values of 1000 or more for labels of your own.
public struct SpanLabel: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The label's numeric value.
    public var rawValue: UInt32
    /// Creates a label from its numeric value (use 1000 or more for your own labels).
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// A span with no particular meaning.
    public static let generic = SpanLabel(rawValue: 0)
    /// One element of an array, string or dictionary, including its "another element?" flag.
    public static let element = SpanLabel(rawValue: 1)
    /// A whole collection (array, string, dictionary).
    public static let collection = SpanLabel(rawValue: 2)
    /// An optional value: the "present?" choice and the wrapped value.
    public static let optional = SpanLabel(rawValue: 3)
    /// A one-of / frequency choice: the branch index and the branch's draws.
    public static let branch = SpanLabel(rawValue: 4)
    /// One level of a recursive generator.
    public static let recursion = SpanLabel(rawValue: 5)
    /// The draws of a `flatMap`: the outer value and the inner generator's draws.
    public static let flatMap = SpanLabel(rawValue: 6)
    /// One attempt of a `filter`.
    public static let filterAttempt = SpanLabel(rawValue: 7)
    /// One step of a state machine: the "another step?" flag, the rule index and its arguments.
    public static let step = SpanLabel(rawValue: 8)
    /// A draw of a symbolic reference from an entity pool.
    public static let reference = SpanLabel(rawValue: 9)
    /// The arguments drawn by one state-machine rule.
    public static let arguments = SpanLabel(rawValue: 10)
    /// A signed integer (magnitude and sign choices).
    public static let integer = SpanLabel(rawValue: 11)

    public var description: String {
        switch rawValue {
        case 0: "generic"
        case 1: "element"
        case 2: "collection"
        case 3: "optional"
        case 4: "branch"
        case 5: "recursion"
        case 6: "flatMap"
        case 7: "filterAttempt"
        case 8: "step"
        case 9: "reference"
        case 10: "arguments"
        case 11: "integer"
        default: "label(\(rawValue))"
        }
    }
}

/// A contiguous range of choices produced by one generator call, `start ..< end` in the tape.
///
/// Spans nest: `depth` is 0 for outermost spans. 16 bytes each, stored contiguously.
public struct ChoiceSpan: Hashable, Sendable, CustomStringConvertible {
    /// Index of the first choice in the span.
    public var start: Int32
    /// Index one past the last choice in the span.
    public var end: Int32
    /// Nesting depth; 0 for a span opened when no other span was open.
    public var depth: UInt16
    /// What the span stands for.
    public var label: SpanLabel

    /// Creates a span covering `start ..< end` at nesting `depth`.
    public init(start: Int, end: Int, depth: Int, label: SpanLabel) {
        self.start = Int32(truncatingIfNeeded: start)
        self.end = Int32(truncatingIfNeeded: end)
        self.depth = UInt16(truncatingIfNeeded: depth)
        self.label = label
    }

    /// The covered indices of the tape.
    public var range: Range<Int> { Int(start) ..< Int(end) }
    /// Number of choices in the span.
    public var count: Int { Int(end - start) }

    public var description: String { "\(label)[\(start)..<\(end)]@\(depth)" }
}

/// The record of one test case: every choice made, the bound each choice was drawn under,
/// and the spans that group them.
///
/// Replaying `choices` through ``ChoiceSource/init(replaying:maxChoices:collectsNotes:)``
/// reproduces the same test case. `bounds` and `spans` are derived data that the shrinker uses;
/// they are recomputed by every execution and are not part of a tape's identity for replay.
public struct ChoiceTape: Hashable, Sendable, CustomStringConvertible {
    /// The choices in draw order. `choices[i] <= bounds[i]` for recorded tapes.
    public var choices: [UInt64]
    /// The inclusive upper bound of each choice (same length as `choices` for recorded tapes;
    /// empty for a tape built from choices only).
    public var bounds: [UInt64]
    /// Spans in the order they were opened (pre-order).
    public var spans: [ChoiceSpan]

    /// Creates a tape.
    public init(choices: [UInt64] = [], bounds: [UInt64] = [], spans: [ChoiceSpan] = []) {
        self.choices = choices
        self.bounds = bounds
        self.spans = spans
    }

    /// Number of choices.
    public var count: Int { choices.count }

    /// A compact, copy-pasteable text form of the choices: decimal values separated by commas,
    /// e.g. `"1,0,1,0,0"`. The empty tape encodes as `""`. Inverse of ``init(encoded:)``.
    public var encoded: String {
        var text = ""
        text.reserveCapacity(choices.count * 2)
        for (index, choice) in choices.enumerated() {
            if index > 0 { text.append(",") }
            text.append(String(choice))
        }
        return text
    }

    /// Parses the text form produced by ``encoded``. Whitespace and an optional surrounding
    /// `[` `]` are ignored. Returns `nil` if any element is not a decimal `UInt64`.
    public init?(encoded text: String) {
        var trimmed = Substring(text)
        trimmed = trimmed.drop(while: { $0.isWhitespace || $0 == "[" })
        while let last = trimmed.last, last.isWhitespace || last == "]" { trimmed = trimmed.dropLast() }
        if trimmed.isEmpty {
            self.init()
            return
        }
        var values: [UInt64] = []
        for part in trimmed.split(separator: ",", omittingEmptySubsequences: false) {
            let digits = part.filter { !$0.isWhitespace }
            guard let value = UInt64(digits) else { return nil }
            values.append(value)
        }
        self.init(choices: values)
    }

    public var description: String { "[\(encoded)]" }

    /// Shortlex order on choices: a shorter tape is simpler; equal lengths compare
    /// lexicographically. This is the order the shrinker minimizes. O(n).
    public static func shortlexPrecedes(_ lhs: [UInt64], _ rhs: [UInt64]) -> Bool {
        if lhs.count != rhs.count { return lhs.count < rhs.count }
        for index in lhs.indices where lhs[index] != rhs[index] {
            return lhs[index] < rhs[index]
        }
        return false
    }
}

/// Thrown when a test case tries to draw more choices than allowed
/// (``ChoiceSource/maxChoices``). The case is discarded, never reported as a failure.
public struct ChoiceOverrun: Error, CustomStringConvertible {
    /// The ``ChoiceSource/maxChoices`` that was exceeded.
    public var limit: Int
    public var description: String { "test case exceeded \(limit) choices" }
}

/// The stream of choices that generators draw from.
///
/// In generation mode choices come from a seeded ``Xoshiro256StarStar`` (after an optional
/// fixed prefix); in replay mode they come from a tape, and a draw past the end of the tape
/// yields 0, the simplest choice. Either way every choice is recorded, with its bound and the
/// spans open at the time, into ``tape``.
///
/// Write custom generators with ``draw(upTo:)``, ``drawBool(probability:)`` and
/// ``span(_:_:)``: keep the rule that a choice of 0 gives the simplest value and that lowering
/// a choice makes the value simpler.
public struct ChoiceSource: ~Copyable {
    /// The choices recorded so far, with bounds and spans.
    public private(set) var tape: ChoiceTape
    var prefix: [UInt64]
    var rng: Xoshiro256StarStar
    var openSpans: [Int]
    /// Whether choices past the prefix come from the PRNG (`true`) or are 0 (`false`).
    public let isGenerating: Bool
    /// The maximum number of choices a test case may make before it is discarded.
    public let maxChoices: Int
    /// Whether ``note(_:)`` records its text. Only the final replay of a counterexample
    /// collects notes, so notes cost nothing while generating and shrinking.
    public let collectsNotes: Bool
    /// Notes recorded with ``note(_:)`` when ``collectsNotes`` is set.
    public private(set) var notes: [String] = []

    /// Creates a source that draws from a PRNG seeded with `seed`.
    /// - Parameters:
    ///   - seed: Seed for ``Xoshiro256StarStar``.
    ///   - prefix: Choices to use before drawing from the PRNG (default none).
    ///   - maxChoices: Overrun limit; drawing more throws ``ChoiceOverrun``.
    ///   - collectsNotes: Whether ``note(_:)`` records text.
    public init(seed: UInt64, prefix: [UInt64] = [], maxChoices: Int = 8192, collectsNotes: Bool = false) {
        self.tape = ChoiceTape()
        self.prefix = prefix
        self.rng = Xoshiro256StarStar(seed: seed)
        self.openSpans = []
        self.isGenerating = true
        self.maxChoices = maxChoices
        self.collectsNotes = collectsNotes
        tape.choices.reserveCapacity(64)
        tape.bounds.reserveCapacity(64)
    }

    /// Creates a source that replays `choices`; draws past the end yield 0.
    /// - Parameters:
    ///   - choices: The tape to replay. Values above a draw's bound are clamped to the bound.
    ///   - maxChoices: Overrun limit; drawing more throws ``ChoiceOverrun``.
    ///   - collectsNotes: Whether ``note(_:)`` records text.
    public init(replaying choices: [UInt64], maxChoices: Int = 8192, collectsNotes: Bool = false) {
        self.tape = ChoiceTape()
        self.prefix = choices
        self.rng = Xoshiro256StarStar(seed: 0)
        self.openSpans = []
        self.isGenerating = false
        self.maxChoices = maxChoices
        self.collectsNotes = collectsNotes
        tape.choices.reserveCapacity(choices.count)
        tape.bounds.reserveCapacity(choices.count)
    }

    /// Number of choices drawn so far.
    public var position: Int { tape.choices.count }

    /// Draws a choice in `0...bound`: the next tape value (clamped to `bound`) when replaying,
    /// otherwise a PRNG value (biased slightly toward 0, `bound` and small values for large
    /// bounds, which finds edge-case bugs sooner).
    /// - Returns: The recorded choice; 0 is the simplest.
    /// - Throws: ``ChoiceOverrun`` past ``maxChoices``.
    /// - Complexity: Amortized O(1).
    public mutating func draw(upTo bound: UInt64) throws -> UInt64 {
        try draw(upTo: bound, generate: { rng in
            if bound < 64 { return rng.next(upTo: bound) }
            let r = rng.next()
            switch r & 31 {
            case 0: return 0
            case 1: return bound
            case 2, 3: return (r >> 5) & 15
            default: return rng.next(upTo: bound)
            }
        }, normalize: nil)
    }

    /// Draws a choice in `0...bound` with a custom generation distribution and an optional
    /// normalization applied to every choice (generated or replayed) before it is recorded.
    ///
    /// Use `normalize` to map a replayed choice that is invalid in the current state onto a
    /// valid one (for example "the next enabled rule"), so that the recorded tape always states
    /// what was actually used.
    /// - Parameters:
    ///   - bound: Largest allowed choice.
    ///   - generate: Produces a choice from the PRNG in generation mode (clamped to `bound`).
    ///   - normalize: Maps any choice in `0...bound` to the choice actually used (must stay
    ///     within `0...bound`).
    /// - Returns: The recorded choice.
    public mutating func draw(
        upTo bound: UInt64,
        generate: (inout Xoshiro256StarStar) -> UInt64,
        normalize: ((UInt64) -> UInt64)?
    ) throws -> UInt64 {
        let index = tape.choices.count
        if index >= maxChoices { throw ChoiceOverrun(limit: maxChoices) }
        var value: UInt64
        if index < prefix.count {
            value = prefix[index]
        } else if isGenerating {
            value = generate(&rng)
        } else {
            value = 0
        }
        if value > bound { value = bound }
        if let normalize { value = min(normalize(value), bound) }
        tape.choices.append(value)
        tape.bounds.append(bound)
        return value
    }

    /// Draws a Boolean choice recorded as 0 (`false`) or 1 (`true`).
    /// - Parameter probability: Chance of `true` in generation mode.
    /// - Returns: `true` iff the recorded choice is 1.
    public mutating func drawBool(probability: Double = 0.5) throws -> Bool {
        try draw(upTo: 1, generate: { rng in rng.nextBool(probability: probability) ? 1 : 0 }, normalize: nil) == 1
    }

    /// Draws an index into `weights`, chosen with probability proportional to its weight when
    /// generating. Index 0 is the simplest. A replayed index whose weight is 0 moves to the
    /// next index with a positive weight (wrapping around).
    /// - Parameter weights: Non-negative weights with a positive sum.
    /// - Returns: The chosen index.
    public mutating func drawIndex(weights: [UInt64]) throws -> Int {
        precondition(!weights.isEmpty, "drawIndex(weights:) needs at least one weight")
        var total: UInt64 = 0
        for weight in weights { total &+= weight }
        precondition(total > 0, "drawIndex(weights:) needs a positive total weight")
        let last = UInt64(weights.count - 1)
        let value = try draw(upTo: last, generate: { rng in
            var pick = rng.next(upTo: total - 1)
            for (index, weight) in weights.enumerated() {
                if pick < weight { return UInt64(index) }
                pick -= weight
            }
            return last
        }, normalize: { value in
            var index = Int(value)
            for _ in 0 ..< weights.count {
                if weights[index] > 0 { return UInt64(index) }
                index = (index + 1) % weights.count
            }
            return value
        })
        return Int(value)
    }

    /// Opens a span labelled `label` at the current position. Pair with ``endSpan()``.
    public mutating func beginSpan(_ label: SpanLabel) {
        let position = tape.choices.count
        openSpans.append(tape.spans.count)
        tape.spans.append(ChoiceSpan(start: position, end: position, depth: openSpans.count - 1, label: label))
    }

    /// Closes the innermost open span at the current position.
    public mutating func endSpan() {
        guard let index = openSpans.popLast() else { return }
        tape.spans[index].end = Int32(truncatingIfNeeded: tape.choices.count)
    }

    /// Runs `body` inside a span labelled `label`; the span is closed even if `body` throws.
    public mutating func span<T>(_ label: SpanLabel, _ body: (inout ChoiceSource) throws -> T) rethrows -> T {
        beginSpan(label)
        defer { endSpan() }
        return try body(&self)
    }

    /// Draws a value from `generator`. Same as `generator.generate(from: &self)`.
    public mutating func draw<Value>(_ generator: Generator<Value>) throws -> Value {
        try generator.generate(from: &self)
    }

    /// Records a line of explanation for the counterexample report (e.g. an intermediate value).
    /// The text is only built when ``collectsNotes`` is set, i.e. on the final replay.
    public mutating func note(_ text: @autoclosure () -> String) {
        if collectsNotes { notes.append(text()) }
    }

    /// Closes all open spans and returns the finished tape, leaving the source empty.
    public mutating func finish() -> ChoiceTape {
        while !openSpans.isEmpty { endSpan() }
        let result = tape
        tape = ChoiceTape()
        return result
    }

    /// Closes all open spans and returns the finished tape and notes.
    consuming func finishWithNotes() -> (ChoiceTape, [String]) {
        while !openSpans.isEmpty { endSpan() }
        return (tape, notes)
    }
}
