import CSQLite
import Foundation

/// The sync bookkeeping of one synced store: per-record replication state (causal length, field stamps, unknown
/// fields, tombstone values, change tag, outbox flag, ledger state), the store's HLC, its server change token, and
/// the merge of remote records. Internal.
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

    /// The conflict log keeps at most this many entries (oldest dropped first).
    static let conflictLogCapacity = 1_000

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
        /// (`CorruptBookkeeping.swift`).
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

    /// Whether storing `state` with ``store(_:_:)`` over the row ``load(_:_:)`` read as `stored` would write the values
    /// the row already holds: every column the upsert sets is equal, including the `state` it derives from `pending` —
    /// except `stamps`, which the caller compares (a merge compares its field registers with the stored stamps).
    static func storeChangesNothing(_ state: RecordState, over stored: RecordState) -> Bool {
        guard state.id == stored.id, state.entity == stored.entity, state.causalLength == stored.causalLength,
              state.created == stored.created, state.redirect == stored.redirect, state.changeTag == stored.changeTag,
              state.localVersion == stored.localVersion, state.pending == stored.pending,
              state.unknown == stored.unknown, state.tombstone == stored.tombstone,
              let storedState = stored.storedState, storedState != "corrupt" else { return false }
        // `updateSQL`'s CASE on the stored state (for `store(_:_:)`).
        let derived = state.pending ? (storedState == "rejected" || storedState == "undecryptable" ? storedState : "pending") : "synced"
        return derived == storedState
    }

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
    private static func store(_ state: RecordState, _ db: Connection, stamps: Data, local mode: StoreMode, exists: Bool) throws {
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

    /// The ledger update of a record whose upload the cloud saved: the new change tag, and out of the outbox unless a
    /// local change came after the uploaded version (`?3`; `?4` clears it regardless). `state` follows `pending` as
    /// ``store(_:_:)`` sets it. One statement instead of a load and a full upsert of a state that only changes there.
    private static let acknowledgeSaveSQL = StatementKey("""
        UPDATE replica_sync_record SET change_tag = ?2,
            pending = CASE WHEN state = 'corrupt' THEN 1 WHEN ?4 OR local_version = ?3 THEN 0 ELSE pending END,
            state = CASE WHEN state = 'corrupt' THEN state WHEN ?4 OR local_version = ?3 THEN 'synced'
                         WHEN pending = 1 AND state NOT IN ('rejected', 'undecryptable') THEN 'pending'
                         WHEN pending = 0 THEN 'synced' ELSE state END
        WHERE id = ?1
        """)

    /// Records that the cloud saved the upload of record `id` (built from local version `version`) under
    /// `changeTag`: what loading its state, setting the tag (and clearing `pending` when `version` is still the local
    /// version, or when `clearingPending`) and storing it did. Returns `false` when the ledger has no record `id`.
    static func acknowledgeSave(_ id: UUID, changeTag: String, version: Int64?, clearingPending: Bool, _ db: Connection) throws -> Bool {
        let statement = try db.cachedStatement(acknowledgeSaveSQL)
        defer { statement.reset() }
        try statement.bind(id, at: 0)
        try statement.bind(version.map(SQLiteValue.integer) ?? .null, at: 2)
        try statement.bind(clearingPending ? 1 : 0, at: 3)
        try statement.withStaticText(changeTag, at: 1) { while try statement.step() {} }
        return db.changes > 0
    }

    /// Deletes the version kept aside (`replica_sync_rejected`) of ledger record `id` (of the entity the ledger holds it
    /// as), which the cloud's new version supersedes.
    static let deleteRejectedOfLedgerRecordSQL = StatementKey("""
        DELETE FROM replica_sync_rejected WHERE id = ?1 AND record_type = (SELECT entity FROM replica_sync_record WHERE id = ?1)
        """)

    // MARK: Local changes
    // Stamping a save's changes: SyncLedger+LocalChanges.swift.

    /// Stores a record a local change touched. A record the cloud rejected for good has new content now, so it is
    /// pending again (the rejection was about the content it had); one that could not be decrypted stays so.
    static func storeLocalChange(_ state: RecordState, _ db: Connection, stamps: Data? = nil, exists: Bool = true) throws {
        try store(state, db, stamps: stamps ?? encodeStamps(state.stamps), local: .localChange, exists: exists)
    }

    // MARK: Outgoing records

    /// The cloud record for a record in the outbox: current values of the fields stamped in the current incarnation,
    /// unknown fields as received, or for a tombstone only the preserved fields.
    static func outgoingRecord(_ state: RecordState, store: Store, db: Connection) throws -> CloudRecord? {
        try outgoingRecord(state, oneStamp: nil, store: store, db: db)
    }

    /// ``outgoingRecord(_:store:db:)`` where `oneStamp`, when given, is the stamp of every known field (then
    /// `state.stamps` is not read): the record as one save wrote it, whose stamps need no map.
    private static func outgoingRecord(_ state: RecordState, oneStamp: FieldStamp?, store: Store, db: Connection) throws -> CloudRecord? {
        var fields: [String: CloudField] = [:]
        if state.isAlive {
            guard let entityIndex = store.entityIndex[state.entity] else { return nil }
            let statements = store.statements[entityIndex]
            let select = try db.cachedStatement(statements.selectByIDKey)
            defer { select.reset() }
            try select.bind(state.id, at: 0)
            guard try select.step() else { return nil }
            let names = statements.fieldNames
            fields = [String: CloudField](minimumCapacity: names.count + state.unknown.count)
            for (index, name) in names.enumerated() {
                guard let stamp = oneStamp ?? state.stamps[name], stamp.incarnation == state.causalLength else { continue }
                let encrypted = statements.attributes[index]?.options.contains(.allowsCloudEncryption) ?? false
                fields[name] = CloudField(value: select.value(Int32(index) + 1), stamp: stamp, isEncrypted: encrypted)
            }
            if oneStamp == nil { try addStoreColumnFields(&fields, state, store: store, entityIndex: entityIndex, db: db) }
            // (A field kept beside the row that this schema, or another version's column, has too: the newer register.)
            for (name, field) in state.unknown where field.stamp.incarnation == state.causalLength && fields[name].map({ $0.stamp < field.stamp }) ?? true {
                fields[name] = field
            }
        } else {
            fields = state.tombstone
        }
        let ended = state.causalLength >= 3 ? try endedIncarnations(of: state.id, db).compactMap(\.redirect) : []
        return CloudRecord(recordID: state.id, recordType: state.entity, changeTag: state.changeTag,
                           causalLength: state.causalLength, created: state.created, redirect: state.redirect,
                           endedRedirects: ended, fields: fields)
    }

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

    /// Records of unknown types to upload again (read before every upload, usually finding none).
    private static let pendingUnknownSQL = StatementKey("SELECT record FROM replica_sync_unknown_record WHERE pending = 1 ORDER BY id LIMIT ?")

    /// Up to `limit` records of the outbox, in ID order, with the local version each was built from. Read in one
    /// read transaction, so each record's ledger state and data row are of the same moment (another process may be
    /// writing the store).
    static func outbox(limit: Int, store: Store, db: Connection) throws -> [(record: CloudRecord, version: Int64)] {
        var result: [(record: CloudRecord, version: Int64)] = []
        var missing: [(id: UUID, version: Int64)] = []
        // Rows whose bookkeeping cannot be read: never uploaded in a wrong form; rebuilt and marked after the read.
        var corrupt: [UUID] = []
        try db.transaction(.deferred) {
            var entries: [(state: RecordState, oneStamp: FieldStamp?)] = []
            do {
                let statement = try db.cachedStatement(store.outboxSQL)
                defer { statement.reset() }
                try statement.bind(Int64(limit), at: 0)
                // The entity of the previous row (records of one entity usually come in runs).
                var entity: (name: String, tail: [UInt8])?
                while try statement.step() {
                    guard let id = statement.uuid(0) else { continue }
                    let name = statement.string(1)
                    if entity?.name != name { entity = store.statements(for: name).map { (name, $0.oneStampTail) } }
                    let oneStamp = entity.flatMap { readOneStamp(statement, 4, oneStampTail: $0.tail) }
                    let state = readState(id, statement, from: 1, stamps: oneStamp == nil ? readStamps(statement, 4) : [:])
                    if !state.corruptColumns.isEmpty {
                        corrupt.append(id)
                        continue
                    }
                    entries.append((state, oneStamp))
                }
            }
            result.reserveCapacity(entries.count)
            for (state, oneStamp) in entries {
                if let record = try outgoingRecord(state, oneStamp: oneStamp, store: store, db: db) {
                    result.append((record, state.localVersion))
                } else {
                    missing.append((state.id, state.localVersion))
                }
            }
            // Records of types this schema does not know go back to a zone that lost them (a reset, or a zone re-created
            // without them), whole and as received: this device may be the only one left that holds them.
            if result.count < limit {
                let statement = try db.cachedStatement(pendingUnknownSQL)
                defer { statement.reset() }
                try statement.bind(Int64(limit - result.count), at: 0)
                while try statement.step() {
                    guard sqlite3_column_type(statement.handle, 0) == SQLITE_TEXT,
                          var record = ReplicaJSON.decode(CloudRecord.self, statement.string(0)) else { continue }
                    record.changeTag = nil
                    result.append((record, 0))
                }
            }
        }
        // Alive in the ledger but the row is gone: nothing can be built; do not loop on it. (Written after the read
        // transaction: only if no save changed the record since — another process may have written it meanwhile.)
        for (id, version) in missing {
            try db.run("UPDATE replica_sync_record SET pending = 0, state = 'rejected', reason = 'missing local row' WHERE id = ? AND local_version = ?",
                       [id.sqliteValue, .integer(version)])
        }
        if !corrupt.isEmpty {
            try db.transaction(.immediate) { for id in corrupt { _ = try load(id, store: store, db) } }
        }
        return result
    }

    /// Marks the saved version of a record of an unknown type as the cloud's. Returns `false` when there is none.
    static func unknownRecordSaved(_ id: UUID, changeTag: String, _ db: Connection) throws -> Bool {
        guard case let .text(json)? = try db.scalar("SELECT record FROM replica_sync_unknown_record WHERE id = ?", [id.sqliteValue]),
              var record = ReplicaJSON.decode(CloudRecord.self, json) else { return false }
        record.changeTag = changeTag
        try db.run("UPDATE replica_sync_unknown_record SET record = ?, pending = 0 WHERE id = ?", [.text(try ReplicaJSON.string(record)), id.sqliteValue])
        return true
    }

    // MARK: Merge

    /// What merging one remote record did locally.
    struct MergeOutcome {
        var change: Change?
        /// Set when the merged record is deleted (whether or not a local row existed).
        var tombstoned: PersistentIdentifier?
        /// Winners of ended incarnations of the merged record that gained writes: they absorb them after the batch.
        var absorbing: [PersistentIdentifier] = []
        enum Change {
            case inserted(Snapshot)
            case updated(Snapshot, [String])
            case deleted(DeletedRecord)
        }
    }

    /// Merges a remote record (from a fetch or a save conflict) into the local store: causal length by max, each
    /// field by its stamp (absent fields keep their local value), unknown fields and record types kept. Writes the
    /// data row and the bookkeeping; returns what changed for history. Idempotent, commutative and associative.
    ///
    /// A record stamped more than `maxDrift` ms ahead of `wall` is not merged yet but held (see `HeldRecords.swift`);
    /// the default never holds.
    static func merge(_ remote: CloudRecord, store: Store, db: Connection, hlc: inout HLC, wall: Int64, maxDrift: Int64 = .max,
                      canaries: Set<Canary> = [], batch: MergeBatch? = nil) throws -> MergeOutcome {
        var remote = remote
        let entityIndex = store.entityIndex[remote.recordType]
        // A record this device cannot apply faithfully is kept aside with the reason, not merged (principle 6). The
        // common case (every check passes) is decided without sorting names or formatting reasons; the local state
        // read for the ownership check is the local side of the merge.
        var local: RecordState?
        // The local stamps by storage position (empty when there is no local state) and how many fields they stamp
        // in all: the merge reads them by position, never by name.
        var localStamps: [FieldStamp?] = []
        var localStampCount = 0
        var reason: RecordRejection?
        var remoteFields = entityIndex.map { fieldsByPosition(remote, store.statements[$0]) } ?? []
        // A record ID beyond every ID in the ledger and in the entity's table is in neither: nothing to read.
        let isNew = try entityIndex.map { try batch?.isNew(remote.recordID, entityIndex: $0, store: store, db: db) ?? false } ?? false
        if let entityIndex, fits(remote, remoteFields, store.statements[entityIndex]) {
            // (A row whose bookkeeping cannot be read is rebuilt first: this merge of a cloud copy repairs it.)
            if !isNew, let loaded = try load(remote.recordID, store: store, db, stampsBy: store.statements[entityIndex]) {
                local = loaded.state
                localStamps = loaded.stamps
                localStampCount = loaded.stampCount
            } else {
                local = nil
            }
            if let local, local.entity != remote.recordType { reason = .idOfAnotherEntity(local.entity) }
        } else {
            local = nil
            reason = try rejectionReason(remote, store: store, db: db)
        }
        if let reason {
            try reject(remote, reason: reason, db)
            batch?.mayHoldRejected = true
            batch?.forget(remote.recordID)
            return MergeOutcome(change: nil)
        }
        // A record stamped too far ahead of this device's clock waits until the clock catches up (R2).
        if let ahead = clockAhead(remote, wall: wall, maxDrift: maxDrift) {
            try hold(remote, reason: ahead.reason, retryAt: ahead.retryAt, db)
            batch?.forget(remote.recordID)
            return MergeOutcome(change: nil)
        }
        if batch?.mayHoldRejected ?? true {
            try db.run(deleteRejectedSQL, [remote.recordID.sqliteValue, .text(remote.recordType)])
        }
        // Advance the local clock past every stamp seen.
        var newest = remote.created.clock
        for field in remote.fields.values where field.stamp.clock > newest { newest = field.stamp.clock }
        hlc = hlc.receive(newest, wall: wall, replica: store.identity)

        guard let entityIndex else {
            try keepUnknownRecord(remote, db)
            batch?.forget(remote.recordID)
            return MergeOutcome(change: nil)
        }
        let entity = store.entities[entityIndex], statements = store.statements[entityIndex]
        // A version this device holds already: the ledger has its change tag, and nothing changed here since that
        // version was merged or acknowledged (nothing pending, nothing set aside as rejected or undecryptable — those
        // set the tag of a version they did not apply; a record that opens once a new key is read has that tag
        // cleared as it leaves the undecryptable state, see `openIncoming`). A change tag names one version of the record (CloudKit's
        // `recordChangeTag`), and merging is idempotent, so merging it again would read the row and write nothing.
        // Most fetched records are such: a device's own uploads coming back. Only while no full resync is under way
        // (see `MergeBatch.skipsHeldVersions`): a full read may come from another zone incarnation or another cloud
        // database, whose tags may repeat ones the ledger holds, and it re-merges everything in full.
        // The batch learns what the full merge would have told it.
        // (Fields an older schema kept as unknown that this one knows — an upgrade added their columns — are not in
        // the row yet: the full merge puts them there.)
        if batch?.skipsHeldVersions == true, let local, !local.pending, local.storedState == "synced", let tag = remote.changeTag,
           local.changeTag == tag, !canaries.contains(.nonIdempotentApply), local.unknown.isEmpty || !local.unknown.keys.contains(where: { statements.fieldIndex[$0] != nil }) {
            batch?.ledgerHolds(remote.recordID)
            batch?.merged(remote.recordID, waitingFor: local.storedWaitingFor, plainTombstone: !local.isAlive && local.redirect == nil,
                          canWait: entity.relationships.contains { !$0.isToMany })
            return MergeOutcome(change: nil, tombstoned: local.isAlive ? nil : PersistentIdentifier(entityName: entity.name, id: remote.recordID))
        }
        // Looked up even without ledger state: a row can predate it (saved while the store was local-only, or by a
        // process that opened the file without sync), and its values are the local side of the merge.
        var localRow: [SQLiteValue]? = isNew ? nil : try {
            let select = try db.cachedStatement(statements.selectByIDKey)
            defer { select.reset() }
            try select.bind(remote.recordID, at: 0)
            guard try select.step() else { return nil }
            return (0..<select.columnCount).map { select.value($0) }
        }()
        // The row as stored; `localRow` and the local registers may take values the ledger kept beside the row, and the
        // fields of columns other app versions declare are merged on their own (SyncLedger+StoreColumns.swift).
        let storedRow = localRow
        let columns = try StoreColumnMerge.prepare(remote, store: store, entityIndex: entityIndex, remoteFields: remoteFields, local: &local,
                                                   localStamps: &localStamps, localStampCount: &localStampCount, localRow: &localRow,
                                                   db: db, batch: batch)
        let fieldNames = statements.fieldNames
        if canaries.contains(.absentAsNull), remote.isAlive {
            let newest = remote.fields.values.map(\.stamp).max() ?? remote.created
            for name in fieldNames where remote.fields[name] == nil { remote.fields[name] = CloudField(value: .null, stamp: newest) }
            remoteFields = fieldsByPosition(remote, statements)
        }

        var causalLength = max(local?.causalLength ?? 0, remote.causalLength)
        let localPending = local?.pending == true
        if canaries.contains(.nonIdempotentApply), let local, local.causalLength == remote.causalLength, local.changeTag == remote.changeTag {
            causalLength += 1
        }
        let incarnation = causalLength % 2 == 1 ? causalLength : causalLength - 1
        // (Compared field by field rather than by switching over `(local, remote)`, which copies both.)
        let localCausalLength = local?.causalLength
        var created: FieldStamp
        if let local, local.causalLength == remote.causalLength {
            created = min(local.created, remote.created)
        } else if let local, local.causalLength > remote.causalLength {
            created = local.created
        } else {
            created = remote.created
        }
        if created.incarnation < incarnation { created.incarnation = incarnation }
        // A redirect belongs to the tombstone of a duplicate that lost: it holds only while that state wins. A live
        // record (a re-insert) redirects nowhere, and neither does a later, ordinary delete of it.
        let redirect: UUID?
        if causalLength % 2 == 1 {
            redirect = nil
        } else if let localCausalLength, localCausalLength > remote.causalLength {
            redirect = local!.redirect
        } else if let localCausalLength, localCausalLength == remote.causalLength {
            // Both sides resolved the same incarnation (possibly against different winners): the smaller ID, so the
            // result does not depend on which side is remote.
            let localRedirect = local!.redirect
            if let a = localRedirect, let b = remote.redirect { redirect = b.bytesPrecede(a) ? b : a } else { redirect = remote.redirect ?? localRedirect }
        } else {
            redirect = remote.causalLength == causalLength ? remote.redirect : nil
        }

        // Field registers: the winning stamp of each field (storage order), `nil` where no write of the current
        // incarnation is known.
        var winners = [FieldStamp?](repeating: nil, count: fieldNames.count)
        var values: [SQLiteValue] = []
        values.reserveCapacity(fieldNames.count)
        var localNewer = false
        var conflicts: [ConflictRecording.Loss] = []
        // A higher causal length from elsewhere ends the local incarnation: its local writes lose to that delete —
        // unless it ended as a duplicate that lost, whose writes go to the winner (R15, R16).
        let endsLocalIncarnation = local.map { local in
            local.isAlive && localPending && causalLength > local.causalLength
                && !(remote.causalLength == local.causalLength + 1 && remote.redirect != nil)
                && !remote.endedRedirects.contains { $0.incarnation == local.causalLength }
        } ?? false
        /// Remote fields this schema knows (when that is all of them, there are no unknown fields to merge).
        var knownRemoteFields = 0
        for (index, name) in fieldNames.enumerated() {
            let localStamp = localStamps.isEmpty ? nil : localStamps[index]
            let localValue = localRow?[index + 1]
            let remoteField = remoteFields[index]
            if remoteField != nil { knownRemoteFields += 1 }
            var winnerStamp: FieldStamp?
            var winnerValue: SQLiteValue?
            if let remoteField, localStamp == nil || remoteField.stamp >= localStamp! {
                winnerStamp = remoteField.stamp
                winnerValue = remoteField.value
                if !endsLocalIncarnation, let localStamp, localStamp < remoteField.stamp, localPending, localStamp.incarnation == incarnation,
                   localStamp.clock.replica == store.identity, let localValue, localValue != remoteField.value {
                    conflicts.append(ConflictRecording.Loss(field: name, local: localStamp, winning: remoteField.stamp, kind: .overwritten))
                }
            } else if let localStamp {
                winnerStamp = localStamp
                winnerValue = localValue ?? local?.tombstone[name]?.value
                if localStamp.incarnation == incarnation { localNewer = true }
            }
            if endsLocalIncarnation, !canaries.contains(.conflictLogMissesDeletes), let localStamp, localStamp.incarnation == local!.incarnation,
               localStamp.clock.replica == store.identity {
                conflicts.append(ConflictRecording.Loss(field: name, local: localStamp, winning: ConflictRecording.newestStamp(remote), kind: .deleted))
            }
            if let winnerStamp, winnerStamp.incarnation == incarnation, let winnerValue {
                winners[index] = winnerStamp
                values.append(winnerValue)
            } else {
                values.append(statements.defaults[index])
            }
        }
        // Unknown fields: union by stamp, current incarnation only.
        var unknown: [String: CloudField] = [:]
        for (name, field) in (local?.unknown ?? [:]) where field.stamp.incarnation == incarnation { unknown[name] = field }
        if knownRemoteFields < remote.fields.count {
            for (name, field) in remote.fields where statements.fieldIndex[name] == nil && field.stamp.incarnation == incarnation {
                if LinkReplication.isLinkField(name) {
                    // Many-to-many links: a causal-length set, merged as a join (R17).
                    let merged = LinkReplication.merge(local: unknown[name], remote: field, incarnation: incarnation, hlc: &hlc,
                                                       wall: wall, replica: store.identity)
                    unknown[name] = merged.field
                    if merged.localNewer { localNewer = true }
                    continue
                }
                if let existing = unknown[name], existing.stamp > field.stamp { localNewer = true; continue }
                unknown[name] = field
            }
        }
        if let local, local.unknown.keys.contains(where: { !remote.fields.keys.contains($0) && local.unknown[$0]!.stamp.incarnation == incarnation }) {
            localNewer = true
        }
        let alive = causalLength % 2 == 1
        let resolvedColumns = columns.resolve(remote, unknown: &unknown, incarnation: incarnation, alive: alive, localNewer: &localNewer)
        // Tombstone values: the preserved fields of whichever side holds the winning (dead) state.
        var tombstone: [String: CloudField] = [:]
        if !alive {
            tombstone = (local?.causalLength ?? 0) > remote.causalLength ? (local?.tombstone ?? [:]) : remote.fields
            if let local, local.causalLength == remote.causalLength {
                for (name, field) in local.tombstone where tombstone[name].map({ $0.stamp < field.stamp }) ?? true { tombstone[name] = field }
            }
            // A duplicate that lost (a tombstone redirecting to the winner) carries every field, so that edits made
            // to it anywhere reach the winner: fold in what this device knew of the live record.
            if redirect != nil, let local, local.isAlive, local.causalLength == causalLength - 1, let localRow {
                for (index, name) in fieldNames.enumerated() {
                    guard let stamp = localStamps.isEmpty ? nil : localStamps[index] else { continue }
                    let field = CloudField(value: localRow[index + 1], stamp: stamp,
                                           isEncrypted: entity.attribute(named: name)?.options.contains(.allowsCloudEncryption) ?? false)
                    if tombstone[name].map({ $0.stamp < stamp }) ?? true { tombstone[name] = field }
                }
            }
            // Likewise a live version of that incarnation arriving at a device that holds the tombstone already: its
            // fields join the tombstone's, so the result does not depend on which of the two arrived first.
            if redirect != nil, remote.isAlive, remote.causalLength == causalLength - 1 {
                for (name, field) in remote.fields where field.stamp.incarnation == remote.causalLength {
                    if tombstone[name].map({ $0.stamp < field.stamp }) ?? true { tombstone[name] = field }
                }
            }
        }
        // Ended incarnations (R15). The writes of an incarnation that ended as a losing duplicate belong to its winner
        // wherever they surface, also after a re-insert: the set of such incarnations (with their winners) is
        // grow-only and travels with the record, and each device hands the writes it holds to the winner. Records of
        // entities with unique keys also keep, locally, the writes of an incarnation that a plain delete ended: a
        // concurrent resolution of that incarnation as a duplicate (the same causal length) may still claim them.
        // Every source below is joined field by field by stamp, so the result does not depend on arrival order.
        var ended: [EndedIncarnation]?
        var endedChanges: [EndedIncarnation] = []
        var absorbing: [PersistentIdentifier] = []
        if causalLength >= 2, !entity.uniquenessConstraints.isEmpty || !remote.endedRedirects.isEmpty {
            var entries = (local?.causalLength ?? 0) >= 2 ? try endedIncarnations(of: remote.recordID, db) : []
            let before = entries
            func note(_ incarnation: Int64, winner: UUID?, fields: [String: CloudField]) {
                guard incarnation % 2 == 1, incarnation < causalLength else { return }
                let fields = fields.filter { $0.value.stamp.incarnation == incarnation }
                if winner == nil, fields.isEmpty { return }
                let index = entries.firstIndex { $0.incarnation == incarnation } ?? {
                    entries.append(EndedIncarnation(incarnation: incarnation, winner: nil, fields: [:]))
                    return entries.count - 1
                }()
                if let winner, entries[index].winner.map({ winner.bytesPrecede($0) }) ?? true { entries[index].winner = winner }
                for (name, field) in fields where entries[index].fields[name].map({ $0.stamp < field.stamp }) ?? true {
                    entries[index].fields[name] = field
                }
            }
            for entry in remote.endedRedirects { note(entry.incarnation, winner: entry.winner, fields: [:]) }
            if let local {
                if local.isAlive, let localRow {
                    var fields: [String: CloudField] = [:]
                    for (index, name) in fieldNames.enumerated() {
                        guard let stamp = localStamps.isEmpty ? nil : localStamps[index] else { continue }
                        fields[name] = CloudField(value: localRow[index + 1], stamp: stamp,
                                                  isEncrypted: entity.attribute(named: name)?.options.contains(.allowsCloudEncryption) ?? false)
                    }
                    for (name, field) in local.unknown { fields[name] = field }
                    note(local.causalLength, winner: nil, fields: fields)
                } else if !local.isAlive {
                    note(local.causalLength - 1, winner: local.redirect, fields: local.redirect != nil ? local.tombstone : [:])
                }
            }
            note(remote.isAlive ? remote.causalLength : remote.causalLength - 1, winner: remote.isAlive ? nil : remote.redirect,
                 fields: remote.isAlive || remote.redirect != nil ? remote.fields : [:])
            // The incarnation the merged tombstone ends: a redirect carries its writes in the tombstone itself.
            if !alive, redirect != nil, let index = entries.firstIndex(where: { $0.incarnation == causalLength - 1 }) {
                for (name, field) in entries[index].fields where tombstone[name].map({ $0.stamp < field.stamp }) ?? true {
                    tombstone[name] = field
                }
                entries[index].winner = nil
            }
            // Only incarnations that ended (a redirect, or a plain delete of a record with unique keys) are kept.
            entries = entries.filter { $0.incarnation < causalLength - (alive ? 0 : 1) || !alive && redirect == nil && $0.incarnation == causalLength - 1 }
            entries = entries.filter { $0.winner != nil || !entity.uniquenessConstraints.isEmpty }
            entries.sort { $0.incarnation < $1.incarnation }
            for entry in entries where !before.contains(entry) {
                endedChanges.append(entry)
                if let winner = entry.winner, !entry.fields.isEmpty { absorbing.append(PersistentIdentifier(entityName: entity.name, id: winner)) }
            }
            ended = entries
        }
        if !alive {
            // A tombstone: only the causal length and its fields matter.
            localNewer = tombstone.contains { name, field in (remote.fields[name]?.stamp).map { $0 < field.stamp } ?? true }
        }
        if let local, local.causalLength > remote.causalLength { localNewer = true }
        if let local, local.causalLength == remote.causalLength, alive, local.created < remote.created { localNewer = true }

        // Redirects of earlier incarnations this device knows and the cloud record lacks go back up.
        if let ended, ended.compactMap(\.redirect) != remote.endedRedirects { localNewer = true }

        var state = local ?? RecordState(
            id: remote.recordID, entity: entity.name, causalLength: causalLength, created: created, stamps: [:], unknown: [:],
            tombstone: [:], redirect: nil, changeTag: nil, localVersion: 0, pending: false)
        // A deleted record carries only its causal length, creation stamp and tombstone values: field stamps of the
        // dead incarnation can never matter again (a re-insert starts a new incarnation).
        if !alive {
            for index in winners.indices { winners[index] = nil }
            unknown = [:]
        }
        /// Whether the merged stamps differ from the local ones (compared by position, without building a map).
        func stampsDiffer() -> Bool {
            var count = 0
            for (index, winner) in winners.enumerated() {
                guard let winner else { continue }
                count += 1
                if (localStamps.isEmpty ? nil : localStamps[index]) != winner { return true }
            }
            return count != localStampCount
        }
        let changedLocally = local.map {
            $0.causalLength != causalLength || $0.created != created || stampsDiffer() || $0.unknown != unknown || $0.tombstone != tombstone
                || !endedChanges.isEmpty || resolvedColumns.changed
        } ?? true
        state.causalLength = causalLength
        state.created = created
        state.stamps = [:]
        state.unknown = unknown
        state.tombstone = tombstone
        state.redirect = redirect
        if let tag = remote.changeTag { state.changeTag = tag }
        // A merge that changes what this device would upload invalidates any upload already in flight.
        if changedLocally && localNewer { try state.bumpLocalVersion(in: store) }
        state.pending = localNewer
        // A record merged again unchanged (e.g. this device's own upload coming back in a fetch) keeps its row as it is.
        // (`changedLocally` covers the stamps.)
        let unchanged = local.map { !changedLocally && storeChangesNothing(state, over: $0) } ?? false
        if !unchanged {
            try self.store(state, db, stamps: resolvedColumns.encodedStamps(names: fieldNames, winners: winners)
                               ?? encodeStamps(names: fieldNames, order: statements.fieldsInStampOrder, stamps: winners,
                                               oneStampTail: statements.oneStampTail), exists: local != nil,
                           mode: .merge)
        }
        batch?.ledgerHolds(remote.recordID)
        // The upsert never writes `waiting_for`: a new row has none, an existing one keeps what `load` read.
        // (Only records that can wait — of an entity with a to-one relationship — are worth remembering.)
        batch?.merged(remote.recordID, waitingFor: local.map { $0.storedWaitingFor } ?? .some(nil), plainTombstone: !alive && redirect == nil,
                      canWait: entity.relationships.contains { !$0.isToMany })
        for entry in endedChanges { try storeEndedIncarnation(id: remote.recordID, entity: entity.name, entry, db) }
        // The cloud holds this replica's writes up to the newest of them this version carries (R16); then the local
        // writes that lost and that the cloud did not hold are logged.
        if let mark = ConflictRecording.newestOwnStamp(remote, replica: store.identity) {
            try ConflictRecording.noteUploaded(remote.recordID, through: mark, db)
        }
        try ConflictRecording.log(conflicts, id: remote.recordID, entity: entity.name, store: store, db)

        // Materialize the data row.
        let id = PersistentIdentifier(entityName: entity.name, id: remote.recordID)
        if alive {
            let snapshot = Snapshot(entityName: entity.name, id: remote.recordID, values: values)
            func update(_ row: [SQLiteValue]) throws -> MergeOutcome {
                let changed = fieldNames.indices.filter { row[$0 + 1] != values[$0] }
                let written = try resolvedColumns.write(remote.recordID, statements, db)
                guard !changed.isEmpty || !written.isEmpty else { return MergeOutcome(change: nil, absorbing: absorbing) }
                if !changed.isEmpty {
                    let assignments = changed.map { "\(quoted(fieldNames[$0])) = ?" }.joined(separator: ", ")
                    try db.run("UPDATE \(statements.table) SET \(assignments) WHERE \"id\" = ?",
                               changed.map { values[$0] } + [remote.recordID.sqliteValue])
                }
                return MergeOutcome(change: .updated(snapshot, changed.map { fieldNames[$0] } + written), absorbing: absorbing)
            }
            if let storedRow { return try update(storedRow) }
            let insert = try db.cachedStatement(statements.insertKey)
            defer { insert.reset() }
            try insert.withBound(id: remote.recordID, values) { while try insert.step() {} }
            batch?.tableHolds(remote.recordID, entityIndex: entityIndex)
            _ = try resolvedColumns.write(remote.recordID, statements, db)
            return MergeOutcome(change: .inserted(snapshot), absorbing: absorbing)
        }
        guard storedRow != nil else { return MergeOutcome(change: nil, tombstoned: id, absorbing: absorbing) }
        try db.run(statements.delete, [remote.recordID.sqliteValue])
        let preserved = entity.attributes.filter { $0.options.contains(.preserveValueOnDeletion) }
            .compactMap { attribute in tombstone[attribute.name].map { (attribute.name, $0.value) } }
        return MergeOutcome(change: .deleted(DeletedRecord(id: id, preservedValues: preserved)), tombstoned: id, absorbing: absorbing)
    }

    /// Whether any ledger record waits for another (a batch skips releasing waiters when none does).
    static let anyWaiterSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_record WHERE waiting_for IS NOT NULL)")
    static let releaseWaitersSQL = StatementKey("UPDATE replica_sync_record SET waiting_for = NULL WHERE waiting_for = ?")
    static let setWaitingSQL = StatementKey("UPDATE replica_sync_record SET waiting_for = ? WHERE id = ?")
    /// Whether `replica_sync_rejected` holds any entry (merges and acknowledged saves skip deleting the entry of
    /// their record when it holds none).
    static let anyRejectedSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_rejected)")
    static let deleteRejectedSQL = StatementKey("DELETE FROM replica_sync_rejected WHERE id = ? AND record_type = ?")

    /// What the merges of one batch share: knowledge that saves each merge a statement. Create one per batch, inside
    /// the transaction that merges it.
    final class MergeBatch {
        /// Whether `replica_sync_rejected` may hold entries (when it does not, merges skip deleting the entry their
        /// record supersedes). Set again by every rejection.
        var mayHoldRejected: Bool
        /// Whether a fetched version whose change tag the ledger holds may be skipped (see `merge`): set by the
        /// engine for fetches that continue from a valid token with no full resync under way, where every tag in
        /// the ledger names a version of the zone being read. `false` by default.
        var skipsHeldVersions = false
        /// Whether the records merged had their encrypted fields opened (the engine has a cipher), so that encrypted
        /// values of fields this schema does not know are plaintext and may go into columns (SyncLedger+StoreColumns).
        var fieldsAreOpened = false
        /// The fields other app versions sharing the store file declare, once read (``columnFields(of:_:)``).
        var columnFieldsRead: [[StoreColumnField]]?

        /// The largest record ID in the ledger (`nil`: none), once read; kept up to date by the batch's merges.
        private var ledgerMax: UUID??
        /// The largest record ID in each entity's table (by entity index; `nil` until read), kept up to date likewise.
        private var tableMax: [UUID??] = []

        init(_ db: Connection) throws {
            mayHoldRejected = try db.scalar(SyncLedger.anyRejectedSQL) != .integer(0)
        }

        /// Whether `id` is certainly in neither the ledger nor the table of the entity at `entityIndex`: it sorts
        /// after the largest ID of both (IDs are 16-byte blobs, ordered bytewise). Imports of new records, whose IDs
        /// are time-ordered, skip two lookups that would find nothing; any other ID is looked up as usual.
        ///
        /// The table's largest ID is read only when the ledger's does not decide it already (a batch of records this
        /// device holds, e.g. its own uploads coming back, reads only the ledger's).
        func isNew(_ id: UUID, entityIndex: Int, store: Store, db: Connection) throws -> Bool {
            if ledgerMax == nil { ledgerMax = .some(try Self.largestID(Self.ledgerLargestIDSQL, db)) }
            if let bound = ledgerMax!, !bound.bytesPrecede(id) { return false }
            if tableMax.count <= entityIndex { tableMax += [UUID??](repeating: nil, count: entityIndex + 1 - tableMax.count) }
            if tableMax[entityIndex] == nil {
                tableMax[entityIndex] = .some(try Self.largestID(store.statements[entityIndex].largestIDKey, db))
            }
            if let bound = tableMax[entityIndex]!, !bound.bytesPrecede(id) { return false }
            return true
        }

        /// The `waiting_for` the ledger row of each record merged in this batch holds, where known: what
        /// ``resolveReferences(after:tombstoned:store:db:batch:)`` would write again is left as it is. Valid for the
        /// batch's write transaction only: no other connection writes meanwhile, the ledger upserts never set
        /// `waiting_for`, and the batch's own `waiting_for` statements update it (``setWaiting(_:for:)``,
        /// ``releaseWaiters(of:_:)``).
        private(set) var waitingFor: [UUID: UUID?] = [:]
        /// The inverse of `waitingFor`'s known parents: the records known to wait for each parent, so that releasing a
        /// parent's waiters costs what they are, not a scan of everything the batch merged.
        private var waiters: [UUID: Set<UUID>] = [:]
        /// Records whose last merge in this batch left a tombstone that redirects nowhere (not a losing duplicate): no
        /// redirect chain starts there.
        private(set) var plainTombstones: Set<UUID> = []
        /// Whether some ledger row may wait for a parent (`nil`: not read yet). Only ever goes from `false` to `true`.
        private var mayHaveWaiters: Bool?

        /// Sets what is known of the `waiting_for` of `id`'s ledger row (`value` `nil`: unknown; `.some(nil)`: none).
        private func know(_ id: UUID, waitingFor value: UUID??) {
            // (One lookup of `id`: the previous value comes back from the update.)
            let previous = value.map { waitingFor.updateValue($0, forKey: id) } ?? waitingFor.removeValue(forKey: id)
            if let previous, let parent = previous { waiters[parent]?.remove(id) }
            if let known = value, let parent = known { waiters[parent, default: []].insert(id) }
        }

        /// Records what the merge of `id` left in its ledger row (`waitingFor` `nil`: unknown). A record that cannot
        /// wait (`canWait` false: its entity has no to-one relationship) is not remembered: nothing asks about it.
        func merged(_ id: UUID, waitingFor: UUID??, plainTombstone: Bool, canWait: Bool = true) {
            if canWait { know(id, waitingFor: waitingFor) } else if self.waitingFor[id] != nil { know(id, waitingFor: nil) }
            if plainTombstone { plainTombstones.insert(id) } else if !plainTombstones.isEmpty { plainTombstones.remove(id) }
        }

        /// Forgets what is known of record `id`'s ledger row.
        func forget(_ id: UUID) {
            know(id, waitingFor: nil)
            if !plainTombstones.isEmpty { plainTombstones.remove(id) }
        }

        /// Records that the ledger row of `id` now waits for `parent` (`nil`: for nothing).
        func setWaiting(_ id: UUID, for parent: UUID?) {
            know(id, waitingFor: .some(parent))
            if parent != nil { mayHaveWaiters = true }
        }

        /// Runs `UPDATE … SET waiting_for = NULL WHERE waiting_for = parent` unless no ledger row can wait (read once
        /// per batch, inside its write transaction, and kept up to date by ``setWaiting(_:for:)``).
        func releaseWaiters(of parent: UUID, _ db: Connection) throws {
            if mayHaveWaiters == nil { mayHaveWaiters = try db.scalar(SyncLedger.anyWaiterSQL) != .integer(0) }
            guard mayHaveWaiters == true else { return }
            try db.run(SyncLedger.releaseWaitersSQL, [parent.sqliteValue])
            // (In any order: each assignment stands alone.)
            for id in waiters.removeValue(forKey: parent) ?? [] { waitingFor[id] = .some(nil) }
        }

        /// Records that the ledger now holds `id`.
        func ledgerHolds(_ id: UUID) {
            if case let .some(bound) = ledgerMax, bound.map({ $0.bytesPrecede(id) }) ?? true { ledgerMax = .some(id) }
        }

        /// Records that the table of the entity at `entityIndex` now holds `id`.
        func tableHolds(_ id: UUID, entityIndex: Int) {
            guard entityIndex < tableMax.count else { return }
            if case let .some(bound) = tableMax[entityIndex], bound.map({ $0.bytesPrecede(id) }) ?? true { tableMax[entityIndex] = .some(id) }
        }

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
    }

    /// The fields of `remote` the entity of `statements` stores, by storage position (`nil`: absent).
    private static func fieldsByPosition(_ remote: CloudRecord, _ statements: EntityStatements) -> [CloudField?] {
        let count = statements.fieldNames.count
        var result = [CloudField?](unsafeUninitializedCapacity: count) { buffer, initialized in
            buffer.initialize(repeating: nil)
            initialized = count
        }
        for (name, field) in remote.fields {
            if let index = statements.fieldIndex[name] { result[index] = field }
        }
        return result
    }

    /// Keeps a record whose type this schema does not know, so a newer app version's data survives here.
    static func keepUnknownRecord(_ record: CloudRecord, _ db: Connection) throws {
        var merged = record
        if case let .text(json)? = try db.scalar("SELECT record FROM replica_sync_unknown_record WHERE id = ?", [record.recordID.sqliteValue]),
           let existing = ReplicaJSON.decode(CloudRecord.self, json) {
            merged = mergeOpaque(existing, record)
        }
        try db.run("""
            INSERT INTO replica_sync_unknown_record (id, record_type, record) VALUES (?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET record = excluded.record, pending = 0
            """, [record.recordID.sqliteValue, .text(record.recordType), .text(try ReplicaJSON.string(merged))])
    }

    /// The join of two versions of a record, field by field (used for records this schema cannot materialize).
    static func mergeOpaque(_ a: CloudRecord, _ b: CloudRecord) -> CloudRecord {
        var result = a.causalLength >= b.causalLength ? a : b
        let incarnation = result.causalLength % 2 == 1 ? result.causalLength : result.causalLength - 1
        var fields: [String: CloudField] = [:]
        for (name, field) in a.fields.merging(b.fields, uniquingKeysWith: { $0.stamp >= $1.stamp ? $0 : $1 })
        where field.stamp.incarnation >= incarnation || result.causalLength % 2 == 0 {
            fields[name] = field
        }
        result.fields = fields
        var ended = a.endedRedirects
        for entry in b.endedRedirects {
            if let index = ended.firstIndex(where: { $0.incarnation == entry.incarnation }) {
                if entry.winner.bytesPrecede(ended[index].winner) { ended[index].winner = entry.winner }
            } else {
                ended.append(entry)
            }
        }
        result.endedRedirects = ended.sorted { $0.incarnation < $1.incarnation }
        if a.causalLength == b.causalLength { result.created = min(a.created, b.created) }
        result.changeTag = b.changeTag ?? a.changeTag
        return result
    }

    private static let logConflictSQL = StatementKey(
        "INSERT INTO replica_sync_conflict (id, entity, field, local_stamp, winning_stamp, kind, winner) VALUES (?, ?, ?, ?, ?, ?, ?)")
    private static let trimConflictsSQL = StatementKey(
        "DELETE FROM replica_sync_conflict WHERE seq <= (SELECT max(seq) FROM replica_sync_conflict) - ?")

    static func logConflict(id: UUID, entity: String, field: String, local: FieldStamp, winning: FieldStamp,
                            duplicateOf winner: UUID? = nil, kind: ConflictLogEntry.Kind = .overwritten, _ db: Connection) throws {
        try db.run(logConflictSQL, [id.sqliteValue, .text(entity), .text(field), .text(local.description), .text(winning.description),
                    .text(winner == nil ? kind.rawValue : ConflictLogEntry.Kind.duplicate.rawValue), winner?.sqliteValue ?? .null])
        // The entry just logged has the largest `seq` (AUTOINCREMENT, never written explicitly, from 1): while it is
        // within the capacity, the trim below would delete nothing.
        if db.lastInsertRowID <= Int64(conflictLogCapacity) { return }
        try db.run(trimConflictsSQL, [.integer(Int64(conflictLogCapacity))])
    }

    // MARK: Relationships

    /// After merging remote records: the children of records that died follow those records' delete rules; live
    /// records whose references point at a deleted record follow that record's rule; references to records not here
    /// yet mark the record as waiting for its parent (it is kept, never deleted for it); records that arrived release
    /// their waiters. Returns the local changes made (to be stamped and uploaded like any local change). A winner's
    /// registers that absorb a losing duplicate's fields keep those fields' own clocks: that change is added to
    /// `changes` (the merge's own changes, recorded in history but never re-stamped), not to the returned ones.
    ///
    /// `batch`, the merges' shared knowledge, saves statements: tombstones known to redirect nowhere are not looked up,
    /// and `waiting_for` is written only where it changes.
    static func resolveReferences(after changes: inout StoreChanges, tombstoned: [PersistentIdentifier], store: Store, db: Connection,
                                  batch: MergeBatch? = nil) throws -> StoreChanges {
        var writer = StoreWriter(store: store, db: db)
        for id in tombstoned {
            if batch?.plainTombstones.contains(id.id) != true, let winner = try liveRedirectTarget(of: id.id, store: store, db) {
                // A duplicate that lost: references to it now point to the winner, whose fields absorb its edits.
                try writer.retargetReferences(from: id, to: winner)
                try forwardRedirects(into: PersistentIdentifier(entityName: id.entityName, id: winner), store: store, db: db, changes: &changes)
            } else {
                try writer.applyDeleteRulesAfterRemoteDelete(of: id)
            }
            if let batch { try batch.releaseWaiters(of: id.id, db) } else { try db.run(releaseWaitersSQL, [id.id.sqliteValue]) }
        }
        let live = changes.inserted + changes.updated.map(\.0)
        for snapshot in live where !snapshot.values.isEmpty {
            // A record without to-one relationships never waits for a parent (relationships are never removed from a
            // synced schema, so it never waited before either).
            guard let entity = store.entity(named: snapshot.entityName), !entity.toOneRelationships.isEmpty else { continue }
            var waitingFor: UUID?
            for (offset, relationship) in entity.toOneRelationships.enumerated() {
                guard case let .blob(bytes) = snapshot.values[entity.attributes.count + offset], let target = UUID(bytes: bytes),
                      let destination = store.entity(named: relationship.destination),
                      let destinationSQL = store.statements(for: relationship.destination) else { continue }
                // Whether the parent's row is here (its ID bound in place: no array of values, no copy of the row).
                let select = try db.cachedStatement(destinationSQL.selectByIDKey)
                let parentHere: Bool
                do {
                    defer { select.reset() }
                    try select.bind(target, at: 0)
                    parentHere = try select.step()
                }
                if parentHere { continue }
                if let parent = try load(target, store: store, db, entity: destination.name), !parent.isAlive {
                    if let winner = try liveRedirectTarget(of: target, store: store, db) {
                        try writer.retargetReference(child: snapshot.persistentModelID, reference: relationship.name, to: winner)
                        continue
                    }
                    let rule = relationship.inverse.flatMap { destination.relationship(named: $0)?.deleteRule } ?? .noAction
                    try writer.followDeletedReference(child: snapshot.persistentModelID, reference: relationship.name, rule: rule)
                } else {
                    waitingFor = waitingFor ?? target
                }
            }
            if let batch {
                if batch.waitingFor[snapshot.id] == .some(waitingFor) { continue }
                batch.setWaiting(snapshot.id, for: waitingFor)
            }
            try db.run(setWaitingSQL, [waitingFor?.sqliteValue ?? .null, snapshot.id.sqliteValue])
        }
        // Only records of an entity some to-one relationship points to can have waiters.
        let referenced = Set(store.entities.flatMap { $0.toOneRelationships.map(\.destination) })
        for snapshot in changes.inserted where referenced.contains(snapshot.entityName) {
            if let batch { try batch.releaseWaiters(of: snapshot.id, db) } else { try db.run(releaseWaitersSQL, [snapshot.id.sqliteValue]) }
        }
        return writer.changes
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

extension Store {
    /// The entity named `name`, if this store holds it.
    func entity(named name: String) -> Schema.Entity? { entityIndex[name].map { entities[$0] } }
    /// The SQL of entity `name`, if this store holds it.
    func statements(for name: String) -> EntityStatements? { entityIndex[name].map { statements[$0] } }
}
