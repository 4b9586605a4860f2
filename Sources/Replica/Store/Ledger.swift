import CSQLite
import Foundation

/// The sync bookkeeping of one synced store: per-record replication state (causal length, field stamps, unknown
/// fields, tombstone values, change tag, outbox flag, ledger state), the store's HLC and its server change token.
/// Declared in Store/ with its tables, their row I/O and the capture of local changes (a save writes them in its own
/// transaction); the sync decisions on it — the merge of remote records, the outbox, acknowledgements, rejections,
/// duplicate resolution, the conflict log — are extensions in Sync/. Internal.
///
/// Every function runs inside the caller's open write transaction, so bookkeeping commits atomically with the data
/// (DESIGN.md principle 3).
enum SyncLedger {
    static let createSQL = """
        CREATE TABLE IF NOT EXISTS replica_sync_record (
            id BLOB PRIMARY KEY NOT NULL,
            entity TEXT NOT NULL,
            causal_length INTEGER NOT NULL,
            created TEXT NOT NULL,
            stamps BLOB NOT NULL,
            unknown TEXT,
            tombstone TEXT,
            redirect BLOB,
            change_tag TEXT,
            local_version INTEGER NOT NULL DEFAULT 0,
            pending INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL DEFAULT 'pending',
            reason TEXT,
            waiting_for BLOB,
            seen INTEGER NOT NULL DEFAULT 0);
        CREATE INDEX IF NOT EXISTS replica_sync_record_waiting ON replica_sync_record (waiting_for) WHERE waiting_for IS NOT NULL;
        CREATE INDEX IF NOT EXISTS replica_sync_record_outbox ON replica_sync_record (pending, id) WHERE pending = 1;
        CREATE TABLE IF NOT EXISTS replica_sync_unknown_record (
            id BLOB PRIMARY KEY NOT NULL,
            record_type TEXT NOT NULL,
            record TEXT NOT NULL);
        CREATE INDEX IF NOT EXISTS replica_sync_record_redirect ON replica_sync_record (redirect) WHERE redirect IS NOT NULL;
        CREATE TABLE IF NOT EXISTS replica_sync_rejected (
            id BLOB NOT NULL,
            record_type TEXT NOT NULL,
            record TEXT NOT NULL,
            reason TEXT NOT NULL,
            seen INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (id, record_type));
        CREATE TABLE IF NOT EXISTS replica_sync_conflict (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id BLOB NOT NULL,
            entity TEXT NOT NULL,
            field TEXT NOT NULL,
            local_stamp TEXT NOT NULL,
            winning_stamp TEXT NOT NULL,
            kind TEXT NOT NULL DEFAULT 'field',
            winner BLOB);
        \(ConflictRecording.createSQL)
        CREATE TABLE IF NOT EXISTS replica_sync_ended_redirect (
            id BLOB NOT NULL,
            incarnation INTEGER NOT NULL,
            entity TEXT NOT NULL,
            winner BLOB,
            fields TEXT,
            PRIMARY KEY (id, incarnation));
        CREATE INDEX IF NOT EXISTS replica_sync_ended_redirect_winner ON replica_sync_ended_redirect (winner) WHERE winner IS NOT NULL;
        CREATE TABLE IF NOT EXISTS replica_sync_held (
            id BLOB NOT NULL,
            record_type TEXT NOT NULL,
            record TEXT NOT NULL,
            reason TEXT NOT NULL,
            retry_at INTEGER NOT NULL,
            PRIMARY KEY (id, record_type));
        CREATE INDEX IF NOT EXISTS replica_sync_record_corrupt ON replica_sync_record (id) WHERE state = 'corrupt';
        CREATE TABLE IF NOT EXISTS replica_sync_asset_wait (
            id BLOB NOT NULL,
            record_type TEXT NOT NULL,
            record TEXT NOT NULL,
            change_tag TEXT,
            assets TEXT NOT NULL,
            reason TEXT,
            PRIMARY KEY (id, record_type));
        CREATE TABLE IF NOT EXISTS replica_sync_sealed_asset (
            sealed_hash TEXT PRIMARY KEY NOT NULL,
            plain_ref TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS replica_sync_asset_chunk (
            hash TEXT NOT NULL,
            idx INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (hash, idx));
        \(LinkReplication.createSQL)
        """

    /// Brings the bookkeeping tables of a store created by an earlier version up to date (inside the caller's
    /// transaction): records of unknown types gained an outbox flag and a resync mark.
    static func migrate(_ db: Connection) throws {
        let columns = Set(try db.rows("SELECT name FROM pragma_table_info('replica_sync_unknown_record')").compactMap {
            if case let .text(name) = $0[0] { return name } else { return nil }
        })
        for (name, statement) in addedColumns where !columns.contains(name) { try db.execute(statement) }
        // The outbox index used to be on `pending` alone, so reading the outbox in ID order sorted it in a temporary
        // B-tree; ``createSQL`` now creates `replica_sync_record_outbox` on `(pending, id)` instead.
        try db.execute("DROP INDEX IF EXISTS replica_sync_record_pending")
    }

    /// ``createSQL`` with the ``addedColumns`` already in the `CREATE TABLE` statement, for a new store: the text
    /// SQLite keeps for the table is the same as after the `ALTER TABLE` statements (each of which makes SQLite
    /// read the whole schema again). ``createSQL`` followed by the statements when the text is not found.
    static let freshCreateSQL: String = {
        let table = "CREATE TABLE IF NOT EXISTS replica_sync_unknown_record ("
        guard let start = createSQL.range(of: table), let end = createSQL[start.upperBound...].range(of: ");"),
              addedColumns.allSatisfy({ $0.statement.hasPrefix("ALTER TABLE replica_sync_unknown_record ADD COLUMN ") }) else {
            return createSQL + "\n" + addedColumns.map { $0.statement + ";\n" }.joined()
        }
        let definitions = addedColumns.map { ", " + $0.statement.dropFirst("ALTER TABLE replica_sync_unknown_record ADD COLUMN ".count) }.joined()
        return createSQL.replacingCharacters(in: end.lowerBound..<end.lowerBound, with: definitions)
    }()

    /// Columns added to the bookkeeping tables after ``createSQL`` was first released, with the statement adding each.
    /// A new store has them from ``freshCreateSQL`` (see `Store.freshSchemaSQL`).
    static let addedColumns: [(name: String, statement: String)] = [
        ("pending", "ALTER TABLE replica_sync_unknown_record ADD COLUMN pending INTEGER NOT NULL DEFAULT 0"),
        ("seen", "ALTER TABLE replica_sync_unknown_record ADD COLUMN seen INTEGER NOT NULL DEFAULT 0"),
    ]

    /// The largest causal length accepted (see ``ReplicationBounds/maxCausalLength``).
    static var maxCausalLength: Int64 { ReplicationBounds.maxCausalLength }

    /// The replication state of one record as stored locally.
    struct RecordState {
        var id: UUID
        var entity: String
        var causalLength: Int64
        var created: FieldStamp
        /// Stamps of known fields.
        var stamps: [String: FieldStamp]
        /// Fields this schema does not know, kept with their stamps and sent back unchanged.
        var unknown: [String: CloudField]
        /// Preserved fields of a deleted record.
        var tombstone: [String: CloudField]
        var redirect: UUID?
        var changeTag: String?
        var localVersion: Int64
        var pending: Bool
        /// The stored `state` column (the ledger state ``store(_:_:)`` derives from `pending`), when read by
        /// ``load(_:_:)``; `nil` otherwise.
        var storedState: String? = nil
        /// The stored `waiting_for` column (which no upsert writes), when read by ``load(_:_:)``; `nil` otherwise.
        var storedWaitingFor: UUID?? = nil
        /// The stored `reason` column, when read by ``load(_:_:)`` and not NULL.
        var storedReason: String? = nil
        /// The bookkeeping columns of the row that could not be read, in column order (empty: all read). Their values
        /// in this state are placeholders until ``rebuildCorrupt(_:entity:store:db:)`` rebuilds them
        /// (`LedgerRepair.swift`).
        var corruptColumns: [String] = []

        /// The first unreadable column of the row as read, or — for a row already marked `corrupt` (rebuilt, waiting
        /// for repair) — the column its reason names; `nil` for a sound row.
        var corruption: String? { corruptColumns.first ?? (storedState == "corrupt" ? storedReason ?? "" : nil) }

        var isAlive: Bool { causalLength % 2 == 1 }
        /// The causal length of the current (or last) incarnation.
        var incarnation: Int64 { causalLength % 2 == 1 ? causalLength : causalLength - 1 }
    }

    // MARK: HLC

    private static let loadHLCSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'hlc'")

    /// The store's HLC. A clock that is missing or does not parse is never taken for zero (a later edit would then be
    /// stamped below older ones and lose): it is rebuilt from every stamp the store holds (``rebuildHLC(_:replica:)``).
    static func loadHLC(_ db: Connection, replica: UUID) throws -> HLC {
        let statement = try db.cachedStatement(loadHLCSQL)
        var stored: HLC?
        do {
            defer { statement.reset() }
            if try statement.step(), sqlite3_column_type(statement.handle, 0) == SQLITE_TEXT {
                // The fixed-width form, parsed in place (this runs in every save and every merged batch).
                if sqlite3_column_bytes(statement.handle, 0) == 48, let text = sqlite3_column_text(statement.handle, 0) {
                    stored = HLC.parse(UnsafeBufferPointer(start: text, count: 48), at: 0)
                }
            }
        }
        guard let stored else { return try rebuildHLC(db, replica: replica) }
        return HLC(physical: stored.physical, logical: stored.logical, replica: replica)
    }

    private static let updateHLCSQL = StatementKey("UPDATE replica_metadata SET value = ? WHERE key = 'hlc'")
    private static let insertHLCSQL = StatementKey("INSERT INTO replica_metadata (key, value) VALUES ('hlc', ?)")

    /// Stores the store's HLC: an update of its row, or (the store's first) an insert of it. The two statements, run
    /// in the caller's write transaction, write what an upsert would, without trying an insert every time (this runs
    /// in every save and every merged batch).
    static func saveHLC(_ hlc: HLC, _ db: Connection) throws {
        let hex = hlc.hex
        func run(_ sql: StatementKey) throws {
            let statement = try db.cachedStatement(sql)
            defer { statement.reset() }
            try statement.withStaticText(hex, at: 0) { while try statement.step() {} }
        }
        try run(updateHLCSQL)
        if db.changes == 0 { try run(insertHLCSQL) }
    }

    // MARK: Record state

    /// The one stamp of every field of an entity when the `stamps` column at `index` of the current row is the
    /// compact form of exactly that (one distinct stamp, then `oneStampTail`, the entity's
    /// ``EntityStatements/oneStampTail``): the form of every record as one save wrote it. `nil` for any other value,
    /// which the caller then decodes in full.
    static func readOneStamp(_ statement: Statement, _ index: Int32, oneStampTail: [UInt8]) -> FieldStamp? {
        guard sqlite3_column_type(statement.handle, index) == SQLITE_BLOB else { return nil }
        let bytes = statement.blob(index)
        guard bytes.count == 2 + 36 + oneStampTail.count, bytes[0] == stampsFormatVersion, bytes[1] == 1,
              oneStampTail.withUnsafeBytes({ memcmp(bytes.baseAddress! + 38, $0.baseAddress!, $0.count) == 0 }) else { return nil }
        return readStamp(bytes, at: 2)
    }

    /// The field stamp (64 hex digits) in the text column at `index` of the current row, parsed in place.
    static func readStamp(_ statement: Statement, _ index: Int32) -> FieldStamp? {
        guard sqlite3_column_type(statement.handle, index) == SQLITE_TEXT, sqlite3_column_bytes(statement.handle, index) == 64,
              let text = sqlite3_column_text(statement.handle, index) else { return statement.isNull(index) ? nil : FieldStamp(statement.string(index)) }
        return FieldStamp.parse(UnsafeBufferPointer(start: text, count: 64), at: 0)
    }

    /// The `stamps` column at `index` of the current row, in whichever form it was written (see LedgerCoding.swift):
    /// a BLOB in the compact form, or TEXT (JSON) from a store written before it. `nil` when NULL or unreadable.
    static func readStamps(_ statement: Statement, _ index: Int32) -> [String: FieldStamp]? {
        switch sqlite3_column_type(statement.handle, index) {
        case SQLITE_BLOB: return decodeStamps(statement.blob(index))
        case SQLITE_TEXT: return decodeStamps(statement.string(index))
        default: return nil
        }
    }

    /// What ``store(_:_:)`` writes is an upsert of the record's row, run as the one of these two statements that
    /// applies, tried in the order the caller expects to succeed (whichever changes no row hands over to the other,
    /// in the same write transaction). Preparing both costs a connection less than preparing one
    /// `INSERT … ON CONFLICT DO UPDATE` of the same columns, and each runs without first trying the other's work.
    ///
    /// A new row takes `state` from `pending` (``insertSQL``, `?12`). An existing row's `state` (``updateSQL``) depends
    /// on its stored state and `?13` (``StoreMode``): 0 for ``store(_:_:)``, where `state` follows `pending` (a rejected
    /// or undecryptable record keeps its state while pending, a corrupt one keeps it); 1 for a record a local change
    /// touched (`pending` is set): the record is pending again unless it could not be decrypted or is corrupt, and a
    /// rejection (about the content it had) is cleared with its reason, in the same statement; 2 for the merge of a
    /// cloud copy, which repairs a corrupt record (its state follows `pending` again, its reason is cleared).
    private static let insertSQL = StatementKey("""
        INSERT INTO replica_sync_record (id, entity, causal_length, created, stamps, unknown, tombstone, redirect,
                                         change_tag, local_version, pending, state)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (id) DO NOTHING
        """)

    /// See ``insertSQL``.
    private static let updateSQL = StatementKey("""
        UPDATE replica_sync_record SET entity = ?2, causal_length = ?3, created = ?4, stamps = ?5, unknown = ?6,
            tombstone = ?7, redirect = ?8, change_tag = ?9, local_version = ?10, pending = ?11,
            state = CASE WHEN ?13 = 1 THEN CASE WHEN state IN ('undecryptable', 'corrupt') THEN state ELSE 'pending' END
                         WHEN ?13 = 0 AND state = 'corrupt' THEN state
                         WHEN ?11 = 1 AND state NOT IN ('rejected', 'undecryptable') THEN 'pending'
                         WHEN ?11 = 0 THEN 'synced' ELSE state END,
            reason = CASE WHEN ?13 = 1 AND state = 'rejected' THEN NULL WHEN ?13 = 2 AND state = 'corrupt' THEN NULL ELSE reason END
        WHERE id = ?1
        """)

    static func store(_ state: RecordState, _ db: Connection) throws {
        try store(state, db, stamps: encodeStamps(state.stamps))
    }

    /// ``store(_:_:)`` with the `stamps` column already encoded (it then ignores `state.stamps`). Binds each
    /// parameter directly (no array of values; text and blobs without copies, valid until the statement has run):
    /// this runs once per merged record. `exists` is whether the ledger holds the record already, as far as the
    /// caller knows: it only picks the statement tried first (see ``insertSQL``).
    static func store(_ state: RecordState, _ db: Connection, stamps: Data, exists: Bool = true, mode: StoreMode = .plain) throws {
        try store(state, db, stamps: stamps, local: mode, exists: exists)
    }

    /// How ``store(_:_:)`` derives an existing row's `state` (see ``insertSQL``).
    enum StoreMode: Int64 {
        /// `state` follows `pending` (rejected and undecryptable records keep theirs while pending; corrupt ones keep theirs).
        case plain = 0
        /// A local change touched the record.
        case localChange = 1
        /// The merge of a version from the cloud: repairs a corrupt record.
        case merge = 2
    }

    /// Writes the ledger row of a record in `mode` (see ``insertSQL``).
    static func store(_ state: RecordState, _ db: Connection, stamps: Data, local mode: StoreMode, exists: Bool) throws {
        let unknown = state.unknown.isEmpty ? nil : try ReplicaJSON.string(state.unknown)
        let tombstone = state.tombstone.isEmpty ? nil : try ReplicaJSON.string(state.tombstone)
        func run(_ sql: StatementKey, update: Bool) throws -> Bool {
            let statement = try db.cachedStatement(sql)
            defer { statement.reset() }
            try statement.bind(state.id, at: 0)
            if update { try statement.bind(mode.rawValue, at: 12) }
            try statement.bind(state.causalLength, at: 2)
            try statement.bind(unknown.map(SQLiteValue.text) ?? .null, at: 5)
            try statement.bind(tombstone.map(SQLiteValue.text) ?? .null, at: 6)
            try statement.bind(state.redirect?.sqliteValue ?? .null, at: 7)
            try statement.bind(state.localVersion, at: 9)
            try statement.bind(state.pending ? 1 : 0, at: 10)
            if !update { try statement.bindStatic(state.pending ? "pending" : "synced", at: 11) }
            try statement.withStaticText(state.entity, at: 1) {
                try statement.withStaticText(state.changeTag, at: 8) {
                    try statement.withStaticStamp(state.created, at: 3) {
                        try statement.withStaticBlob(stamps, at: 4) { while try statement.step() {} }
                    }
                }
            }
            return db.changes > 0
        }
        if exists {
            if try !run(updateSQL, update: true) { _ = try run(insertSQL, update: false) }
        } else {
            if try !run(insertSQL, update: false) { _ = try run(updateSQL, update: true) }
        }
    }

    // MARK: Local changes
    // Stamping a save's changes: LedgerCapture.swift.

    /// Stores a record a local change touched. A record the cloud rejected for good has new content now, so it is
    /// pending again (the rejection was about the content it had); one that could not be decrypted stays so.
    static func storeLocalChange(_ state: RecordState, _ db: Connection, stamps: Data? = nil, exists: Bool = true) throws {
        try store(state, db, stamps: stamps ?? encodeStamps(state.stamps), local: .localChange, exists: exists)
    }

    // MARK: Ledger reads

    /// A bound on the IDs `sql` (a `max(id)` query) finds: no 16-byte ID there sorts after it. `nil` when the
    /// column holds no blob (its largest value is of another storage class, and SQLite orders every blob after
    /// those). The largest blob itself when it is 16 bytes long; otherwise its first 16 bytes, zero-padded (a
    /// shorter blob precedes its padding; every 16-byte blob before a longer one is at most its prefix).
    static let ledgerLargestIDSQL = StatementKey("SELECT max(id) FROM replica_sync_record")

    static func largestID(_ sql: StatementKey, _ db: Connection) throws -> UUID? {
        let statement = try db.cachedStatement(sql)
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        // The usual case, a record ID, read in place.
        if let id = statement.uuid(0) { return id }
        guard sqlite3_column_type(statement.handle, 0) == SQLITE_BLOB else { return nil }
        let bytes = statement.blob(0)
        var uuid = UUID.unassigned.uuid
        withUnsafeMutableBytes(of: &uuid) { raw in
            for index in 0..<16 { raw[index] = index < bytes.count ? bytes[index] : 0 }
        }
        return UUID(uuid: uuid)
    }

    /// The entity of a ledger record, by ID (read when a save checks that an inserted ID is not another entity's, see
    /// `StoreWriter`, and when a remote record is checked).
    static let entityOfRecordSQL = StatementKey("SELECT entity FROM replica_sync_record WHERE id = ?")

    /// The outbox of a store of `entities`, in ID order: ledger state read with the ID, so no lookup per record
    /// (``loadSQL``'s columns after the ID). Only records of `entities`: in a store file shared with a process of
    /// another app version, records of entities this schema does not know are that process's to upload (this one
    /// cannot read their rows); they stay queued, counted as pending, never refused (P6).
    /// `names` as a list of SQL string literals (`'A', 'B'`), for an `IN (...)` of entity names.
    static func sqlStringList(_ names: [String]) -> String {
        names.map { "'" + $0.replacingOccurrences(of: "'", with: "''") + "'" }.joined(separator: ", ")
    }

    /// `entities` `nil`: every record (only for the canary ``Canary/unknownEntityRefused``).
    static func outboxSQL(entities: [String]?) -> StatementKey {
        let names = entities.map(sqlStringList)
        return StatementKey("""
            SELECT id, \(stateColumns)
            FROM replica_sync_record WHERE pending = 1 AND state NOT IN ('rejected', 'undecryptable', 'corrupt')
                \(names.map { "AND entity IN (\($0.isEmpty ? "NULL" : $0))" } ?? "") ORDER BY id LIMIT ?
            """)
    }

    /// Follows a chain of duplicate redirects from `id` to the live record it ends at (at most 16 hops). A duplicate
    /// only ever redirects to a record of its own entity: a chain that reaches another entity (a malformed record)
    /// ends nowhere, and the tombstone is a plain delete.
    static func liveRedirectTarget(of id: UUID, store: Store, _ db: Connection) throws -> UUID? {
        var current = id
        var entity: String?
        for _ in 0..<16 {
            guard let state = try load(current, store: store, db, entity: entity), state.entity == (entity ?? state.entity) else { return nil }
            entity = state.entity
            if state.isAlive { return current == id ? nil : current }
            guard let next = state.redirect else { return nil }
            current = next
        }
        return nil
    }
}

/// Which local writes the cloud already holds, and the conflict log entries for the merge decisions in which a local
/// write it did not hold lost (R16 in `Specs/replication-protocol.md`). Internal; every function runs inside the
/// caller's write transaction.
///
/// A local write is *unsynced* when its stamp is this store's replica's and is newer than the record's upload mark:
/// the newest stamp of this replica that a version of the record in the cloud is known to carry (an acknowledged
/// upload, or any fetched version). An upload sends every field's current value, and this replica's clock only moves
/// forward, so a cloud version carrying this replica's stamp `s` holds every write of this replica to the record up to
/// `s` (or a newer write of another device to that field).
enum ConflictRecording {
    /// The upload mark of each record (absent: none known). A table beside `replica_sync_record`, so old stores open
    /// unchanged (created by `SyncLedger.createSQL`, which runs on every open of a synced store).
    static let createSQL = """
        CREATE TABLE IF NOT EXISTS replica_sync_uploaded (
            id BLOB PRIMARY KEY NOT NULL,
            through TEXT NOT NULL);
        """
}
