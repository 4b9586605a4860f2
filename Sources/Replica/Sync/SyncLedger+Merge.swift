import Foundation

/// Merging remote records into the store: field by field under the stamps (R1–R5), tombstones and causal lengths,
/// conflicts logged (R16). Split from `SyncLedger.swift` by responsibility; no code change.
extension SyncLedger {
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
        // The fields of columns other app versions declare lose local writes as this schema's do (R16).
        let columnLosses = canaries.contains(.conflictLogMissesStoreColumns) ? (deleted: [], overwritten: [])
            : columns.losses(remote, resolved: resolvedColumns, localPending: localPending, endsLocalIncarnation: endsLocalIncarnation,
                             localIncarnation: local?.incarnation, incarnation: incarnation, replica: store.identity)
        if !canaries.contains(.conflictLogMissesDeletes) { conflicts += columnLosses.deleted }
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
                try ConflictRecording.log(columnLosses.overwritten.filter { written.contains($0.field) }, id: remote.recordID,
                                          entity: entity.name, store: store, db)
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
            if ledgerMax == nil { ledgerMax = .some(try SyncLedger.largestID(SyncLedger.ledgerLargestIDSQL, db)) }
            if let bound = ledgerMax!, !bound.bytesPrecede(id) { return false }
            if tableMax.count <= entityIndex { tableMax += [UUID??](repeating: nil, count: entityIndex + 1 - tableMax.count) }
            if tableMax[entityIndex] == nil {
                tableMax[entityIndex] = .some(try SyncLedger.largestID(store.statements[entityIndex].largestIDKey, db))
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
}
