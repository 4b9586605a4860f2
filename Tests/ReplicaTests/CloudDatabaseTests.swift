import Foundation
import Testing
@testable import Replica

/// The same contract checked against both cloud database implementations.
@Suite("Cloud databases")
struct CloudDatabaseTests {
    enum Kind: String, CaseIterable, Sendable { case inMemory, sqliteFile }

    static func make(_ kind: Kind) throws -> any CloudDatabase {
        switch kind {
        case .inMemory: return InMemoryCloudDatabase()
        case .sqliteFile:
            let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-cloud-\(UUID().uuidString).sqlite")
            return try SQLiteCloudDatabase(url: url)
        }
    }

    static func record(_ n: Int, tag: String? = nil) -> CloudRecord {
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: Int64(n), logical: 0, replica: UUID(uuidString: "00000000-0000-7000-8000-000000000000")!))
        return CloudRecord(recordID: UUID(uuidString: "00000000-0000-7000-8000-0000000000\(String(format: "%02d", n))")!,
                           recordType: "Note", changeTag: tag, causalLength: 1, created: stamp,
                           fields: ["title": CloudField(value: .text("note \(n)"), stamp: stamp)])
    }

    @Test("zones, saves with change tags, conflicts carrying the server record", arguments: Kind.allCases)
    func modifyAndConflict(kind: Kind) async throws {
        let db = try Self.make(kind)
        await #expect(throws: CloudError.zoneNotFound) { try await db.modifyRecords([Self.record(1)], in: "z") }
        try await db.createZone("z")
        try await db.createZone("z")  // idempotent
        let saved = try await db.modifyRecords([Self.record(1), Self.record(2)], in: "z")
        guard case let .saved(_, tag1) = saved[0] else { Issue.record("not saved"); return }
        // A save with the current tag succeeds; a stale tag conflicts and returns the server's version.
        var update = Self.record(1, tag: tag1)
        update.fields["title"]!.value = .text("updated")
        let second = try await db.modifyRecords([update], in: "z")
        guard case .saved = second[0] else { Issue.record("update not saved"); return }
        let stale = try await db.modifyRecords([Self.record(1, tag: tag1)], in: "z")
        guard case let .conflict(server) = stale[0] else { Issue.record("no conflict"); return }
        #expect(server.fields["title"]?.value == .text("updated"))
        // A new record saved with no tag while the server has one also conflicts.
        guard case .conflict = try await db.modifyRecords([Self.record(2)], in: "z")[0] else { Issue.record("no conflict"); return }
    }

    @Test("zone changes: paging with more-coming, newest version once, expired tokens, reset", arguments: Kind.allCases)
    func changes(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        _ = try await db.modifyRecords((1...5).map { Self.record($0) }, in: "z")
        let page1 = try await db.fetchZoneChanges("z", since: nil, limit: 2)
        #expect(page1.records.count == 2)
        #expect(page1.moreComing)
        let page2 = try await db.fetchZoneChanges("z", since: page1.token, limit: 10)
        #expect(page2.records.count == 3)
        #expect(!page2.moreComing)
        let empty = try await db.fetchZoneChanges("z", since: page2.token, limit: 10)
        #expect(empty.records.isEmpty)

        // Re-saving record 1 moves it to the end of the stream, once.
        let current = try await db.fetchZoneChanges("z", since: nil, limit: 10).records.first { $0.recordID == Self.record(1).recordID }!
        _ = try await db.modifyRecords([current], in: "z")
        let after = try await db.fetchZoneChanges("z", since: page2.token, limit: 10)
        #expect(after.records.map(\.recordID) == [Self.record(1).recordID])
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 10).records.count == 5)

        // After a reset, old tokens are expired even once the zone exists again.
        if let memory = db as? InMemoryCloudDatabase { memory.resetZone("z") }
        if let file = db as? SQLiteCloudDatabase { try file.resetZone("z") }
        await #expect(throws: CloudError.zoneNotFound) { try await db.fetchZoneChanges("z", since: nil, limit: 10) }
        try await db.createZone("z")
        await #expect(throws: CloudError.changeTokenExpired) { try await db.fetchZoneChanges("z", since: after.token, limit: 10) }
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 10).records.isEmpty)
    }

    @Test("zone metadata is compare-and-swap", arguments: Kind.allCases)
    func metadata(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data("v1".utf8), ifCurrent: nil) == Data("v1".utf8))
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data("v2".utf8), ifCurrent: nil) == Data("v1".utf8))
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data("v2".utf8), ifCurrent: Data("v1".utf8)) == Data("v2".utf8))
        #expect(try await db.zoneMetadata("z") == ["schema": Data("v2".utf8)])
    }

    @Test("injected faults fail exactly the next matching operations")
    func injection() throws {
        let db = InMemoryCloudDatabase()
        try db.createZone("z")
        db.injectFailure(.rateLimited(retryAfterMilliseconds: 10), for: .modify)
        #expect(try db.fetchZoneChanges("z", since: nil, limit: 1).records.isEmpty)  // a fetch is not affected
        #expect(throws: CloudError.rateLimited(retryAfterMilliseconds: 10)) { try db.modifyRecords([Self.record(1)], in: "z") }
        #expect(try db.modifyRecords([Self.record(1)], in: "z").count == 1)
    }
}
