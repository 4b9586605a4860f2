import Foundation
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// The output and exit status of one `replica-cloud` run.
struct CommandResult {
    var status: Int32
    var output: String
    var error: String
    var all: String { output + error }
}

/// Runs the `replica-cloud` executable (built beside the test bundle) with `arguments`, `environment` added to this
/// process's (minus REPLICA_CLOUD_*), and `input` on standard input.
func replicaCloud(_ arguments: [String], environment: [String: String] = [:], input: String = "") throws -> CommandResult {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent("replica-cloud").path) {
        directory = directory.deletingLastPathComponent()
    }
    let process = Process()
    process.executableURL = directory.appendingPathComponent("replica-cloud")
    process.arguments = arguments
    var variables = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("REPLICA_CLOUD_") }
    for (key, value) in environment { variables[key] = value }
    process.environment = variables
    let output = Pipe(), error = Pipe(), stdin = Pipe()
    process.standardOutput = output
    process.standardError = error
    process.standardInput = stdin
    try process.run()
    stdin.fileHandleForWriting.write(Data(input.utf8))
    try stdin.fileHandleForWriting.close()
    let out = output.fileHandleForReading.readDataToEndOfFile(), err = error.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return CommandResult(status: process.terminationStatus, output: String(decoding: out, as: UTF8.self),
                         error: String(decoding: err, as: UTF8.self))
}

/// `replica-cloud`: schema set-up and upgrades, users, status and pruning, with exit codes 0/1/2 and no secret ever
/// printed.
@Suite("replica-cloud command", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct ReplicaCloudCommandTests {
    @Test("init installs the schema, is idempotent, upgrades an older one keeping its data, and refuses a newer one")
    func initAndUpgrade() async throws {
        let server = try PostgresTestServer.get()
        let fresh = try server.freshDatabase(installing: false)
        let url = server.connectionString(["dbname": fresh])
        let first = try replicaCloud(["init", url])
        #expect(first.status == 0, "\(first.all)")
        #expect(first.output.contains("installed to version \(PostgresCloudSchema.currentVersion)"))
        let again = try replicaCloud(["init", "--url", url])
        #expect(again.status == 0)
        #expect(again.output.contains("already at version \(PostgresCloudSchema.currentVersion)"))
        #expect(try server.administration(database: fresh).schemaVersion() == PostgresCloudSchema.currentVersion)

        // A database at version 1 (tables, no functions yet) with a zone in it: init upgrades it, the zone stays.
        let old = try server.freshDatabase(installing: false)
        try server.administration(database: old).install(upTo: 1)
        try server.superuserSQL("INSERT INTO replica.zone (owner, name, epoch) VALUES ('kept', 'notes', 65536)", database: old)
        let upgrade = try replicaCloud(["init", server.connectionString(["dbname": old])])
        #expect(upgrade.status == 0, "\(upgrade.all)")
        #expect(upgrade.output.contains("upgraded from version 1 to version \(PostgresCloudSchema.currentVersion)"))
        let cloud = try server.cloud(owner: "kept", database: old)
        _ = try await cloud.modifyRecords([CloudDatabaseTests.record(1)], in: "notes")
        #expect(try await cloud.fetchZoneChanges("notes", since: nil, limit: 10).records.count == 1)

        // A schema newer than the tool: refused, nothing changed.
        try server.superuserSQL("UPDATE replica.schema_version SET version = 99", database: old)
        let newer = try replicaCloud(["init", server.connectionString(["dbname": old])])
        #expect(newer.status == 1)
        #expect(newer.error.contains("version 99, newer than this tool's"))
    }

    @Test("add-user takes the password from the environment or standard input, never prints it, and the role can log in")
    func addUser() async throws {
        let server = try PostgresTestServer.get()
        let url = server.connectionString([:])
        let name = "cli_\(UUID().uuidString.lowercased().prefix(8))", password = "pw-\(UUID().uuidString)"
        let made = try replicaCloud(["add-user", name, "--url", url], environment: ["REPLICA_CLOUD_PASSWORD": password])
        #expect(made.status == 0, "\(made.all)")
        #expect(made.output.contains("role '\(name)' created in replica_user"))
        #expect(!made.all.contains(password))
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: name, password: password))
        try await cloud.createZone("z")

        // A new password from standard input; the old one no longer works.
        let second = "pw2-\(UUID().uuidString)"
        let updated = try replicaCloud(["add-user", name], environment: ["REPLICA_CLOUD_URL": url], input: second + "\n")
        #expect(updated.status == 0, "\(updated.all)")
        #expect(updated.output.contains("updated"))
        #expect(!updated.all.contains(second))
        try await PostgresCloudDatabase(connectionString: server.connectionString(role: name, password: second)).createZone("z")
        await #expect(throws: CloudError.self) {
            try await PostgresCloudDatabase(connectionString: server.connectionString(role: name, password: password)).createZone("z")
        }

        // An app backend role; a user role cannot also become one.
        let app = "cliapp_\(UUID().uuidString.lowercased().prefix(8))"
        #expect(try replicaCloud(["add-user", app, "--app", "--url", url], environment: ["REPLICA_CLOUD_PASSWORD": password]).status == 0)
        let both = try replicaCloud(["add-user", name, "--app", "--url", url], environment: ["REPLICA_CLOUD_PASSWORD": password])
        #expect(both.status == 2)
        #expect(both.error.contains("already a member of replica_user"))
        // No password at all: a usage error.
        let none = try replicaCloud(["add-user", "nobody_\(UUID().uuidString.prefix(4))", "--url", url])
        #expect(none.status == 2)
        #expect(none.error.contains("no password"))
    }

    @Test("status lists every zone with its counts; prune drops old tombstones; a non-administrator is refused")
    func statusAndPrune() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        let url = server.connectionString(["dbname": database])
        let cloud = try server.cloud(owner: "carol", database: database)
        try await cloud.createZone("notes")
        let saved = try await cloud.modifyRecords([CloudDatabaseTests.record(1), CloudDatabaseTests.record(2)], in: "notes")
        var tombstone = CloudDatabaseTests.record(2, tag: CloudDatabaseTests.tags(saved)[1])
        tombstone.causalLength = 2
        _ = try await cloud.modifyRecords([tombstone], in: "notes")

        let status = try replicaCloud(["status", "--url", url])
        #expect(status.status == 0, "\(status.all)")
        #expect(status.output.contains("1 zone(s)"))
        #expect(status.output.contains("carol\tnotes\t1\t1\t3\t0\t"))
        let pruned = try replicaCloud(["prune", "--keep", "0", "--url", url])
        #expect(pruned.status == 0, "\(pruned.all)")
        #expect(pruned.output.contains("carol/notes: dropped 1 tombstone(s); tokens before sequence 3 now expire"))
        #expect(try replicaCloud(["status", "--url", url]).output.contains("carol\tnotes\t1\t0\t3\t3\t-"))

        let user = try server.makeUser("plain", database: database)
        let refused = try replicaCloud(["status", "--url", server.connectionString(role: user.name, database: database)])
        #expect(refused.status == 1)
        #expect(refused.error.contains("cannot see every user's zones"))
    }

    @Test("usage errors exit 2, failures exit 1, and a connection string's password is never printed")
    func exitCodesAndSecrets() throws {
        #expect(try replicaCloud([]).status == 2)
        #expect(try replicaCloud(["frobnicate"]).status == 2)
        #expect(try replicaCloud(["prune", "--url", "host=/nowhere"]).status == 2)
        #expect(try replicaCloud(["prune", "--keep", "-1", "--url", "host=/nowhere"]).status == 2)
        #expect(try replicaCloud(["help"]).status == 0)
        let secret = "s3cret-\(UUID().uuidString)"
        for url in ["postgresql://someone:\(secret)@127.0.0.1:1/db?connect_timeout=5", "host=127.0.0.1 port=1 password=\(secret)",
                    "host=x password=\(secret) 'unterminated"] {
            let result = try replicaCloud(["status", "--url", url])
            #expect(result.status == 1, "\(result.all)")
            #expect(!result.all.contains(secret))
        }
        let server = try PostgresTestServer.get()
        let user = try server.makeUser("wrongpw")
        let wrong = try replicaCloud(["status", "--url", server.connectionString(role: user.name, password: secret)])
        #expect(wrong.status == 1)
        #expect(wrong.error.contains("password authentication failed"))
        #expect(!wrong.all.contains(secret))
    }
}
