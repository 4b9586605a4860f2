// Generators: values built from choices on a tape.

/// A recipe that turns choices from a ``ChoiceSource`` into a value.
///
/// Generators are values: build them once with the ``Gen`` builders and combinators
/// (``map(_:)``, ``flatMap(_:)``, ``filter(maxAttempts:_:)``, ``Gen/zip(_:_:)``) and reuse them
/// across cases. Every builder maps the all-zero tape to its simplest value, and lowering or
/// deleting choices makes values simpler, so shrinking needs no per-type shrinker.
public struct Generator<Value>: Sendable {
    let body: @Sendable (inout ChoiceSource) throws -> Value

    /// Creates a generator from a drawing function.
    ///
    /// The function must be deterministic given the choices it draws (no other randomness, no
    /// clock) and should map choice 0 to the simplest value.
    /// - Parameter body: Draws choices from the source and builds a value.
    public init(_ body: @escaping @Sendable (inout ChoiceSource) throws -> Value) {
        self.body = body
    }

    /// Draws one value from `source`.
    /// - Throws: ``ChoiceOverrun`` if the case grows too large, ``PropertyDiscard`` if a filter
    ///   gives up, or anything the generator's own code throws.
    public func generate(from source: inout ChoiceSource) throws -> Value {
        try body(&source)
    }

    /// Transforms every generated value. Shrinks exactly like `self`.
    /// - Parameter transform: A pure function of the value.
    public func map<T>(_ transform: @escaping @Sendable (Value) throws -> T) -> Generator<T> {
        let body = self.body
        return Generator<T> { source in try transform(body(&source)) }
    }

    /// Chooses a second generator from the value of the first (dependent generation).
    ///
    /// The outer and inner draws share one ``SpanLabel/flatMap`` span, so the shrinker can
    /// zero or delete the pair as a unit.
    /// - Parameter next: Returns the generator to draw from, given the first value.
    public func flatMap<T>(_ next: @escaping @Sendable (Value) throws -> Generator<T>) -> Generator<T> {
        let body = self.body
        return Generator<T> { source in
            try source.span(.flatMap) { source in
                let first = try body(&source)
                return try next(first).generate(from: &source)
            }
        }
    }

    /// Keeps only values satisfying `predicate`, retrying up to `maxAttempts` times.
    ///
    /// Rejected attempts stay on the tape (in ``SpanLabel/filterAttempt`` spans) where the
    /// shrinker can delete them. If every attempt is rejected the test case is discarded by
    /// throwing ``PropertyDiscard``. Prefer building valid values directly when you can.
    public func filter(maxAttempts: Int = 100, _ predicate: @escaping @Sendable (Value) -> Bool) -> Generator<Value> {
        let body = self.body
        return Generator { source in
            for _ in 0 ..< maxAttempts {
                source.beginSpan(.filterAttempt)
                let value = try body(&source)
                source.endSpan()
                if predicate(value) { return value }
            }
            throw PropertyDiscard(reason: "filter rejected \(maxAttempts) attempts")
        }
    }

    /// Wraps every draw of this generator in a span with the given label.
    public func labeled(_ label: SpanLabel) -> Generator<Value> {
        let body = self.body
        return Generator { source in try source.span(label) { try body(&$0) } }
    }
}

/// Builders for common generators. Every builder maps a zero tape to the simplest value:
/// integers closest to zero (or to the bound nearest zero), `false`, the first element, `nil`,
/// empty collections, the first `oneOf` / `frequency` branch, the non-recursive base case.
public enum Gen {
    // MARK: Constants and integers

    /// Always produces `value` and draws nothing.
    public static func constant<Value: Sendable>(_ value: Value) -> Generator<Value> {
        Generator { _ in value }
    }

    /// Integers in `range`, shrinking toward 0 (or toward the bound nearest 0 when the range
    /// excludes 0). Positive values are simpler than negative values of the same magnitude.
    ///
    /// Encoding: one choice (the distance from the simplest bound) when the range does not
    /// straddle 0; otherwise a magnitude choice and a sign choice (0 = positive).
    public static func int(in range: ClosedRange<Int>) -> Generator<Int> {
        integer(in: range)
    }

    /// Integers of any fixed-width type up to 64 bits in `range`; see ``int(in:)``.
    public static func integer<T: FixedWidthInteger & Sendable>(in range: ClosedRange<T>) -> Generator<T> {
        precondition(T.bitWidth <= 64, "Gen.integer supports integer types of at most 64 bits")
        let lower = UInt64(truncatingIfNeeded: range.lowerBound)
        let upper = UInt64(truncatingIfNeeded: range.upperBound)
        if range.lowerBound >= 0 {
            let width = upper &- lower
            return Generator { source in
                T(truncatingIfNeeded: lower &+ (try source.draw(upTo: width)))
            }
        }
        if range.upperBound <= 0 {
            let width = upper &- lower
            return Generator { source in
                T(truncatingIfNeeded: upper &- (try source.draw(upTo: width)))
            }
        }
        // Straddles zero (signed type): magnitude first, then sign.
        let negativeMagnitude = 0 &- lower // |lowerBound|, exact even for T.min
        let positiveMagnitude = upper
        let largest = max(negativeMagnitude, positiveMagnitude)
        return Generator { source in
            try source.span(.integer) { source in
                let magnitude = try source.draw(upTo: largest)
                let positiveFits = magnitude <= positiveMagnitude
                let negativeFits = magnitude <= negativeMagnitude
                let negative: Bool
                if positiveFits && negativeFits {
                    negative = try source.draw(upTo: 1) == 1
                } else {
                    // Only one sign fits; the choice is recorded as 0 (forced).
                    _ = try source.draw(upTo: 0)
                    negative = !positiveFits
                }
                return negative
                    ? T(truncatingIfNeeded: 0 &- magnitude)
                    : T(truncatingIfNeeded: magnitude)
            }
        }
    }

    /// Any `Int`, shrinking toward 0.
    public static var int: Generator<Int> { int(in: Int.min ... Int.max) }

    /// Any `UInt64`, shrinking toward 0. One choice, stored verbatim.
    public static var uint64: Generator<UInt64> {
        Generator { source in try source.draw(upTo: .max) }
    }

    /// `false` (choice 0) or `true` (choice 1), each with probability 1/2 when generating.
    public static var bool: Generator<Bool> { bool(probability: 0.5) }

    /// A Boolean that is `true` with the given probability when generating; shrinks to `false`.
    public static func bool(probability: Double) -> Generator<Bool> {
        Generator { source in try source.drawBool(probability: probability) }
    }

    /// Doubles in `range`, evenly spaced on 2^53 steps; shrinks toward `range.lowerBound`.
    public static func double(in range: ClosedRange<Double>) -> Generator<Double> {
        precondition(range.lowerBound.isFinite && range.upperBound.isFinite, "Gen.double needs a finite range")
        let steps: UInt64 = 1 << 53
        let lower = range.lowerBound
        let width = range.upperBound - range.lowerBound
        return Generator { source in
            let step = try source.draw(upTo: steps)
            if step == steps { return range.upperBound }
            return min(lower + width * (Double(step) / Double(steps)), range.upperBound)
        }
    }

    // MARK: Choosing

    /// An element of `elements`; the first element is the simplest.
    /// - Complexity: The collection is copied into an array once; each draw is O(1).
    public static func element<C: Collection>(of elements: C) -> Generator<C.Element>
    where C.Element: Sendable {
        let array = Array(elements)
        precondition(!array.isEmpty, "Gen.element(of:) needs a non-empty collection")
        let last = UInt64(array.count - 1)
        return Generator { source in array[Int(try source.draw(upTo: last))] }
    }

    /// One of `generators`, chosen uniformly; the first is the simplest.
    public static func oneOf<Value>(_ generators: Generator<Value>...) -> Generator<Value> {
        oneOf(generators)
    }

    /// One of `generators`, chosen uniformly; the first is the simplest.
    public static func oneOf<Value>(_ generators: [Generator<Value>]) -> Generator<Value> {
        precondition(!generators.isEmpty, "Gen.oneOf needs at least one generator")
        let last = UInt64(generators.count - 1)
        return Generator { source in
            try source.span(.branch) { source in
                let index = Int(try source.draw(upTo: last))
                return try generators[index].generate(from: &source)
            }
        }
    }

    /// One of several generators, chosen with probability proportional to its weight when
    /// generating. The first entry is the simplest whatever its weight, so list the simplest
    /// case first.
    /// - Parameter choices: Pairs of non-negative weight and generator, with a positive total.
    public static func frequency<Value>(_ choices: [(weight: Int, generator: Generator<Value>)]) -> Generator<Value> {
        precondition(!choices.isEmpty, "Gen.frequency needs at least one choice")
        precondition(choices.allSatisfy { $0.weight >= 0 }, "Gen.frequency weights must not be negative")
        let weights = choices.map { UInt64($0.weight) }
        let generators = choices.map(\.generator)
        return Generator { source in
            try source.span(.branch) { source in
                let index = try source.drawIndex(weights: weights)
                return try generators[index].generate(from: &source)
            }
        }
    }

    /// One of several generators; see ``frequency(_:)-9o7ag``.
    public static func frequency<Value>(_ choices: (weight: Int, generator: Generator<Value>)...) -> Generator<Value> {
        frequency(choices)
    }

    // MARK: Wrappers and collections

    /// `nil` (the simplest) or a value of `wrapped`.
    /// - Parameter probability: Chance of a value (not `nil`) when generating.
    public static func optional<Value>(_ wrapped: Generator<Value>, probability: Double = 0.75) -> Generator<Value?> {
        Generator { source in
            try source.span(.optional) { source in
                try source.drawBool(probability: probability) ? try wrapped.generate(from: &source) : nil
            }
        }
    }

    /// Arrays of `element` values, shortest first.
    ///
    /// Encoding: each element beyond `minLength` is preceded by an "another element?" choice
    /// (1 = yes), and each element with its flag forms one ``SpanLabel/element`` span, so
    /// deleting a span removes exactly one element.
    /// - Parameters:
    ///   - element: Generator of the elements.
    ///   - minLength: Elements always present (no flag is drawn for them).
    ///   - maxLength: Largest length; no flag is drawn once it is reached.
    ///   - averageLength: Mean number of optional elements when generating (before the cap).
    public static func array<Element>(
        of element: Generator<Element>,
        minLength: Int = 0,
        maxLength: Int = 32,
        averageLength: Double? = nil
    ) -> Generator<[Element]> {
        precondition(minLength >= 0 && maxLength >= minLength, "Gen.array needs 0 <= minLength <= maxLength")
        let average = averageLength ?? min(Double(maxLength - minLength), max(4.0, Double(maxLength - minLength) / 4.0))
        let continueProbability = average <= 0 ? 0 : 1.0 - 1.0 / (1.0 + average)
        return Generator { source in
            try source.span(.collection) { source in
                var result: [Element] = []
                result.reserveCapacity(minLength)
                while result.count < maxLength {
                    source.beginSpan(.element)
                    if result.count >= minLength {
                        guard try source.drawBool(probability: continueProbability) else {
                            source.endSpan()
                            break
                        }
                    }
                    result.append(try element.generate(from: &source))
                    source.endSpan()
                }
                return result
            }
        }
    }

    /// Strings of characters drawn from `alphabet`; the first character of the alphabet is the
    /// simplest character and the empty string the simplest string.
    /// - Parameters:
    ///   - alphabet: Characters to use, simplest first (default `a`–`z`, `A`–`Z`, `0`–`9`,
    ///     space and a few punctuation and non-ASCII characters).
    ///   - minLength: Smallest length in characters.
    ///   - maxLength: Largest length in characters.
    public static func string(
        alphabet: String = Gen.defaultAlphabet,
        minLength: Int = 0,
        maxLength: Int = 16
    ) -> Generator<String> {
        string(of: element(of: Array(alphabet)), minLength: minLength, maxLength: maxLength)
    }

    /// Strings whose characters come from `character`.
    public static func string(
        of character: Generator<Character>,
        minLength: Int = 0,
        maxLength: Int = 16
    ) -> Generator<String> {
        array(of: character, minLength: minLength, maxLength: maxLength).map { String($0) }
    }

    /// The default string alphabet: simplest (`a`) first.
    public static let defaultAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.,'\"\\/\n\té€😀"

    /// Dictionaries built from up to `maxCount` drawn key–value pairs; when a key repeats, the
    /// first pair wins (later duplicates are ignored). Shrinks to `[:]`.
    public static func dictionary<Key: Hashable & Sendable, Value>(
        keys: Generator<Key>,
        values: Generator<Value>,
        maxCount: Int = 16
    ) -> Generator<[Key: Value]> {
        array(of: zip(keys, values), maxLength: maxCount).map { pairs in
            Dictionary(pairs, uniquingKeysWith: { first, _ in first })
        }
    }

    // MARK: Recursion

    /// A recursive structure with bounded depth.
    ///
    /// At each level the generator chooses between `base` (choice 0, the simplest) and
    /// `extend(child)`, where `child` is the same recursive generator one level shallower. At
    /// depth 0 only `base` is used, so generation always terminates.
    /// - Parameters:
    ///   - maxDepth: Maximum number of nested `extend` applications.
    ///   - expandProbability: Chance of choosing `extend` at each level when generating.
    ///   - base: Generator of leaves.
    ///   - extend: Builds a node generator from the generator of its children.
    /// - Complexity: Builds `maxDepth + 1` generators once.
    public static func recursive<Value>(
        maxDepth: Int,
        expandProbability: Double = 0.5,
        base: Generator<Value>,
        extend: (Generator<Value>) -> Generator<Value>
    ) -> Generator<Value> {
        precondition(maxDepth >= 0, "Gen.recursive needs maxDepth >= 0")
        var level = base
        for _ in 0 ..< maxDepth {
            let child = level
            let node = extend(child)
            level = Generator { source in
                try source.span(.recursion) { source in
                    try source.drawBool(probability: expandProbability)
                        ? try node.generate(from: &source)
                        : try base.generate(from: &source)
                }
            }
        }
        return level
    }

    // MARK: Composition

    /// Pairs of values drawn one after the other.
    public static func zip<A, B>(_ a: Generator<A>, _ b: Generator<B>) -> Generator<(A, B)> {
        Generator { source in (try a.generate(from: &source), try b.generate(from: &source)) }
    }

    /// Triples of values drawn one after the other.
    public static func zip<A, B, C>(_ a: Generator<A>, _ b: Generator<B>, _ c: Generator<C>) -> Generator<(A, B, C)> {
        Generator { source in
            (try a.generate(from: &source), try b.generate(from: &source), try c.generate(from: &source))
        }
    }

    /// Quadruples of values drawn one after the other.
    public static func zip<A, B, C, D>(
        _ a: Generator<A>, _ b: Generator<B>, _ c: Generator<C>, _ d: Generator<D>
    ) -> Generator<(A, B, C, D)> {
        Generator { source in
            (
                try a.generate(from: &source), try b.generate(from: &source),
                try c.generate(from: &source), try d.generate(from: &source)
            )
        }
    }
}
