import CSQLite
import Foundation

/// Applies one save's changes to one store inside an open write transaction. Internal.
///
/// Order: deletes (with delete rules), then inserts and updates, then uniqueness checks over every record written,
/// so keys may be swapped between records within one save. Validation failures are collected, not thrown, so that
/// the caller can report all of them at once and roll back.
struct StoreWriter {
    let store: Store
    let db: Connection
    private(set) var failures: [ModelValidationFailure] = []
    /// What this save did, for history and notifications.
    private(set) var changes = StoreChanges()
    private var deleted = Set<PersistentIdentifier>()
    /// Records this save deletes: a deny rule does not count them as related records that block a delete.
    private var scheduledDeletes = Set<PersistentIdentifier>()
    /// The values this save writes, by record: a deny rule judges the references as they will be after the save.
    private var scheduledSnapshots: [PersistentIdentifier: Snapshot] = [:]

    init(store: Store, db: Connection) {
        self.store = store
        self.db = db
    }

    mutating func apply(_ batch: [(PersistentIdentifier, ModelContext.PendingChange)]) throws {
        for (id, change) in batch {
            if case .delete = change { scheduledDeletes.insert(id) }
            if let snapshot = change.snapshot { scheduledSnapshots[id] = snapshot }
        }
        for (id, change) in batch {
            switch change {
            case .delete, .replace: try deleteRecord(id)
            case .insert, .update: break
            }
        }
        var written: [Snapshot] = []
        for (id, change) in batch {
            switch change {
            case let .insert(snapshot), let .replace(snapshot):
                if try insert(snapshot) { written.append(snapshot) }
            case let .update(snapshot):
                if try update(snapshot) { written.append(snapshot) }
            case .delete:
                _ = id
            }
        }
        for snapshot in written { try checkUniqueness(snapshot) }
    }

    private func entity(_ name: String) -> (Schema.Entity, EntityStatements) {
        let index = store.entityIndex[name]!
        return (store.entities[index], store.statements[index])
    }

    // MARK: Insert and update

    /// Inserts a record. Returns `false` (and records a failure) when it cannot be written.
    private mutating func insert(_ snapshot: Snapshot) throws -> Bool {
        let (entity, sql) = entity(snapshot.entityName)
        for (offset, relationship) in entity.toOneRelationships.enumerated() where !relationship.isOptional {
            if snapshot.values[entity.attributes.count + offset].isNull {
                failures.append(.missingRequiredRelationship(entity: entity.name, relationship: relationship.name, id: snapshot.persistentModelID))
                return false
            }
        }
        let statement = try db.cachedStatement(sql.insert)
        defer { statement.reset() }
        try statement.bind(snapshot.id.sqliteValue, at: 0)
        for (i, value) in snapshot.values.enumerated() { try statement.bind(value, at: Int32(i + 1)) }
        do {
            while try statement.step() {}
        } catch let error as SQLiteError where error.extendedResultCode == SQLiteError.constraintPrimaryKey
                                            || error.extendedResultCode == SQLiteError.constraintUnique {
            failures.append(.duplicateIdentifier(snapshot.persistentModelID))
            return false
        }
        changes.inserted.append(snapshot)
        _ = try writeLinks(snapshot)
        return true
    }

    /// Writes the fields of `snapshot` whose stored value differs. Returns whether anything was written.
    /// - Throws: ``ReplicaError/recordNotFound(_:)`` when the record does not exist.
    private mutating func update(_ snapshot: Snapshot) throws -> Bool {
        let (entity, sql) = entity(snapshot.entityName)
        guard let current = try db.rows(sql.selectByID, [snapshot.id.sqliteValue]).first else {
            throw ReplicaError.recordNotFound(snapshot.persistentModelID)
        }
        let names = entity.fieldNames
        var changed: [Int] = []
        for (i, value) in snapshot.values.enumerated() where current[i + 1] != value { changed.append(i) }
        let changedLinks = try writeLinks(snapshot)
        guard !changed.isEmpty || !changedLinks.isEmpty else { return false }
        for (offset, relationship) in entity.toOneRelationships.enumerated() where !relationship.isOptional {
            if snapshot.values[entity.attributes.count + offset].isNull {
                failures.append(.missingRequiredRelationship(entity: entity.name, relationship: relationship.name, id: snapshot.persistentModelID))
                return false
            }
        }
        if !changed.isEmpty {
            let assignments = changed.map { "\(quoted(names[$0])) = ?" }.joined(separator: ", ")
            try db.run("UPDATE \(sql.table) SET \(assignments) WHERE \"id\" = ?",
                       changed.map { snapshot.values[$0] } + [snapshot.id.sqliteValue])
        }
        changes.updated.append((snapshot, changed.map { names[$0] } + changedLinks))
        return true
    }

    // MARK: Uniqueness

    private mutating func checkUniqueness(_ snapshot: Snapshot) throws {
        let (entity, sql) = entity(snapshot.entityName)
        for constraint in entity.uniquenessConstraints where !constraint.isEmpty {
            let indices = constraint.compactMap { name in entity.fieldNames.firstIndex(of: name) }
            let values = indices.map { snapshot.values[$0] }
            // As in SQL, a key with a NULL part never collides.
            if values.contains(where: \.isNull) { continue }
            let condition = constraint.map { "\(quoted($0)) = ?" }.joined(separator: " AND ")
            let clash = try db.scalar("SELECT 1 FROM \(sql.table) WHERE \(condition) AND \"id\" <> ? LIMIT 1",
                                      values + [snapshot.id.sqliteValue])
            if clash != nil {
                failures.append(.uniqueConstraintViolation(entity: entity.name, attributes: constraint, id: snapshot.persistentModelID))
            }
        }
    }

    // MARK: Delete with delete rules

    /// Whether `id` is deleted by this save (already, or later in it).
    func isBeingDeleted(_ id: PersistentIdentifier) -> Bool {
        deleted.contains(id) || scheduledDeletes.contains(id)
    }

    /// Whether `target` still refers to the record `deleted` through its relationship `inverse` once this save is
    /// applied: it is not deleted, and the values this save writes for it (if any) still hold the reference.
    func stillReferences(_ target: PersistentIdentifier, _ deleted: UUID, through inverse: String?) -> Bool {
        if isBeingDeleted(target) { return false }
        guard let inverse, let snapshot = scheduledSnapshots[target], let index = store.entityIndex[target.entityName] else { return true }
        let entity = store.entities[index]
        if let field = entity.fieldNames.firstIndex(of: inverse), field < snapshot.values.count {
            return snapshot.values[field] == deleted.sqliteValue
        }
        if let slot = entity.relationships.filter(\.isToMany).firstIndex(where: { $0.name == inverse }), slot < snapshot.toManyMembers.count {
            return snapshot.toManyMembers[slot].contains(deleted)
        }
        return true
    }

    /// Records a validation failure (used by the link-table code in StoreWriter+Links.swift).
    mutating func recordFailure(_ failure: ModelValidationFailure) {
        failures.append(failure)
    }

    /// Records that a delete rule changed the membership of `relationship` of the records `ids` (for history).
    mutating func recordMembershipChange(of ids: [UUID], entity: String, relationship: String) {
        for id in ids { changes.updated.append((Snapshot(entityName: entity, id: id, values: []), [relationship])) }
    }

    /// Deletes a record and applies its relationships' delete rules (recursively for cascades).
    /// A record that does not exist (deleted earlier, or never saved) is skipped.
    mutating func deleteRecord(_ id: PersistentIdentifier) throws {
        guard deleted.insert(id).inserted else { return }
        let (entity, sql) = entity(id.entityName)
        guard let row = try db.rows(sql.selectByID, [id.id.sqliteValue]).first else { return }
        let fieldIndex = Dictionary(uniqueKeysWithValues: entity.fieldNames.enumerated().map { ($1, $0 + 1) })
        for relationship in entity.relationships {
            let (destination, destinationSQL) = self.entity(relationship.destination)
            if let table = LinkTable.of(relationship, in: entity.name, destination: destination) {
                try deleteLinks(of: id, relationship: relationship, table: table, destination: destination)
                continue
            }
            let targets: [UUID]
            if relationship.isToMany {
                guard let inverse = relationship.inverse else { continue }
                targets = try db.rows("SELECT \"id\" FROM \(destinationSQL.table) WHERE \(quoted(inverse)) = ? ORDER BY \"id\"",
                                      [id.id.sqliteValue]).compactMap { try? UUID(sqliteValue: $0[0]) }
            } else {
                targets = [try? UUID(sqliteValue: row[fieldIndex[relationship.name]!])].compactMap { $0 }
            }
            if targets.isEmpty { continue }
            switch relationship.deleteRule {
            case .deny:
                let blocking = targets.filter {
                    stillReferences(PersistentIdentifier(entityName: destination.name, id: $0), id.id, through: relationship.inverse)
                }
                if !blocking.isEmpty {
                    failures.append(.deleteDenied(entity: entity.name, relationship: relationship.name, count: blocking.count))
                }
            case .cascade:
                for target in targets { try deleteRecord(PersistentIdentifier(entityName: destination.name, id: target)) }
            case .nullify:
                guard let inverseName = relationship.inverse, let inverse = destination.relationship(named: inverseName),
                      !inverse.isToMany else { continue }
                if !inverse.isOptional {
                    for target in targets where !deleted.contains(PersistentIdentifier(entityName: destination.name, id: target)) {
                        failures.append(.missingRequiredRelationship(entity: destination.name, relationship: inverseName,
                                                                     id: PersistentIdentifier(entityName: destination.name, id: target)))
                    }
                    continue
                }
                try db.run("UPDATE \(destinationSQL.table) SET \(quoted(inverseName)) = NULL WHERE \(quoted(inverseName)) = ?",
                           [id.id.sqliteValue])
                for target in targets {
                    changes.updated.append((Snapshot(entityName: destination.name, id: target, values: []), [inverseName]))
                }
            case .noAction:
                break
            }
        }
        try db.run(sql.delete, [id.id.sqliteValue])
        let preserved = entity.attributes.enumerated().filter { $0.element.options.contains(.preserveValueOnDeletion) }
        changes.deleted.append(DeletedRecord(
            id: id, preservedValues: preserved.map { ($0.element.name, row[$0.offset + 1]) }))
    }
}

/// What one save did to one store: the input of history and save notifications.
struct StoreChanges {
    var inserted: [Snapshot] = []
    /// Updated records with the names of the fields that changed. Records changed by a delete rule (nullify) carry
    /// only their ID and the changed field's name.
    var updated: [(Snapshot, [String])] = []
    var deleted: [DeletedRecord] = []
}

/// A deleted record and the values of its attributes marked ``Schema/Attribute/Options/preserveValueOnDeletion``.
struct DeletedRecord {
    let id: PersistentIdentifier
    let preservedValues: [(String, SQLiteValue)]
}
