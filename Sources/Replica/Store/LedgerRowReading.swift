import CSQLite
import Foundation

// Reading a ledger row (`replica_sync_record`) into a `SyncLedger.RecordState`, checking every column: a value that
// does not decode is reported (`RecordState.corruptColumns`), never read as a default (see LedgerRepair.swift).

extension SyncLedger {
    /// The columns every read of a ledger row selects, in the order ``readState(_:_:from:stamps:)`` reads them.
    static let stateColumns = "entity, causal_length, created, stamps, unknown, tombstone, redirect, change_tag, local_version, pending, state, waiting_for, reason"

    static let loadSQL = StatementKey("SELECT \(stateColumns) FROM replica_sync_record WHERE id = ?")

    static let loadAllSQL = StatementKey("SELECT id, \(stateColumns) FROM replica_sync_record ORDER BY id")

    /// Every record state of the ledger, in ID order (rows whose ID is no 16-byte blob are skipped): what
    /// ``loadAsStored(_:_:)`` returns for each (unreadable columns listed in ``RecordState/corruptColumns``, never
    /// rebuilt: nothing is written), read in one scan.
    static func loadAll(_ db: Connection) throws -> [RecordState] {
        let statement = try db.cachedStatement(loadAllSQL)
        defer { statement.reset() }
        var states: [RecordState] = []
        while try statement.step() {
            guard let id = statement.uuid(0) else { continue }
            states.append(readState(id, statement, from: 1, stamps: readStamps(statement, 4)))
        }
        return states
    }

    /// The ledger row of `id` as stored, without repairing anything: unreadable columns are listed in
    /// ``RecordState/corruptColumns`` and hold placeholders. For inspection; writers use ``load(_:store:_:entity:)``.
    static func loadAsStored(_ id: UUID, _ db: Connection) throws -> RecordState? {
        let statement = try db.cachedStatement(loadSQL)
        defer { statement.reset() }
        try statement.bind(id, at: 0)
        guard try statement.step() else { return nil }
        return readState(id, statement, from: 0, stamps: readStamps(statement, 3))
    }

    /// The ledger state of `id` for a write (inside the caller's write transaction). A row whose bookkeeping cannot be
    /// read is rebuilt first and marked `corrupt` (``rebuildCorrupt(_:entity:store:db:)``; `entity`, when known, is the
    /// record's entity). `nil` when the ledger has no row for `id`, or has one whose entity cannot be told (a
    /// tombstone whose `entity` column is unreadable: it waits, marked, for a cloud copy).
    static func load(_ id: UUID, store: Store, _ db: Connection, entity: String? = nil) throws -> RecordState? {
        guard var state = try loadAsStored(id, db) else { return nil }
        if !state.corruptColumns.isEmpty {
            guard try rebuildCorrupt(&state, entity: entity, store: store, db: db) else { return nil }
        }
        return state
    }

    /// ``load(_:store:_:entity:)`` for the merge or update of a record of the entity of `statements`: the state with an
    /// empty `stamps` map, and instead the stamps by storage position and the number of fields stamped in all
    /// (``readStampsByPosition(_:_:_:)``), read without building the map (a row that needs rebuilding builds it).
    static func load(_ id: UUID, store: Store, _ db: Connection, stampsBy statements: EntityStatements) throws
        -> (state: RecordState, stamps: [FieldStamp?], stampCount: Int)? {
        var result: (state: RecordState, stamps: [FieldStamp?], stampCount: Int)
        do {
            let statement = try db.cachedStatement(loadSQL)
            defer { statement.reset() }
            try statement.bind(id, at: 0)
            guard try statement.step() else { return nil }
            let stamps = readStampsByPosition(statement, 3, statements)
            result = (readState(id, statement, from: 0, stamps: stamps.readable ? [:] : nil), stamps.stamps, stamps.count)
        }
        // Stamps of an incarnation beyond the record's, or whose clock the text form cannot hold, are unreadable too.
        if !result.state.corruptColumns.contains("stamps"), !result.state.corruptColumns.contains("causal_length"),
           result.stamps.contains(where: { $0.map { !isSound($0, causalLength: result.state.causalLength) } ?? false }) {
            // (In column order: after entity, causal length and creation stamp.)
            let before = result.state.corruptColumns.prefix { ["entity", "causal_length", "created"].contains($0) }.count
            result.state.corruptColumns.insert("stamps", at: before)
        }
        guard !result.state.corruptColumns.isEmpty else { return result }
        // The row is rebuilt (and re-read whole): the map gives the stamps by position.
        guard var state = try load(id, store: store, db, entity: statements.entityName) else { return nil }
        let stamps = statements.fieldNames.map { state.stamps[$0] }
        let count = state.stamps.count
        state.stamps = [:]
        return (state, stamps, count)
    }

    /// The record state in the columns of ``stateColumns`` starting at `first` of the current row of `statement`, with
    /// `stamps` (read by the caller from column `first + 3`; `nil`: unreadable). Every column is checked: one that does
    /// not hold what the ledger writes there (another storage class, text or bytes that do not decode, a number out of
    /// range, stamps of an incarnation beyond the causal length) is listed in ``RecordState/corruptColumns`` and read
    /// as a placeholder — never taken for "no stamps", "nothing unknown" or zero (DESIGN.md principle 9).
    static func readState(_ id: UUID, _ statement: Statement, from first: Int32, stamps: [String: FieldStamp]?) -> RecordState {
        let handle = statement.handle
        @inline(__always) func type(_ offset: Int32) -> Int32 { sqlite3_column_type(handle, first + offset) }
        var corrupt: [String] = []
        let storedState = knownState(statement, first + 10)
        let entity = type(0) == SQLITE_TEXT ? statement.string(first) : ""
        if entity.isEmpty { corrupt.append("entity") }
        var causalLength = type(1) == SQLITE_INTEGER ? statement.int64(first + 1) : -1
        // An undecryptable record never merged here is a placeholder of causal length 0 (see E5).
        let placeholder = causalLength == 0 && storedState == "undecryptable"
        if !placeholder && !(1...maxCausalLength).contains(causalLength) {
            corrupt.append("causal_length")
            causalLength = 0
        }
        let knownLength = !corrupt.contains("causal_length")
        var created = readStamp(statement, first + 2)
        if let stamp = created, !placeholder, knownLength, !isSound(stamp, causalLength: causalLength) { created = nil }
        if created == nil { corrupt.append("created") }
        var stamps = stamps
        if let map = stamps, knownLength, map.values.contains(where: { !isSound($0, causalLength: causalLength) }) { stamps = nil }
        if stamps == nil { corrupt.append("stamps") }
        func fields(_ offset: Int32, _ column: String) -> [String: CloudField] {
            switch type(offset) {
            case SQLITE_NULL: return [:]
            case SQLITE_TEXT: if let fields = decodeCloudFields(statement.string(first + offset)) { return fields }
            default: break
            }
            corrupt.append(column)
            return [:]
        }
        let unknown = fields(4, "unknown"), tombstone = fields(5, "tombstone")
        let redirect = statement.uuid(first + 6)
        if redirect == nil && type(6) != SQLITE_NULL { corrupt.append("redirect") }
        let changeTag: String? = type(7) == SQLITE_TEXT ? statement.string(first + 7) : nil
        if changeTag == nil && type(7) != SQLITE_NULL { corrupt.append("change_tag") }
        var localVersion = type(8) == SQLITE_INTEGER ? statement.int64(first + 8) : -1
        if !(0...ReplicationBounds.maxLocalVersion).contains(localVersion) {
            corrupt.append("local_version")
            localVersion = 0
        }
        let pendingValue = type(9) == SQLITE_INTEGER ? statement.int64(first + 9) : -1
        if pendingValue != 0 && pendingValue != 1 { corrupt.append("pending") }
        if storedState == nil { corrupt.append("state") }
        let waitingFor = statement.uuid(first + 11)
        if waitingFor == nil && type(11) != SQLITE_NULL { corrupt.append("waiting_for") }
        return RecordState(
            id: id, entity: entity, causalLength: causalLength,
            created: created ?? FieldStamp(incarnation: 0, clock: .zero(id)), stamps: stamps ?? [:],
            unknown: unknown, tombstone: tombstone, redirect: redirect, changeTag: changeTag,
            localVersion: localVersion, pending: pendingValue != 0,
            storedState: storedState, storedWaitingFor: .some(waitingFor),
            storedReason: storedState == "corrupt" && type(12) == SQLITE_TEXT ? statement.string(first + 12) : nil,
            corruptColumns: corrupt)
    }

    /// The `state` column at `index` of the current row as one of the ledger's states (a literal: no string is made
    /// per row), or `nil` when it holds anything else.
    @inline(__always)
    private static func knownState(_ statement: Statement, _ index: Int32) -> String? {
        guard sqlite3_column_type(statement.handle, index) == SQLITE_TEXT, let text = sqlite3_column_text(statement.handle, index) else { return nil }
        let count = Int(sqlite3_column_bytes(statement.handle, index))
        func matches(_ literal: StaticString) -> Bool {
            literal.utf8CodeUnitCount == count && memcmp(text, literal.utf8Start, count) == 0
        }
        if matches("synced") { return "synced" }
        if matches("pending") { return "pending" }
        if matches("rejected") { return "rejected" }
        if matches("undecryptable") { return "undecryptable" }
        if matches("corrupt") { return "corrupt" }
        return nil
    }

    /// Whether `stamp` can belong to a record of `causalLength`: its incarnation within `0 ... causalLength` and its
    /// clock within the text form's range.
    @inline(__always)
    static func isSound(_ stamp: FieldStamp, causalLength: Int64) -> Bool {
        stamp.incarnation >= 0 && stamp.incarnation <= causalLength && stamp.clock.fitsHex
    }
}
