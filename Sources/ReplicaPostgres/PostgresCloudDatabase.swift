import Foundation
import Replica

/// A `CloudDatabase` kept by a PostgreSQL server: the cloud for real deployments. One database serves many users;
/// PostgreSQL's row-level security keeps each user's zones to that user (`Specs/cloud-postgres.md`).
///
/// Same semantics as `InMemoryCloudDatabase` and `SQLiteCloudDatabase` (the contract suite runs against all
/// three): zones with epochs, change tags under the if-server-record-unchanged policy, a per-zone change feed read
/// with server change tokens, token expiry, zone deletion, compare-and-swap zone metadata. Every operation is one
/// call of a function of the server's `replica` schema (installed by `replica-cloud init`): one round trip, one
/// transaction, parameters always bound, never spliced into SQL.
///
/// Two ways to deploy it:
/// - **a role per user**: each device connects with its user's own role (made by `replica-cloud add-user`), and
///   `owner` is `nil`: the role is the owner.
/// - **a trusted app backend** connects with one pooled role (`replica-cloud add-user --app`) and names the user
///   it acts for in `owner`; each request sets it for its own transaction only (`set_config(…, true)`), so a
///   transaction-mode connection pooler may sit in between.
///
/// Thread-safe: requests from several engines run at once on up to `maximumConnections` connections; blocking
/// libpq calls never run on Swift's cooperative thread pool. A connection that breaks is replaced on the next
/// request. Errors are mapped to what a device can act on (`PostgresErrorMapping`); the connection string and
/// password never appear in an error or a description.
///
/// Source: <https://www.postgresql.org/docs/current/libpq.html>, <https://www.postgresql.org/docs/current/ddl-rowsecurity.html>
public final class PostgresCloudDatabase: CloudDatabase, CustomStringConvertible {
    /// A connection string libpq cannot parse. It is not shown: it may hold a password.
    public struct MalformedConnectionString: Error, CustomStringConvertible, Equatable {
        public var description: String { "the PostgreSQL connection string cannot be parsed (not shown: it may hold a password)" }
    }

    let pool: ConnectionPool
    let options: PGConnectionOptions
    /// The user an app backend acts for; `nil` when the connecting role is the user.
    public let owner: String?
    let preparesStatements: Bool
    let environment: ReplicaEnvironment

    /// A cloud on the PostgreSQL server `connectionString` names. Connects lazily, at the first request.
    /// - Parameters:
    ///   - connectionString: a libpq connection string, `postgresql://role[:password]@host:port/database?…` or
    ///     `host=… dbname=… user=…`; libpq's environment variables (`PGHOST`, `PGPASSWORD`, …) and `~/.pgpass`
    ///     fill in what it leaves out. A 10 s `connect_timeout` applies unless it sets one.
    ///   - owner: `nil` when the role is the user (its own zones); for an app backend's role (a member of
    ///     `replica_app`), the user whose zones to act on. Must not be empty.
    ///   - maximumConnections: how many requests may run at once (each on a connection of its own; default 4).
    ///   - preparesStatements: parse each statement once per connection (`PQprepare`; default). Pass `false` behind
    ///     a connection pooler that cannot keep prepared statements (PgBouncer before 1.21 in transaction mode).
    ///   - environment: the source of delays between reconnection attempts of ``zoneChanges()``.
    /// - Throws: ``MalformedConnectionString`` when libpq cannot parse `connectionString`.
    public init(connectionString: String, owner: String? = nil, maximumConnections: Int = 4, preparesStatements: Bool = true,
                environment: ReplicaEnvironment = .live) throws(MalformedConnectionString) {
        precondition(owner?.isEmpty != true, "PostgresCloudDatabase: the owner must not be empty (pass nil for the role's own zones)")
        precondition(maximumConnections >= 1, "PostgresCloudDatabase: maximumConnections must be at least 1")
        guard let options = PGConnectionOptions(connectionString) else { throw MalformedConnectionString() }
        self.options = options
        self.owner = owner
        self.preparesStatements = preparesStatements
        self.environment = environment
        pool = ConnectionPool(options: options, capacity: maximumConnections)
    }

    /// Role, host, port and database (never the password), and the owner when one is set.
    public var description: String {
        "PostgresCloudDatabase(\(options.summary)\(owner.map { ", owner \($0)" } ?? ""))"
    }

    /// Closes the connections not in use (the next request connects again).
    public func closeIdleConnections() { pool.closeIdleConnections() }

    // MARK: CloudDatabase

    public func createZone(_ zone: String) async throws(CloudError) {
        let parameters = [PGParameter.text(owner), .text(zone)]
        let prepare = preparesStatements
        _ = try await pool.run { connection throws(PGFailure) in
            _ = try connection.query(SQL.createZone, parameters, prepare: prepare)
        }
    }

    public func deleteZone(_ zone: String) async throws(CloudError) {
        try await deleteZone(zone, reason: .deleted)
    }

    /// Deletes `zone` for `reason` (`replica.delete_zone` with a reason, schema step 4), kept until the zone is created
    /// again: operations on it fail with `CloudError.zoneDeleted(reason:)` meanwhile.
    public func deleteZone(_ zone: String, reason: ZoneDeletionReason) async throws(CloudError) {
        let parameters = [PGParameter.text(owner), .text(zone), .text(reason.rawValue)]
        let prepare = preparesStatements
        try await explainingMissingZone(zone) { () async throws(CloudError) in
            _ = try await pool.run { connection throws(PGFailure) in
                _ = try connection.query(SQL.deleteZoneForReason, parameters, prepare: prepare)
            }
        }
    }

    /// Runs `body`; when it finds the zone missing (RZ001), asks the server why (`replica.zone_deletion_reason`): a
    /// known reason makes the error ``CloudError/zoneDeleted(reason:)``. Only failing requests pay for the question;
    /// when it cannot be answered (the server is gone again), the error stays ``CloudError/zoneNotFound``.
    private func explainingMissingZone<T>(_ zone: String, _ body: () async throws(CloudError) -> T) async throws(CloudError) -> T {
        do {
            return try await body()
        } catch .zoneNotFound {
            let parameters = [PGParameter.text(owner), .text(zone)]
            let prepare = preparesStatements
            let reason = try? await pool.run { connection throws(PGFailure) -> String? in
                try connection.query(SQL.zoneDeletionReason, parameters, prepare: prepare).string(0, 0)
            }
            guard let text = reason, let known = ZoneDeletionReason(rawValue: text) else { throw .zoneNotFound }
            throw .zoneDeleted(reason: known)
        }
    }

    public func modifyRecords(_ records: [CloudRecord], in zone: String) async throws(CloudError) -> [RecordSaveResult] {
        // The server assigns change tags: a record's body is stored without one, its tag in a column of its own.
        // Bodies are written in the binary form (`CloudRecordBody`), straight into the `bytea[]` parameter. As the
        // other clouds: a record whose stamps the stored form cannot hold is refused on its own (it could never be
        // read back); the rest of the batch is saved. An empty batch still checks that the zone exists.
        var refused: [Int: RecordSaveResult] = [:]
        var ids: [UUID] = [], tags: [String?] = [], alive: [Bool] = [], assets: [String?] = []
        ids.reserveCapacity(records.count)
        assets.reserveCapacity(records.count)
        tags.reserveCapacity(records.count)
        alive.reserveCapacity(records.count)
        // The `bytea[]` of the bodies: its header (completed below, once the count is known), then each body as its
        // length and bytes.
        var bodies: [UInt8] = []
        bodies.reserveCapacity(20 + records.count * 320)
        bodies.append(contentsOf: repeatElement(0, count: 20))
        var writer = CloudRecordBody.Writer()
        for (index, record) in records.enumerated() {
            let lengthAt = bodies.count
            bodies.append(contentsOf: repeatElement(0, count: 4))
            do {
                try writer.append(record, includingChangeTag: false, to: &bodies)
            } catch {
                bodies.removeSubrange(lengthAt...)
                refused[index] = record.unencodableFailure
                    ?? .failed(recordID: record.recordID, error: .invalidRecord(reason: "record \(record.recordID.uuidString.lowercased()) cannot be encoded"))
                continue
            }
            let length = UInt32(bodies.count - lengthAt - 4).bigEndian
            bodies.withUnsafeMutableBytes { $0.storeBytes(of: length, toByteOffset: lengthAt, as: UInt32.self) }
            ids.append(record.recordID)
            tags.append(record.changeTag)
            alive.append(record.isAlive)
            // The assets it references, which the zone must hold complete (the server cannot read the body's fields).
            let references = writer.lastRecordMayReferenceAssets ? record.assetReferences : []
            assets.append(references.isEmpty ? "" : references.filter { $0 != Self.emptyAsset }.map { "\($0.hash):\($0.size)" }.joined(separator: ","))
        }
        var header: [UInt8] = []
        PGParameter.arrayHeader(count: ids.count, hasNull: false, element: .bytea, into: &header)
        bodies.replaceSubrange(0..<20, with: header)
        let parameters: [PGParameter] = [.text(owner), .text(zone), .uuidArray(ids), .textArray(tags), .boolArray(alive),
                                         .encoded(.byteaArray, bodies), .textArray(assets)]
        let prepare = preparesStatements
        let count = ids.count
        let sentIDs = ids
        // Conflicts carry the server's record: read in place from the result, on the connection's queue.
        let answers = try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) -> [RecordSaveResult] in
            let result = try connection.query(SQL.modifyRecords, parameters, prepare: prepare)
            guard result.count == count else {
                throw PGFailure(origin: .unexpectedResult, message: "modify_records returned \(result.count) results for \(count) records")
            }
            var reader = CloudRecordBody.Reader()
            var answers: [RecordSaveResult] = []
            answers.reserveCapacity(count)
            for row in 0..<count {
                guard let saved = result.bool(row, 0) else {
                    throw PGFailure(origin: .unexpectedResult, message: "modify_records returned a malformed result")
                }
                let tag = result.string(row, 1)
                if !saved, let missing = result.string(row, 3) {
                    answers.append(.failed(recordID: sentIDs[row], error: .assetNotFound(hash: missing)))
                } else if saved {
                    guard let tag else { throw PGFailure(origin: .unexpectedResult, message: "modify_records returned a malformed result") }
                    answers.append(.saved(recordID: sentIDs[row], changeTag: tag))
                } else if let tag, let body = result.bytes(row, 2), var server = try? reader.read(body), server.recordID == sentIDs[row] {
                    server.changeTag = tag
                    answers.append(.conflict(serverRecord: server))
                } else {
                    answers.append(.failed(recordID: sentIDs[row], error: .invalidRecord(reason: Self.unreadable(sentIDs[row], zone: zone))))
                }
            }
            return answers
        } }
        guard !refused.isEmpty else { return answers }
        var next = answers.makeIterator()
        return records.indices.map { index in refused[index] ?? next.next()! }
    }

    public func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) async throws(CloudError) -> ZoneChangeBatch {
        let limit = Int32(clamping: max(1, min(limit, Int(Int32.max) - 1)))
        let parameters: [PGParameter] = [.text(owner), .text(zone), token.map { .int8($0.epoch) } ?? .null(.int8),
                                         token.map { .int8($0.sequence) } ?? .null(.int8), .int4(limit)]
        let prepare = preparesStatements
        // Bodies are decoded in place from the result, on the connection's queue (either stored form).
        return try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) -> ZoneChangeBatch in
            let result = try connection.query(SQL.fetchChanges, parameters, prepare: prepare)
            guard result.count >= 1, let epoch = result.int64(0, 0), let zoneSequence = result.int64(0, 1) else {
                throw PGFailure(origin: .unexpectedResult, message: "fetch_changes returned no zone header")
            }
            let more = result.count - 1 > Int(limit)
            let rows = min(result.count - 1, Int(limit))
            var records: [CloudRecord] = []
            var unreadable: [UnreadableCloudRecord] = []
            records.reserveCapacity(rows)
            var reader = CloudRecordBody.Reader()
            var last = zoneSequence
            for row in 1..<(rows + 1) {
                guard let sequence = result.int64(row, 2), let id = result.uuid(row, 3), let tag = result.string(row, 4),
                      let body = result.bytes(row, 5) else {
                    throw PGFailure(origin: .unexpectedResult, message: "fetch_changes returned a malformed record row")
                }
                last = sequence
                guard var record = try? reader.read(body), record.recordID == id else {
                    // One record no device can read is that record's problem, reported with the page (as the other
                    // clouds do): the rest of the zone stays readable.
                    unreadable.append(UnreadableCloudRecord(recordID: id, recordType: CloudRecordBody.recordType(of: Data(body)),
                                                            changeTag: tag, reason: Self.unreadable(id, zone: zone)))
                    continue
                }
                record.changeTag = tag
                records.append(record)
            }
            return ZoneChangeBatch(records: records, token: ServerChangeToken(epoch: epoch, sequence: more ? last : zoneSequence),
                                   moreComing: more, unreadable: unreadable)
        } }
    }

    public func zoneMetadata(_ zone: String) async throws(CloudError) -> [String: Data] {
        let parameters = [PGParameter.text(owner), .text(zone)]
        let prepare = preparesStatements
        return try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) -> [String: Data] in
            let result = try connection.query(SQL.zoneMetadata, parameters, prepare: prepare)
            var metadata: [String: Data] = [:]
            for row in 0..<result.count {
                guard let key = result.string(row, 0), let value = result.data(row, 1) else {
                    throw PGFailure(origin: .unexpectedResult, message: "zone_metadata returned a malformed row")
                }
                metadata[key] = value
            }
            return metadata
        } }
    }

    public func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) async throws(CloudError) -> Data {
        let parameters: [PGParameter] = [.text(owner), .text(zone), .text(key), .bytea(value),
                                         expected.map { .bytea($0) } ?? .null(.bytea)]
        let prepare = preparesStatements
        return try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) -> Data in
            let result = try connection.query(SQL.setZoneMetadata, parameters, prepare: prepare)
            guard result.count == 1, let stored = result.data(0, 0) else {
                throw PGFailure(origin: .unexpectedResult, message: "set_zone_metadata returned no value")
            }
            return stored
        } }
    }

    // MARK: Assets

    /// The upload state an asset function's row describes (`out_complete`, `out_chunks` as comma-separated indices).
    private static func uploadState(_ asset: CloudAssetReference, _ result: PGRows) throws(PGFailure) -> CloudAssetUploadState {
        guard result.count == 1, let complete = result.bool(0, 0) else {
            throw PGFailure(origin: .unexpectedResult, message: "an asset function returned no state")
        }
        if complete { return CloudAssetUploadState(asset: asset, receivedChunks: Array(0..<asset.chunkCount), isComplete: true) }
        let list = result.string(0, 1) ?? ""
        var chunks: [Int] = []
        for part in list.split(separator: ",") {
            guard let index = Int(part) else { throw PGFailure(origin: .unexpectedResult, message: "an asset function returned malformed chunks") }
            chunks.append(index)
        }
        return CloudAssetUploadState(asset: asset, receivedChunks: chunks, isComplete: false)
    }

    /// `replica.prepare_asset_upload`: what the zone holds of `asset` (schema step 6).
    public func prepareAssetUpload(_ asset: CloudAssetReference, in zone: String) async throws(CloudError) -> CloudAssetUploadState {
        let parameters: [PGParameter] = [.text(owner), .text(zone), .text(asset.hash), .int8(asset.size)]
        let prepare = preparesStatements
        return try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) in
            try Self.uploadState(asset, try connection.query(SQL.prepareAssetUpload, parameters, prepare: prepare))
        } }
    }

    /// `replica.upload_asset_chunk`: stores chunk `index`; the last one completes the asset, checked (schema step 6).
    public func uploadAssetChunk(_ asset: CloudAssetReference, index: Int, bytes: Data, in zone: String) async throws(CloudError) -> CloudAssetUploadState {
        let parameters: [PGParameter] = [.text(owner), .text(zone), .text(asset.hash), .int8(asset.size),
                                         .int4(Int32(clamping: index)), .bytea(bytes)]
        let prepare = preparesStatements
        let outcome = try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) -> (CloudAssetUploadState, Bool) in
            let result = try connection.query(SQL.uploadAssetChunk, parameters, prepare: prepare)
            guard let mismatch = result.bool(0, 2) else {
                throw PGFailure(origin: .unexpectedResult, message: "upload_asset_chunk returned no state")
            }
            return (try Self.uploadState(asset, result), mismatch)
        } }
        if outcome.1 { throw .assetHashMismatch(hash: asset.hash) }
        return outcome.0
    }

    /// `replica.download_asset_chunk`: chunk `index` of the complete asset (schema step 6).
    public func downloadAssetChunk(_ asset: CloudAssetReference, index: Int, in zone: String) async throws(CloudError) -> Data {
        let parameters: [PGParameter] = [.text(owner), .text(zone), .text(asset.hash), .int8(asset.size), .int4(Int32(clamping: index))]
        let prepare = preparesStatements
        return try await explainingMissingZone(zone) { () async throws(CloudError) in try await pool.run { connection throws(PGFailure) -> Data in
            let result = try connection.query(SQL.downloadAssetChunk, parameters, prepare: prepare)
            guard result.count == 1, let data = result.data(0, 0) else {
                throw PGFailure(origin: .unexpectedResult, message: "download_asset_chunk returned no bytes")
            }
            return data
        } }
    }

    /// The asset of no bytes, which every zone holds without an upload.
    private static let emptyAsset = CloudAssetReference(of: Data())

    /// The reason given for a stored record that does not decode: it names the record, so it can be found and repaired.
    private static func unreadable(_ id: UUID, zone: String) -> String {
        "stored record \(id.uuidString.lowercased()) of zone '\(zone)' is unreadable"
    }

    /// The statements: calls of the schema's functions, parameters bound (`Specs/cloud-postgres.md`).
    enum SQL {
        static let createZone = "SELECT replica.create_zone($1, $2)"
        static let deleteZoneForReason = "SELECT replica.delete_zone($1, $2, $3)"
        static let zoneDeletionReason = "SELECT replica.zone_deletion_reason($1, $2)"
        static let modifyRecords = "SELECT out_saved, out_change_tag, out_body, out_missing FROM replica.modify_records($1, $2, $3, $4, $5, $6, $7)"
        static let fetchChanges = """
            SELECT out_epoch, out_zone_sequence, out_sequence, out_id, out_change_tag, out_body
            FROM replica.fetch_changes($1, $2, $3, $4, $5)
            """
        static let zoneMetadata = "SELECT out_key, out_value FROM replica.zone_metadata($1, $2)"
        static let setZoneMetadata = "SELECT replica.set_zone_metadata($1, $2, $3, $4, $5)"
        static let listen = "SELECT replica.listen($1)"
        static let prepareAssetUpload = "SELECT out_complete, out_chunks FROM replica.prepare_asset_upload($1, $2, $3, $4)"
        static let uploadAssetChunk = "SELECT out_complete, out_chunks, out_mismatch FROM replica.upload_asset_chunk($1, $2, $3, $4, $5, $6)"
        static let downloadAssetChunk = "SELECT replica.download_asset_chunk($1, $2, $3, $4, $5)"
        static let zoneNames = "SELECT replica.zone_names($1)"
    }
}
