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
            // A stale copy must not link a record this save deleted.
            let added = desired.filter {
                !currentSet.contains($0) && !wasDeleted(PersistentIdentifier(entityName: relationship.destination, id: $0))
            }
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

    /// The stored many-to-many members of the record `id`, by to-many slot (``Snapshot/toManyMembers`` order; empty
    /// for a one-to-many slot, and an empty array when the entity has no many-to-many relationship): what undo
    /// writes back. A relationship that is its own inverse lists the links the record holds. One indexed read per
    /// many-to-many relationship.
    func manyToManyMembers(of id: PersistentIdentifier) throws -> [[UUID]] {
        guard let index = store.entityIndex[id.entityName] else { return [] }
        let entity = store.entities[index]
        let relationships = manyToManyRelationships(of: entity)
        guard !relationships.isEmpty else { return [] }
        var members = Array(repeating: [UUID](), count: entity.relationships.filter(\.isToMany).count)
        for (relationship, slot, table) in relationships {
            let (this, other) = table.columns(entity: entity.name, relationship: relationship.name)
            members[slot] = try linked(id.id, table: table, this: this, other: other)
        }
        return members
    }

    /// The IDs linked to `id` through a link table, in ID order.
    func linked(_ id: UUID, table: LinkTable, this: String, other: String) throws -> [UUID] {
        try db.rows("SELECT \(quoted(other)) FROM \(table.quotedName) WHERE \(quoted(this)) = ? ORDER BY \(quoted(other))",
                    [id.sqliteValue]).compactMap { try? UUID(sqliteValue: $0[0]) }
    }

    /// Applies a many-to-many relationship's delete rule for the deleted record `id` and removes its links. With the
    /// deny rule, the links stay until ``checkDeletedLinks()`` judges them at the end of the save.
    mutating func deleteLinks(of id: PersistentIdentifier, relationship: Schema.Relationship, table: LinkTable,
                              destination: Schema.Entity) throws {
        let (this, other) = table.columns(entity: id.entityName, relationship: relationship.name)
        let targets = try linkedBothWays(id.id, table: table, this: this, other: other)
        switch relationship.deleteRule {
        case .deny:
            if !targets.isEmpty {
                deferredLinkChecks.append((id.entityName, relationship, table, id.id))
                return
            }
        case .cascade:
            for target in targets { try deleteRecord(PersistentIdentifier(entityName: destination.name, id: target), viaCascade: true) }
        case .nullify, .noAction:
            break
        }
        try removeLinks(of: id.id, relationship: relationship, table: table, this: this, other: other)
    }

    /// The records linked to `id`; for a relationship that is its own inverse, links held by either record.
    private func linkedBothWays(_ id: UUID, table: LinkTable, this: String, other: String) throws -> [UUID] {
        var targets = try linked(id, table: table, this: this, other: other)
        if table.ownerEntity == table.memberEntity && table.ownerRelationship == table.memberRelationship {
            for target in try linked(id, table: table, this: other, other: this) where !targets.contains(target) {
                targets.append(target)
            }
        }
        return targets
    }

    /// Removes the links of the deleted record `id` (the relationship's membership changes for the records that
    /// remain).
    private mutating func removeLinks(of id: UUID, relationship: Schema.Relationship, table: LinkTable,
                                      this: String, other: String) throws {
        let targets = try linkedBothWays(id, table: table, this: this, other: other)
        try db.run("DELETE FROM \(table.quotedName) WHERE \(quoted(this)) = ?", [id.sqliteValue])
        if table.ownerEntity == table.memberEntity && table.ownerRelationship == table.memberRelationship {
            try db.run("DELETE FROM \(table.quotedName) WHERE \(quoted(other)) = ?", [id.sqliteValue])
        }
        if let inverse = relationship.inverse {
            let remaining = targets.filter { !wasDeleted(PersistentIdentifier(entityName: relationship.destination, id: $0)) }
            recordMembershipChange(of: remaining, entity: relationship.destination, relationship: inverse)
        }
    }

    /// Judges the deny rules of deleted records' many-to-many relationships once every change of the save is
    /// applied: linked records the same save deleted, or whose saved members no longer include the deleted record,
    /// do not count. Then removes the deleted records' links.
    mutating func checkDeletedLinks() throws {
        for (entity, relationship, table, id) in deferredLinkChecks {
            let (this, other) = table.columns(entity: entity, relationship: relationship.name)
            let (_, destinationSQL) = self.entity(relationship.destination)
            let remaining = try linkedBothWays(id, table: table, this: this, other: other).filter {
                try db.scalar(destinationSQL.selectByIDKey, [$0.sqliteValue]) != nil
            }
            if !remaining.isEmpty {
                recordFailure(.deleteDenied(entity: entity, relationship: relationship.name, count: remaining.count))
            }
            try removeLinks(of: id, relationship: relationship, table: table, this: this, other: other)
        }
        deferredLinkChecks = []
    }
}
