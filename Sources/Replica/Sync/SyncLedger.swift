import CSQLite
import Foundation

// The sync decisions on the ledger: what a merge writes, outgoing records and the outbox, acknowledgements,
// references. `SyncLedger`, its tables, their row I/O and change capture are declared in Store/ (Ledger.swift,
// LedgerRowReading.swift, LedgerCoding.swift, LedgerCapture.swift), since a save writes them in its own transaction.
extension SyncLedger {
    /// The conflict log keeps at most this many entries (oldest dropped first).
    static let conflictLogCapacity = 1_000

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
}
