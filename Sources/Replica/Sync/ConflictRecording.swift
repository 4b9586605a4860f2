import Foundation

// Upload marks and the conflict log (R16). `ConflictRecording` and its table's DDL (`createSQL`) are declared in
// Store/Ledger.swift with the ledger's tables.

extension ConflictRecording {
    // Writes only when the mark grows (fixed-width hex orders as the stamps do), so merging a version again writes
    // nothing (LedgerWriteAvoidanceTests).
    private static let noteSQL = StatementKey("""
        INSERT INTO replica_sync_uploaded (id, through) VALUES (?, ?)
        ON CONFLICT (id) DO UPDATE SET through = excluded.through WHERE excluded.through > through
        """)
    private static let readSQL = StatementKey("SELECT through FROM replica_sync_uploaded WHERE id = ?")

    /// The newest stamp of `replica` among the fields of `record` (`nil`: none).
    static func newestOwnStamp(_ record: CloudRecord, replica: UUID) -> HLC? {
        var newest: HLC?
        for field in record.fields.values where field.stamp.clock.replica == replica {
            if newest.map({ $0 < field.stamp.clock }) ?? true { newest = field.stamp.clock }
        }
        return newest
    }

    /// Records that the cloud holds every write of this replica to record `id` up to `through`.
    static func noteUploaded(_ id: UUID, through: HLC, _ db: Connection) throws {
        try db.run(noteSQL, [id.sqliteValue, .text(through.hex)])
    }

    /// The upload mark of record `id`.
    /// - Throws: ``BookkeepingCorruption`` when the stored mark cannot be read (never taken for "none").
    static func uploadMark(_ id: UUID, storeName: String, _ db: Connection) throws -> HLC? {
        guard let row = try db.rows(readSQL, [id.sqliteValue]).first else { return nil }
        guard case let .text(text) = row[0], let mark = HLC(hex: Substring(text)) else {
            throw BookkeepingCorruption(store: storeName, recordID: id, column: "replica_sync_uploaded.through")
        }
        return mark
    }

    /// Whether a local write stamped `stamp` is one the cloud did not hold.
    static func isUnsynced(_ stamp: FieldStamp, replica: UUID, mark: HLC?) -> Bool {
        stamp.clock.replica == replica && mark.map { $0 < stamp.clock } ?? true
    }

    /// A candidate entry: a local write that lost, before the upload mark is consulted.
    struct Loss {
        var field: String
        var local: FieldStamp
        var winning: FieldStamp
        var kind: ConflictLogEntry.Kind
    }

    /// Logs the losses of record `id` whose local write the cloud did not hold.
    static func log(_ losses: [Loss], id: UUID, entity: String, store: Store, _ db: Connection) throws {
        guard !losses.isEmpty else { return }
        let mark = try uploadMark(id, storeName: store.configuration.name, db)
        for loss in losses where isUnsynced(loss.local, replica: store.identity, mark: mark) {
            try SyncLedger.logConflict(id: id, entity: entity, field: loss.field, local: loss.local, winning: loss.winning,
                                       kind: loss.kind, db)
        }
    }

    /// The newest stamp a remote version carries (its creation or any field): a delete carries no stamp of its own,
    /// so this is the latest write known to have happened before it.
    static func newestStamp(_ record: CloudRecord) -> FieldStamp {
        record.fields.values.reduce(record.created) { max($0, $1.stamp) }
    }

    /// Before the records a remote delete cascaded to are stamped as deleted: logs, for each such record this device
    /// had written without the cloud holding it, every such field (kind ``ConflictLogEntry/Kind/cascaded``), with
    /// `applied` (this device's clock as it applied the delete) as the winning stamp.
    static func logCascades(_ deleted: [DeletedRecord], applied: HLC, store: Store, db: Connection) throws {
        for record in deleted where record.viaCascade {
            guard let state = try SyncLedger.load(record.id.id, store: store, db, entity: record.id.entityName),
                  state.isAlive, state.pending else { continue }
            let winning = FieldStamp(incarnation: state.causalLength + 1, clock: applied)
            let losses = state.stamps.sorted { $0.key < $1.key }.compactMap { name, stamp in
                stamp.incarnation == state.incarnation ? Loss(field: name, local: stamp, winning: winning, kind: .cascaded) : nil
            }
            try log(losses, id: record.id.id, entity: record.id.entityName, store: store, db)
        }
    }
}
