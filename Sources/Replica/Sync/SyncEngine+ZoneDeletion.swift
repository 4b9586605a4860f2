import Foundation

/// What the engine does when the cloud reports its zone deleted (``CloudError/zoneDeleted(reason:)``): the
/// ``ZoneDeletionPolicy`` decides before anything changes locally — keep the store's data and upload it again, or
/// erase it (R18 in `Specs/replication-protocol.md`).
extension SyncEngine {
    /// The `replica_metadata` key that holds the reason of a zone deletion waiting for the app's answer.
    static let pendingZoneDeletionKey = "zone_deletion_pending"

    /// The zone deletion waiting for the app's answer (policy ``ZoneDeletionPolicy/ask``), or `nil`. Also in
    /// ``SyncStatus/zoneDeletion``.
    public var pendingZoneDeletion: ZoneDeletion? { pendingDeletion }

    /// Answers the zone deletion the engine is waiting on (``pendingZoneDeletion``, policy ``ZoneDeletionPolicy/ask``):
    /// keeps the local data and uploads it again, or erases it (``ZoneDeletionResponse``). Syncing resumes with the
    /// zone created again.
    /// - Parameter response: what to do.
    /// - Returns: `false` when no deletion was waiting for an answer (nothing is done).
    /// - Throws: ``SQLiteError`` when the store cannot be written (the question then stands).
    @discardableResult
    public func resolveZoneDeletion(_ response: ZoneDeletionResponse) throws -> Bool {
        guard try loadPendingZoneDeletion(applyingPolicy: false) else { return false }
        try respond(response)
        return true
    }

    /// Called by ``handle(_:_:)`` when an operation found the zone missing: for a reason the cloud names (and not this
    /// engine's own deletion, a key reset), the policy decides; otherwise the store keeps its data.
    func zoneWasLost(reason: ZoneDeletionReason?) throws {
        guard let reason, !deletedZoneItself else {
            deletedZoneItself = false
            return try reuploadAfterZoneLoss()
        }
        let deletion = ZoneDeletion(storeName: storeName, zone: zone, reason: reason)
        guard let response = options.zoneDeletionPolicy.response(to: deletion) else {
            // Asked, and kept in the store (an engine after a restart, or of another process, waits for the answer
            // too). Nothing local changes until it comes.
            try db.run("""
                INSERT INTO replica_metadata (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value
                """, [.text(Self.pendingZoneDeletionKey), .text(reason.rawValue)])
            pendingDeletion = deletion
            zoneReady = false
            return
        }
        try respond(response)
    }

    /// Whether a zone deletion waits for the app's answer, reading the store's record of one (left by an earlier engine
    /// or another process). With `applyingPolicy`, a question that an earlier engine asked and that this engine's
    /// policy answers by itself (it is not ``ZoneDeletionPolicy/ask``) is answered now.
    func loadPendingZoneDeletion(applyingPolicy: Bool = true) throws -> Bool {
        if pendingDeletion != nil { return true }
        guard let value = try db.scalar("SELECT value FROM replica_metadata WHERE key = ?", [.text(Self.pendingZoneDeletionKey)]) else {
            return false
        }
        // A reason this version cannot read (a newer version's) still asks: reported as a deletion, and only the
        // app's answer acts on it.
        let reason: ZoneDeletionReason = if case let .text(text) = value, let known = ZoneDeletionReason(rawValue: text) { known } else { .deleted }
        let deletion = ZoneDeletion(storeName: storeName, zone: zone, reason: reason)
        if applyingPolicy, let response = options.zoneDeletionPolicy.response(to: deletion) {
            try respond(response)
            return false
        }
        pendingDeletion = deletion
        zoneReady = false
        return true
    }

    /// Carries out `response` to the zone's deletion.
    private func respond(_ response: ZoneDeletionResponse) throws {
        switch response {
        case .keepAndReupload:
            try reuploadAfterZoneLoss()
        case .eraseLocalData:
            try eraseSyncedData()
        }
        try db.run("DELETE FROM replica_metadata WHERE key = ?", [.text(Self.pendingZoneDeletionKey)])
        pendingDeletion = nil
    }

    /// Erases every record of the store and its sync bookkeeping in one transaction, recorded in history with the sync
    /// author (so nothing of it is uploaded, while the change stream and other processes see the deletions). The zone
    /// is then created again, empty; the store's clock and conflict log are kept.
    private func eraseSyncedData() throws {
        zoneReady = false
        schemaChecked = false
        proposedSchema = nil
        needsFetch = true
        try importing {
            var changes = StoreChanges()
            for (index, entity) in store.entities.enumerated() {
                let sql = store.statements[index]
                let preserved = entity.attributes.enumerated().filter { $0.element.options.contains(.preserveValueOnDeletion) }
                for row in try db.rows(sql.selectAll + " ORDER BY \"id\"", cache: false) {
                    guard let id = try? UUID(sqliteValue: row[0]) else { continue }
                    changes.deleted.append(DeletedRecord(id: PersistentIdentifier(entityName: entity.name, id: id),
                                                         preservedValues: preserved.map { ($0.element.name, row[$0.offset + 1]) }))
                }
                try db.run("DELETE FROM \(sql.table)")
            }
            // Many-to-many links go with their records (R17): the link rows, and links waiting for a record.
            if !container.environment.canaries.contains(.eraseLeavesLinkRows) {
                for table in LinkTable.all(in: store.entities) { try db.run("DELETE FROM \(table.quotedName)") }
            }
            var tables = ["replica_sync_record", "replica_sync_unknown_record", "replica_sync_rejected", "replica_sync_held",
                          "replica_sync_ended_redirect", "replica_sync_uploaded"]
            for table in ["replica_sync_link_waiting", "replica_sync_link_dormant", "replica_sync_asset_wait", "replica_sync_asset_chunk", "replica_sync_sealed_asset"] {
                if try db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(table)]) != nil { tables.append(table) }
            }
            for table in tables { try db.run("DELETE FROM \(table)") }
            try db.run("DELETE FROM replica_metadata WHERE key IN ('server_change_token', 'resync_active', 'resync_generation')")
            try encryptionZoneWasReset()
            let token = try HistoryLog.record(changes, author: HistoryTransaction.syncAuthor, environment: container.environment, db: db)
            if let token { container.changeHub.willCommit(store: storeIndex, token: token, origin: .syncImport) }
            if !changes.isEmpty { importedChanges = (token, changes) }
        }
    }
}
