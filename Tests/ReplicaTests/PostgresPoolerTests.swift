import Foundation
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// PgBouncer, in transaction mode, in front of a cluster of the test's own (Scripts/postgres-cluster.sh pgbouncer): one
/// server connection serves every client transaction in turn.
final class PgBouncer: @unchecked Sendable {
    static var isInstalled: Bool {
        ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"].contains { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Missing PgBouncer = failure (CI, or REPLICA_REQUIRE_PGBOUNCER=1; `make setup` installs it), rather than a skip.
    static var isRequired: Bool {
        let environment = ProcessInfo.processInfo.environment
        return environment["REPLICA_REQUIRE_PGBOUNCER"] == "1" || environment["CI"].map { !$0.isEmpty && $0 != "0" && $0 != "false" } == true
    }

    static var shouldRun: Bool { PostgresTestServer.shouldRun && (isInstalled || isRequired) }

    let directory: URL
    let port: String
    let database: String

    /// Starts PgBouncer with database `database` of `cluster`, which it reaches as `role`.
    init(cluster: PostgresCluster, database: String, role: String) throws {
        directory = cluster.directory.deletingLastPathComponent().appendingPathComponent("pool")
        let output = try PostgresCluster.script(["pgbouncer", cluster.directory.path, directory.path, database, role])
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("PORT=") }) else {
            throw PostgresCluster.Failure(description: "postgres-cluster.sh pgbouncer printed no port")
        }
        port = String(line.dropFirst(5))
        self.database = database
    }

    deinit { _ = try? PostgresCluster.script(["pgbouncer-stop", directory.path]) }

    /// The connection string of the pooled database through PgBouncer as `role`.
    func connectionString(role: String) -> String { "host=127.0.0.1 port=\(port) dbname=\(database) user=\(role) sslmode=disable" }
}

@Suite("PostgreSQL behind PgBouncer", .enabled(if: PgBouncer.shouldRun, "the pooler tests need PgBouncer (apt-get install pgbouncer, or `make setup`)"))
struct PostgresPoolerTests {
    @Test("two users' app-backend requests interleaved through one transaction-mode pool stay apart; a transaction naming no owner sees nothing")
    func transactionModeIsolation() async throws {
        let cluster = try PostgresCluster.start()
        try cluster.makeCloudDatabase()
        let role = "backend"
        let bouncer = try PgBouncer(cluster: cluster, database: "replica_cloud", role: role)
        let suffix = UUID().uuidString.prefix(8).lowercased()
        let alice = "alice-\(suffix)", bob = "bob-\(suffix)"
        // Unnamed statements: PgBouncer before 1.21 keeps no prepared statements in transaction mode.
        let clouds = [alice: try PostgresCloudDatabase(connectionString: bouncer.connectionString(role: role), owner: alice, preparesStatements: false),
                      bob: try PostgresCloudDatabase(connectionString: bouncer.connectionString(role: role), owner: bob, preparesStatements: false)]
        for (_, cloud) in clouds { try await cloud.createZone("notes") }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for n in 1...20 {
                for owner in [alice, bob] {
                    group.addTask {
                        let cloud = clouds[owner]!
                        var record = CloudDatabaseTests.record(n)
                        record.fields["title"]!.value = .text("\(owner) \(n)")
                        _ = try await cloud.modifyRecords([record], in: "notes")
                        let seen = try await cloud.fetchZoneChanges("notes", since: nil, limit: 100).records
                        #expect(seen.allSatisfy { if case let .text(title)? = $0.fields["title"]?.value { title.hasPrefix(owner) } else { false } },
                                "\(owner) saw another user's record")
                        _ = try await cloud.setZoneMetadata("notes", key: "k\(n)", value: Data(owner.utf8), ifCurrent: nil)
                    }
                }
            }
            try await group.waitForAll()
        }
        for (owner, cloud) in clouds {
            let records = try await cloud.fetchZoneChanges("notes", since: nil, limit: 100).records
            #expect(records.count == 20)
            #expect(Set(records.compactMap { if case let .text(title)? = $0.fields["title"]?.value { title } else { nil } })
                    == Set((1...20).map { "\(owner) \($0)" }))
            #expect(try await cloud.zoneMetadata("notes").values.allSatisfy { $0 == Data(owner.utf8) })
        }
        // Every request went through one server connection of the pooled role.
        #expect(try cluster.value("SELECT pg_catalog.count(*)::text FROM pg_catalog.pg_stat_activity WHERE usename = 'backend'") == "1")
        // Hand-written SQL through the same pool: the owner holds for its transaction only. The next transaction, on the
        // very server connection that just served Alice, names nobody and sees nothing.
        guard let options = PGConnectionOptions(bouncer.connectionString(role: role)) else { Issue.record("bad string"); return }
        let raw = try PGConnection.open(options)
        try raw.execute("BEGIN")
        _ = try raw.texts("SELECT pg_catalog.set_config('replica.owner', $1, true)", [alice])
        #expect(try raw.integer("SELECT pg_catalog.count(*) FROM replica.record") == 20)
        try raw.execute("COMMIT")
        #expect(try raw.integer("SELECT pg_catalog.count(*) FROM replica.record") == 0)
        #expect(try raw.integer("SELECT pg_catalog.count(*) FROM replica.zone") == 0)
        #expect(throws: PGFailure.self) { try raw.texts("SELECT out_epoch FROM replica.fetch_changes(NULL, 'notes', NULL, NULL, 10)") }
        withExtendedLifetime((cluster, bouncer)) {}
    }
}
