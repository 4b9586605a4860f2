// Throwaway PostgreSQL clusters of a test's own (Scripts/postgres-cluster.sh): for tests that restart, stop or promote
// a server, or need several — never the shared server of Scripts/with-postgres.sh, which other tests use meanwhile.
import Foundation
import Testing
@testable import ReplicaPostgres

/// One cluster in a directory of its own, removed (server stopped, files deleted) when the value goes away.
final class PostgresCluster: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The cluster script: named by with-postgres.sh, else found from this file's place in the package.
    static var script: URL {
        if let path = ProcessInfo.processInfo.environment["REPLICA_POSTGRES_CLUSTER"], !path.isEmpty { return URL(fileURLWithPath: path) }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Scripts/postgres-cluster.sh")
    }

    /// The directory (socket included: keep it short, a Unix socket path has at most 107 bytes).
    let directory: URL
    let port: String
    /// A parent directory to remove with the cluster (the one made for a cluster and its standbys).
    private let parent: URL?
    /// The cluster a standby was made from: kept until the standby goes (it owns the parent directory).
    private let origin: PostgresCluster?

    private init(directory: URL, port: String, parent: URL?, origin: PostgresCluster? = nil) {
        self.directory = directory
        self.port = port
        self.parent = parent
        self.origin = origin
    }

    deinit {
        _ = try? Self.script(["remove", directory.path])
        if let parent { try? FileManager.default.removeItem(at: parent) }
    }

    /// Runs the cluster script; returns its standard output.
    @discardableResult
    static func script(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [script.path] + arguments
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        try process.run()
        let out = output.fileHandleForReading.readDataToEndOfFile(), err = error.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw Failure(description: "postgres-cluster.sh \(arguments.first ?? "") failed: \(String(decoding: err, as: UTF8.self))")
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func port(in output: String) throws -> String {
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("PORT=") }) else {
            throw Failure(description: "postgres-cluster.sh printed no port")
        }
        return String(line.dropFirst(5))
    }

    /// A new, empty parent directory for clusters (short, readable by the server's OS user).
    static func makeParent() throws -> URL {
        let parent = URL(fileURLWithPath: "/tmp/rpg-\(UUID().uuidString.prefix(8).lowercased())")
        try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o755])
        return parent
    }

    /// Starts a new cluster. `durable`: commits acknowledged only once their WAL is written (a crash loses none).
    static func start(durable: Bool = false, name: String = "a") throws -> PostgresCluster {
        let parent = try makeParent()
        let directory = parent.appendingPathComponent(name)
        let output = try script(["start", directory.path] + (durable ? ["--durable"] : []))
        return PostgresCluster(directory: directory, port: try port(in: output), parent: parent)
    }

    /// Starts an asynchronous streaming standby of this cluster (pg_basebackup -R), beside it.
    func standby(name: String = "b") throws -> PostgresCluster {
        let directory = directory.deletingLastPathComponent().appendingPathComponent(name)
        let output = try Self.script(["standby", self.directory.path, directory.path])
        return PostgresCluster(directory: directory, port: try Self.port(in: output), parent: nil, origin: self)
    }

    /// Crashes and restarts the server (`pg_ctl restart -m immediate`), same port.
    func restart() throws { try Self.script(["restart", directory.path]) }
    /// Stops the server (`fast` or `immediate`).
    func stop(_ mode: String = "fast") throws { try Self.script(["stop", directory.path, mode]) }
    /// Starts a stopped server again, same port.
    func launch() throws { try Self.script(["launch", directory.path]) }
    /// Promotes a standby (waits until it accepts writes).
    func promote() throws { try Self.script(["promote", directory.path]) }

    /// A keyword/value connection string to `database` as `role`, over the Unix socket (trusted).
    func connectionString(database: String = "postgres", role: String = "postgres") -> String {
        "host='\(directory.path)' port='\(port)' dbname='\(database)' user='\(role)'"
    }

    /// Runs `sql` as the superuser on `database`.
    func sql(_ sql: String, database: String = "postgres") throws {
        guard let options = PGConnectionOptions(connectionString(database: database)) else { throw Failure(description: "bad connection string") }
        try PGConnection.open(options).execute(sql)
    }

    /// The single value `sql` returns — a `text` column: cast others (`::text`) — as the superuser on `database`.
    func value(_ sql: String, database: String = "postgres") throws -> String? {
        guard let options = PGConnectionOptions(connectionString(database: database)) else { throw Failure(description: "bad connection string") }
        return try PGConnection.open(options).texts(sql).first?.first ?? nil
    }

    /// Makes database `name` with the replica schema and an app-backend role `backend` (trusted over the socket).
    func makeCloudDatabase(_ name: String = "replica_cloud", shard: Int? = nil) throws {
        try sql("CREATE DATABASE \(name)")
        let admin = try PostgresCloudAdministration(connectionString: connectionString(database: name))
        try admin.install()
        if let shard { try admin.setShard(shard) }
        try admin.addUser("backend", password: "backend-\(UUID().uuidString)", group: .app)
    }
}
