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
                  let row = try db.rows(sql.selectByID, [snapshot.id.sqliteValue]).first else { continue }
            for constraint in entity.uniquenessConstraints where !constraint.isEmpty {
                let indices = constraint.compactMap { entity.fieldNames.firstIndex(of: $0) }
                let key = indices.map { row[$0 + 1] }
                if key.contains(where: \.isNull) { continue }
                let condition = constraint.map { "\(quoted($0)) = ?" }.joined(separator: " AND ")
                let ids = try db.rows("SELECT \"id\" FROM \(sql.table) WHERE \(condition) ORDER BY \"id\"", key)
                    .compactMap { try? UUID(sqliteValue: $0[0]) }
                guard ids.count > 1 else { continue }
                let states = try ids.compactMap { try load($0, db) }.filter(\.isAlive)
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
              let row = try db.rows(sql.selectByID, [loser.id.sqliteValue]).first else { return }
        var state = loser
        var carried = state.tombstone
        for (index, name) in entity.fieldNames.enumerated() {
            guard let stamp = state.stamps[name], carried[name].map({ $0.stamp < stamp }) ?? true else { continue }
            let encrypted = entity.attribute(named: name)?.options.contains(.allowsCloudEncryption) ?? false
            carried[name] = CloudField(value: row[index + 1], stamp: stamp, isEncrypted: encrypted)
        }
        for (name, field) in state.unknown where carried[name].map({ $0.stamp < field.stamp }) ?? true { carried[name] = field }
        state.causalLength += 1
        state.tombstone = carried
        state.redirect = winner.id
        state.stamps = [:]
        state.unknown = [:]
        state.localVersion += 1
        state.pending = true
        try SyncLedger.store(state, db)
        try db.run(sql.delete, [loser.id.sqliteValue])
        let preserved = entity.attributes.enumerated().filter { $0.element.options.contains(.preserveValueOnDeletion) }
        changes.deleted.append(DeletedRecord(id: PersistentIdentifier(entityName: entity.name, id: loser.id),
                                             preservedValues: preserved.map { ($0.element.name, row[$0.offset + 1]) }))
        try logConflict(id: loser.id, entity: entity.name, field: "*", local: loser.created, winning: winner.created,
                        duplicateOf: winner.id, db)
    }

    /// Folds the fields of every tombstone that redirects to `winner` into the winner's registers (by clock).
    static func forwardRedirects(into winner: PersistentIdentifier, store: Store, db: Connection, changes: inout StoreChanges) throws {
        guard let entity = store.entity(named: winner.entityName), let sql = store.statements(for: winner.entityName),
              var state = try load(winner.id, db), state.isAlive,
              var row = try db.rows(sql.selectByID, [winner.id.sqliteValue]).first else { return }
        let losers = try db.rows("SELECT id FROM replica_sync_record WHERE redirect = ? AND entity = ? ORDER BY id",
                                 [winner.id.sqliteValue, .text(winner.entityName)])
            .compactMap { try? UUID(sqliteValue: $0[0]) }
        var changed: [Int] = []
        var unknownChanged = false
        for loserID in losers {
            guard let loser = try load(loserID, db) else { continue }
            for (name, field) in loser.tombstone {
                if let index = entity.fieldNames.firstIndex(of: name) {
                    if let current = state.stamps[name], current.clock >= field.stamp.clock { continue }
                    state.stamps[name] = FieldStamp(incarnation: state.incarnation, clock: field.stamp.clock)
                    row[index + 1] = field.value
                    if !changed.contains(index) { changed.append(index) }
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
        state.localVersion += 1
        state.pending = true
        try SyncLedger.store(state, db)
        changes.updated.append((Snapshot(entityName: entity.name, id: winner.id, values: Array(row.dropFirst())),
                                changed.map { entity.fieldNames[$0] }))
    }
}
