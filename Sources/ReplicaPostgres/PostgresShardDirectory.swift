import Foundation
import Replica

/// Where one owner's zones live: a shard of the PostgreSQL cloud (``PostgresShardDirectory``).
public struct PostgresShardLocation: Equatable, Sendable {
    /// The shard's id (0 … 32767): `replica.server.shard` of its database, part of every epoch it issues.
    public var shard: Int
    /// The shard's libpq connection string, without credentials (each device adds its own).
    public var connection: String

    public init(shard: Int, connection: String) {
        self.shard = shard
        self.connection = connection
    }
}

/// The user → shard map of a sharded PostgreSQL cloud: a database (the directory — a small one of its own, or one of
/// the shards) whose `replica.placement` names the shard of each owner and `replica.shard_endpoint` how to reach
/// it (`Specs/cloud-postgres.md` §13). A device (or an app backend) asks it once where its owner's zones live, then
/// connects to that shard with its own credentials.
///
/// Each shard is an independent PostgreSQL server (or primary with its standbys) whose `replica.server.shard` is set
/// by `replica-cloud init --shard N`; that id is part of the epoch of every zone it creates, so a token or change tag
/// of one shard never matches another: a device whose owner moved to another shard finds its token expired there
/// and resyncs in full, uploading what the new shard lacks.
public final class PostgresShardDirectory: CustomStringConvertible {
    private let pool: ConnectionPool
    private let options: PGConnectionOptions
    /// The owner an app backend asks for; `nil` when the connecting role is the owner.
    public let owner: String?

    /// The libpq keywords that carry credentials: taken from the directory's connection string into a shard's.
    static let credentialKeywords = ["user", "password", "passfile", "sslcert", "sslkey", "sslpassword", "sslrootcert",
                                     "sslmode", "channel_binding", "krbsrvname", "gssencmode", "require_auth"]

    /// A directory reached through `connectionString` (the same credentials the device uses for its shard).
    /// - Parameter owner: as ``PostgresCloudDatabase/owner``: `nil` for a role of the user's own, the user's name for
    ///   an app backend.
    /// - Throws: ``PostgresCloudDatabase/MalformedConnectionString`` when libpq cannot parse `connectionString`.
    public init(connectionString: String, owner: String? = nil) throws(PostgresCloudDatabase.MalformedConnectionString) {
        precondition(owner?.isEmpty != true, "PostgresShardDirectory: the owner must not be empty (pass nil for the role's own)")
        guard let options = PGConnectionOptions(connectionString) else { throw PostgresCloudDatabase.MalformedConnectionString() }
        self.options = options
        self.owner = owner
        pool = ConnectionPool(options: options, capacity: 1)
    }

    /// Role, host, port and database of the directory (never the password).
    public var description: String {
        "PostgresShardDirectory(\(options.summary)\(owner.map { ", owner \($0)" } ?? ""))"
    }

    /// The shard that keeps the owner's zones, or `nil` when the owner is not placed (the directory's administrator
    /// places owners: `replica-cloud place`).
    /// - Throws: `CloudError` as ``PostgresCloudDatabase`` maps failures (a directory without the schema is
    ///   `serviceUnavailable`, a refused login `permissionFailure`, …).
    public func locate() async throws(CloudError) -> PostgresShardLocation? {
        let parameters = [PGParameter.text(owner)]
        return try await pool.run { connection throws(PGFailure) -> PostgresShardLocation? in
            let rows = try connection.query("SELECT out_shard, out_connection FROM replica.locate($1)", parameters, prepare: false)
            guard rows.count > 0 else { return nil }
            guard let shard = rows.int32(0, 0), let endpoint = rows.string(0, 1) else {
                throw PGFailure(origin: .unexpectedResult, message: "locate returned a malformed row")
            }
            return PostgresShardLocation(shard: Int(shard), connection: endpoint)
        }
    }

    /// The connection string of `location` with this directory's credentials (role, password, TLS files and modes)
    /// in place of any the endpoint names.
    /// - Throws: `CloudError.serviceUnavailable(reason:)` when the endpoint stored in the directory does not parse.
    public func connectionString(for location: PostgresShardLocation) throws(CloudError) -> String {
        guard let endpoint = PGConnectionOptions(location.connection) else {
            throw .serviceUnavailable(reason: "the directory's endpoint of shard \(location.shard) is not a connection string")
        }
        var pairs = endpoint.options.filter { !Self.credentialKeywords.contains($0.keyword) }
        pairs += options.options.filter { Self.credentialKeywords.contains($0.keyword) }
        return PGConnectionOptions.keywordString(pairs)
    }

    /// A cloud on the owner's shard, reached with this directory's credentials.
    /// - Parameters: as ``PostgresCloudDatabase/init(connectionString:owner:maximumConnections:preparesStatements:environment:)``.
    /// - Throws: `CloudError.zoneNotFound` when the owner is not placed; other `CloudError`s of ``locate()``.
    public func cloud(maximumConnections: Int = 4, preparesStatements: Bool = true,
                      environment: ReplicaEnvironment = .live) async throws(CloudError) -> PostgresCloudDatabase {
        guard let location = try await locate() else { throw .zoneNotFound }
        let string = try connectionString(for: location)
        do {
            return try PostgresCloudDatabase(connectionString: string, owner: owner, maximumConnections: maximumConnections,
                                             preparesStatements: preparesStatements, environment: environment)
        } catch {
            throw .serviceUnavailable(reason: "the directory's endpoint of shard \(location.shard) is not a connection string")
        }
    }
}

extension PGConnectionOptions {
    /// `pairs` as a libpq keyword/value connection string, each value quoted.
    static func keywordString(_ pairs: [(keyword: String, value: String)]) -> String {
        pairs.map { "\($0.keyword)='\($0.value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'"))'" }
            .joined(separator: " ")
    }
}

extension PostgresCloudAdministration {
    /// This database's shard id (`replica.server.shard`), part of the epoch of every zone it creates.
    public func shard() throws(Failure) -> Int {
        try requireCurrentSchema()
        let rows = try run("SELECT shard FROM replica.server")
        guard let shard = rows.int32(0, 0) else { throw .server(sqlState: "XX000", message: "replica.server has no row") }
        return Int(shard)
    }

    /// Sets this database's shard id. Allowed while no zone of another shard id exists (a shard's id is fixed once it
    /// keeps zones: their epochs carry it).
    /// - Parameter shard: 0 … 32767, different for every shard of one deployment.
    /// - Throws: ``Failure/invalidArgument(_:)`` for an id out of range or when zones of another id exist.
    public func setShard(_ shard: Int) throws(Failure) {
        guard (0...32767).contains(shard) else { throw .invalidArgument("--shard needs a number in 0...32767") }
        try requireCurrentSchema()
        let others = try run("SELECT pg_catalog.count(*) FROM replica.zone WHERE (epoch >> 48) <> $1", [.int8(Int64(shard))])
        if let count = others.int64(0, 0), count > 0 {
            throw .invalidArgument("this database keeps \(count) zone(s) of another shard id: its shard id cannot change")
        }
        _ = try run("UPDATE replica.server SET shard = $1", [.int4(Int32(shard))])
    }

    /// Declares that this server may have lost acknowledged writes in a way its lineage does not show (a logical dump
    /// restored into the same cluster, a crash with `synchronous_commit = off`, two standbys of one primary promoted
    /// to the same timeline): every zone gets other epochs, so every device's token expires and it re-reads its zones
    /// in full, uploading what only it holds, and no change tag of before repeats. A promotion or point-in-time
    /// recovery needs no such step: the lineage changes by itself (`Specs/cloud-postgres.md` §12).
    /// - Throws: ``Failure/notAdministrator(role:)``; ``Failure/server(sqlState:message:)``.
    public func renewEpochs() throws(Failure) {
        try requireCurrentSchema()
        try requireAdministrator()
        _ = try run("SELECT replica.renew_epoch_salt()")
    }

    /// Records how to reach shard `shard` in this database's directory (made or replaced).
    /// - Parameter connection: a libpq connection string of the shard without credentials (host, port, database…):
    ///   devices add their own.
    /// - Throws: ``Failure/invalidArgument(_:)`` for an id out of range, a string libpq cannot parse or one that holds a
    ///   password.
    public func setShardEndpoint(_ shard: Int, connection: String) throws(Failure) {
        guard (0...32767).contains(shard) else { throw .invalidArgument("the shard id needs a number in 0...32767") }
        guard let parsed = PGConnectionOptions(connection) else {
            throw .invalidArgument("the shard's connection string cannot be parsed (not shown: it may hold a password)")
        }
        guard parsed.value("password") == nil else {
            throw .invalidArgument("the shard's connection string holds a password: give it without credentials")
        }
        try requireCurrentSchema()
        try requireAdministrator()
        _ = try run("""
            INSERT INTO replica.shard_endpoint (shard, connection) VALUES ($1, $2)
            ON CONFLICT (shard) DO UPDATE SET connection = excluded.connection
            """, [.int4(Int32(shard)), .text(connection)])
    }

    /// Places `owner`'s zones on shard `shard` in this database's directory (made or moved). Moving an owner does not
    /// copy zones: on the new shard the owner's devices find their zones missing or their tokens expired, and upload
    /// everything they hold (revoke the owner's role on the old shard so that no device keeps writing there).
    /// - Throws: ``Failure/invalidArgument(_:)`` for an empty owner or a shard without an endpoint.
    public func place(owner: String, shard: Int) throws(Failure) {
        guard !owner.isEmpty else { throw .invalidArgument("the owner is empty") }
        try requireCurrentSchema()
        try requireAdministrator()
        let known = try run("SELECT pg_catalog.count(*) FROM replica.shard_endpoint WHERE shard = $1", [.int4(Int32(shard))])
        guard known.int64(0, 0) == 1 else { throw .invalidArgument("shard \(shard) has no endpoint: add it first (replica-cloud shard)") }
        _ = try run("""
            INSERT INTO replica.placement (owner, shard) VALUES ($1, $2)
            ON CONFLICT (owner) DO UPDATE SET shard = excluded.shard, placed_at = pg_catalog.now()
            """, [.text(owner), .int4(Int32(shard))])
    }
}
