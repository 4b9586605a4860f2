import Foundation
import Synchronization

/// A cloud database kept in one SQLite file: the embedded default, which several processes (and devices simulated
/// by processes) on one machine can share. Same semantics as ``InMemoryCloudDatabase``; every operation is one
/// SQLite write transaction, so concurrent processes see a linear history of saves.
///
/// Layout: `cloud_zone(name, epoch, sequence, oldest_valid)`, `cloud_epoch(name, epoch, deletion_reason)` (epochs
/// and the reason of a zone's deletion outlive deleted zones; files made before reasons existed gain the column when
/// opened), `cloud_record(zone, id, sequence, change_tag, record)` with the record's body in the binary form (a BLOB,
/// ``CloudRecordBody``; files written before it hold JSON text, still read: the storage class tells them apart),
/// `cloud_zone_metadata(zone, key, value)`, and assets: `cloud_asset(zone, hash, size, complete)` with their chunks
/// in `cloud_asset_chunk(zone, hash, idx, data)` (files made before assets existed gain both tables when opened).
public final class SQLiteCloudDatabase: CloudDatabase {
    /// Guards `db`: the connection is only touched while holding this lock.
    private let lock = Mutex(())
    private nonisolated(unsafe) var db: Connection
    /// The database file.
    public let url: URL
    private let environment: ReplicaEnvironment
    /// The largest asset this cloud accepts, in bytes.
    public let maximumAssetSize: Int64

    /// Opens (creating if needed) the cloud database file at `url`.
    /// - Parameters:
    ///   - environment: the source of randomness for zone epochs (``ReplicaEnvironment/live`` by default): a zone
    ///     created in a new or re-created file never accepts a change token issued by another file.
    ///   - maximumAssetSize: the largest asset it accepts, in bytes (default
    ///     ``CloudAssetReference/defaultMaximumSize``, 256 MiB).
    /// - Throws: ``SQLiteError`` when the file cannot be opened or is not a database, or the file system's error when
    ///   its directory cannot be created.
    public init(url: URL, environment: ReplicaEnvironment = .live, maximumAssetSize: Int64 = CloudAssetReference.defaultMaximumSize) throws {
        self.url = url
        self.environment = environment
        self.maximumAssetSize = maximumAssetSize
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        self.db = try Self.open(url)
    }

    /// Opens the file at `url` (creating it and its tables if needed).
    private static func open(_ url: URL) throws -> Connection {
        let db = try Connection(location: .file(url))
        try db.transaction(.immediate) {
            try db.execute("""
                CREATE TABLE IF NOT EXISTS cloud_zone (name TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL,
                    sequence INTEGER NOT NULL DEFAULT 0, oldest_valid INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE IF NOT EXISTS cloud_epoch (name TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS cloud_record (zone TEXT NOT NULL, id BLOB NOT NULL, sequence INTEGER NOT NULL,
                    change_tag TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (zone, id));
                CREATE INDEX IF NOT EXISTS cloud_record_sequence ON cloud_record (zone, sequence);
                CREATE TABLE IF NOT EXISTS cloud_zone_metadata (zone TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
                    PRIMARY KEY (zone, key));
                CREATE TABLE IF NOT EXISTS cloud_asset (zone TEXT NOT NULL, hash TEXT NOT NULL, size INTEGER NOT NULL,
                    complete INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (zone, hash));
                CREATE TABLE IF NOT EXISTS cloud_asset_chunk (zone TEXT NOT NULL, hash TEXT NOT NULL, idx INTEGER NOT NULL,
                    data BLOB NOT NULL, PRIMARY KEY (zone, hash, idx));
                """)
            // Files made before zone deletion reasons existed: the column is added (NULL: no reason known).
            if try db.scalar("SELECT count(*) FROM pragma_table_info('cloud_epoch') WHERE name = 'deletion_reason'") == .integer(0) {
                try db.execute("ALTER TABLE cloud_epoch ADD COLUMN deletion_reason TEXT")
            }
        }
        return db
    }

    /// When the file at `url` is no longer the one `db` has open (deleted, or replaced by another file), SQLite would
    /// go on reading and writing the unlinked file, which no other process sees: a split brain where every side
    /// reports success. Opens the file now at `url` instead (a new file has no zones, so engines see their zone as
    /// reset and upload again). SQLite itself tells whether the file moved (`SQLITE_FCNTL_HAS_MOVED`: the path no
    /// longer names the open inode), and the stale connection is told to keep its write-ahead log
    /// (`SQLITE_FCNTL_PERSIST_WAL`), so that closing it cannot unlink, by name, the `-wal` and `-shm` files that now
    /// belong to the file at `url`. Called under the lock.
    /// Source: <https://www.sqlite.org/c3ref/c_fcntl_begin_atomic_write.html>
    private func reopenIfMoved() throws {
        guard db.fileHasMoved else { return }
        db.persistWAL()
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        db = try Self.open(url)
    }

    /// Runs `body` in a write transaction; a failure of the file surfaces as the cloud error it amounts to
    /// (``cloudError(for:)``).
    private func write<T: Sendable>(_ body: (Connection) throws -> T) throws(CloudError) -> T {
        do {
            return try lock.withLock { _ in
                try reopenIfMoved()
                return try db.transaction(.immediate) { try body(db) }
            }
        } catch let error as CloudError {
            throw error
        } catch let error as SQLiteError {
            throw Self.cloudError(for: error)
        } catch {
            throw CloudError.serviceUnavailable(reason: "cloud database file: \(type(of: error))")
        }
    }

    /// The cloud error a failure of the cloud file amounts to: another process holding the file's write lock
    /// (`SQLITE_BUSY`, `SQLITE_LOCKED`, after the 5 s busy timeout) is ``CloudError/zoneBusy(retryAfterMilliseconds:)``;
    /// a full disk (`SQLITE_FULL`) is ``CloudError/quotaExceeded``; anything else — a corrupt or foreign file, a
    /// read-only file, an I/O error, a missing table — is ``CloudError/serviceUnavailable(reason:)`` naming SQLite's
    /// result code and message (never bound values). All three are transient: the engine keeps its changes queued
    /// and retries. Source: <https://www.sqlite.org/rescode.html>
    static func cloudError(for error: SQLiteError) -> CloudError {
        if error.isBusy { return .zoneBusy(retryAfterMilliseconds: 100) }
        if error.isFull { return .quotaExceeded }
        return .serviceUnavailable(reason: "cloud database file: SQLite error \(error.extendedResultCode) "
            + "(\(error.resultCodeText)): \(error.message)")
    }

    /// The error for an operation on zone `name`, which does not exist: ``CloudError/zoneDeleted(reason:)`` when its
    /// deletion left a reason this version knows, else ``CloudError/zoneNotFound``.
    private static func missing(_ name: String, _ db: Connection) throws -> CloudError {
        guard case let .text(text)? = try db.scalar("SELECT deletion_reason FROM cloud_epoch WHERE name = ?", [.text(name)]),
              let reason = ZoneDeletionReason(rawValue: text) else { return .zoneNotFound }
        return .zoneDeleted(reason: reason)
    }

    private static func zone(_ name: String, _ db: Connection) throws -> (epoch: Int64, sequence: Int64, oldestValid: Int64)? {
        guard let row = try db.rows("SELECT epoch, sequence, oldest_valid FROM cloud_zone WHERE name = ?", [.text(name)]).first,
              case let .integer(epoch) = row[0], case let .integer(sequence) = row[1], case let .integer(oldest) = row[2] else { return nil }
        return (epoch, sequence, oldest)
    }

    public func createZone(_ zone: String) throws(CloudError) {
        try write { db in
            guard try Self.zone(zone, db) == nil else { return }
            // A random epoch: tokens of an earlier incarnation of this zone, or of a zone in another (or a deleted and
            // re-created) database file, never match.
            var epoch: Int64
            repeat {
                epoch = Int64(environment.random.next() >> 17)
            } while try db.scalar("SELECT 1 FROM cloud_epoch WHERE name = ? AND epoch = ?", [.text(zone), .integer(epoch)]) != nil || epoch == 0
            try db.run("INSERT INTO cloud_zone (name, epoch) VALUES (?, ?)", [.text(zone), .integer(epoch)])
            try db.run("""
                INSERT INTO cloud_epoch (name, epoch) VALUES (?, ?)
                ON CONFLICT (name) DO UPDATE SET epoch = excluded.epoch, deletion_reason = NULL
                """, [.text(zone), .integer(epoch)])
        }
    }

    public func deleteZone(_ zone: String) throws(CloudError) {
        try deleteZone(zone, reason: .deleted)
    }

    public func deleteZone(_ zone: String, reason: ZoneDeletionReason) throws(CloudError) {
        try write { db in
            guard try Self.zone(zone, db) != nil else { throw try Self.missing(zone, db) }
            try Self.remove(zone, reason: reason, db)
        }
    }

    private static func remove(_ zone: String, reason: ZoneDeletionReason?, _ db: Connection) throws {
        try db.run("DELETE FROM cloud_record WHERE zone = ?", [.text(zone)])
        try db.run("DELETE FROM cloud_zone_metadata WHERE zone = ?", [.text(zone)])
        try db.run("DELETE FROM cloud_asset_chunk WHERE zone = ?", [.text(zone)])
        try db.run("DELETE FROM cloud_asset WHERE zone = ?", [.text(zone)])
        try db.run("DELETE FROM cloud_zone WHERE name = ?", [.text(zone)])
        try db.run("UPDATE cloud_epoch SET deletion_reason = ? WHERE name = ?", [reason.map { .text($0.rawValue) } ?? .null, .text(zone)])
    }

    public func modifyRecords(_ records: [CloudRecord], in zone: String) throws(CloudError) -> [RecordSaveResult] {
        try write { db in
            guard var z = try Self.zone(zone, db) else { throw try Self.missing(zone, db) }
            var results: [RecordSaveResult] = []
            var writer = CloudRecordBody.Writer()
            for record in records {
                // A record whose stamps the text form cannot hold could never be read back: refused, not stored.
                if let failure = record.unencodableFailure {
                    results.append(failure)
                    continue
                }
                if let row = try db.rows("SELECT change_tag, record FROM cloud_record WHERE zone = ? AND id = ?",
                                         [.text(zone), record.recordID.sqliteValue]).first,
                   case let .text(tag) = row[0], tag != record.changeTag {
                    guard let server = Self.storedRecord(row[1]) else {
                        results.append(.failed(recordID: record.recordID, error: .invalidRecord(
                            reason: Self.unreadable(record.recordID.sqliteValue, zone: zone))))
                        continue
                    }
                    results.append(.conflict(serverRecord: server))
                    continue
                }
                // A live record references only assets the zone holds complete (R19).
                if let missing = try Self.firstMissingAsset(of: record, zone: zone, db) {
                    results.append(.failed(recordID: record.recordID, error: .assetNotFound(hash: missing.hash)))
                    continue
                }
                z.sequence += 1
                var stored = record
                stored.changeTag = "\(z.epoch).\(z.sequence)"
                try db.run("""
                    INSERT INTO cloud_record (zone, id, sequence, change_tag, record) VALUES (?, ?, ?, ?, ?)
                    ON CONFLICT (zone, id) DO UPDATE SET sequence = excluded.sequence, change_tag = excluded.change_tag,
                        record = excluded.record
                    """, [.text(zone), record.recordID.sqliteValue, .integer(z.sequence), .text(stored.changeTag!),
                          .blob(try writer.body(stored))])
                results.append(.saved(recordID: record.recordID, changeTag: stored.changeTag!))
            }
            try db.run("UPDATE cloud_zone SET sequence = ? WHERE name = ?", [.integer(z.sequence), .text(zone)])
            return results
        }
    }

    public func fetchZoneChanges(_ zone: String, since token: ServerChangeToken?, limit: Int) throws(CloudError) -> ZoneChangeBatch {
        try write { db in
            guard let z = try Self.zone(zone, db) else { throw try Self.missing(zone, db) }
            if let token, token.epoch != z.epoch || token.sequence < z.oldestValid || token.sequence > z.sequence {
                throw CloudError.changeTokenExpired
            }
            let after = token?.sequence ?? 0
            let limit = max(1, limit)
            let rows = try db.rows("SELECT sequence, record, id, change_tag FROM cloud_record WHERE zone = ? AND sequence > ? ORDER BY sequence LIMIT ?",
                                   [.text(zone), .integer(after), .integer(Int64(limit + 1))])
            let more = rows.count > limit
            let page = rows.prefix(limit)
            var records: [CloudRecord] = []
            var unreadable: [UnreadableCloudRecord] = []
            for row in page {
                if let record = Self.storedRecord(row[1]) {
                    records.append(record)
                    continue
                }
                // One record the file cannot read is that record's problem, reported with the page: the rest of the
                // zone stays readable for every device.
                let type: String? = switch row[1] {
                case let .blob(body): CloudRecordBody.recordType(of: body)
                case let .text(json): CloudRecordBody.recordType(of: Data(json.utf8))
                default: nil
                }
                let tag: String? = if case let .text(t) = row[3] { t } else { nil }
                unreadable.append(UnreadableCloudRecord(recordID: try? UUID(sqliteValue: row[2]), recordType: type, changeTag: tag,
                                                        reason: Self.unreadable(row[2], zone: zone)))
            }
            let last: Int64 = if more, case let .integer(s)? = page.last?[0] { s } else { z.sequence }
            return ZoneChangeBatch(records: records, token: ServerChangeToken(epoch: z.epoch, sequence: last), moreComing: more,
                                   unreadable: unreadable)
        }
    }

    /// The reason given for a stored record that does not decode: it names the record, so it can be found and repaired.
    private static func unreadable(_ id: SQLiteValue, zone: String) -> String {
        let name = (try? UUID(sqliteValue: id)).map { $0.uuidString.lowercased() } ?? "with a malformed ID"
        return "stored record \(name) of zone '\(zone)' is unreadable"
    }

    public func zoneMetadata(_ zone: String) throws(CloudError) -> [String: Data] {
        try write { db in
            guard try Self.zone(zone, db) != nil else { throw try Self.missing(zone, db) }
            var result: [String: Data] = [:]
            for row in try db.rows("SELECT key, value FROM cloud_zone_metadata WHERE zone = ?", [.text(zone)]) {
                if case let .text(key) = row[0], case let .blob(value) = row[1] { result[key] = value }
            }
            return result
        }
    }

    public func setZoneMetadata(_ zone: String, key: String, value: Data, ifCurrent expected: Data?) throws(CloudError) -> Data {
        try write { db in
            guard try Self.zone(zone, db) != nil else { throw try Self.missing(zone, db) }
            let current: Data? = if case let .blob(v)? = try db.scalar("SELECT value FROM cloud_zone_metadata WHERE zone = ? AND key = ?",
                                                                      [.text(zone), .text(key)]) { v } else { nil }
            guard current == expected else { return current ?? Data() }
            try db.run("INSERT INTO cloud_zone_metadata (zone, key, value) VALUES (?, ?, ?) ON CONFLICT (zone, key) DO UPDATE SET value = excluded.value",
                       [.text(zone), .text(key), .blob(value)])
            return value
        }
    }

    /// Deletes `zone` and its records (a zone reset), whether or not it exists. Tokens from before never work again.
    /// - Parameter reason: why the zone is gone, as devices will be told (``CloudError/zoneDeleted(reason:)``);
    ///   `nil` (the default): not said (``CloudError/zoneNotFound``).
    public func resetZone(_ zone: String, reason: ZoneDeletionReason? = nil) throws(CloudError) {
        try write { db in try Self.remove(zone, reason: reason, db) }
    }

    /// A number that changes with every zone's epoch and sequence, whichever process wrote them (each save moves its
    /// zone's sequence): one read of the small zone table, for the sync runtime's polling
    /// (``CloudDatabase/changeCounter()``). `nil` when the file cannot be read now.
    public func changeCounter() -> Int64? {
        lock.withLock { _ in
            guard let rows = try? db.rows("SELECT epoch, sequence FROM cloud_zone ORDER BY name") else { return nil }
            return rows.reduce(Int64(rows.count)) { value, row in
                guard case let .integer(epoch) = row[0], case let .integer(sequence) = row[1] else { return value &+ 1 }
                return (value &* 1_000_003) &+ epoch &* 31 &+ sequence
            }
        }
    }

    /// The record a `record` column holds: a binary body (BLOB) or, in files written before it, JSON text; `nil` when
    /// it is neither (damaged).
    private static func storedRecord(_ value: SQLiteValue) -> CloudRecord? {
        switch value {
        case let .blob(body): return try? CloudRecordBody.decode(body)
        case let .text(json): return try? CloudRecordJSON.decode(Data(json.utf8))
        default: return nil
        }
    }

    /// Every record of `zone`, in ID order.
    public func records(in zone: String) throws(CloudError) -> [CloudRecord] {
        try write { db in
            try db.rows("SELECT record FROM cloud_record WHERE zone = ? ORDER BY id", [.text(zone)]).compactMap { row in
                Self.storedRecord(row[0])
            }
        }
    }

    // MARK: Assets

    /// The first asset `record` references that `zone` does not hold complete, or `nil`.
    private static func firstMissingAsset(of record: CloudRecord, zone: String, _ db: Connection) throws -> CloudAssetReference? {
        for asset in record.assetReferences where !CloudAssetRules.isEmpty(asset) {
            let held = try db.scalar("SELECT EXISTS (SELECT 1 FROM cloud_asset WHERE zone = ? AND hash = ? AND size = ? AND complete = 1)",
                                     [.text(zone), .text(asset.hash), .integer(asset.size)])
            if held != .integer(1) { return asset }
        }
        return nil
    }

    /// What `zone` holds of `asset`: its entry (made, empty, when missing, or when an unfinished one of another size is
    /// there; an empty asset is complete at once) and the chunks received. Inside a write transaction.
    private static func entry(_ asset: CloudAssetReference, zone: String, _ db: Connection) throws -> CloudAssetUploadState {
        if let row = try db.rows("SELECT size, complete FROM cloud_asset WHERE zone = ? AND hash = ?", [.text(zone), .text(asset.hash)]).first,
           case let .integer(size) = row[0], case let .integer(complete) = row[1] {
            if size == asset.size {
                if complete == 1 { return CloudAssetUploadState(asset: asset, receivedChunks: Array(0..<asset.chunkCount), isComplete: true) }
                let received = try db.rows("SELECT idx FROM cloud_asset_chunk WHERE zone = ? AND hash = ? ORDER BY idx",
                                           [.text(zone), .text(asset.hash)]).compactMap { row -> Int? in
                    if case let .integer(index) = row[0] { Int(index) } else { nil }
                }
                return CloudAssetUploadState(asset: asset, receivedChunks: received, isComplete: false)
            }
            // Bytes of two sizes cannot have one hash: a finished asset keeps its size; an unfinished one restarts.
            if complete == 1 { throw CloudError.assetHashMismatch(hash: asset.hash) }
            try db.run("DELETE FROM cloud_asset_chunk WHERE zone = ? AND hash = ?", [.text(zone), .text(asset.hash)])
        }
        let complete = asset.size == 0
        if complete, asset.hash != CloudAssetRules.emptyHash { throw CloudError.assetHashMismatch(hash: asset.hash) }
        try db.run("""
            INSERT INTO cloud_asset (zone, hash, size, complete) VALUES (?, ?, ?, ?)
            ON CONFLICT (zone, hash) DO UPDATE SET size = excluded.size, complete = excluded.complete
            """, [.text(zone), .text(asset.hash), .integer(asset.size), .integer(complete ? 1 : 0)])
        return CloudAssetUploadState(asset: asset, receivedChunks: [], isComplete: complete)
    }

    public func prepareAssetUpload(_ asset: CloudAssetReference, in zone: String) throws(CloudError) -> CloudAssetUploadState {
        try write { db in
            guard try Self.zone(zone, db) != nil else { throw try Self.missing(zone, db) }
            try CloudAssetRules.check(asset, limit: maximumAssetSize)
            return try Self.entry(asset, zone: zone, db)
        }
    }

    public func uploadAssetChunk(_ asset: CloudAssetReference, index: Int, bytes: Data, in zone: String) throws(CloudError) -> CloudAssetUploadState {
        // A hash mismatch drops the chunks and commits that (the error is returned, not thrown, from the transaction).
        let outcome: Result<CloudAssetUploadState, CloudError> = try write { db in
            guard try Self.zone(zone, db) != nil else { throw try Self.missing(zone, db) }
            try CloudAssetRules.check(asset, limit: maximumAssetSize)
            try CloudAssetRules.check(asset, index: index, length: bytes.count)
            var state = try Self.entry(asset, zone: zone, db)
            guard !state.isComplete else { return .success(state) }
            try db.run("""
                INSERT INTO cloud_asset_chunk (zone, hash, idx, data) VALUES (?, ?, ?, ?)
                ON CONFLICT (zone, hash, idx) DO UPDATE SET data = excluded.data
                """, [.text(zone), .text(asset.hash), .integer(Int64(index)), .blob(bytes)])
            if !state.receivedChunks.contains(index) { state.receivedChunks = (state.receivedChunks + [index]).sorted() }
            guard state.receivedChunks.count == asset.chunkCount else { return .success(state) }
            // Every chunk is here: they must hash to the name (read one at a time).
            var hasher = SHA256Hasher()
            for chunk in 0..<asset.chunkCount {
                guard case let .blob(data)? = try db.scalar("SELECT data FROM cloud_asset_chunk WHERE zone = ? AND hash = ? AND idx = ?",
                                                            [.text(zone), .text(asset.hash), .integer(Int64(chunk))]) else { continue }
                hasher.update(data)
            }
            guard hasher.finalizeHex() == asset.hash else {
                try db.run("DELETE FROM cloud_asset_chunk WHERE zone = ? AND hash = ?", [.text(zone), .text(asset.hash)])
                try db.run("DELETE FROM cloud_asset WHERE zone = ? AND hash = ?", [.text(zone), .text(asset.hash)])
                return .failure(.assetHashMismatch(hash: asset.hash))
            }
            try db.run("UPDATE cloud_asset SET complete = 1 WHERE zone = ? AND hash = ?", [.text(zone), .text(asset.hash)])
            state.isComplete = true
            return .success(state)
        }
        return try outcome.get()
    }

    public func downloadAssetChunk(_ asset: CloudAssetReference, index: Int, in zone: String) throws(CloudError) -> Data {
        try write { db in
            guard try Self.zone(zone, db) != nil else { throw try Self.missing(zone, db) }
            guard try db.scalar("SELECT 1 FROM cloud_asset WHERE zone = ? AND hash = ? AND size = ? AND complete = 1",
                                [.text(zone), .text(asset.hash), .integer(asset.size)]) != nil else {
                throw CloudError.assetNotFound(hash: asset.hash)
            }
            try CloudAssetRules.checkIndex(asset, index)
            guard case let .blob(data)? = try db.scalar("SELECT data FROM cloud_asset_chunk WHERE zone = ? AND hash = ? AND idx = ?",
                                                        [.text(zone), .text(asset.hash), .integer(Int64(index))]) else {
                throw CloudError.serviceUnavailable(reason: "cloud database file: chunk \(index) of \(asset) is missing")
            }
            return data
        }
    }

    /// The assets of `zone` (complete or not), in hash order, for tests and status.
    public func assets(in zone: String) throws(CloudError) -> [CloudAssetUploadState] {
        try write { db in
            try db.rows("SELECT hash, size FROM cloud_asset WHERE zone = ? ORDER BY hash", [.text(zone)]).compactMap { row in
                guard case let .text(hash) = row[0], case let .integer(size) = row[1],
                      let asset = CloudAssetReference(hash: hash, size: size) else { return nil }
                return try Self.entry(asset, zone: zone, db)
            }
        }
    }
}
