import Foundation

/// Resolution of duplicate unique keys that devices created concurrently (DESIGN.md, "Uniqueness that the cloud
/// cannot enforce"). Internal.
///
/// - The winner of a group of live records sharing a unique key is the one with the smallest (creation HLC, ID).
/// - Each loser becomes a tombstone that redirects to the winner and carries every field it had, with its stamp.
/// - The winner's field registers absorb every loser's fields by clock (re-stamped into the winner's incarnation with
///   the original clock), so no newer edit is lost; later edits of a loser reach the winner the same way.
/// - References to a loser are pointed at the winner (``SyncLedger/resolveReferences(after:tombstoned:store:db:)``); the
///   absorbed fields are never re-stamped by the device that merges them.
///
/// Every step is a deterministic function of the records involved, so every device reaches the same state whatever
/// order records arrive in.
extension SyncLedger {
    /// Resolves duplicates among the live records an import touched. Returns the losers (now tombstones).
    static func deduplicate(_ touched: [Snapshot], store: Store, db: Connection, changes: inout StoreChanges) throws -> [PersistentIdentifier] {
        var losers: [PersistentIdentifier] = []
        for snapshot in touched where !snapshot.values.isEmpty {
            guard let entity = store.entity(named: snapshot.entityName), !entity.uniquenessConstraints.isEmpty,
                  let sql = store.statements(for: entity.name),
                  let row = try db.rows(sql.selectByIDKey, [snapshot.id.sqliteValue]).first else { continue }
            for constraint in entity.uniquenessConstraints where !constraint.isEmpty {
                let indices = constraint.compactMap { entity.fieldNames.firstIndex(of: $0) }
                let key = indices.map { row[$0 + 1] }
                if key.contains(where: \.isNull) { continue }
                let condition = constraint.map { "\(quoted($0)) = ?" }.joined(separator: " AND ")
                let ids = try db.rows("SELECT \"id\" FROM \(sql.table) WHERE \(condition) ORDER BY \"id\"", key)
                    .compactMap { try? UUID(sqliteValue: $0[0]) }
                guard ids.count > 1 else { continue }
                let states = try ids.compactMap { try load($0, store: store, db, entity: entity.name) }.filter(\.isAlive)
                guard let winner = states.min(by: { a, b in
                    a.created.clock != b.created.clock ? a.created.clock < b.created.clock : a.id.bytesPrecede(b.id)
                }) else { continue }
                for loser in states where loser.id != winner.id {
                    try absorb(loser, into: winner, entity: entity, store: store, db: db, changes: &changes)
                    losers.append(PersistentIdentifier(entityName: entity.name, id: loser.id))
                }
                try forwardRedirects(into: PersistentIdentifier(entityName: entity.name, id: winner.id), store: store, db: db, changes: &changes)
            }
        }
        return losers
    }

    /// Turns `loser` into a tombstone that redirects to `winner` and carries all of its fields.
    private static func absorb(_ loser: RecordState, into winner: RecordState, entity: Schema.Entity, store: Store, db: Connection,
                               changes: inout StoreChanges) throws {
        guard let sql = store.statements(for: entity.name),
              let row = try db.rows(sql.selectByIDKey, [loser.id.sqliteValue]).first else { return }
        var state = loser
        var carried = state.tombstone
        for (index, name) in entity.fieldNames.enumerated() {
            guard let stamp = state.stamps[name], carried[name].map({ $0.stamp < stamp }) ?? true else { continue }
            let encrypted = entity.attribute(named: name)?.options.contains(.allowsCloudEncryption) ?? false
            carried[name] = CloudField(value: row[index + 1], stamp: stamp, isEncrypted: encrypted)
        }
        for (name, field) in state.unknown where carried[name].map({ $0.stamp < field.stamp }) ?? true { carried[name] = field }
        try state.bumpCausalLength(in: store)
        state.tombstone = carried
        state.redirect = winner.id
        state.stamps = [:]
        state.unknown = [:]
        try state.bumpLocalVersion(in: store)
        state.pending = true
        try SyncLedger.store(state, db)
        try db.run(sql.delete, [loser.id.sqliteValue])
        let preserved = entity.attributes.enumerated().filter { $0.element.options.contains(.preserveValueOnDeletion) }
        changes.deleted.append(DeletedRecord(id: PersistentIdentifier(entityName: entity.name, id: loser.id),
                                             preservedValues: preserved.map { ($0.element.name, row[$0.offset + 1]) }))
        // Logged on the device that created the loser, while the cloud did not hold it yet (R16): the loser's fields
        // live on in the winner, but the record this device created is gone.
        if ConflictRecording.isUnsynced(loser.created, replica: store.identity,
                                        mark: try ConflictRecording.uploadMark(loser.id, storeName: store.configuration.name, db)) {
            try logConflict(id: loser.id, entity: entity.name, field: "*", local: loser.created, winning: winner.created,
                            duplicateOf: winner.id, db)
        }
    }

    /// Folds into the winner's registers (by clock) the fields of every tombstone that redirects to `winner`, and of
    /// every ended incarnation that did (a loser re-inserted later) — transitively, since a loser's own losers
    /// reached it the same way.
    static func forwardRedirects(into winner: PersistentIdentifier, store: Store, db: Connection, changes: inout StoreChanges) throws {
        guard let entity = store.entity(named: winner.entityName), let sql = store.statements(for: winner.entityName),
              var state = try load(winner.id, store: store, db, entity: winner.entityName), state.isAlive,
              var row = try db.rows(sql.selectByIDKey, [winner.id.sqliteValue]).first else { return }
        var contributions: [[String: CloudField]] = []
        var visited: Set<UUID> = [winner.id]
        var frontier = [winner.id]
        while !frontier.isEmpty {  // ends: `visited` admits each record once
            var next: [UUID] = []
            for target in frontier {
                let losers = try db.rows("SELECT id FROM replica_sync_record WHERE redirect = ? AND entity = ? ORDER BY id",
                                         [target.sqliteValue, .text(winner.entityName)])
                    .compactMap { try? UUID(sqliteValue: $0[0]) }
                for loserID in losers {
                    guard let loser = try load(loserID, store: store, db, entity: winner.entityName), !loser.isAlive else { continue }
                    contributions.append(loser.tombstone)
                    if visited.insert(loserID).inserted { next.append(loserID) }
                }
                let ended = try db.rows("""
                    SELECT id, fields FROM replica_sync_ended_redirect WHERE winner = ? AND entity = ? ORDER BY id, incarnation
                    """, [target.sqliteValue, .text(winner.entityName)])
                for entry in ended {
                    guard let loserID = try? UUID(sqliteValue: entry[0]) else { continue }
                    if case let .text(json) = entry[1], let fields = ReplicaJSON.decode([String: CloudField].self, json) { contributions.append(fields) }
                    if visited.insert(loserID).inserted { next.append(loserID) }
                }
            }
            frontier = next
        }
        var changed: [Int] = []
        var unknownChanged = false
        // The winner's own writes that an absorbed, newer value replaces (the first replaced stamp of each field).
        var losses: [ConflictRecording.Loss] = []
        for fields in contributions {
            for (name, field) in fields.sorted(by: { $0.key < $1.key }) {
                if let index = entity.fieldNames.firstIndex(of: name) {
                    if let current = state.stamps[name], current.clock >= field.stamp.clock { continue }
                    let absorbed = FieldStamp(incarnation: state.incarnation, clock: field.stamp.clock)
                    if let current = state.stamps[name], current.incarnation == state.incarnation, current.clock.replica == store.identity,
                       row[index + 1] != field.value, !losses.contains(where: { $0.field == name }) {
                        losses.append(ConflictRecording.Loss(field: name, local: current, winning: absorbed, kind: .overwritten))
                    }
                    state.stamps[name] = absorbed
                    row[index + 1] = field.value
                    if !changed.contains(index) { changed.append(index) }
                } else if LinkReplication.isLinkField(name) {
                    // Many-to-many links of a loser join the winner's as a stamped local change of the winner (R17,
                    // `LinkReplication.reconcile`): a join kept under an absorbed clock could give one stamp two values.
                    continue
                } else {
                    if let current = state.unknown[name], current.stamp.clock >= field.stamp.clock { continue }
                    var moved = field
                    moved.stamp = FieldStamp(incarnation: state.incarnation, clock: field.stamp.clock)
                    state.unknown[name] = moved
                    unknownChanged = true
                }
            }
        }
        guard !changed.isEmpty || unknownChanged else { return }
        changed.sort()
        if !changed.isEmpty {
            let assignments = changed.map { "\(quoted(entity.fieldNames[$0])) = ?" }.joined(separator: ", ")
            try db.run("UPDATE \(sql.table) SET \(assignments) WHERE \"id\" = ?", changed.map { row[$0 + 1] } + [winner.id.sqliteValue])
        }
        // Logged where the winner's write was local and the cloud did not hold it (R16): the duplicate's newer value won.
        try ConflictRecording.log(losses, id: winner.id, entity: entity.name, store: store, db)
        try state.bumpLocalVersion(in: store)
        state.pending = true
        try SyncLedger.store(state, db)
        changes.updated.append((Snapshot(entityName: entity.name, id: winner.id, values: Array(row.dropFirst())),
                                changed.map { entity.fieldNames[$0] }))
    }

    /// After a batch of merges: winners whose ended incarnations gained writes absorb them (a winner that lost in turn
    /// passes them on to the live record its redirects end at), and so does every winner that just arrived here
    /// while tombstones or ended incarnations already redirected to it.
    static func absorbEndedRedirects(_ winners: [PersistentIdentifier], arrived: [Snapshot], store: Store, db: Connection,
                                     changes: inout StoreChanges) throws {
        var targets: [PersistentIdentifier] = []
        for winner in winners {
            guard let state = try load(winner.id, store: store, db, entity: winner.entityName) else { continue }
            let live = state.isAlive ? winner.id : try liveRedirectTarget(of: winner.id, store: store, db)
            if let live { targets.append(PersistentIdentifier(entityName: winner.entityName, id: live)) }
        }
        for snapshot in arrived where !snapshot.values.isEmpty {
            guard let entity = store.entity(named: snapshot.entityName), !entity.uniquenessConstraints.isEmpty else { continue }
            let redirected = try db.scalar("""
                SELECT EXISTS (SELECT 1 FROM replica_sync_record WHERE redirect = ?1)
                    OR EXISTS (SELECT 1 FROM replica_sync_ended_redirect WHERE winner = ?1)
                """, [snapshot.id.sqliteValue])
            if redirected != .integer(0) { targets.append(PersistentIdentifier(entityName: entity.name, id: snapshot.id)) }
        }
        var done: Set<UUID> = []
        for target in targets.sorted(by: { $0.id.bytesPrecede($1.id) }) where done.insert(target.id).inserted {
            try forwardRedirects(into: target, store: store, db: db, changes: &changes)
        }
    }
}
