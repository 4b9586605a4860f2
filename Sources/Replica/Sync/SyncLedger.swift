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
