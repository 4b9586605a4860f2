import Foundation
import Testing
@testable import Replica

/// Merging is a join: commutative, associative and idempotent (DESIGN.md principle 5). Random record versions are
/// merged into fresh stores in different orders, groupings and with duplicates; every store must end identical.
@Suite("Merge laws")
struct MergeLawTests {
    /// SplitMix64, local to this test (the property engine of ReplicaTesting is used by the property suites).
    struct Rng {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return Int((z ^ (z >> 31)) % UInt64(bound))
        }
    }

    static let ids = (1...3).map { UUID(uuidString: "01900000-0000-7000-8000-00000000000\($0)")! }
    static let replicas = (1...3).map { UUID(uuidString: "01900000-0000-7000-8000-0000000000a\($0)")! }

    static func randomVersion(_ rng: inout Rng) -> CloudRecord {
        let causalLength = Int64(1 + rng.next(4))
        let incarnation = causalLength % 2 == 1 ? causalLength : causalLength - 1
        func stamp() -> FieldStamp {
            FieldStamp(incarnation: max(1, incarnation - Int64(rng.next(2) * 2)),
                       clock: HLC(physical: Int64(rng.next(5)), logical: Int32(rng.next(2)), replica: replicas[rng.next(3)]))
        }
        var fields: [String: CloudField] = [:]
        let titles = ["a", "b", "c"]
        if rng.next(3) > 0 { fields["title"] = CloudField(value: .text(titles[rng.next(3)]), stamp: stamp()) }
        if rng.next(3) > 0 { fields["body"] = CloudField(value: rng.next(2) == 0 ? .null : .text(titles[rng.next(3)]), stamp: stamp()) }
        if rng.next(3) > 0 { fields["rating"] = CloudField(value: .integer(Int64(rng.next(4))), stamp: stamp()) }
        if rng.next(4) == 0 { fields["futureField"] = CloudField(value: .text("x"), stamp: stamp()) }
        // Equal stamps must carry equal values (a stamp names one write): derive the value from the stamp.
        for (name, field) in fields where name != "body" || !field.value.isNull {
            if name == "title" { fields[name]!.value = .text(titles[Int(field.stamp.clock.physical) % 3]) }
            if name == "rating" { fields[name]!.value = .integer(field.stamp.clock.physical) }
        }
        if let body = fields["body"] { fields["body"]!.value = body.stamp.clock.logical == 0 ? .null : .text("body \(body.stamp.clock.physical)") }
        return CloudRecord(recordID: ids[rng.next(3)], recordType: "SyncNote", causalLength: causalLength,
                           created: FieldStamp(incarnation: incarnation, clock: HLC(physical: Int64(rng.next(3)), logical: 0, replica: replicas[0])),
                           fields: fields)
    }

    /// The observable state of a device after merging: rows and replication state (without outbox bookkeeping).
    static func state(of device: Device) throws -> String {
        let rows = try device.notes().map { "\($0.id) \($0.title) \($0.body ?? "nil") \($0.rating)" }
        let ledger = try device.engine.db.rows("SELECT id, causal_length, created, stamps, unknown, tombstone FROM replica_sync_record ORDER BY id")
        // Every value in full (the `stamps` column is a blob): SQLiteValue's own description hides contents.
        func render(_ value: SQLiteValue) -> String {
            switch value {
            case let .text(text): text
            case let .blob(bytes): bytes.map { String(format: "%02x", $0) }.joined()
            case let .integer(number): "\(number)"
            case let .real(number): "\(number)"
            case .null: "null"
            }
        }
        return rows.joined(separator: "\n") + "\n" + ledger.map { "\($0.map(render))" }.joined(separator: "\n")
    }

    static func merge(_ records: [CloudRecord], into device: Device) throws {
        let store = device.container.stores[0]
        try device.engine.db.transaction {
            var hlc = try SyncLedger.loadHLC(device.engine.db, replica: store.identity)
            for record in records { _ = try SyncLedger.merge(record, store: store, db: device.engine.db, hlc: &hlc, wall: 0) }
        }
    }

    @Test("any order, any grouping, any duplication of the same versions gives the same store", arguments: 0..<25)
    func joinLaws(seed: Int) throws {
        // REPLICA_PROPERTY_SCALE=N runs N times as many cases (for long exploration runs).
        let scale = Int(ProcessInfo.processInfo.environment["REPLICA_PROPERTY_SCALE"] ?? "") ?? 1
        for round in 0..<max(1, scale) { try checkJoinLaws(seed: seed + 25 * round) }
    }

    func checkJoinLaws(seed: Int) throws {
        var rng = Rng(state: UInt64(seed) &* 7919)
        let versions = (0..<(3 + rng.next(6))).map { _ in Self.randomVersion(&rng) }
        let reference = try Device("ref", seed: 1)
        try Self.merge(versions, into: reference)
        let expected = try Self.state(of: reference)
        for trial in 0..<4 {
            var shuffled = versions
            for i in shuffled.indices.reversed() { shuffled.swapAt(i, rng.next(i + 1)) }
            if trial % 2 == 1 { shuffled += shuffled.prefix(rng.next(shuffled.count) + 1) }  // duplicates
            let device = try Device("trial", seed: 1)
            // Groupings: merge in chunks, each in its own transaction (associativity).
            var start = 0
            while start < shuffled.count {
                let end = min(shuffled.count, start + 1 + rng.next(3))
                try Self.merge(Array(shuffled[start..<end]), into: device)
                start = end
            }
            let got = try Self.state(of: device)
            if got != expected, ProcessInfo.processInfo.environment["MERGE_DEBUG"] != nil { print("EXPECTED\n\(expected)\nGOT\n\(got)\nVERSIONS \(versions.map { "\($0.recordID.uuidString.suffix(2)) cl\($0.causalLength) created \($0.created) \($0.fields.mapValues { "\($0.value) \($0.stamp)" })" })") }
            #expect(got == expected, "seed \(seed) trial \(trial)")
        }
    }
}
