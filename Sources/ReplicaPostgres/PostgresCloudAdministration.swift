import CLibpq
import Foundation
import Replica

/// Set-up and upkeep of a PostgreSQL cloud database (what `replica-cloud` runs): install or upgrade the schema,
/// add users, report status, prune tombstone history. Synchronous, on one connection of its own.
///
/// Run it as the schema's owner: a superuser, or a role with `CREATEROLE` that owns the database (`init`); status
/// and pruning read every user's zones, so they need a superuser, a `BYPASSRLS` role or a member of
/// `replica_admin`.
public final class PostgresCloudAdministration {
    /// Why an administration command failed. Descriptions never show the connection string or a password.
    public enum Failure: Error, CustomStringConvertible, Equatable {
        /// libpq cannot parse the connection string (not shown: it may hold a password).
        case malformedConnectionString
        /// No connection: refused, unreachable, or the login was refused (libpq's message, scrubbed).
        case connection(String)
        /// The server refused a statement: SQLSTATE and its primary message.
        case server(sqlState: String, message: String)
        /// The database has no `replica` schema: run `init` first.
        case schemaMissing
        /// The database's schema is newer than this code knows: upgrade the tool before using it there.
        case schemaNewer(found: Int, supported: Int)
        /// The role cannot see every user's zones (status, prune).
        case notAdministrator(role: String)
        /// A value the command cannot use (reason).
        case invalidArgument(String)

        public var description: String {
            switch self {
            case .malformedConnectionString: return "the connection string cannot be parsed (not shown: it may hold a password)"
            case let .connection(message): return "cannot connect: \(message)"
            case let .server(state, message): return "the server refused: \(message) (SQLSTATE \(state))"
            case .schemaMissing: return "the database has no replica schema: run `replica-cloud init` first"
            case let .schemaNewer(found, supported):
                return "the database's replica schema is version \(found), newer than this tool's \(supported): upgrade replica-cloud"
            case let .notAdministrator(role):
                return "role '\(role)' cannot see every user's zones: run as a superuser, a BYPASSRLS role or a member of replica_admin"
            case let .invalidArgument(reason): return reason
            }
        }
    }

    /// Which group a login role joins (``addUser(_:password:group:)``).
    public enum Group: String, Sendable, CaseIterable {
        /// A user connecting with a role of their own: the role is the owner of its zones.
        case user = "replica_user"
        /// A trusted app backend acting for many users, naming the owner in each transaction.
        case app = "replica_app"
        /// An administrator: sees every user's zones (status, prune).
        case admin = "replica_admin"
    }

    /// The outcome of ``install()``.
    public struct InstallReport: Equatable, Sendable {
        /// The schema version before (0: none).
        public var previousVersion: Int
        /// The schema version now.
        public var version: Int
        /// The steps that ran, as "version: summary".
        public var stepsRun: [String]
    }

    /// One zone in ``status()``.
    public struct ZoneStatus: Equatable, Sendable {
        /// The zone's owner (a role name, or the name an app backend acts for).
        public var owner: String
        /// The zone's name.
        public var name: String
        /// The zone's epoch (shard, incarnation, prune generation: `Specs/cloud-postgres.md`).
        public var epoch: Int64
        /// The zone's change sequence: the newest change.
        public var sequence: Int64
        /// The oldest change sequence a token may hold after a prune (older tokens of earlier prune generations
        /// are expired).
        public var oldestValidSequence: Int64
        /// Live records.
        public var records: Int64
        /// Tombstones kept.
        public var tombstones: Int64
        /// When the oldest kept tombstone was written (server clock), if any.
        public var oldestTombstone: Date?
        /// Complete assets kept (schema step 6).
        public var assets: Int64 = 0
        /// Their bytes.
        public var assetBytes: Int64 = 0
        /// Assets whose upload has not finished (chunks received, not all).
        public var unfinishedAssets: Int64 = 0
    }

    /// The outcome of ``status()``.
    public struct Status: Equatable, Sendable {
        /// The installed schema version.
        public var schemaVersion: Int
        /// Every zone, by owner, then name.
        public var zones: [ZoneStatus]
    }

    /// One zone's outcome of ``prune(keepingDays:)``.
    public struct PrunedZone: Equatable, Sendable {
        /// The zone's owner.
        public var owner: String
        /// The zone's name.
        public var name: String
        /// Tombstones dropped.
        public var tombstonesDropped: Int64
        /// The zone's oldest valid token sequence now.
        public var oldestValidSequence: Int64
        /// Assets dropped: unreferenced by every record and untouched since the cutoff (unfinished uploads included).
        public var assetsDropped: Int64 = 0
        /// Bytes of the complete assets dropped.
        public var assetBytesDropped: Int64 = 0
    }

    let connection: PGConnection

    /// Connects to the database `connectionString` names.
    /// - Throws: ``Failure/malformedConnectionString`` or ``Failure/connection(_:)``.
    public init(connectionString: String) throws(Failure) {
        guard let options = PGConnectionOptions(connectionString) else { throw .malformedConnectionString }
        do {
            connection = try PGConnection.open(options)
        } catch {
            throw .connection(error.message)
        }
    }

    /// The role this connection uses.
    public var role: String { connection.role }

    func run(_ sql: String, _ parameters: [PGParameter] = []) throws(Failure) -> PGRows {
        do {
            return try connection.query(sql, parameters, prepare: false)
        } catch {
            throw Self.failure(error)
        }
    }

    func execute(_ sql: String) throws(Failure) {
        do {
            try connection.execute(sql)
        } catch {
            throw Self.failure(error)
        }
    }

    static func failure(_ error: PGFailure) -> Failure {
        if let state = error.sqlState, error.origin == .server { return .server(sqlState: state, message: error.message) }
        return .connection(error.message)
    }

    /// The installed schema version; `nil` when the database has none.
    public func schemaVersion() throws(Failure) -> Int? {
        let exists = try run("SELECT pg_catalog.to_regclass('replica.schema_version') IS NOT NULL")
        guard exists.bool(0, 0) == true else { return nil }
        let rows = try run("SELECT version FROM replica.schema_version")
        return rows.count == 0 ? nil : rows.int32(0, 0).map(Int.init)
    }

    /// Installs the schema, or upgrades an older one, in one transaction (idempotent: an up-to-date database is left
    /// as it is). Roles `replica_user`, `replica_app` and `replica_admin` are made when the cluster lacks them.
    /// - Returns: the versions before and after, and the steps that ran.
    /// - Throws: ``Failure/schemaNewer(found:supported:)`` (nothing changed), ``Failure/server(sqlState:message:)``
    ///   (e.g. 42501 when the role may not create schemas or roles; nothing changed).
    @discardableResult
    public func install() throws(Failure) -> InstallReport {
        try execute("BEGIN")
        do throws(Failure) {
            _ = try run("SELECT pg_catalog.pg_advisory_xact_lock($1)", [.int8(PostgresCloudSchema.installLockKey)])
            try execute(PostgresCloudSchema.bootstrap)
            let rows = try run("SELECT version FROM replica.schema_version")
            let previous = rows.count == 0 ? 0 : Int(rows.int32(0, 0) ?? 0)
            guard previous <= PostgresCloudSchema.currentVersion else {
                throw Failure.schemaNewer(found: previous, supported: PostgresCloudSchema.currentVersion)
            }
            var ran: [String] = []
            for step in PostgresCloudSchema.steps where step.version > previous {
                try execute(step.sql)
                ran.append("\(step.version): \(step.summary)")
            }
            if !ran.isEmpty {
                _ = try run("""
                    INSERT INTO replica.schema_version (version) VALUES ($1)
                    ON CONFLICT (singleton) DO UPDATE SET version = excluded.version, upgraded_at = now()
                    """, [.int4(Int32(PostgresCloudSchema.currentVersion))])
            }
            try execute("COMMIT")
            return InstallReport(previousVersion: previous, version: PostgresCloudSchema.currentVersion, stepsRun: ran)
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    /// Installs the schema's steps up to `version` only (tests of upgrades).
    func install(upTo version: Int) throws(Failure) {
        try execute("BEGIN")
        do throws(Failure) {
            _ = try run("SELECT pg_catalog.pg_advisory_xact_lock($1)", [.int8(PostgresCloudSchema.installLockKey)])
            try execute(PostgresCloudSchema.bootstrap)
            for step in PostgresCloudSchema.steps where step.version <= version { try execute(step.sql) }
            _ = try run("INSERT INTO replica.schema_version (version) VALUES ($1)", [.int4(Int32(version))])
            try execute("COMMIT")
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    /// Fails unless the schema is installed at the version this code speaks.
    func requireCurrentSchema() throws(Failure) {
        guard let version = try schemaVersion() else { throw .schemaMissing }
        if version > PostgresCloudSchema.currentVersion {
            throw .schemaNewer(found: version, supported: PostgresCloudSchema.currentVersion)
        }
        if version < PostgresCloudSchema.currentVersion {
            throw .invalidArgument("the database's replica schema is version \(version), older than this tool's "
                + "\(PostgresCloudSchema.currentVersion): run `replica-cloud init` to upgrade it")
        }
    }

    /// Makes login role `name` in `group` with `password`, or, when the role exists, sets its password and adds it to
    /// `group`. The password never reaches the server: libpq computes its SCRAM-SHA-256 verifier here
    /// (`PQencryptPasswordConn`), and only that is sent, as a bound parameter.
    /// - Returns: `true` when the role was made, `false` when it existed.
    /// - Throws: ``Failure/invalidArgument(_:)`` for an empty name or password, a reserved name, or a per-user role
    ///   asked to become an app role (or the reverse); ``Failure/server(sqlState:message:)`` (42501 without
    ///   `CREATEROLE`).
    @discardableResult
    public func addUser(_ name: String, password: String, group: Group = .user) throws(Failure) -> Bool {
        guard !name.isEmpty else { throw .invalidArgument("the role name is empty") }
        guard !password.isEmpty else { throw .invalidArgument("the password is empty") }
        try requireCurrentSchema()
        guard let encrypted = PQencryptPasswordConn(connection.handle, password, name, "scram-sha-256") else {
            throw .connection("libpq could not compute the password's verifier")
        }
        let verifier = String(cString: encrypted)
        PQfreemem(encrypted)
        do {
            let rows = try connection.query("SELECT replica.create_login($1, $2, $3)",
                                            [.text(name), .text(verifier), .text(group.rawValue)], prepare: false)
            return rows.bool(0, 0) ?? false
        } catch {
            if error.sqlState == "22023" { throw .invalidArgument(error.message) }
            throw Self.failure(error)
        }
    }

    /// Fails unless this role sees every user's rows.
    func requireAdministrator() throws(Failure) {
        let rows = try run("""
            SELECT r.rolsuper OR r.rolbypassrls OR pg_catalog.pg_has_role('replica_admin', 'MEMBER')
            FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
            """)
        guard rows.bool(0, 0) == true else { throw .notAdministrator(role: connection.role) }
    }

    /// Every zone of every user: records, tombstones, sequence and the oldest token kept.
    public func status() throws(Failure) -> Status {
        try requireCurrentSchema()
        try requireAdministrator()
        let rows = try run("""
            SELECT z.owner, z.name, z.epoch, z.sequence, z.oldest_valid,
                   pg_catalog.count(r.id) FILTER (WHERE r.alive),
                   pg_catalog.count(r.id) FILTER (WHERE NOT r.alive),
                   pg_catalog.date_part('epoch', pg_catalog.min(r.changed_at) FILTER (WHERE NOT r.alive))::float8,
                   (SELECT pg_catalog.count(*) FROM replica.asset a WHERE a.zone_id = z.id AND a.complete),
                   (SELECT COALESCE(pg_catalog.sum(a.size), 0)::bigint FROM replica.asset a WHERE a.zone_id = z.id AND a.complete),
                   (SELECT pg_catalog.count(*) FROM replica.asset a WHERE a.zone_id = z.id AND NOT a.complete)
            FROM replica.zone z LEFT JOIN replica.record r ON r.zone_id = z.id
            GROUP BY z.id ORDER BY z.owner, z.name
            """)
        var zones: [ZoneStatus] = []
        for row in 0..<rows.count {
            guard let owner = rows.string(row, 0), let name = rows.string(row, 1), let epoch = rows.int64(row, 2),
                  let sequence = rows.int64(row, 3), let oldest = rows.int64(row, 4), let alive = rows.int64(row, 5),
                  let tombstones = rows.int64(row, 6) else {
                throw .server(sqlState: "XX000", message: "status: a malformed row")
            }
            zones.append(ZoneStatus(owner: owner, name: name, epoch: epoch, sequence: sequence, oldestValidSequence: oldest,
                                    records: alive, tombstones: tombstones,
                                    oldestTombstone: rows.double(row, 7).map { Date(timeIntervalSince1970: $0) },
                                    assets: rows.int64(row, 8) ?? 0, assetBytes: rows.int64(row, 9) ?? 0,
                                    unfinishedAssets: rows.int64(row, 10) ?? 0))
        }
        return Status(schemaVersion: PostgresCloudSchema.currentVersion, zones: zones)
    }

    /// The largest asset the server accepts, in bytes (`replica.server.max_asset_size`, schema step 6).
    public func maximumAssetSize() throws(Failure) -> Int64 {
        try requireCurrentSchema()
        guard let value = try run("SELECT max_asset_size FROM replica.server").int64(0, 0) else {
            throw .server(sqlState: "XX000", message: "asset-limit: no server row")
        }
        return value
    }

    /// Sets the largest asset the server accepts, in bytes. Uploads already complete stay; larger new ones are refused
    /// with `CloudError.assetTooLarge(size:limit:)` (a device keeps such a record, marked rejected).
    /// - Parameter bytes: the limit (≥ 0).
    /// - Throws: ``Failure/invalidArgument(_:)`` for a negative limit; ``Failure/server(sqlState:message:)``
    ///   (42501 when the role is not an administrator).
    public func setMaximumAssetSize(_ bytes: Int64) throws(Failure) {
        guard bytes >= 0 else { throw .invalidArgument("the asset limit must be a number of bytes ≥ 0") }
        try requireCurrentSchema()
        _ = try run("UPDATE replica.server SET max_asset_size = $1", [.int8(bytes)])
    }

    /// Drops the tombstones written more than `days` ago (server clock) from every zone, one zone per transaction,
    /// and raises each such zone's oldest valid token to the newest change dropped: a device whose token is older
    /// than that (it may not have seen a dropped tombstone) gets `changeTokenExpired` and resyncs in full. Tokens of
    /// reads that started after the prune stay valid (the zone's prune generation, part of the epoch, tells them
    /// apart).
    ///
    /// Then, in the same pass, each zone's assets that no record (alive or tombstone) references and that no device
    /// uploaded or prepared for upload in the kept window — and never within the last hour, whatever `days` says, so
    /// an asset uploaded just before the record that will reference it stays — are dropped, unfinished uploads
    /// included. A record references an asset when the asset's hash appears in its stored body.
    /// - Parameter days: the history to keep, in days (≥ 0; fractions allowed).
    /// - Returns: the zones that dropped tombstones or assets.
    public func prune(keepingDays days: Double) throws(Failure) -> [PrunedZone] {
        guard days >= 0, days.isFinite else { throw .invalidArgument("--keep needs a number of days ≥ 0") }
        try requireCurrentSchema()
        try requireAdministrator()
        let now = try run("SELECT pg_catalog.date_part('epoch', pg_catalog.now())::float8")
        guard let serverNow = now.double(0, 0) else { throw .server(sqlState: "XX000", message: "prune: no server time") }
        let before = serverNow - days * 86_400
        let zones = try run("SELECT id, owner, name FROM replica.zone ORDER BY owner, name")
        var pruned: [PrunedZone] = []
        for row in 0..<zones.count {
            guard let id = zones.int64(row, 0), let owner = zones.string(row, 1), let name = zones.string(row, 2) else { continue }
            let result = try run("SELECT out_pruned, out_oldest_valid FROM replica.prune_zone($1, $2)", [.int8(id), .float8(before)])
            let assets = try run("SELECT out_assets, out_bytes FROM replica.prune_assets($1, $2)",
                                 [.int8(id), .float8(min(before, serverNow - 3_600))])
            let dropped = result.int64(0, 0) ?? 0
            let assetsDropped = assets.int64(0, 0) ?? 0
            guard dropped > 0 || assetsDropped > 0 else { continue }
            pruned.append(PrunedZone(owner: owner, name: name, tombstonesDropped: dropped, oldestValidSequence: result.int64(0, 1) ?? 0,
                                     assetsDropped: assetsDropped, assetBytesDropped: assets.int64(0, 1) ?? 0))
        }
        return pruned
    }
}
