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

    @Test("a broken cloud file is a transient serviceUnavailable naming the problem, not zoneBusy; busy and full map to zoneBusy and quotaExceeded")
    func sqliteFailuresMapToCloudErrors() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-cloud-\(UUID().uuidString).sqlite")
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: url.path + suffix) } }
        let db = try SQLiteCloudDatabase(url: url)
        try db.createZone("z")
        _ = try db.modifyRecords([Self.record(1)], in: "z")
        // Another process damages the file: the records table disappears.
        let other = try Connection(location: .file(url))
        try other.execute("DROP TABLE cloud_record")
        var thrown: CloudError?
        do { _ = try db.modifyRecords([Self.record(2)], in: "z") } catch { thrown = error }
        guard case let .serviceUnavailable(reason)? = thrown else {
            Issue.record("expected serviceUnavailable, got \(String(describing: thrown))")
            return
        }
        #expect(reason.contains("no such table: cloud_record"))
        #expect(!reason.contains("note 2"))
        #expect(thrown?.isTransient == true)
        // The mapping of the other SQLite failures.
        #expect(SQLiteCloudDatabase.cloudError(for: SQLiteError(extendedResultCode: 5, message: "database is locked"))
                == .zoneBusy(retryAfterMilliseconds: 100))
        #expect(SQLiteCloudDatabase.cloudError(for: SQLiteError(extendedResultCode: 6, message: "database table is locked"))
                == .zoneBusy(retryAfterMilliseconds: 100))
        #expect(SQLiteCloudDatabase.cloudError(for: SQLiteError(extendedResultCode: 13, message: "database or disk is full"))
                == .quotaExceeded)
        if case .serviceUnavailable = SQLiteCloudDatabase.cloudError(for: SQLiteError(extendedResultCode: 11, message: "database disk image is malformed")) {
        } else {
            Issue.record("a corrupt file must map to serviceUnavailable")
        }
    }

    @Test("an engine whose SQLite cloud file breaks keeps its changes queued, reports the error and uploads once the file is usable again")
    func engineSurvivesBrokenCloudFile() async throws {
        let directory = adversarialDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let cloudURL = directory.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: cloudURL)
        let device = try Device("a", seed: 41, directory: directory.appendingPathComponent("a"))
        try await drive(device, cloud)
        device.context.insert(SyncNote(title: "first", rating: 1))
        try device.context.save()
        let other = try Connection(location: .file(cloudURL))
        try other.execute("ALTER TABLE cloud_record RENAME TO cloud_record_moved")
        // Each attempt fails; the engine backs off (the helper skips its waits) and keeps the note queued.
        try await drive(device, cloud, maxRequests: 12)
        let status = try device.engine.status()
        #expect(status.pendingRecords == 1)
        guard case .serviceUnavailable? = status.lastError else {
            Issue.record("expected serviceUnavailable in the status, got \(String(describing: status.lastError))")
            return
        }
        #expect(try device.context.fetch(FetchDescriptor<SyncNote>()).map(\.title) == ["first"])
        // The file is repaired; the next retry uploads the note.
        try other.execute("ALTER TABLE cloud_record_moved RENAME TO cloud_record")
        try await drive(device, cloud)
        #expect(try device.engine.status().pendingRecords == 0)
        #expect(try device.engine.status().lastError == nil)
        #expect(try cloud.records(in: "notes").count == 1)
    }
}
