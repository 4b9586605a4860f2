import Foundation

// Records received from the cloud that are stamped too far ahead of this device's clock (R2): not merged, so that a
// broken clock elsewhere cannot drag this device's clock (and every later stamp it makes) along; not dropped and not
// clamped either (clamping would make devices disagree). They wait in `replica_sync_held` until the wall clock has
// caught up, and are merged then.

extension SyncLedger {
    /// `remote` is not merged yet when one of its stamps lies more than `maxDrift` ms ahead of `wall` (this device's
    /// clock): the refusal (naming the first such stamp) and the wall-clock time from which it may be merged.
    /// `nil` when the record may be merged now (`maxDrift` of `Int64.max`: never held).
    static func clockAhead(_ remote: CloudRecord, wall: Int64, maxDrift: Int64) -> (reason: RecordRejection, retryAt: Int64)? {
        let limit = max(0, maxDrift)
        let now = HLC.clampedPhysical(wall)
        let (bound, overflow) = now.addingReportingOverflow(limit)
        guard !overflow else { return nil }
        // The common case, decided without sorting names: nothing is ahead.
        var newest = remote.created.clock.physical
        for field in remote.fields.values where field.stamp.clock.physical > newest { newest = field.stamp.clock.physical }
        guard newest > bound else { return nil }
        // The first stamp past the bound names the refusal: the creation stamp, else a field in name order.
        let site: RecordRejection.StampSite, physical: Int64
        if remote.created.clock.physical > bound {
            (site, physical) = (.creation, remote.created.clock.physical)
        } else {
            let name = remote.fields.keys.sorted().first { remote.fields[$0]!.stamp.clock.physical > bound }!
            (site, physical) = (.field(name), remote.fields[name]!.stamp.clock.physical)
        }
        return (.clockAhead(site, aheadBy: physical - now, limit: limit), newest - limit)
    }

    /// Keeps `remote` until the wall clock reaches `retryAt`, joined field by field with a version of it kept already
    /// (so no held version replaces another). A local record with changes to upload takes its change tag, as for a
    /// rejected version (its upload replaces the cloud's version instead of conflicting with it forever; the held
    /// version is merged, and the result uploaded, once the clock has caught up).
    static func hold(_ remote: CloudRecord, reason: RecordRejection, retryAt: Int64, _ db: Connection) throws {
        var record = remote
        var retry = retryAt
        if let row = try db.rows("SELECT record, retry_at FROM replica_sync_held WHERE id = ? AND record_type = ?",
                                 [remote.recordID.sqliteValue, .text(remote.recordType)]).first {
            if case let .text(json) = row[0], let existing = ReplicaJSON.decode(CloudRecord.self, json) { record = mergeOpaque(existing, remote) }
            if case let .integer(earlier) = row[1] { retry = max(retry, earlier) }
        }
        try db.run("""
            INSERT INTO replica_sync_held (id, record_type, record, reason, retry_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (id, record_type) DO UPDATE SET record = excluded.record, reason = excluded.reason, retry_at = excluded.retry_at
            """, [remote.recordID.sqliteValue, .text(remote.recordType), .text(try ReplicaJSON.string(record)), .text(reason.description), .integer(retry)])
        if let tag = remote.changeTag { try adoptChangeTag(tag, of: remote.recordID, db) }
    }

    private static let anyHeldSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_held)")

    /// Takes the held records whose time has come (`retry_at` ≤ `wall`) out of `replica_sync_held`, in ID order, with
    /// their change tags cleared (the cloud's current version of the record may be a later one): the caller merges
    /// them (a record still ahead is held again) and then calls ``requeueRetried(_:_:)``. An entry that cannot be
    /// read stays where it is (and keeps counting in the status).
    static func takeDueHeldRecords(wall: Int64, _ db: Connection) throws -> [CloudRecord] {
        guard try db.scalar(anyHeldSQL) == .integer(1) else { return [] }
        var due: [CloudRecord] = []
        for row in try db.rows("SELECT id, record_type, record FROM replica_sync_held WHERE retry_at <= ? ORDER BY id, record_type",
                               [.integer(wall)]) {
            guard case let .text(json) = row[2], var record = ReplicaJSON.decode(CloudRecord.self, json) else { continue }
            try db.run("DELETE FROM replica_sync_held WHERE id = ? AND record_type = ?", [row[0], row[1]])
            record.changeTag = nil
            due.append(record)
        }
        return due
    }

    /// After merging records taken by ``takeDueHeldRecords(wall:_:)``: each one merged (not held again) goes back to
    /// the outbox, so that the cloud — whose current version may lack the held one's writes — learns the merged result.
    static func requeueRetried(_ records: [CloudRecord], _ db: Connection) throws {
        for record in records {
            let held = try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_held WHERE id = ?)", [record.recordID.sqliteValue])
            guard held == .integer(0) else { continue }
            try db.run("""
                UPDATE replica_sync_record SET pending = 1, local_version = local_version + 1,
                    state = CASE WHEN state IN ('rejected', 'undecryptable', 'corrupt') THEN state ELSE 'pending' END
                WHERE id = ?
                """, [record.recordID.sqliteValue])
            try db.run("UPDATE replica_sync_unknown_record SET pending = 1 WHERE id = ?", [record.recordID.sqliteValue])
        }
    }
}
