import Foundation
import Testing
@testable import Replica
import ReplicaPostgres

/// One contract for every cloud database: the same tests, unchanged, against ``InMemoryCloudDatabase``,
/// ``SQLiteCloudDatabase`` (a file) and ``PostgresCloudDatabase`` (the test server, each test under an owner of its
/// own), so the three cannot drift apart. The PostgreSQL cases run when the server is there or required
/// (``PostgresTestServer``).
@Suite("Cloud databases")
struct CloudDatabaseTests {
    enum Kind: String, CaseIterable, Sendable { case inMemory, sqliteFile, postgres }

    /// Every kind; PostgreSQL only when its tests run (they fail without a server when it is required).
    static let kinds: [Kind] = PostgresTestServer.shouldRun ? Kind.allCases : [.inMemory, .sqliteFile]

    static func make(_ kind: Kind) throws -> any CloudDatabase {
        switch kind {
        case .inMemory: return InMemoryCloudDatabase()
        case .sqliteFile:
            let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-cloud-\(UUID().uuidString).sqlite")
            return try SQLiteCloudDatabase(url: url)
        case .postgres: return try PostgresTestServer.get().cloud()
        }
    }

    static func record(_ n: Int, tag: String? = nil) -> CloudRecord {
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: Int64(n), logical: 0, replica: UUID(uuidString: "00000000-0000-7000-8000-000000000000")!))
        return CloudRecord(recordID: UUID(uuidString: "00000000-0000-7000-8000-0000000000\(String(format: "%02d", n))")!,
                           recordType: "Note", changeTag: tag, causalLength: 1, created: stamp,
                           fields: ["title": CloudField(value: .text("note \(n)"), stamp: stamp)])
    }

    /// The saved change tag of each result (`nil` for a result that is not `saved`).
    static func tags(_ results: [RecordSaveResult]) -> [String?] {
        results.map { if case let .saved(_, tag) = $0 { tag } else { nil } }
    }

    @Test("zones, saves with change tags, conflicts carrying the server record", arguments: kinds)
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
        #expect(server.changeTag == Self.tags(second)[0])
        // A new record saved with no tag while the server has one also conflicts.
        guard case .conflict = try await db.modifyRecords([Self.record(2)], in: "z")[0] else { Issue.record("no conflict"); return }
    }

    @Test("zone changes: paging with more-coming, newest version once, expired tokens, reset", arguments: kinds)
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
        try await db.deleteZone("z")
        await #expect(throws: CloudError.zoneDeleted(reason: .deleted)) { try await db.fetchZoneChanges("z", since: nil, limit: 10) }
        try await db.createZone("z")
        await #expect(throws: CloudError.changeTokenExpired) { try await db.fetchZoneChanges("z", since: after.token, limit: 10) }
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 10).records.isEmpty)
    }

    @Test("zone metadata is compare-and-swap", arguments: kinds)
    func metadata(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data("v1".utf8), ifCurrent: nil) == Data("v1".utf8))
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data("v2".utf8), ifCurrent: nil) == Data("v1".utf8))
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data("v2".utf8), ifCurrent: Data("v1".utf8)) == Data("v2".utf8))
        #expect(try await db.zoneMetadata("z") == ["schema": Data("v2".utf8)])
    }

    @Test("zone metadata: an empty value is not an absent one, keys are independent, deleting the zone deletes them", arguments: kinds)
    func metadataEdges(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        #expect(try await db.zoneMetadata("z").isEmpty)
        #expect(try await db.setZoneMetadata("z", key: "salt", value: Data(), ifCurrent: nil) == Data())
        // The key now holds an empty value: "expected absent" no longer matches, "expected empty" does.
        #expect(try await db.setZoneMetadata("z", key: "salt", value: Data([1]), ifCurrent: nil) == Data())
        #expect(try await db.setZoneMetadata("z", key: "salt", value: Data([1]), ifCurrent: Data()) == Data([1]))
        #expect(try await db.setZoneMetadata("z", key: "schema", value: Data([2]), ifCurrent: nil) == Data([2]))
        #expect(try await db.zoneMetadata("z") == ["salt": Data([1]), "schema": Data([2])])
        try await db.deleteZone("z")
        try await db.createZone("z")
        #expect(try await db.zoneMetadata("z").isEmpty)
    }

    @Test("a missing zone: every operation but createZone fails with zoneNotFound, even an empty save", arguments: kinds)
    func missingZone(kind: Kind) async throws {
        let db = try Self.make(kind)
        await #expect(throws: CloudError.zoneNotFound) { try await db.modifyRecords([], in: "absent") }
        await #expect(throws: CloudError.zoneNotFound) { try await db.fetchZoneChanges("absent", since: nil, limit: 5) }
        await #expect(throws: CloudError.zoneNotFound) { try await db.zoneMetadata("absent") }
        await #expect(throws: CloudError.zoneNotFound) {
            try await db.setZoneMetadata("absent", key: "k", value: Data([1]), ifCurrent: nil)
        }
        await #expect(throws: CloudError.zoneNotFound) { try await db.deleteZone("absent") }
        // Zones are separate: another zone's records are not in this one.
        try await db.createZone("a")
        try await db.createZone("b")
        _ = try await db.modifyRecords([Self.record(1)], in: "a")
        #expect(try await db.fetchZoneChanges("b", since: nil, limit: 5).records.isEmpty)
        #expect(try await db.modifyRecords([], in: "b").isEmpty)
    }

    @Test("a zone deleted and created again starts a new epoch: older tokens expire and change tags never repeat", arguments: kinds)
    func recreatedZone(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let before = Self.tags(try await db.modifyRecords((1...3).map { Self.record($0) }, in: "z"))
        let oldToken = try await db.fetchZoneChanges("z", since: nil, limit: 10).token
        try await db.deleteZone("z")
        try await db.createZone("z")
        let after = Self.tags(try await db.modifyRecords((1...3).map { Self.record($0) }, in: "z"))
        #expect(!before.contains(nil) && !after.contains(nil))
        #expect(Set(before).isDisjoint(with: after))
        // The new zone has as many changes as the old one had: only the epoch tells the old token apart.
        await #expect(throws: CloudError.changeTokenExpired) { try await db.fetchZoneChanges("z", since: oldToken, limit: 10) }
        let fresh = try await db.fetchZoneChanges("z", since: nil, limit: 10)
        #expect(fresh.records.map(\.changeTag) == after)
        #expect(fresh.token.epoch != oldToken.epoch)
    }

    @Test("one record twice in a batch: the first copy is saved, the second conflicts with it", arguments: kinds)
    func duplicateInBatch(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        var second = Self.record(1)
        second.fields["title"]!.value = .text("second copy")
        let results = try await db.modifyRecords([Self.record(1), second, Self.record(2)], in: "z")
        #expect(results.map(\.recordID) == [Self.record(1).recordID, Self.record(1).recordID, Self.record(2).recordID])
        guard case let .saved(_, tag) = results[0], case let .conflict(server) = results[1], case .saved = results[2] else {
            Issue.record("unexpected results \(results)")
            return
        }
        #expect(server.changeTag == tag)
        #expect(server.fields["title"]?.value == .text("note 1"))
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 10).records.count == 2)
    }

    @Test("a record whose stamps the text form cannot hold is refused on its own, in its place; the rest of the batch is saved", arguments: kinds)
    func unencodableStampRefused(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        var beyond = Self.record(2)
        beyond.fields["title"]!.stamp.clock.physical = HLC.maxPhysical + 1
        var negative = Self.record(3)
        negative.created.incarnation = -1
        let results = try await db.modifyRecords([Self.record(1), beyond, negative, Self.record(4)], in: "z")
        #expect(results.map(\.recordID) == [1, 2, 3, 4].map { Self.record($0).recordID })
        guard case .saved = results[0], case let .failed(_, fieldError) = results[1], case let .failed(_, creationError) = results[2],
              case .saved = results[3] else {
            Issue.record("unexpected results \(results)")
            return
        }
        #expect("\(fieldError)".contains("title"))
        #expect("\(creationError)".contains("creation"))
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 10).records.map(\.recordID) == [Self.record(1).recordID, Self.record(4).recordID])
        // Only refused records: nothing saved, the zone still checked.
        #expect(try await db.modifyRecords([beyond], in: "z").count == 1)
        await #expect(throws: CloudError.zoneNotFound) { try await db.modifyRecords([beyond], in: "missing") }
    }

    @Test("a token from the future — a sequence the zone never reached — expires", arguments: kinds)
    func tokenFromTheFuture(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        _ = try await db.modifyRecords([Self.record(1)], in: "z")
        let token = try await db.fetchZoneChanges("z", since: nil, limit: 10).token
        let ahead = ServerChangeToken(epoch: token.epoch, sequence: token.sequence + 5)
        await #expect(throws: CloudError.changeTokenExpired) { try await db.fetchZoneChanges("z", since: ahead, limit: 10) }
        // The current token is valid and empty.
        #expect(try await db.fetchZoneChanges("z", since: token, limit: 10).records.isEmpty)
    }

    @Test("a tombstone stays in the change feed with its preserved fields and even causal length", arguments: kinds)
    func tombstones(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let saved = try await db.modifyRecords([Self.record(1)], in: "z")
        let token = try await db.fetchZoneChanges("z", since: nil, limit: 10).token
        var tombstone = Self.record(1, tag: Self.tags(saved)[0])
        tombstone.causalLength = 2
        tombstone.fields = ["title": tombstone.fields["title"]!]
        _ = try await db.modifyRecords([tombstone], in: "z")
        let changes = try await db.fetchZoneChanges("z", since: token, limit: 10)
        #expect(changes.records.count == 1)
        #expect(changes.records.first?.causalLength == 2)
        #expect(changes.records.first?.isAlive == false)
        #expect(changes.records.first?.fields["title"]?.value == .text("note 1"))
    }

    @Test("a paged read with writes in between sees every record at its newest version, each once per pass", arguments: kinds)
    func pagingDuringWrites(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        _ = try await db.modifyRecords((1...4).map { Self.record($0) }, in: "z")
        var seen: [UUID: String] = [:]
        var token: ServerChangeToken?
        var pages = 0
        var wrote = false
        repeat {
            let batch = try await db.fetchZoneChanges("z", since: token, limit: 1)
            for record in batch.records { seen[record.recordID] = record.changeTag }
            token = batch.token
            pages += 1
            if !wrote {
                // Mid-read: a new record, and record 1 (already read) changes.
                wrote = true
                let first = batch.records[0]
                _ = try await db.modifyRecords([Self.record(5), first], in: "z")
            }
            if !batch.moreComing { break }
        } while pages < 20
        let all = try await db.fetchZoneChanges("z", since: nil, limit: 100).records
        #expect(seen.count == 5)
        #expect(seen == Dictionary(uniqueKeysWithValues: all.map { ($0.recordID, $0.changeTag!) }))
    }

    /// Makes the server drop history so older tokens expire: InMemory's `expireChangeTokens`, PostgreSQL's prune
    /// (`replica-cloud prune --keep 0`, in a database of this test's own: a prune covers every zone). The SQLite
    /// cloud keeps all history.
    static func dropHistory(_ kind: Kind) async throws -> (db: any CloudDatabase, drop: @Sendable (String) async throws -> Void) {
        switch kind {
        case .inMemory:
            let memory = InMemoryCloudDatabase()
            return (memory, { memory.expireChangeTokens(in: $0) })
        case .postgres:
            let server = try PostgresTestServer.get()
            let database = try server.freshDatabase()
            return (try server.cloud(database: database), { _ in _ = try server.administration(database: database).prune(keepingDays: 0) })
        case .sqliteFile:
            preconditionFailure("the SQLite cloud keeps all history")
        }
    }

    @Test("after the server drops history, a token from before fails with changeTokenExpired and a full re-read pages to the end",
          arguments: kinds.filter { $0 != .sqliteFile })
    func droppedHistory(kind: Kind) async throws {
        let (db, drop) = try await Self.dropHistory(kind)
        try await db.createZone("z")
        let saved = try await db.modifyRecords((1...4).map { Self.record($0) }, in: "z")
        let early = try await db.fetchZoneChanges("z", since: nil, limit: 1).token
        var tombstone = Self.record(4, tag: Self.tags(saved)[3])
        tombstone.causalLength = 2
        _ = try await db.modifyRecords([tombstone], in: "z")
        try await drop("z")
        await #expect(throws: CloudError.changeTokenExpired) { try await db.fetchZoneChanges("z", since: early, limit: 1) }
        // A full re-read, one record per page: its page tokens lie below the dropped history, and stay valid.
        var token: ServerChangeToken?
        var ids: [UUID] = []
        for _ in 0..<10 {
            let batch = try await db.fetchZoneChanges("z", since: token, limit: 1)
            ids += batch.records.map(\.recordID)
            token = batch.token
            if !batch.moreComing { break }
        }
        #expect(Set(ids).isSuperset(of: (1...3).map { Self.record($0).recordID }))
        #expect(try await db.fetchZoneChanges("z", since: token, limit: 1).records.isEmpty)
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

    @Test("an SQLite cloud file holding JSON records (written before binary bodies) is still read; saves store binary bodies")
    func sqliteReadsJSONRecords() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-cloud-\(UUID().uuidString).sqlite")
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: url.path + suffix) } }
        let db = try SQLiteCloudDatabase(url: url)
        try db.createZone("z")
        let tags = Self.tags(try db.modifyRecords([Self.record(1), Self.record(2)], in: "z"))
        let other = try Connection(location: .file(url))
        func storage(_ n: Int) throws -> SQLiteValue? {
            try other.scalar("SELECT typeof(record) FROM cloud_record WHERE id = ?", [Self.record(n).recordID.sqliteValue])
        }
        #expect(try storage(1) == .text("blob") && storage(2) == .text("blob"))
        // Record 1 as the file kept it before: JSON text, its change tag inside.
        let json = String(decoding: try CloudRecordJSON.encode(Self.record(1, tag: tags[0])), as: UTF8.self)
        try other.run("UPDATE cloud_record SET record = ? WHERE id = ?", [.text(json), Self.record(1).recordID.sqliteValue])
        #expect(try storage(1) == .text("text"))
        let page = try db.fetchZoneChanges("z", since: nil, limit: 10)
        #expect(page.records == [Self.record(1, tag: tags[0]), Self.record(2, tag: tags[1])] && page.unreadable.isEmpty)
        #expect(try db.records(in: "z").count == 2)
        #expect(try db.modifyRecords([Self.record(1)], in: "z") == [.conflict(serverRecord: Self.record(1, tag: tags[0]))])
        guard case .saved = try db.modifyRecords([Self.record(1, tag: tags[0])], in: "z")[0] else { Issue.record("not saved"); return }
        #expect(try storage(1) == .text("blob"))
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
        let directory = temporaryTestDirectory()
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
