// Integrated shrinking by editing the choice tape.
//
// The shrinker never looks at generated values. It edits the failing tape, replays each
// candidate, and keeps a candidate only if it is shortlex-smaller than the best tape so far and
// fails the same way. Because generators map smaller choices to simpler values, a
// shortlex-minimal failing tape decodes to a minimal counterexample.
//
// Cheap passes, repeated until they stop making progress: delete spans (largest first), zero
// spans, lower duplicated values together, lower each value (0, then v-1 and binary search,
// then halving), move value from a choice to a later one with the same bound, swap adjacent
// sibling spans. At a local minimum of those, costlier passes try to escape: delete chunks of
// 8/4/2/1 choices, lower a value while deleting a later span, delete a span while raising a
// later value, replace runs of siblings with a shorter sibling, delete pairs of spans.

/// Why shrinking stopped.
public enum ShrinkStopReason: String, Sendable, Hashable, CustomStringConvertible {
    /// No pass could improve the tape any further (a local minimum).
    case localMinimum = "local minimum"
    /// The maximum number of re-executions was used up.
    case executionBudget = "execution budget exhausted"
    /// The wall-clock safety limit was reached.
    case timeLimit = "time limit reached"

    public var description: String { rawValue }
}

/// Limits on how much work shrinking may do.
public struct ShrinkBudget: Sendable, Hashable {
    /// Maximum number of candidate executions (deterministic; the primary limit).
    public var maxExecutions: Int
    /// Wall-clock safety net. Reaching it makes results depend on machine speed, so keep it
    /// well above what `maxExecutions` needs.
    public var maxDuration: Duration

    /// Creates a budget: by default 5000 executions with a 30-second safety net.
    public init(maxExecutions: Int = 5000, maxDuration: Duration = .seconds(30)) {
        self.maxExecutions = maxExecutions
        self.maxDuration = maxDuration
    }
}

/// The result of running a test case on a candidate tape.
struct TapeExecutionOutcome {
    enum Status {
        case passed
        case discarded
        case failed(identity: String, error: any Error)
    }

    var status: Status
    var tape: ChoiceTape
}

/// Tape-editing shrinker. Deterministic given a deterministic `execute`.
struct TapeShrinker {
    let execute: ([UInt64]) -> TapeExecutionOutcome
    let identity: String
    let budget: ShrinkBudget
    private(set) var best: ChoiceTape
    private(set) var bestError: any Error
    private(set) var executions = 0
    private(set) var improvements = 0
    private(set) var stopReason: ShrinkStopReason?
    private var seen: Set<[UInt64]> = []
    private let clock = ContinuousClock()
    private let deadline: ContinuousClock.Instant

    /// Largest distance between two choices that ``redistribute()`` moves value between.
    private let redistributionWindow = 8

    init(
        initial: ChoiceTape,
        error: any Error,
        identity: String,
        budget: ShrinkBudget,
        execute: @escaping ([UInt64]) -> TapeExecutionOutcome
    ) {
        self.best = initial
        self.bestError = error
        self.identity = identity
        self.budget = budget
        self.execute = execute
        self.deadline = ContinuousClock().now.advanced(by: budget.maxDuration)
        seen.insert(initial.choices)
    }

    /// Executions that escape passes may still spend without making progress.
    private var allowance = Int.max
    /// How many fruitless executions each escape pass may spend (reset by every improvement).
    private let escapeAllowance = 250

    /// Whether the current pass must stop: budget spent, or its fruitless allowance used up.
    private var stopped: Bool { stopReason != nil || allowance <= 0 }

    /// Runs all passes until none makes progress or the budget runs out.
    /// - Returns: Why shrinking stopped.
    mutating func shrink() -> ShrinkStopReason {
        while !stopped {
            let before = best.choices
            deleteSpans()
            zeroSpans()
            lowerDuplicates()
            lowerValues()
            redistribute()
            swapSiblings()
            // Costlier passes, only at a local minimum of the cheap ones.
            // Each gets a limited allowance of fruitless executions, so a genuinely minimal but
            // large tape does not burn the whole budget.
            let escapes: [(inout TapeShrinker) -> Void] = [
                { $0.deleteChunks() }, { $0.lowerAndDelete() }, { $0.deleteAndCompensate() },
                { $0.replaceWithSibling() }, { $0.deleteSpanPairs() },
            ]
            for escape in escapes where best.choices == before && stopReason == nil {
                allowance = escapeAllowance
                escape(&self)
                allowance = .max
            }
            if best.choices == before { break }
        }
        return stopReason ?? .localMinimum
    }

    // MARK: Candidate evaluation

    /// Executes `candidate` (unless cached or not shortlex-smaller) and adopts it if it fails
    /// the same way and its recorded tape is shortlex-smaller than the best.
    /// - Returns: Whether the best tape changed.
    private mutating func consider(_ candidate: [UInt64]) -> Bool {
        if stopped { return false }
        guard ChoiceTape.shortlexPrecedes(candidate, best.choices) else { return false }
        guard seen.insert(candidate).inserted else { return false }
        if executions >= budget.maxExecutions {
            stopReason = .executionBudget
            return false
        }
        if clock.now >= deadline {
            stopReason = .timeLimit
            return false
        }
        executions += 1
        if allowance != .max { allowance -= 1 }
        let outcome = execute(candidate)
        if outcome.tape.choices != candidate { seen.insert(outcome.tape.choices) }
        guard case .failed(let failureIdentity, let error) = outcome.status,
              failureIdentity == identity,
              ChoiceTape.shortlexPrecedes(outcome.tape.choices, best.choices)
        else { return false }
        best = outcome.tape
        bestError = error
        improvements += 1
        if allowance != .max { allowance = escapeAllowance }
        return true
    }

    /// Distinct non-empty spans of the best tape, largest first (ties: earliest first).
    private func spansLargestFirst() -> [Range<Int>] {
        var ranges = best.spans.compactMap { span -> Range<Int>? in
            let range = span.range
            return range.isEmpty || range.upperBound > best.choices.count ? nil : range
        }
        ranges.sort { $0.count != $1.count ? $0.count > $1.count : $0.lowerBound < $1.lowerBound }
        var unique: [Range<Int>] = []
        unique.reserveCapacity(ranges.count)
        for range in ranges where unique.last != range { unique.append(range) }
        return unique
    }

    // MARK: Passes

    /// Deletes whole spans (an array element, a state-machine step, ...), largest first.
    private mutating func deleteSpans() {
        var order = spansLargestFirst()
        var index = 0
        while index < order.count, !stopped {
            let range = order[index]
            if range.upperBound <= best.choices.count {
                var candidate = best.choices
                candidate.removeSubrange(range)
                if consider(candidate) {
                    order = spansLargestFirst()
                    continue
                }
            }
            index += 1
        }
    }

    /// Replaces whole spans with zeros (their simplest content), largest first.
    private mutating func zeroSpans() {
        var order = spansLargestFirst()
        var index = 0
        while index < order.count, !stopped {
            let range = order[index]
            if range.upperBound <= best.choices.count, best.choices[range].contains(where: { $0 != 0 }) {
                var candidate = best.choices
                for position in range { candidate[position] = 0 }
                if consider(candidate) {
                    order = spansLargestFirst()
                    continue
                }
            }
            index += 1
        }
    }

    /// Deletes runs of 8, 4, 2 and 1 consecutive choices, from the end of the tape backwards.
    /// Catches structure that no span describes.
    private mutating func deleteChunks() {
        for size in [8, 4, 2, 1] {
            var start = best.choices.count - size
            while start >= 0, !stopped {
                var candidate = best.choices
                candidate.removeSubrange(start ..< start + size)
                _ = consider(candidate)
                start = min(start - 1, best.choices.count - size)
            }
        }
    }

    /// Lowers every choice on its own: tries 0, then `value - 1`, then binary search.
    private mutating func lowerValues() {
        var position = 0
        while position < best.choices.count, !stopped {
            lower([position])
            position += 1
        }
    }

    /// Lowers groups of choices that share a value and a bound, all together. This is what
    /// turns `[2, 2, 2]` into `[0, 0, 0]` when lowering any one of them alone would stop the
    /// test failing.
    private mutating func lowerDuplicates() {
        struct Key: Hashable { var value: UInt64; var bound: UInt64 }
        guard best.bounds.count == best.choices.count else { return }
        var groups: [Key: [Int]] = [:]
        for (position, value) in best.choices.enumerated() where value > 0 {
            groups[Key(value: value, bound: best.bounds[position]), default: []].append(position)
        }
        // Deterministic order: by first position (never by hash order).
        let ordered = groups.values.filter { $0.count > 1 }.sorted { $0[0] < $1[0] }
        for group in ordered where !stopped {
            lower(group)
        }
    }

    /// Lowers the choices at `positions` (which share a value) to a common smaller value.
    private mutating func lower(_ positions: [Int]) {
        func currentValue() -> UInt64? {
            guard let first = positions.first, positions.allSatisfy({ $0 < best.choices.count }) else { return nil }
            let value = best.choices[first]
            return positions.allSatisfy({ best.choices[$0] == value }) ? value : nil
        }
        func candidate(_ value: UInt64) -> [UInt64] {
            var result = best.choices
            for position in positions { result[position] = value }
            return result
        }
        guard let start = currentValue(), start > 0 else { return }
        if consider(candidate(0)) { return }
        if start > 1, consider(candidate(start - 1)) {
            // Invariant: `low` does not reproduce, `high` does (it is the current value).
            var low: UInt64 = 0
            var high = start - 1
            while low + 1 < high, !stopped {
                guard currentValue() == high else { return }
                let middle = low + (high - low) / 2
                if consider(candidate(middle)) { high = middle } else { low = middle }
            }
        }
        // Failing need not be monotone in the value: also try halving, repeatedly.
        while let value = currentValue(), value > 1, !stopped {
            var improved = false
            var shifted = value >> 1
            while shifted > 0, !stopped {
                if consider(candidate(shifted)) {
                    improved = true
                    break
                }
                shifted >>= 1
            }
            if !improved { return }
        }
    }

    /// Lowers a choice by one while deleting a later span or choice: the move that shrinks a
    /// length-prefixed structure (a count, then that many items).
    private mutating func lowerAndDelete() {
        var position = 0
        while position < best.choices.count, !stopped {
            let value = best.choices[position]
            if value > 0 {
                var targets: [Range<Int>] = []
                for span in best.spans where Int(span.start) > position && span.end > span.start {
                    if !targets.contains(span.range) { targets.append(span.range) }
                    if targets.count >= redistributionWindow { break }
                }
                for later in (position + 1) ..< min(position + 1 + redistributionWindow, best.choices.count) {
                    let single = later ..< later + 1
                    if !targets.contains(single) { targets.append(single) }
                }
                for target in targets where !stopped {
                    guard target.upperBound <= best.choices.count, best.choices[position] == value else { break }
                    var candidate = best.choices
                    candidate[position] = value - 1
                    candidate.removeSubrange(target)
                    if consider(candidate) { break }
                }
            }
            position += 1
        }
    }

    /// Deletes a span and raises one of the next few choices to make up for it, e.g. replaces
    /// `increment(); add(5)` by `add(6)`. Raises are tried by doubling, then narrowed by binary
    /// search, so the smallest compensation that reproduces the failure wins.
    private mutating func deleteAndCompensate() {
        guard best.bounds.count == best.choices.count else { return }
        var order = spansLargestFirst()
        var index = 0
        while index < order.count, !stopped {
            let range = order[index]
            index += 1
            guard range.upperBound <= best.choices.count else { continue }
            var base = best.choices
            base.removeSubrange(range)
            let bounds = best.bounds
            var accepted = false
            var position = range.lowerBound
            while position < min(range.lowerBound + redistributionWindow, base.count), !stopped, !accepted {
                let bound = bounds[position + range.count]
                let value = base[position]
                position += 1
                guard bound > 1, value < bound else { continue }
                let room = bound - value
                func candidate(_ raise: UInt64) -> [UInt64] {
                    var result = base
                    result[position - 1] = value + raise
                    return result
                }
                var failedRaise: UInt64 = 0
                var raise: UInt64 = 1
                while !stopped {
                    if consider(candidate(raise)) {
                        accepted = true
                        // Narrow down: smaller raises are shortlex-smaller still.
                        var low = failedRaise, high = raise
                        while low + 1 < high, !stopped {
                            let middle = low + (high - low) / 2
                            if consider(candidate(middle)) { high = middle } else { low = middle }
                        }
                        break
                    }
                    failedRaise = raise
                    if raise == room { break }
                    raise = raise > room / 2 ? room : raise * 2
                }
            }
            if accepted {
                order = spansLargestFirst()
                index = 0
            }
        }
    }

    /// Moves value from a choice to a later choice with the same bound (e.g. from one list
    /// element to another), which lowers the tape in shortlex order while keeping a sum.
    /// After this, the emptied element can often be deleted.
    private mutating func redistribute() {
        guard best.bounds.count == best.choices.count else { return }
        var first = 0
        while first < best.choices.count, !stopped {
            var second = first + 1
            while second <= first + redistributionWindow, second < best.choices.count, !stopped {
                moveValue(from: first, to: second)
                second += 1
            }
            first += 1
        }
    }

    private mutating func moveValue(from first: Int, to second: Int) {
        let bound = best.bounds[first]
        guard bound > 1, best.bounds[second] == bound else { return }
        let a = best.choices[first], b = best.choices[second]
        guard a > 0, b < bound else { return }
        let maximum = min(a, bound - b)
        func candidate(_ amount: UInt64) -> [UInt64] {
            var result = best.choices
            result[first] = a - amount
            result[second] = b + amount
            return result
        }
        func unchanged(_ moved: UInt64) -> Bool {
            second < best.choices.count && best.choices[first] == a - moved && best.choices[second] == b + moved
        }
        if consider(candidate(maximum)) { return }
        if maximum == 1 || !consider(candidate(1)) { return }
        // Invariant: moving `low` reproduces (it is the current best), moving `high` does not.
        var low: UInt64 = 1
        var high = maximum
        while low + 1 < high, !stopped {
            guard unchanged(low) else { return }
            let middle = low + (high - low) / 2
            if consider(candidate(middle)) { low = middle } else { high = middle }
        }
    }

    /// Chains of adjacent sibling spans: same depth, same label, each starting where the
    /// previous one ends (e.g. the elements of one array, the steps of one program).
    private func siblingChains() -> [[ChoiceSpan]] {
        let spans = best.spans
        var next = [Int?](repeating: nil, count: spans.count)
        var hasPrevious = [Bool](repeating: false, count: spans.count)
        for index in spans.indices {
            let span = spans[index]
            var probe = index + 1
            while probe < spans.count {
                let candidate = spans[probe]
                if candidate.depth < span.depth { break }
                if candidate.depth == span.depth {
                    if candidate.start == span.end && candidate.label == span.label && candidate.end > candidate.start {
                        next[index] = probe
                        hasPrevious[probe] = true
                    }
                    break
                }
                probe += 1
            }
        }
        var chains: [[ChoiceSpan]] = []
        for index in spans.indices where !hasPrevious[index] && next[index] != nil && spans[index].end > spans[index].start {
            var chain = [spans[index]]
            var cursor = index
            while let following = next[cursor] {
                chain.append(spans[following])
                cursor = following
            }
            chains.append(chain)
        }
        return chains
    }

    /// Replaces a run of one to three adjacent siblings with a copy of a shorter sibling, e.g.
    /// `increment(); increment()` with a copy of a later `add(10)` step. This escapes local
    /// minima where the simpler program needs a different rule, not fewer or smaller choices.
    private mutating func replaceWithSibling() {
        var restarts = 0
        outer: while !stopped, restarts < 64 {
            for chain in siblingChains() {
                var donors: [ArraySlice<UInt64>] = []
                for span in chain where Int(span.end) <= best.choices.count {
                    let content = best.choices[span.range]
                    if !donors.contains(content) { donors.append(content) }
                }
                for runLength in 1 ... min(3, chain.count) {
                    for start in 0 ... (chain.count - runLength) {
                        let run = Int(chain[start].start) ..< Int(chain[start + runLength - 1].end)
                        guard run.upperBound <= best.choices.count else { continue }
                        for donor in donors where donor.count < run.count || (donor.count == run.count && donor.lexicographicallyPrecedes(best.choices[run])) {
                            if stopped { return }
                            var candidate = Array(best.choices[..<run.lowerBound])
                            candidate.append(contentsOf: donor)
                            candidate.append(contentsOf: best.choices[run.upperBound...])
                            if consider(candidate) {
                                restarts += 1
                                continue outer
                            }
                        }
                    }
                }
            }
            return
        }
    }

    /// Deletes two non-overlapping spans with the same label and depth at once (e.g. the step
    /// creating an entity and a later step that only touched it), which single deletions can't
    /// do when each deletion alone changes what later references point to.
    /// - Complexity: Quadratic in the number of such spans; runs only at a local minimum.
    private mutating func deleteSpanPairs() {
        var restarts = 0
        outer: while !stopped, restarts < 64 {
            let spans = best.spans.filter { $0.end > $0.start && Int($0.end) <= best.choices.count }
            for (firstIndex, first) in spans.enumerated() {
                for second in spans[(firstIndex + 1)...]
                where second.start >= first.end && second.label == first.label && second.depth == first.depth {
                    if stopped { return }
                    var candidate = best.choices
                    candidate.removeSubrange(second.range)
                    candidate.removeSubrange(first.range)
                    if consider(candidate) {
                        restarts += 1
                        continue outer
                    }
                }
            }
            return
        }
    }

    /// Swaps adjacent sibling spans (same depth and label) when that lowers the tape, e.g.
    /// sorting list elements or state-machine steps into their simplest order.
    private mutating func swapSiblings() {
        var index = 0
        while index < best.spans.count, !stopped {
            let spans = best.spans
            let left = spans[index]
            index += 1
            guard left.end > left.start, Int(left.end) <= best.choices.count else { continue }
            // The next span in pre-order at the same depth that starts where `left` ends.
            var partner: ChoiceSpan?
            var probe = index
            while probe < spans.count {
                let span = spans[probe]
                if span.depth < left.depth { break }
                if span.depth == left.depth {
                    if span.start == left.end && span.label == left.label { partner = span }
                    break
                }
                probe += 1
            }
            guard let right = partner, right.end > right.start, Int(right.end) <= best.choices.count else { continue }
            let leftChoices = best.choices[left.range]
            let rightChoices = best.choices[right.range]
            var candidate = Array(best.choices[..<left.range.lowerBound])
            candidate.append(contentsOf: rightChoices)
            candidate.append(contentsOf: leftChoices)
            candidate.append(contentsOf: best.choices[right.range.upperBound...])
            _ = consider(candidate)
        }
    }
}
