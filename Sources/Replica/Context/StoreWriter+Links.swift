import Foundation

/// Many-to-many links in a save. Internal.
///
/// A saved model's many-to-many members (``Snapshot/toManyMembers``) are the truth for its side: links are added
/// and removed relative to the store, so either side may be edited. When both sides of one link are saved with
/// disagreeing members in one save, the change registered later wins (changes apply in registration order).
extension StoreWriter {
    /// The many-to-many relationships of `entity`, with their slot in ``Snapshot/toManyMembers`` and link table.
    func manyToManyRelationships(of entity: Schema.Entity) -> [(relationship: Schema.Relationship, slot: Int, table: LinkTable)] {
        var result: [(relationship: Schema.Relationship, slot: Int, table: LinkTable)] = []
        for (slot, relationship) in entity.relationships.filter(\.isToMany).enumerated() {
            guard let index = store.entityIndex[relationship.destination],
                  let table = LinkTable.of(relationship, in: entity.name, destination: store.entities[index]) else { continue }
            result.append((relationship, slot, table))
        }
        return result
    }

    /// Writes the links of `snapshot`'s many-to-many relationships that differ from the store.
    /// - Returns: the names of the relationships whose links changed.
    mutating func writeLinks(_ snapshot: Snapshot) throws -> [String] {
        guard !snapshot.toManyMembers.isEmpty, let index = store.entityIndex[snapshot.entityName] else { return [] }
        let entity = store.entities[index]
        var changed: [String] = []
        for (relationship, slot, table) in manyToManyRelationships(of: entity) where slot < snapshot.toManyMembers.count {
            let (this, other) = table.columns(entity: entity.name, relationship: relationship.name)
            var desired: [UUID] = []
            var desiredSet = Set<UUID>()
            for id in snapshot.toManyMembers[slot] where desiredSet.insert(id).inserted { desired.append(id) }
            let current = try linked(snapshot.id, table: table, this: this, other: other)
            let currentSet = Set(current)
            let removed = current.filter { !desiredSet.contains($0) }
            let added = desired.filter { !currentSet.contains($0) }
            guard !removed.isEmpty || !added.isEmpty else { continue }
            for member in removed {
                try db.run("DELETE FROM \(table.quotedName) WHERE \(quoted(this)) = ? AND \(quoted(other)) = ?",
                           [snapshot.id.sqliteValue, member.sqliteValue])
            }
            for member in added {
                try db.run("INSERT OR IGNORE INTO \(table.quotedName) (\(quoted(this)), \(quoted(other))) VALUES (?, ?)",
                           [snapshot.id.sqliteValue, member.sqliteValue])
            }
            changed.append(relationship.name)
            if let inverse = relationship.inverse {
                recordMembershipChange(of: removed + added, entity: relationship.destination, relationship: inverse)
            }
        }
        return changed
    }

    /// The IDs linked to `id` through a link table, in ID order.
    func linked(_ id: UUID, table: LinkTable, this: String, other: String) throws -> [UUID] {
        try db.rows("SELECT \(quoted(other)) FROM \(table.quotedName) WHERE \(quoted(this)) = ? ORDER BY \(quoted(other))",
                    [id.sqliteValue]).compactMap { try? UUID(sqliteValue: $0[0]) }
    }

    /// Applies a many-to-many relationship's delete rule for the deleted record `id`, then removes its links.
    mutating func deleteLinks(of id: PersistentIdentifier, relationship: Schema.Relationship, table: LinkTable,
                              destination: Schema.Entity) throws {
        let (this, other) = table.columns(entity: id.entityName, relationship: relationship.name)
        var targets = try linked(id.id, table: table, this: this, other: other)
        let selfInverse = table.ownerEntity == table.memberEntity && table.ownerRelationship == table.memberRelationship
        if selfInverse {
            // Stored once, from the record that holds the link: look both ways.
            for target in try linked(id.id, table: table, this: other, other: this) where !targets.contains(target) {
                targets.append(target)
            }
        }
        switch relationship.deleteRule {
        case .deny:
            let blocking = targets.filter {
                stillReferences(PersistentIdentifier(entityName: destination.name, id: $0), id.id, through: relationship.inverse)
            }
            if !blocking.isEmpty {
                recordFailure(.deleteDenied(entity: id.entityName, relationship: relationship.name, count: blocking.count))
            }
        case .cascade:
            for target in targets { try deleteRecord(PersistentIdentifier(entityName: destination.name, id: target)) }
        case .nullify, .noAction:
            break
        }
        // The links belong to the relationship: they go with the record whatever the rule.
        try db.run("DELETE FROM \(table.quotedName) WHERE \(quoted(this)) = ?", [id.id.sqliteValue])
        if selfInverse { try db.run("DELETE FROM \(table.quotedName) WHERE \(quoted(other)) = ?", [id.id.sqliteValue]) }
        if let inverse = relationship.inverse {
            let remaining = targets.filter { !isBeingDeleted(PersistentIdentifier(entityName: destination.name, id: $0)) }
            recordMembershipChange(of: remaining, entity: destination.name, relationship: inverse)
        }
    }
}
