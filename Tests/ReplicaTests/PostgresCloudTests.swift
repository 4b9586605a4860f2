import Foundation
import Synchronization
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// What PostgresCloudDatabase adds to the cloud contract: push notifications, errors a device can act on,
/// reconnection, pruning, secrets kept out of messages, and the sync engine on top of it.
@Suite("PostgreSQL cloud", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresCloudTests {
    static func record(_ n: Int, tag: String? = nil) -> CloudRecord { CloudDatabaseTests.record(n, tag: tag) }

    /// Terminates every backend of `role` whose current or last query matches `pattern` (SQL LIKE); returns how many.
    @discardableResult
    static func terminate(role: String, query pattern: String = "%", waitingForLock: Bool = false,
                          database: String? = nil) throws -> Int64 {
        let server = try PostgresTestServer.get()
        let admin = try server.rawConnection(role: "postgres", database: database)
        return try admin.integer("""
            SELECT pg_catalog.count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity
            WHERE usename = $1 AND query LIKE $2 AND ($3::text IS NULL OR wait_event_type = 'Lock') AND pid <> pg_catalog.pg_backend_pid()
            """, [.text(role), .text(pattern), waitingForLock ? .text("lock") : .null(.text)]) ?? 0
    }

    /// Waits (up to 10 s) until no backend of `role` is left.
    static func waitUntilGone(role: String) async throws -> Bool {
        let admin = try PostgresTestServer.get().rawConnection(role: "postgres")
        for _ in 0..<1_000 {
            if try admin.integer("SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE usename = $1", [.text(role)]) == 0 {
                return true
            }
            try await Task.sleep(nanoseconds: 10_000_000)
        }
        return false
    }

    // MARK: Notifications

    @Test("a commit on one connection is announced on another, with the zone name only; a save that saves nothing is not")
    func commitAnnounced() async throws {
        let server = try PostgresTestServer.get()
        let owner = "owner-\(UUID().uuidString.lowercased())"
        let writer = try server.cloud(owner: owner), listening = try server.cloud(owner: owner)
        try await writer.createZone("notes")
        let saved = try await writer.modifyRecords([Self.record(1)], in: "notes")
        let heard = await ZoneChangeRecorder(listening)
        // Every record conflicts: nothing commits, nothing is announced.
        let conflicting = try await writer.modifyRecords([Self.record(1)], in: "notes")
        guard case .conflict = conflicting[0] else { Issue.record("expected a conflict"); return }
        // A real save, a metadata change, a new zone and a deletion are.
        var update = Self.record(1, tag: CloudDatabaseTests.tags(saved)[0])
        update.fields["title"]!.value = .text("a secret title")
        _ = try await writer.modifyRecords([update], in: "notes")
        #expect(await heard.waitFor("notes"))
        _ = try await writer.setZoneMetadata("notes", key: "k", value: Data([1]), ifCurrent: nil)
        #expect(await heard.waitFor("notes", count: 2))
        try await writer.createZone("drafts")
        try await writer.deleteZone("drafts")
        #expect(await heard.waitFor("drafts", count: 2))
        #expect(heard.zones == ["notes", "notes", "drafts", "drafts"])
        #expect(!heard.zones.contains { $0.contains("secret") })
    }

    @Test("a listener whose connection is terminated reconnects, announces every zone once, and hears later commits")
    func listenerReconnects() async throws {
        let server = try PostgresTestServer.get()
        let user = try server.makeUser("listener")
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: user.name))
        try await cloud.createZone("a")
        try await cloud.createZone("b")
        let heard = await ZoneChangeRecorder(cloud)
        #expect(try Self.terminate(role: user.name, query: "SELECT replica.listen%") == 1)
        #expect(await heard.waitUntil { heard.listenCount >= 2 })
        #expect(await heard.waitFor("b"))
        #expect(heard.zones.sorted() == ["a", "b"])
        _ = try await cloud.modifyRecords([Self.record(1)], in: "a")
        #expect(await heard.waitFor("a", count: 2))
    }

    // MARK: Errors

    @Test("a refused connection is networkUnavailable; a wrong password a permissionFailure naming the role, never the password")
    func connectionErrors() async throws {
        let server = try PostgresTestServer.get()
        let user = try server.makeUser("carol")
        let refused = try PostgresCloudDatabase(connectionString: "host=127.0.0.1 port=1 user=\(user.name) password=hunter2-secret connect_timeout=5")
        await #expect(throws: CloudError.networkUnavailable) { try await refused.createZone("z") }
        // The right password works over TCP; a wrong one is refused, and the message names the role only.
        let good = try PostgresCloudDatabase(connectionString: server.connectionString(role: user.name, password: user.password))
        try await good.createZone("z")
        let wrongPassword = "wrong-\(UUID().uuidString)"
        let url = "postgresql://\(user.name):\(wrongPassword)@127.0.0.1:\(server.tcpPort ?? "5432")/\(server.database)?sslmode=disable"
        let bad = try PostgresCloudDatabase(connectionString: url)
        do {
            try await bad.createZone("z")
            Issue.record("a wrong password was accepted")
        } catch {
            guard case let .permissionFailure(reason) = error else { Issue.record("got \(error)"); return }
            #expect(reason.contains(user.name))
            #expect(!reason.contains(wrongPassword) && !"\(error)".contains(wrongPassword))
            #expect(error.isTransient == false)
        }
        #expect(!bad.description.contains(wrongPassword))
        #expect(bad.description.contains(user.name))
        // An unknown database is refused as well.
        let nowhere = try PostgresCloudDatabase(connectionString: server.connectionString(role: user.name, database: "no_such_database"))
        await #expect { try await nowhere.createZone("z") } throws: { ($0 as? CloudError).map { if case .permissionFailure = $0 { true } else { false } } ?? false }
        // A malformed string is refused without echoing it.
        let malformed = "host=x password=\(wrongPassword) 'unterminated"
        #expect(throws: PostgresCloudDatabase.MalformedConnectionString()) { try PostgresCloudDatabase(connectionString: malformed) }
        #expect(!PostgresCloudDatabase.MalformedConnectionString().description.contains(wrongPassword))
    }

    @Test("a database without the replica schema is a transient serviceUnavailable saying to run replica-cloud init")
    func schemaMissing() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase(installing: false)
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(["dbname": database]))
        do {
            try await cloud.createZone("z")
            Issue.record("no error")
        } catch {
            guard case let .serviceUnavailable(reason) = error else { Issue.record("got \(error)"); return }
            #expect(reason.contains("replica-cloud init"))
            #expect(error.isTransient)
        }
    }

    @Test("SQLSTATEs map to what a device can act on: busy, quota, permission, network, invalid record")
    func errorMapping() {
        func map(_ state: String?, origin: PGFailure.Origin = .server) -> CloudError {
            PostgresErrorMapping.cloudError(for: PGFailure(origin: origin, sqlState: state, message: "message", role: "dave"))
        }
        for state in ["40001", "40P01", "55P03"] { #expect(map(state) == .zoneBusy(retryAfterMilliseconds: 100)) }
        #expect(map("53100") == .quotaExceeded)
        for state in ["28P01", "28000", "42501"] {
            guard case let .permissionFailure(reason) = map(state) else { Issue.record("\(state)"); continue }
            #expect(reason.contains("dave"))
        }
        for state in ["08006", "08001", "57P01", "57P02"] { #expect(map(state) == .networkUnavailable) }
        #expect(map(nil, origin: .connectionLost) == .networkUnavailable)
        #expect(map("RZ001") == .zoneNotFound)
        #expect(map("RZ002") == .changeTokenExpired)
        guard case .invalidRecord = map("22021"), case .invalidRecord = map("54000"), case .serviceUnavailable = map("57P03"),
              case .serviceUnavailable = map("53300") else {
            Issue.record("data exceptions are invalid records; a server starting up or full is unavailable")
            return
        }
        #expect(PostgresErrorMapping.connectError("connection to server at \"h\", port 1 failed: Connection refused", role: "r")
                == .networkUnavailable)
        guard case .permissionFailure = PostgresErrorMapping.connectError(
            "connection to server failed: FATAL:  password authentication failed for user \"r\"", role: "r"),
            case .serviceUnavailable = PostgresErrorMapping.connectError("FATAL:  the database system is starting up", role: "r")
        else {
            Issue.record("connect errors")
            return
        }
    }

    @Test("a stored body no device can read is reported with its page (ID, type, tag), never failing the page; a save with its tag replaces it")
    func unreadableStoredRecord() async throws {
        let server = try PostgresTestServer.get()
        let owner = "owner-\(UUID().uuidString.lowercased())"
        let cloud = try server.cloud(owner: owner)
        try await cloud.createZone("notes")
        _ = try await cloud.modifyRecords([Self.record(1), Self.record(2), Self.record(3)], in: "notes")
        let id2 = Self.record(2).recordID.uuidString.lowercased(), id3 = Self.record(3).recordID.uuidString.lowercased()
        // Record 2's body loses its fields; record 3's is not JSON at all.
        try server.superuserSQL("UPDATE replica.record SET body = convert_to('{\"recordType\":\"Note\",\"broken\":true}', 'UTF8') WHERE owner = '\(owner)' AND id = '\(id2)'")
        try server.superuserSQL("UPDATE replica.record SET body = '\\xff00'::bytea WHERE owner = '\(owner)' AND id = '\(id3)'")
        let page = try await cloud.fetchZoneChanges("notes", since: nil, limit: 10)
        #expect(page.records.map(\.recordID) == [Self.record(1).recordID])
        #expect(page.unreadable.map(\.recordID) == [Self.record(2).recordID, Self.record(3).recordID])
        #expect(page.unreadable.map(\.recordType) == ["Note", nil])
        #expect(page.unreadable.allSatisfy { $0.changeTag != nil && $0.reason.contains("unreadable") && !$0.reason.contains("broken") })
        // A save carrying the unreadable version's tag replaces it.
        let replaced = try await cloud.modifyRecords([Self.record(2, tag: page.unreadable[0].changeTag)], in: "notes")
        guard case .saved = replaced[0] else { Issue.record("not saved: \(replaced)"); return }
        let after = try await cloud.fetchZoneChanges("notes", since: nil, limit: 10)
        #expect(after.records.map(\.recordID) == [Self.record(1).recordID, Self.record(2).recordID])
        #expect(after.unreadable.map(\.recordID) == [Self.record(3).recordID])
    }

    @Test("bodies written as JSON (before the binary form) are still read, in pages and in conflicts; saves store binary bodies")
    func legacyJSONBodiesAreRead() async throws {
        let server = try PostgresTestServer.get()
        let owner = "owner-\(UUID().uuidString.lowercased())"
        let cloud = try server.cloud(owner: owner)
        try await cloud.createZone("notes")
        let tags = CloudDatabaseTests.tags(try await cloud.modifyRecords([Self.record(1), Self.record(2)], in: "notes"))
        let admin = try server.rawConnection(role: "postgres")
        func firstByte(_ n: Int) throws -> Int64? {
            try admin.integer("SELECT pg_catalog.get_byte(body, 0)::bigint FROM replica.record WHERE owner = $1 AND id = $2::text::uuid",
                              [.text(owner), .text(Self.record(n).recordID.uuidString.lowercased())])
        }
        #expect(try firstByte(1) == Int64(CloudRecordBody.marker) && firstByte(2) == Int64(CloudRecordBody.marker))
        // Record 1 as an older client stored it: JSON without the change tag.
        _ = try admin.query("UPDATE replica.record SET body = $1 WHERE owner = $2 AND id = $3::text::uuid",
                            [.bytea(try CloudRecordJSON.encode(Self.record(1))), .text(owner), .text(Self.record(1).recordID.uuidString.lowercased())],
                            prepare: false)
        #expect(try firstByte(1) == Int64(UInt8(ascii: "{")))
        let page = try await cloud.fetchZoneChanges("notes", since: nil, limit: 10)
        #expect(page.unreadable.isEmpty)
        #expect(page.records == [Self.record(1, tag: tags[0]), Self.record(2, tag: tags[1])])
        // A stale save conflicts and carries the JSON-stored record; a save on its tag stores a binary body again.
        let stale = try await cloud.modifyRecords([Self.record(1)], in: "notes")
        #expect(stale == [.conflict(serverRecord: Self.record(1, tag: tags[0]))])
        var edited = Self.record(1, tag: tags[0])
        edited.fields["title"]!.value = .text("edited")
        guard case .saved = try await cloud.modifyRecords([edited], in: "notes")[0] else { Issue.record("not saved"); return }
        #expect(try firstByte(1) == Int64(CloudRecordBody.marker))
    }

    @Test("a write that waits past the lock timeout on a busy zone is zoneBusy; retried later it saves")
    func lockTimeoutIsZoneBusy() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        try server.superuserSQL("ALTER FUNCTION replica.modify_records(text, text, uuid[], text[], boolean[], bytea[], text[]) SET lock_timeout = '150ms'",
                                database: database)
        let cloud = try server.cloud(owner: "busy", database: database)
        try await cloud.createZone("z")
        let holder = try server.rawConnection(role: "postgres", database: database)
        try holder.execute("BEGIN")
        _ = try holder.query("SELECT 1 FROM replica.zone WHERE owner = 'busy' FOR UPDATE", [], prepare: false)
        await #expect(throws: CloudError.zoneBusy(retryAfterMilliseconds: 100)) { try await cloud.modifyRecords([Self.record(1)], in: "z") }
        try holder.execute("COMMIT")
        guard case .saved = try await cloud.modifyRecords([Self.record(1)], in: "z")[0] else { Issue.record("not saved"); return }
    }

    @Test("a device whose role loses its privileges keeps its changes queued, reports permissionFailure, and uploads once they are back")
    func engineSurvivesRevokedPrivileges() async throws {
        let server = try PostgresTestServer.get()
        let user = try server.makeUser("revoked")
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: user.name))
        let device = try Device("device", seed: 12)
        try await drive(device, cloud)
        try server.superuserSQL("REVOKE replica_user FROM \(user.name)")
        device.context.insert(SyncNote(title: "written while refused", rating: 2))
        try device.context.save()
        try await drive(device, cloud, maxRequests: 12)
        let status = try device.engine.status()
        #expect(status.pendingRecords == 1)
        guard case let .permissionFailure(reason)? = status.lastError else {
            Issue.record("expected permissionFailure, got \(String(describing: status.lastError))")
            return
        }
        #expect(reason.contains(user.name))
        #expect(!reason.contains(user.password))
        try server.superuserSQL("GRANT replica_user TO \(user.name)")
        try await drive(device, cloud)
        #expect(try device.engine.status().pendingRecords == 0)
        #expect(try device.engine.status().lastError == nil)
        #expect(try await cloud.fetchZoneChanges("notes", since: nil, limit: 10).records.count == 1)
    }

    // MARK: Reconnection

    @Test("connections terminated between requests are replaced before the next request, which succeeds")
    func reconnectBetweenRequests() async throws {
        let server = try PostgresTestServer.get()
        let user = try server.makeUser("between")
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: user.name), maximumConnections: 2)
        try await cloud.createZone("z")
        #expect(try Self.terminate(role: user.name) >= 1)
        // Once the backends are gone, their last message and the end of their sockets have been sent.
        #expect(try await Self.waitUntilGone(role: user.name))
        _ = try await cloud.modifyRecords([Self.record(1)], in: "z")
        #expect(try await cloud.fetchZoneChanges("z", since: nil, limit: 10).records.count == 1)
    }

    @Test("a connection lost mid-request is networkUnavailable; repeating the request is safe and saves once")
    func reconnectMidRequest() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        let user = try server.makeUser("midway", database: database)
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: user.name, database: database))
        try await cloud.createZone("z")
        // Another session holds the zone's lock, so the save waits on the server; its connection is killed meanwhile.
        let holder = try server.rawConnection(role: "postgres", database: database)
        try holder.execute("BEGIN")
        _ = try holder.query("SELECT 1 FROM replica.zone WHERE owner = $1 FOR UPDATE", [.text(user.name)], prepare: false)
        let save = Task { try await cloud.modifyRecords([Self.record(1)], in: "z") }
        var killed: Int64 = 0
        for _ in 0..<1_000 where killed == 0 {
            try await Task.sleep(nanoseconds: 10_000_000)
            killed = try Self.terminate(role: user.name, query: "%modify_records%", waitingForLock: true, database: database)
        }
        #expect(killed == 1)
        do {
            _ = try await save.value
            Issue.record("the save survived its connection")
        } catch {
            #expect(error as? CloudError == .networkUnavailable)
        }
        try holder.execute("COMMIT")
        // The outcome was unknown to the client; the save is guarded by its change tag, so repeating it is safe.
        let repeated = try await cloud.modifyRecords([Self.record(1)], in: "z")
        guard case let .saved(_, tag) = repeated[0] else { Issue.record("not saved: \(repeated)"); return }
        let again = try await cloud.modifyRecords([Self.record(1)], in: "z")
        guard case let .conflict(serverRecord) = again[0] else { Issue.record("a repeat of a committed save must conflict"); return }
        #expect(serverRecord.changeTag == tag)
        #expect(serverRecord.fields == Self.record(1).fields)
        #expect(try await cloud.fetchZoneChanges("z", since: nil, limit: 10).records.count == 1)
    }

    // MARK: Pruning

    @Test("prune: tokens that saw the dropped tombstones stay valid, older ones expire; status counts what is kept")
    func pruneHorizon() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        let cloud = try server.cloud(owner: "pruned", database: database)
        try await cloud.createZone("z")
        let saved = try await cloud.modifyRecords((1...3).map { Self.record($0) }, in: "z")
        let beforeDelete = try await cloud.fetchZoneChanges("z", since: nil, limit: 10).token
        var tombstone = Self.record(2, tag: CloudDatabaseTests.tags(saved)[1])
        tombstone.causalLength = 2
        _ = try await cloud.modifyRecords([tombstone], in: "z")
        let afterDelete = try await cloud.fetchZoneChanges("z", since: nil, limit: 10).token
        let admin = try server.administration(database: database)
        #expect(try admin.status().zones.map { [$0.records, $0.tombstones, $0.oldestValidSequence] } == [[2, 1, 0]])
        // Keeping a day of history drops nothing.
        #expect(try admin.prune(keepingDays: 1).isEmpty)
        let pruned = try admin.prune(keepingDays: 0)
        #expect(pruned == [.init(owner: "pruned", name: "z", tombstonesDropped: 1, oldestValidSequence: 4)])
        let status = try admin.status().zones[0]
        #expect([status.records, status.tombstones, status.oldestValidSequence] == [2, 0, 4])
        #expect(status.epoch == afterDelete.epoch + 1)  // the next prune generation
        await #expect(throws: CloudError.changeTokenExpired) { try await cloud.fetchZoneChanges("z", since: beforeDelete, limit: 10) }
        let current = try await cloud.fetchZoneChanges("z", since: afterDelete, limit: 10)
        #expect(current.records.isEmpty)
        #expect(current.token == ServerChangeToken(epoch: afterDelete.epoch + 1, sequence: 4))

        // The 65536th prune generation does not fit: the zone takes a new incarnation and every older token expires.
        try server.superuserSQL("UPDATE replica.zone SET epoch = epoch | 65535", database: database)
        let lastGeneration = try await cloud.fetchZoneChanges("z", since: nil, limit: 10).token
        var second = Self.record(3, tag: CloudDatabaseTests.tags(saved)[2])
        second.causalLength = 2
        _ = try await cloud.modifyRecords([second], in: "z")
        let seenAll = try await cloud.fetchZoneChanges("z", since: lastGeneration, limit: 10).token
        #expect(try admin.prune(keepingDays: 0).count == 1)
        let renewed = try admin.status().zones[0].epoch
        #expect(renewed & 0xFFFF == 0)
        #expect(renewed >> 16 != seenAll.epoch >> 16)
        await #expect(throws: CloudError.changeTokenExpired) { try await cloud.fetchZoneChanges("z", since: seenAll, limit: 10) }
        #expect(try await cloud.fetchZoneChanges("z", since: nil, limit: 10).records.count == 1)
    }

    // MARK: Concurrency and statements

    @Test("many concurrent requests on one instance share its pool; unnamed statements (for poolers) work as prepared ones do")
    func poolAndStatements() async throws {
        let server = try PostgresTestServer.get()
        for prepares in [true, false] {
            let cloud = try server.cloud(maximumConnections: 3, preparesStatements: prepares)
            try await cloud.createZone("z")
            try await withThrowingTaskGroup(of: Void.self) { group in
                for n in 1...24 {
                    group.addTask {
                        _ = try await cloud.modifyRecords([Self.record(n)], in: "z")
                        _ = try await cloud.fetchZoneChanges("z", since: nil, limit: 5)
                    }
                }
                try await group.waitForAll()
            }
            #expect(try await cloud.fetchZoneChanges("z", since: nil, limit: 100).records.count == 24)
        }
    }

    // MARK: Sync engine

    /// A cloud that performs every request on `base` but loses the answer of the first `count` saves (as when the
    /// connection drops at commit): the device sees networkUnavailable for a save that committed.
    final class LosingSaveAnswers: CloudDatabase {
        let base: PostgresCloudDatabase
        let remaining: Atomic<Int>
        init(_ base: PostgresCloudDatabase, count: Int) {
            self.base = base
            remaining = Atomic(count)
        }
        func createZone(_ zone: String) async throws(CloudError) { try await base.createZone(zone) }
        func deleteZone(_ zone: String) async throws(CloudError) { try await base.deleteZone(zone) }
        func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
            let results = try await base.modifyRecords(records, in: zone)
            if remaining.subtract(1, ordering: .sequentiallyConsistent).oldValue > 0 { throw .networkUnavailable }
            return results
        }
        func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
            try await base.fetchZoneChanges(zone, since: token, limit: limit)
        }
        func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] { try await base.zoneMetadata(zone) }
        func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
            try await base.setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)
        }
    }

    @Test("two devices sync through PostgreSQL with the real engine and SyncDriver, also when save answers are lost after commit")
    func twoDevicesSync() async throws {
        let server = try PostgresTestServer.get()
        let owner = "devices-\(UUID().uuidString.lowercased())"
        let phone = try Device("phone", seed: 7), laptop = try Device("laptop", seed: 8)
        let phoneCloud = LosingSaveAnswers(try server.cloud(owner: owner), count: 2)
        let laptopCloud = try server.cloud(owner: owner)
        phone.context.insert(SyncNote(title: "from the phone", rating: 3))
        phone.context.insert(SyncNote(title: "also from the phone", rating: 1))
        try phone.context.save()
        let phoneStatus = try await SyncDriver.syncUntilIdle(phone.engine, with: phoneCloud)
        #expect(phoneStatus.isUpToDate)
        var laptopStatus = try await SyncDriver.syncUntilIdle(laptop.engine, with: laptopCloud)
        #expect(laptopStatus.isUpToDate)
        #expect(try laptop.notes().map(\.title).sorted() == ["also from the phone", "from the phone"])
        // The laptop edits one note and deletes the other; the phone sees both.
        var edited = try laptop.notes().first { $0.title == "from the phone" }!
        edited.rating = 5
        laptop.context.update(edited)
        let deleted = try laptop.notes().first { $0.title == "also from the phone" }!
        laptop.context.delete(deleted)
        try laptop.context.save()
        laptopStatus = try await SyncDriver.syncUntilIdle(laptop.engine, with: laptopCloud)
        #expect(laptopStatus.isUpToDate)
        #expect(try await SyncDriver.syncUntilIdle(phone.engine, with: phoneCloud).isUpToDate)
        #expect(try phone.notes().map { "\($0.title) \($0.rating)" } == ["from the phone 5"])
        // The cloud holds one version of each note: the lost answers caused no duplicates.
        let records = try await laptopCloud.fetchZoneChanges("notes", since: nil, limit: 100).records
        #expect(records.count == 2)
        #expect(records.filter(\.isAlive).count == 1)
    }
}
