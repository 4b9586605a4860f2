// Every random decision of a simulation, drawn from the property engine's choice tape.

/// Span labels of simulation tapes (values ≥ 1000, as the property engine asks for labels of its users).
extension SpanLabel {
    /// The set-up draws (clock skews).
    public static let simulationSetup = SpanLabel(rawValue: 1000)
    /// The arguments of one chaos action.
    public static let simulationAction = SpanLabel(rawValue: 1001)
    /// The fate of one message or cloud request.
    public static let simulationFate = SpanLabel(rawValue: 1002)
}

/// Draws a simulation's decisions from a ``ChoiceSource``. A draw of 0 is always the simplest, most benign choice
/// (no fault, the first device, the first record, no delay), so shrinking the tape simplifies workload and faults
/// together. While ``isDrawing`` is `false` (heal, quiesce and check phases) nothing is drawn and every decision
/// is the benign one.
final class Dice {
    var source: ChoiceSource
    var isDrawing = true

    init(source: consuming ChoiceSource) {
        self.source = source
    }

    /// An integer in `0...bound` (uniform when generating).
    func upTo(_ bound: Int) throws -> Int {
        guard isDrawing, bound > 0 else { return 0 }
        return Int(try source.draw(upTo: UInt64(bound), generate: { $0.next(upTo: UInt64(bound)) }, normalize: nil))
    }

    /// An index below `count`.
    func below(_ count: Int) throws -> Int { try upTo(count - 1) }

    /// A value in `0...bound`, small values (up to `small`) drawn with probability `p` when generating: for
    /// workloads that come in bursts and keep returning to the same few records.
    func skewed(_ bound: Int, small: Int, probability p: Double) throws -> Int {
        guard isDrawing, bound > 0 else { return 0 }
        let bound = UInt64(bound), small = UInt64(min(small, Int(bound)))
        return Int(try source.draw(upTo: bound, generate: { rng in
            rng.nextBool(probability: p) ? rng.next(upTo: small) : rng.next(upTo: bound)
        }, normalize: nil))
    }

    /// `true` with probability `p` when generating.
    func chance(_ p: Double) throws -> Bool {
        guard isDrawing, p > 0 else { return false }
        return try source.drawBool(probability: p)
    }

    /// An index into `weights` (index 0 is the simplest), drawn in proportion to the weights when generating.
    func pick(_ weights: [UInt64]) throws -> Int {
        guard isDrawing, weights.count > 1, weights.dropFirst().contains(where: { $0 > 0 }) else { return 0 }
        return try source.drawIndex(weights: weights)
    }

    /// A signed integer in `-bound...bound`, shrinking toward 0.
    func signed(_ bound: Int) throws -> Int {
        guard isDrawing, bound > 0 else { return 0 }
        let magnitude = try upTo(bound)
        if magnitude == 0 { return 0 }
        return try source.drawBool() ? -magnitude : magnitude
    }

    /// Runs `body` inside a span labelled `label`.
    func span<T>(_ label: SpanLabel, _ body: () throws -> T) rethrows -> T {
        guard isDrawing else { return try body() }
        source.beginSpan(label)
        defer { source.endSpan() }
        return try body()
    }

    /// The number of choices drawn so far.
    var position: Int { source.position }
}

/// Probability weights as integers (parts per million); the first weight is what remains of 1.
func weights(_ rates: [Double]) -> [UInt64] {
    let scaled = rates.map { UInt64(($0 * 1_000_000).rounded()) }
    let rest = 1_000_000 - min(1_000_000, scaled.reduce(0, +))
    return [rest] + scaled
}
