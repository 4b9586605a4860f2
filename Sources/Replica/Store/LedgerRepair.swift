import CSQLite
import Foundation

/// Sync bookkeeping that cannot be read: a column of a record's ledger row (or a store-level metadata value) that
/// does not decode. Names the store, the record and the column — never the bytes (they may hold an encrypted
/// field's plaintext or ciphertext).
///
/// Reported by ``LedgerState/corrupt(_:)`` and ``ReplicationState/corruption``, counted by
/// ``SyncStatus/corruptRecords``, and thrown as ``ReplicaError/corruptBookkeeping(_:)`` where nothing can go on.
/// See `Specs/replication-protocol.md` (R14) for how such a record is kept and repaired.
public struct BookkeepingCorruption: Error, Hashable, Sendable, CustomStringConvertible {
    /// The store (its configuration name).
    public let store: String
    /// The record whose ledger row holds the unreadable column; `nil` for store-level metadata.
    public let recordID: UUID?
    /// The unreadable column of `replica_sync_record` (`stamps`, `created`, `unknown`, `tombstone`, `causal_length`,
    /// `entity`, `redirect`, `change_tag`, `waiting_for`, `local_version`, `pending`, `state`), or a metadata value as
    /// `replica_metadata.<key>`.
    public let column: String

    /// A corruption of `column` of record `recordID` in store `store`.
    public init(store: String, recordID: UUID?, column: String) {
        self.store = store
        self.recordID = recordID
        self.column = column
    }

    public var description: String {
        let place = recordID.map { "record \($0.uuidString.lowercased())" } ?? "the store"
        return "unreadable sync bookkeeping in store '\(store)': column '\(column)' of \(place)"
    }
}

// How a ledger row whose bookkeeping cannot be read is kept (R14, DESIGN.md principles 6 and 9).
//
// Every read of a ledger row checks each column (`SyncLedger.readState`). A row with a column that does not hold
// what the ledger writes there is *corrupt*: it is never read as "no stamps", "nothing unknown" or zero. Where a
// write follows (a save, a merge, an upload read), the row is first rebuilt and marked `state = 'corrupt'`, `reason`
// = the first unreadable column:
//
// - field stamps: every field of the stored row keeps its value, stamped with the *lowest* stamp of the incarnation
//   (physical 0, counter 0, this store's replica): any real write of the field — the cloud's copy, another device's
//   edit, a later local edit — wins over it, and where none exists the local value stays and is uploaded;
// - the creation stamp: the store's current clock (later than the real one: a merged cloud copy's wins by `min`);
// - the causal length: the creation stamp's incarnation, else the stamps', else 1 — odd while the record's row
//   exists, even when it does not;
// - unknown fields, tombstone values, redirect, change tag, waiting-for: none (a merged cloud copy brings them back);
//   local version 0; pending.
//
// A local save on a corrupt record goes on as usual on the rebuilt row: the new edit is stamped with a real clock and
// so wins over the lowest stamps — nothing it wrote is lost. A marked record is not uploaded (the outbox skips it),
// never marked synced, counted in `SyncStatus.corruptRecords` and reported as `LedgerState.corrupt`. The engine then
// reads the whole zone (a full resync): the merge of the record's cloud copy repairs the row (and clears the mark);
// a record the zone does not hold, or holds in a form that cannot be applied, is released when the full read
// completes, with its rebuilt bookkeeping, and uploaded.

extension SyncLedger {
    /// The stamp a rebuilt row gives a field whose stamp could not be read: the lowest stamp of `incarnation` on
    /// `replica` (physical 0, counter 0), below every real write of that incarnation.
    static func lowestStamp(incarnation: Int64, replica: UUID) -> FieldStamp {
        FieldStamp(incarnation: incarnation, clock: HLC(physical: 0, logical: 0, replica: replica))
    }

    /// Rebuilds the unreadable columns of `state` (as `readState` listed them in ``RecordState/corruptColumns``) as the
    /// top of this file describes, writes the row and marks it `corrupt`, inside the caller's write transaction.
    /// `entity`, when known, is the record's entity (else the stored one, else the table holding the record's row).
    /// Returns `false` when the entity cannot be told (a tombstone whose `entity` is unreadable): the row is only
    /// marked, its bytes stay, and a cloud copy of the record repairs it.
    static func rebuildCorrupt(_ state: inout RecordState, entity hint: String?, store: Store, db: Connection) throws -> Bool {
        guard let column = state.corruptColumns.first else { return true }
        let columns = state.corruptColumns
        func rowExists(_ statements: EntityStatements) throws -> Bool {
            let select = try db.cachedStatement(statements.selectByIDKey)
            defer { select.reset() }
            try select.bind(state.id, at: 0)
            return try select.step()
        }
        var entityIndex = columns.contains("entity") ? nil : store.entityIndex[state.entity]
        if entityIndex == nil, let hint { entityIndex = store.entityIndex[hint] }
        if entityIndex == nil { entityIndex = try store.statements.firstIndex(where: rowExists) }
        guard let entityIndex else {
            try markCorrupt(state.id, column: column, db)
            return false
        }
        let statements = store.statements[entityIndex]
        state.entity = statements.entityName
        let alive = try rowExists(statements)
        if columns.contains("causal_length") {
            var incarnation: Int64 = 1
            if !columns.contains("created"), state.created.incarnation >= 1 {
                incarnation = state.created.incarnation
            } else if !columns.contains("stamps"), let top = state.stamps.values.map(\.incarnation).max(), top >= 1 {
                incarnation = top
            }
            incarnation = min(incarnation, maxCausalLength - 1)
            if incarnation % 2 == 0 { incarnation -= 1 }
            state.causalLength = alive ? incarnation : incarnation + 1
        }
        if columns.contains("stamps") {
            state.stamps = [:]
            if state.isAlive {
                let lowest = lowestStamp(incarnation: state.incarnation, replica: store.identity)
                for name in statements.fieldNames { state.stamps[name] = lowest }
            }
        }
        if columns.contains("created") {
            state.created = FieldStamp(incarnation: state.incarnation, clock: try loadHLC(db, replica: store.identity))
        }
        // (Unknown fields, tombstone values, redirect, change tag and local version read as none, 0.)
        state.pending = true
        try self.store(state, db)
        try markCorrupt(state.id, column: column, db)
        state.storedState = "corrupt"
        state.storedReason = column
        if columns.contains("waiting_for") { state.storedWaitingFor = .some(nil) }
        state.corruptColumns = []
        return true
    }

    /// Marks ledger row `id` corrupt (state `corrupt`, reason `column`, pending), clearing a `waiting_for` that is not a
    /// record ID.
    static func markCorrupt(_ id: UUID, column: String, _ db: Connection) throws {
        try db.run("""
            UPDATE replica_sync_record SET state = 'corrupt', reason = ?, pending = 1,
                waiting_for = CASE WHEN typeof(waiting_for) = 'blob' AND length(waiting_for) = 16 THEN waiting_for END
            WHERE id = ?
            """, [.text(column), id.sqliteValue])
    }
}

// MARK: The store's clock

extension SyncLedger {
    /// The HLC of a store whose stored clock is missing or does not parse (R2): the largest clock of every stamp the
    /// store holds — field and creation stamps of the ledger, unknown fields and tombstone values, records of unknown
    /// types, ended incarnations, the conflict log — so the next tick orders after every one of them; a fresh store
    /// (none) starts at zero. The tick also takes the wall clock, so the result is never behind it either. Stamps that
    /// cannot be read are skipped (their rows are corrupt, and rebuilt on their own). Written back by the next save or
    /// merge, in the same transaction. Complexity: one scan of the ledger tables.
    static func rebuildHLC(_ db: Connection, replica: UUID) throws -> HLC {
        var top = HLC.zero(replica)
        func see(_ clock: HLC) {
            guard clock.fitsHex, clock.physical > top.physical || (clock.physical == top.physical && clock.logical > top.logical) else { return }
            top = HLC(physical: clock.physical, logical: clock.logical, replica: replica)
        }
        func see(_ fields: [String: CloudField]?) { for field in (fields ?? [:]).values { see(field.stamp.clock) } }
        func text(_ value: SQLiteValue) -> String? { if case let .text(text) = value { text } else { nil } }
        let ledger = try db.cachedStatement("SELECT created, stamps, unknown, tombstone FROM replica_sync_record")
        do {
            defer { ledger.reset() }
            while try ledger.step() {
                if let created = readStamp(ledger, 0) { see(created.clock) }
                for stamp in (readStamps(ledger, 1) ?? [:]).values { see(stamp.clock) }
                for column: Int32 in [2, 3] where sqlite3_column_type(ledger.handle, column) == SQLITE_TEXT {
                    see(decodeCloudFields(ledger.string(column)))
                }
            }
        }
        for row in try db.rows("SELECT record FROM replica_sync_unknown_record") {
            if let json = text(row[0]), let record = ReplicaJSON.decode(CloudRecord.self, json) {
                see(record.created.clock)
                see(record.fields)
            }
        }
        for row in try db.rows("SELECT fields FROM replica_sync_ended_redirect WHERE fields IS NOT NULL") {
            if let json = text(row[0]) { see(decodeCloudFields(json)) }
        }
        for row in try db.rows("SELECT local_stamp, winning_stamp FROM replica_sync_conflict") {
            for value in row { if let json = text(value), let stamp = FieldStamp(json) { see(stamp.clock) } }
        }
        return top
    }
}
