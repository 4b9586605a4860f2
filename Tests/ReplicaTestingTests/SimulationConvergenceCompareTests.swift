import Foundation
import Replica
@testable import ReplicaTesting
import Testing

/// The convergence check compares a ledger's stamps with the cloud's first with `stampsAgree` and
/// `unknownFieldsAgree`, and only on a difference in name order (for the message). Both must answer exactly as the
/// original comparisons over the union of names and over the filtered dictionaries.
@Suite("Simulator: convergence stamp comparisons")
struct SimulationConvergenceCompareTests {
    /// The property engine's deterministic SplitMix64, drawing below a bound.
    private struct Mix {
        var generator: SplitMix64
        init(state: UInt64) { generator = SplitMix64(seed: state) }
        mutating func next(_ bound: Int) -> Int { Int(generator.next() % UInt64(bound)) }
    }

    private static let names = ["a", "b", "c", "d"]
    private static let replica = UUID(uuid: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16))

    private func stamp(_ mix: inout Mix) -> FieldStamp {
        FieldStamp(incarnation: [1, 3][mix.next(2)], clock: HLC(physical: Int64(mix.next(3)), logical: 0, replica: Self.replica))
    }

    /// The convergence check's original stamp comparison.
    private func referenceStampsAgree(_ stamps: [String: FieldStamp], _ fields: [String: CloudField], known: Set<String>, incarnation: Int64) -> Bool {
        for name in Set(stamps.keys).union(fields.keys.filter { known.contains($0) }).sorted() {
            let cloudStamp = fields[name].flatMap { $0.stamp.incarnation == incarnation ? $0.stamp : nil }
            if stamps[name] != cloudStamp { return false }
        }
        return true
    }

    /// The convergence check's original unknown-field comparison.
    private func referenceUnknownAgree(_ unknown: [String: CloudField], _ fields: [String: CloudField], known: Set<String>, incarnation: Int64) -> Bool {
        let unknownCloud = fields.filter { !known.contains($0.key) && $0.value.stamp.incarnation == incarnation }
        return unknownCloud.mapValues(\.stamp) == unknown.mapValues(\.stamp)
    }

    @Test("both comparisons answer as the originals over 20,000 random ledgers and records, agreeing ones included")
    func sameAnswers() {
        var mix = Mix(state: 42)
        var agreed = (stamps: 0, unknown: 0)
        for _ in 0..<20_000 {
            let known = Set(Self.names.filter { _ in mix.next(2) == 0 })
            var fields: [String: CloudField] = [:]
            for name in Self.names where mix.next(3) > 0 {
                fields[name] = CloudField(value: .integer(Int64(mix.next(5))), stamp: stamp(&mix))
            }
            // Ledgers that mostly copy the cloud (so that agreement is common), with random differences.
            var stamps: [String: FieldStamp] = [:]
            var unknown: [String: CloudField] = [:]
            for name in Self.names {
                switch mix.next(6) {
                case 0: continue
                case 1: stamps[name] = stamp(&mix)
                case 2: unknown[name] = CloudField(value: .null, stamp: stamp(&mix))
                default:
                    guard let field = fields[name], field.stamp.incarnation == 3 else { continue }
                    if known.contains(name) { stamps[name] = field.stamp } else { unknown[name] = field }
                }
            }
            let expectedStamps = referenceStampsAgree(stamps, fields, known: known, incarnation: 3)
            let expectedUnknown = referenceUnknownAgree(unknown, fields, known: known, incarnation: 3)
            #expect(stampsAgree(stamps, fields, known: known, incarnation: 3) == expectedStamps, "\(stamps) \(fields) \(known)")
            #expect(unknownFieldsAgree(unknown, fields, known: known, incarnation: 3) == expectedUnknown, "\(unknown) \(fields) \(known)")
            if expectedStamps { agreed.stamps += 1 }
            if expectedUnknown { agreed.unknown += 1 }
        }
        // Both answers occur often enough for the comparison to mean something.
        #expect(agreed.stamps > 1_000 && agreed.stamps < 19_000)
        #expect(agreed.unknown > 1_000 && agreed.unknown < 19_000)
    }
}
