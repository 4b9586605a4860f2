import Foundation

extension SyncEngine {
    /// The ledger entry of one record, or `nil` when the store never synced it.
    public func ledgerEntry(for id: PersistentIdentifier) throws -> LedgerEntry? {
        try ledgerEntries(where: "id = ?", [id.id.sqliteValue]).first { $0.id == id }
    }

    /// Every ledger entry in `state` (all entries when `nil`), in record ID order.
    public func ledgerEntries(in state: LedgerState.Kind? = nil) throws -> [LedgerEntry] {
        let entries = try ledgerEntries(where: "1", [])
        guard let state else { return entries }
        return entries.filter { $0.state.kind == state }
    }

    /// The entries of local records, with the versions received from the cloud that could not be applied (rejected)
    /// or not yet (held: stamped too far ahead of this device's clock): such a version marks its record with its state
    /// (unless the record's own bookkeeping is corrupt, which is reported first), or is an entry of its own when no
    /// local record has it.
    private func ledgerEntries(where condition: String, _ values: [SQLiteValue]) throws -> [LedgerEntry] {
        var entries = try localLedgerEntries(where: condition, values)
        func overlay(_ sql: String, _ state: ([SQLiteValue]) -> LedgerState?) throws {
            for row in try db.rows(sql, values, cache: false) {
                guard let id = try? UUID(sqliteValue: row[0]), case let .text(type) = row[1], case let .text(json) = row[2],
                      let state = state(row) else { continue }
                let pid = PersistentIdentifier(entityName: type, id: id)
                if let index = entries.firstIndex(where: { $0.id == pid }) {
                    let entry = entries[index]
                    if case .corrupt = entry.state { continue }
                    entries[index] = LedgerEntry(id: pid, state: state, causalLength: entry.causalLength, changeTag: entry.changeTag)
                } else {
                    let record = ReplicaJSON.decode(CloudRecord.self, json)
                    entries.append(LedgerEntry(id: pid, state: state, causalLength: record?.causalLength ?? 0, changeTag: record?.changeTag))
                }
            }
        }
        try overlay("SELECT id, record_type, record, reason FROM replica_sync_rejected WHERE \(condition) ORDER BY id, record_type") { row in
            if case let .text(reason) = row[3] { .rejected(reason: reason) } else { nil }
        }
        try overlay("SELECT id, record_type, record, reason, retry_at FROM replica_sync_held WHERE \(condition) ORDER BY id, record_type") { row in
            if case let .text(reason) = row[3], case let .integer(retryAt) = row[4] { .aheadOfClock(reason: reason, retryAt: retryAt) } else { nil }
        }
        try overlay("SELECT id, record_type, record, reason, assets FROM replica_sync_asset_wait WHERE \(condition) ORDER BY id, record_type") { row in
            guard case let .text(list) = row[4], let first = list.split(separator: "\n").first.flatMap({ CloudAssetReference(fieldValue: String($0)) })
            else { return nil }
            let reason: String? = if case let .text(text) = row[3] { text } else { nil }
            return .waitingForAsset(first, reason: reason)
        }
        return entries.sorted { $0.id.id.bytes.lexicographicallyPrecedes($1.id.id.bytes) || ($0.id.id == $1.id.id && $0.id < $1.id) }
    }

    private func localLedgerEntries(where condition: String, _ values: [SQLiteValue]) throws -> [LedgerEntry] {
        try db.rows("""
            SELECT id, entity, causal_length, pending, state, reason, coalesce(waiting_for, \(LinkReplication.linkWaitedForSQL)), change_tag
            FROM replica_sync_record
            WHERE \(condition) ORDER BY id
            """, values).compactMap { row in
            guard let id = try? UUID(sqliteValue: row[0]), case let .text(entity) = row[1], case let .integer(cl) = row[2],
                  case let .text(stateText) = row[4] else { return nil }
            let reason: String = if case let .text(r) = row[5] { r } else { "" }
            let state: LedgerState
            switch stateText {
            case "rejected": state = .rejected(reason: reason)
            case "undecryptable": state = .undecryptable(reason: reason)
            case "corrupt": state = .corrupt(BookkeepingCorruption(store: storeName, recordID: id, column: reason))
            default:
                if cl % 2 == 1, let parent = try? UUID(sqliteValue: row[6]) { state = .waitingForParent(parent) }
                else if case .integer(1) = row[3] { state = .pending }
                else { state = .synced }
            }
            let tag: String? = if case let .text(t) = row[7] { t } else { nil }
            return LedgerEntry(id: PersistentIdentifier(entityName: entity, id: id), state: state, causalLength: cl, changeTag: tag)
        }
    }

    /// The newest merge decisions in which a local write the cloud did not hold yet lost (at most `limit`, newest
    /// first; the store keeps the newest 1,000). Each such decision is logged once, on the device whose write lost,
    /// and nothing else is (R16 in `Specs/replication-protocol.md`).
    /// - Parameter limit: the most entries to return.
    /// - Returns: the entries, newest first; rows whose stamps cannot be read are left out.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func conflictLog(limit: Int = 100) throws -> [ConflictLogEntry] {
        try db.rows("SELECT id, entity, field, local_stamp, winning_stamp, winner, kind FROM replica_sync_conflict ORDER BY seq DESC LIMIT ?",
                    [.integer(Int64(limit))]).compactMap { row in
            guard let id = try? UUID(sqliteValue: row[0]), case let .text(entity) = row[1], case let .text(field) = row[2],
                  case let .text(local) = row[3], case let .text(winning) = row[4],
                  let localStamp = FieldStamp(local), let winningStamp = FieldStamp(winning) else { return nil }
            let winner = (try? UUID(sqliteValue: row[5])).map { PersistentIdentifier(entityName: entity, id: $0) }
            let kind: ConflictLogEntry.Kind = if case let .text(kind) = row[6] {
                ConflictLogEntry.Kind(rawValue: kind) ?? (winner == nil ? .overwritten : .duplicate)
            } else { winner == nil ? .overwritten : .duplicate }
            return ConflictLogEntry(id: PersistentIdentifier(entityName: entity, id: id), field: field,
                                    localStamp: localStamp, winningStamp: winningStamp, duplicateOf: winner, kind: kind)
        }
    }
}
