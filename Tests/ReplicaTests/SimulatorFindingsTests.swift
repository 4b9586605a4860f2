import Foundation
import Testing
@testable import Replica

/// Library bugs the simulator (`replica-sim`) found, one focused test each. The shrunk traces that found them are
/// replayed by `SimulationRegressionTests` (Simulations/regressions/).
@Suite("Bugs found by the simulator")
struct SimulatorFindingsTests {
    private static func record(_ n: UInt8) -> CloudRecord {
        let id = UUID(uuid: (1, 0, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, n))
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: Int64(n), logical: 0, replica: id))
        return CloudRecord(recordID: id, recordType: "T", causalLength: 1, created: stamp,
                           fields: ["n": CloudField(value: .integer(Int64(n)), stamp: stamp)])
    }

    @Test("after the change tokens of a zone expire, a paged re-read from the start completes (trips seed 1, liveness)")
    func pagedRereadAfterExpiry() throws {
        let db = InMemoryCloudDatabase()
        try db.createZone("z")
        _ = try db.modifyRecords((1...5).map(Self.record), in: "z")
        let before = try db.fetchZoneChanges("z", since: nil, limit: 10)
        db.expireChangeTokens(in: "z")
        #expect(throws: CloudError.changeTokenExpired) { try db.fetchZoneChanges("z", since: before.token, limit: 10) }
        // The full re-read pages through the zone with tokens issued after the expiry: they must stay valid.
        var token: ServerChangeToken?
        var seen: [UUID] = []
        for _ in 0..<10 {
            let page = try db.fetchZoneChanges("z", since: token, limit: 2)
            seen += page.records.map(\.recordID)
            token = page.token
            if !page.moreComing { break }
        }
        #expect(seen == (1...5).map { Self.record($0).recordID })
        // Records saved before the expiry keep their change tags: an upload based on them is not a conflict.
        var stored = try #require(db.records(in: "z").first)
        stored.fields["n"]?.value = .integer(42)
        guard case .saved? = try db.modifyRecords([stored], in: "z").first else {
            Issue.record("a record saved before the expiry conflicted with its own change tag")
            return
        }
    }
}
