import Foundation

// Records of a type this schema does not know are kept whole in `replica_sync_unknown_record` (R9). When a version
// that declares the type opens the store — the same app after an upgrade, or a newer process sharing an app-group
// store file with an older one that fetched them — it adopts them: they are merged as received, so the rows appear
// in the entity's table although the fetch that brought them lies behind the change token.

extension SyncLedger {
    /// Takes the kept records of types `store` declares out of `replica_sync_unknown_record`, in ID order, for the
    /// caller to merge. `requeue` lists those that were queued for upload (the zone had lost them): once merged, they
    /// go back to the outbox (``requeueRetried(_:_:)``). An entry that cannot be read stays where it is.
    /// Complexity: one `EXISTS` query when nothing is kept (the common case).
    static func takeAdoptableUnknownRecords(store: Store, _ db: Connection) throws -> (records: [CloudRecord], requeue: [CloudRecord]) {
        guard try db.scalar(anyUnknownRecordSQL) == .integer(1), !store.entities.isEmpty else { return ([], []) }
        let names = sqlStringList(store.entities.map(\.name))
        var records: [CloudRecord] = []
        var requeue: [CloudRecord] = []
        for row in try db.rows("SELECT id, record, pending FROM replica_sync_unknown_record WHERE record_type IN (\(names)) ORDER BY id") {
            guard case let .text(json) = row[1], var record = ReplicaJSON.decode(CloudRecord.self, json),
                  let entity = store.entity(named: record.recordType) else { continue }
            // A tombstone kept opaquely holds every field its versions had (the older schema cannot tell which ones
            // survive a delete); this one can: only attributes preserved on deletion (and fields it does not know)
            // stay, as in the tombstone the deleting device uploaded.
            if !record.isAlive {
                record.fields = record.fields.filter { name, _ in
                    if let attribute = entity.attribute(named: name) { return attribute.options.contains(.preserveValueOnDeletion) }
                    return entity.relationship(named: name) == nil
                }
            }
            try db.run("DELETE FROM replica_sync_unknown_record WHERE id = ?", [row[0]])
            records.append(record)
            if row[2] == .integer(1) { requeue.append(record) }
        }
        return (records, requeue)
    }

    private static let anyUnknownRecordSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_unknown_record)")
}
