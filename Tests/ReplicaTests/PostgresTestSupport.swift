// The PostgreSQL server the tests of PostgresCloudDatabase use: the throwaway cluster of Scripts/with-postgres.sh
// (`make test`), named by REPLICA_TEST_POSTGRES_URL. Without it the PostgreSQL tests fail when CI is set or
// REPLICA_REQUIRE_POSTGRES=1 (make and the script set it), and are skipped with a message for a plain `swift test`.
import Foundation
import Synchronization
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// The test server: the schema installed in its test database once per test process, an app-backend role for the
/// contract tests, and helpers for roles and databases of a test's own (tests run in parallel, so each one works
/// under owners, roles or databases nobody else uses).
struct PostgresTestServer: Sendable {
    struct Unavailable: Error, CustomStringConvertible {
        var description: String
    }

    static let skipMessage = "the PostgreSQL tests need a server: run `make test` or `Scripts/with-postgres.sh swift test` "
        + "(or set REPLICA_TEST_POSTGRES_URL to a database this user may administer)"

    private static var environment: [String: String] { ProcessInfo.processInfo.environment }
    static var url: String? { environment["REPLICA_TEST_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 } }
    /// Missing server = failure (CI, make), rather than a skip.
    static var isRequired: Bool {
        environment["REPLICA_REQUIRE_POSTGRES"] == "1" || environment["CI"].map { !$0.isEmpty && $0 != "0" && $0 != "false" } == true
    }
    /// Whether the PostgreSQL tests run: the server is there, or must be (and they fail without it).
    static var shouldRun: Bool { url != nil || isRequired }

    /// The role of the app backend the contract tests connect as (each test with an owner of its own).
    static let appRole = "replica_test_backend"

    /// libpq's options of the superuser URL (host, port, database, user…).
    let base: [(keyword: String, value: String)]
    /// The TCP port the server listens on at 127.0.0.1 (for password logins).
    let tcpPort: String?
    let database: String

    private static let shared: Mutex<Result<PostgresTestServer, Unavailable>?> = Mutex(nil)

    /// The server, set up on first use.
    /// - Throws: ``Unavailable`` when there is no server (only reached when ``isRequired``: otherwise the tests are
    ///   skipped first) or it cannot be set up.
    static func get() throws -> PostgresTestServer {
        try shared.withLock { cached in
            if cached == nil { cached = Result { () throws(Unavailable) in try make() } }
            return try cached!.get()
        }
    }

    private static func make() throws(Unavailable) -> PostgresTestServer {
        guard let url else {
            throw Unavailable(description: "REPLICA_TEST_POSTGRES_URL is not set although the PostgreSQL tests are required "
                + "(CI or REPLICA_REQUIRE_POSTGRES=1): \(skipMessage)")
        }
        guard let options = PGConnectionOptions(url) else { throw Unavailable(description: "REPLICA_TEST_POSTGRES_URL cannot be parsed") }
        let server = PostgresTestServer(base: options.options, tcpPort: environment["REPLICA_TEST_POSTGRES_PORT"],
                                        database: options.value("dbname") ?? "postgres")
        do {
            let admin = try PostgresCloudAdministration(connectionString: url)
            try admin.install()
            try admin.addUser(appRole, password: "backend-\(UUID().uuidString)", group: .app)
        } catch {
            throw Unavailable(description: "the PostgreSQL test server cannot be set up: \(error)")
        }
        return server
    }

    /// A keyword/value connection string: the superuser URL with `overrides` (quoted for libpq).
    func connectionString(_ overrides: [String: String] = [:]) -> String {
        var pairs = base.filter { overrides[$0.keyword] == nil }
        for key in overrides.keys.sorted() { pairs.append((key, overrides[key]!)) }
        return pairs.map { "\($0.keyword)='\($0.value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'"))'" }
            .joined(separator: " ")
    }

    /// The connection string of `role` on `database` (default: the test database): over the Unix socket (trusted,
    /// no password), or with `password` over TCP at 127.0.0.1 (scram-sha-256).
    func connectionString(role: String, database: String? = nil, password: String? = nil) -> String {
        var overrides = ["user": role, "dbname": database ?? self.database]
        if let password {
            overrides["host"] = "127.0.0.1"
            overrides["port"] = tcpPort ?? "5432"
            overrides["password"] = password
            overrides["sslmode"] = "disable"
        }
        return connectionString(overrides)
    }

    /// A cloud acting for an owner of its own through the app-backend role (the contract tests).
    func cloud(owner: String = "owner-\(UUID().uuidString.lowercased())", database: String? = nil, maximumConnections: Int = 4,
               preparesStatements: Bool = true) throws -> PostgresCloudDatabase {
        try PostgresCloudDatabase(connectionString: connectionString(role: Self.appRole, database: database), owner: owner,
                                  maximumConnections: maximumConnections, preparesStatements: preparesStatements)
    }

    /// The superuser's administration connection to `database` (default: the test database).
    func administration(database: String? = nil) throws -> PostgresCloudAdministration {
        try PostgresCloudAdministration(connectionString: connectionString(["dbname": database ?? self.database]))
    }

    /// A new database with the schema installed (for tests that prune, report status or install: they see every
    /// zone of their database).
    func freshDatabase(installing: Bool = true) throws -> String {
        let name = "replica_\(UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(16))"
        try superuserSQL("CREATE DATABASE \(name)")
        if installing { try administration(database: name).install() }
        return name
    }

    /// A per-user login role (`replica_user`) with a fresh name and password.
    func makeUser(_ prefix: String, database: String? = nil) throws -> (name: String, password: String) {
        let name = "\(prefix)_\(UUID().uuidString.lowercased().prefix(8))"
        let password = "pw-\(UUID().uuidString)"
        try administration(database: database).addUser(name, password: password, group: .user)
        return (name, password)
    }

    /// Runs `sql` (no parameters) as the superuser on `database`.
    func superuserSQL(_ sql: String, database: String? = nil) throws {
        guard let options = PGConnectionOptions(connectionString(["dbname": database ?? self.database])) else {
            throw Unavailable(description: "bad connection string")
        }
        let connection = try PGConnection.open(options)
        try connection.execute(sql)
    }

    /// A raw connection as `role` (hand-written SQL in the isolation tests).
    func rawConnection(role: String, database: String? = nil) throws -> PGConnection {
        guard let options = PGConnectionOptions(connectionString(role: role, database: database)) else {
            throw Unavailable(description: "bad connection string")
        }
        return try PGConnection.open(options)
    }
}

extension PGConnection {
    /// The rows of `sql` with text parameters, as text (test convenience).
    func texts(_ sql: String, _ parameters: [String?] = []) throws -> [[String?]] {
        let rows = try query(sql, parameters.map { PGParameter.text($0) }, prepare: false)
        return (0..<rows.count).map { row in (0..<rows.columns).map { rows.string(row, $0) } }
    }

    /// The single integer `sql` returns (bigint in binary), e.g. a count.
    func integer(_ sql: String, _ parameters: [PGParameter] = []) throws -> Int64? {
        try query(sql, parameters, prepare: false).int64(0, 0)
    }
}

extension PGFailure: CustomStringConvertible {
    public var description: String { "PGFailure(\(origin), \(sqlState ?? "-"), \(message))" }
}

/// Collects what a ``PostgresCloudDatabase/zoneChanges()`` sequence announces, so a test can wait for an
/// announcement with a timeout (a missing one fails the test instead of hanging it).
final class ZoneChangeRecorder: Sendable {
    private final class Log: Sendable {
        let received = Mutex<[String]>([])
        let listens = Atomic<Int>(0)
    }

    private let log = Log()
    private let task = Mutex<Task<Void, Never>?>(nil)

    /// Starts listening on `cloud`; returns once the listening connection is up.
    init(_ cloud: PostgresCloudDatabase) async {
        let log = self.log
        let stream = cloud.zoneChanges(onListening: { log.listens.add(1, ordering: .sequentiallyConsistent) })
        task.withLock { $0 = Task { for await zone in stream { log.received.withLock { $0.append(zone) } } } }
        _ = await waitUntil { log.listens.load(ordering: .sequentiallyConsistent) >= 1 }
    }

    deinit { task.withLock { $0?.cancel() } }

    /// Stops listening (the sequence ends, its connection closes).
    func stop() { task.withLock { $0?.cancel() } }

    var zones: [String] { log.received.withLock { $0 } }
    /// How many times the listening connection has (re)connected.
    var listenCount: Int { log.listens.load(ordering: .sequentiallyConsistent) }

    /// Waits until `condition` holds, checking every 10 ms for at most `seconds`; returns whether it held.
    func waitUntil(seconds: Double = 10, _ condition: @Sendable () -> Bool) async -> Bool {
        for _ in 0..<Int(seconds * 100) {
            if condition() { return true }
            try? await Task.sleep(nanoseconds: 10_000_000)
        }
        return condition()
    }

    /// Waits until `zone` has been announced `count` times in all.
    func waitFor(_ zone: String, count: Int = 1, seconds: Double = 10) async -> Bool {
        await waitUntil(seconds: seconds) { self.zones.filter { $0 == zone }.count >= count }
    }
}
