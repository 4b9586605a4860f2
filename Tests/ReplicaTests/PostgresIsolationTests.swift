import Foundation
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// Per-user isolation by PostgreSQL itself (row-level security, forced): one database, many users, each user's zones
/// visible to that user only — through the cloud API and through hand-written SQL on the same connection.
@Suite("PostgreSQL per-user isolation", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresIsolationTests {
    static let tables = ["zone", "zone_incarnation", "record", "zone_metadata", "owner_channel"]

    /// Alice's zone "notes" with two records and metadata, and a listener channel.
    static func seed(_ alice: PostgresCloudDatabase) async throws -> ZoneChangeBatch {
        try await alice.createZone("notes")
        _ = try await alice.modifyRecords([CloudDatabaseTests.record(1), CloudDatabaseTests.record(2)], in: "notes")
        _ = try await alice.setZoneMetadata("notes", key: "schema", value: Data("alice's schema".utf8), ifCurrent: nil)
        let listener = await ZoneChangeRecorder(alice)  // gives the owner a notification channel
        try await alice.createZone("other")
        #expect(await listener.waitFor("other"))
        listener.stop()
        return try await alice.fetchZoneChanges("notes", since: nil, limit: 10)
    }

    /// Every cloud operation of `intruder` on the zone "notes" fails as if it did not exist, or with a permission
    /// failure; its own zone of the same name is its own.
    static func expectNoAccess(_ intruder: PostgresCloudDatabase) async throws {
        await #expect(throws: CloudError.zoneNotFound) { try await intruder.fetchZoneChanges("notes", since: nil, limit: 10) }
        await #expect(throws: CloudError.zoneNotFound) { try await intruder.zoneMetadata("notes") }
        await #expect(throws: CloudError.zoneNotFound) {
            try await intruder.modifyRecords([CloudDatabaseTests.record(1)], in: "notes")
        }
        await #expect(throws: CloudError.zoneNotFound) {
            try await intruder.setZoneMetadata("notes", key: "schema", value: Data("mine".utf8), ifCurrent: nil)
        }
        await #expect(throws: CloudError.zoneNotFound) { try await intruder.deleteZone("notes") }
        // Creating "notes" makes the intruder's own, empty zone.
        try await intruder.createZone("notes")
        #expect(try await intruder.fetchZoneChanges("notes", since: nil, limit: 10).records.isEmpty)
        #expect(try await intruder.zoneMetadata("notes").isEmpty)
        _ = try await intruder.modifyRecords([CloudDatabaseTests.record(1)], in: "notes")
    }

    /// Alice's zone is as she left it.
    static func expectIntact(_ alice: PostgresCloudDatabase, _ before: ZoneChangeBatch) async throws {
        let after = try await alice.fetchZoneChanges("notes", since: nil, limit: 10)
        #expect(after == before)
        #expect(try await alice.zoneMetadata("notes") == ["schema": Data("alice's schema".utf8)])
    }

    /// The number of rows of `owner` `connection` sees in each table.
    static func visibleRows(_ connection: PGConnection, owner: String) throws -> [Int64] {
        try tables.map { try connection.integer("SELECT pg_catalog.count(*) FROM replica.\($0) WHERE owner = $1", [.text(owner)]) ?? -1 }
    }

    /// `sql` fails on `connection` with `sqlState`.
    static func expectRefused(_ connection: PGConnection, _ sql: String, _ parameters: [PGParameter] = [], sqlState: String,
                              sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            _ = try connection.query(sql, parameters, prepare: false)
            Issue.record("ran: \(sql)", sourceLocation: sourceLocation)
        } catch {
            #expect(error.sqlState == sqlState, "\(sql): \(error)", sourceLocation: sourceLocation)
        }
    }

    @Test("a role per user: another user's role reaches nothing of Alice's, through the cloud or hand-written SQL")
    func rolePerUser() async throws {
        let server = try PostgresTestServer.get()
        let alice = try server.makeUser("alice"), bob = try server.makeUser("bob")
        let aliceCloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: alice.name))
        let bobCloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: bob.name))
        let before = try await Self.seed(aliceCloud)
        try await Self.expectNoAccess(bobCloud)

        // Naming Alice as the owner does not help a per-user role: it may act only as itself.
        let posing = try PostgresCloudDatabase(connectionString: server.connectionString(role: bob.name), owner: alice.name)
        do {
            _ = try await posing.fetchZoneChanges("notes", since: nil, limit: 10)
            Issue.record("bob acted as alice")
        } catch {
            guard case let .permissionFailure(reason) = error else { Issue.record("got \(error)"); return }
            #expect(reason.contains(bob.name))
        }

        // Hand-written SQL on Bob's own connection.
        let sql = try server.rawConnection(role: bob.name)
        #expect(try Self.visibleRows(sql, owner: alice.name) == [0, 0, 0, 0, 0])
        _ = try sql.query("SELECT pg_catalog.set_config('replica.owner', $1, false)", [.text(alice.name)], prepare: false)
        #expect(try Self.visibleRows(sql, owner: alice.name) == [0, 0, 0, 0, 0])
        #expect(try sql.integer("WITH changed AS (UPDATE replica.record SET body = '\\x00'::bytea WHERE owner = $1 RETURNING 1) "
                                + "SELECT pg_catalog.count(*) FROM changed", [.text(alice.name)]) == 0)
        #expect(try sql.integer("WITH gone AS (DELETE FROM replica.zone WHERE owner = $1 RETURNING 1) SELECT pg_catalog.count(*) FROM gone",
                                [.text(alice.name)]) == 0)
        Self.expectRefused(sql, "INSERT INTO replica.zone (owner, name, epoch) VALUES ($1, 'planted', 65536)",
                           [.text(alice.name)], sqlState: "42501")
        Self.expectRefused(sql, "INSERT INTO replica.owner_channel (owner, channel) VALUES ($1, 'replica_eavesdrop')",
                           [.text(alice.name)], sqlState: "42501")
        Self.expectRefused(sql, "SELECT * FROM replica.fetch_changes($1, 'notes', NULL, NULL, 10)", [.text(alice.name)], sqlState: "42501")
        Self.expectRefused(sql, "SELECT replica.prune_zone(1, 0)", sqlState: "42501")
        Self.expectRefused(sql, "ALTER TABLE replica.record DISABLE ROW LEVEL SECURITY", sqlState: "42501")
        Self.expectRefused(sql, "ALTER TABLE replica.record NO FORCE ROW LEVEL SECURITY", sqlState: "42501")
        Self.expectRefused(sql, "DROP POLICY owner_is_role ON replica.record", sqlState: "42501")
        Self.expectRefused(sql, "SELECT replica.create_login('mallory', 'x', 'replica_admin')", sqlState: "42501")
        Self.expectRefused(sql, "GRANT replica_admin TO CURRENT_USER", sqlState: "42501")
        Self.expectRefused(sql, "TRUNCATE replica.record", sqlState: "42501")
        // Turning row security off does not reveal rows: the query is refused instead.
        _ = try sql.query("SELECT pg_catalog.set_config('row_security', 'off', false)", [], prepare: false)
        Self.expectRefused(sql, "SELECT pg_catalog.count(*) FROM replica.record", sqlState: "42501")

        // Alice's own connection sees her rows — and Bob's only zone, "notes" of his own, stays out of it.
        let aliceSQL = try server.rawConnection(role: alice.name)
        #expect(try Self.visibleRows(aliceSQL, owner: alice.name) == [2, 2, 2, 1, 1])
        #expect(try Self.visibleRows(aliceSQL, owner: bob.name) == [0, 0, 0, 0, 0])
        try await Self.expectIntact(aliceCloud, before)
    }

    @Test("an app backend on one pooled role: the owner set per transaction sees only that owner's zones, and nothing without one")
    func appBackend() async throws {
        let server = try PostgresTestServer.get()
        let alice = "alice-\(UUID().uuidString.lowercased())", bob = "bob-\(UUID().uuidString.lowercased())"
        let aliceCloud = try server.cloud(owner: alice), bobCloud = try server.cloud(owner: bob)
        let before = try await Self.seed(aliceCloud)
        try await Self.expectNoAccess(bobCloud)

        // The backend role without an owner acts for nobody.
        let ownerless = try PostgresCloudDatabase(connectionString: server.connectionString(role: PostgresTestServer.appRole))
        do {
            _ = try await ownerless.fetchZoneChanges("notes", since: nil, limit: 10)
            Issue.record("a backend without an owner read a zone")
        } catch {
            guard case .permissionFailure = error else { Issue.record("got \(error)"); return }
        }

        // Hand-written SQL on the backend's connection: nothing without an owner; with Bob set for a transaction,
        // Bob's rows only; after that transaction, nothing again (SET LOCAL: safe behind a transaction pooler).
        let sql = try server.rawConnection(role: PostgresTestServer.appRole)
        #expect(try Self.visibleRows(sql, owner: alice) == [0, 0, 0, 0, 0])
        #expect(try sql.integer("SELECT pg_catalog.count(*) FROM replica.zone") == 0)
        try sql.execute("BEGIN")
        _ = try sql.query("SELECT pg_catalog.set_config('replica.owner', $1, true)", [.text(bob)], prepare: false)
        #expect(try Self.visibleRows(sql, owner: alice) == [0, 0, 0, 0, 0])
        #expect(try sql.integer("SELECT pg_catalog.count(*) FROM replica.record") == 1)
        Self.expectRefused(sql, "INSERT INTO replica.zone (owner, name, epoch) VALUES ($1, 'planted', 65536)", [.text(alice)],
                           sqlState: "42501")
        try sql.execute("ROLLBACK")
        #expect(try sql.integer("SELECT pg_catalog.count(*) FROM replica.record") == 0)
        try sql.execute("BEGIN")
        _ = try sql.query("SELECT pg_catalog.set_config('replica.owner', $1, true)", [.text(alice)], prepare: false)
        #expect(try Self.visibleRows(sql, owner: alice) == [2, 2, 2, 1, 1])
        try sql.execute("COMMIT")
        #expect(try Self.visibleRows(sql, owner: alice) == [0, 0, 0, 0, 0])
        try await Self.expectIntact(aliceCloud, before)
    }

    @Test("notifications reach only the owner's listeners: another user's commits are never announced to them")
    func notificationsStayWithTheirOwner() async throws {
        let server = try PostgresTestServer.get()
        let alice = try server.cloud(), bob = try server.cloud()
        try await alice.createZone("mine")
        try await bob.createZone("theirs")
        let bobHears = await ZoneChangeRecorder(bob), aliceHears = await ZoneChangeRecorder(alice)
        _ = try await alice.modifyRecords([CloudDatabaseTests.record(1)], in: "mine")
        try await alice.createZone("also-mine")
        #expect(await aliceHears.waitFor("also-mine"))
        // Bob's listener is up and hears his own commit, after Alice's: hers never reached it.
        _ = try await bob.modifyRecords([CloudDatabaseTests.record(1)], in: "theirs")
        #expect(await bobHears.waitFor("theirs"))
        #expect(bobHears.zones == ["theirs"])
        #expect(aliceHears.zones == ["mine", "also-mine"])
    }
}
