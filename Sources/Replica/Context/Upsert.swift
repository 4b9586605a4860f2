import Foundation

// Upserts of unique keys (SwiftData's semantics for `@Attribute(.unique)` and `#Unique`): inserting a model whose
// unique key (a unique attribute, or every part of a compound uniqueness constraint) equals an existing record's
// updates that record instead of failing. The existing record keeps its identity; the insert resolves to it.
//
// Resolved at save, inside the write transaction, after the save's deletes are applied (a key the same save frees by
// a delete is inserted, not upserted) and before anything else is written:
// - the existing record is a stored one, or one inserted earlier in the same save (two inserts of one key in one save
//   leave one record, with the later insert's values), or a stored record whose pending update in the same save gives
//   it the key;
// - a stored record whose pending update in the same save moves it off the key does not count;
// - the insert's values are written over the existing record's: every field of the inserted copy, of which only those
//   that differ from the stored row are written (and, in a synced store, stamped). So it is an update in history, on
//   the change stream and in the outbox, never a new record;
// - an insert whose key parts match *different* records (one by each of two constraints) is ambiguous: it stays an
//   insert and fails the save with `.uniqueConstraintViolation`, as do updates that take a key already held;
// - references to the inserted ID among the save's other changes (to-one references and many-to-many members) are
//   pointed at the existing record, so a child inserted with its parent follows the parent into the existing record;
// - a delete-and-insert of one ID (a new incarnation, `.replace`) names its identity explicitly and is not upserted.

extension StoreWriter {
    /// A unique key of one constraint of one entity, as stored values.
    private struct Key: Hashable {
        let entity: String
        let constraint: Int
        let values: [SQLiteValue]
    }

    private static let upsertStatementKind = 2

    /// The positions of the fields of each uniqueness constraint of `entity` (empty constraints skipped).
    private func constraintFields(_ entityName: String) -> [(position: Int, fields: [Int])] {
        let (entity, sql) = entity(entityName)
        return entity.uniquenessConstraints.enumerated().compactMap { position, constraint in
            constraint.isEmpty ? nil : (position, constraint.compactMap { sql.fieldIndex[$0] })
        }
    }

    /// The key of `snapshot` for one constraint, or `nil` when a part is NULL (as in SQL, such a key never collides).
    /// An external-storage part is its stored form (the reference a row holds), so keys compare with rows.
    private func key(_ snapshot: Snapshot, _ constraint: (position: Int, fields: [Int])) -> Key? {
        let values = constraint.fields.map { field in
            field < snapshot.values.count ? comparableStoredValue(snapshot.values[field], field: field, entity: snapshot.entityName) : .null
        }
        if values.contains(where: \.isNull) { return nil }
        return Key(entity: snapshot.entityName, constraint: constraint.position, values: values)
    }

    /// `batch` with every insert of an existing record's unique key turned into an update of that record (see the
    /// comment at the top of this file); the resolutions are in ``upserts``. Returns `batch` itself when no entity
    /// of the batch has uniqueness constraints or nothing is upserted.
    ///
    /// - Complexity: one indexed query per unique constraint of each inserted record with constraints, plus O(batch)
    ///   in memory; nothing when no inserted entity has uniqueness constraints.
    mutating func resolveUpserts(_ batch: [PendingChanges.Entry]) throws -> [PendingChanges.Entry] {
        var constraintsByEntity: [String: [(position: Int, fields: [Int])]] = [:]
        func constraints(_ name: String) -> [(position: Int, fields: [Int])] {
            if let known = constraintsByEntity[name] { return known }
            let found = constraintFields(name)
            constraintsByEntity[name] = found
            return found
        }
        // Nothing to do unless an insert has a unique key.
        guard batch.contains(where: { entry in
            if case let .insert(snapshot)? = entry.change { return !constraints(snapshot.entityName).isEmpty }
            return false
        }) else { return batch }

        var result = batch
        /// Keys held by records of the batch: pending updates that set a part of the key, inserts and re-inserts
        /// (by the record's position in `result`).
        var claimed: [Key: Int] = [:]
        /// Positions of the pending updates, by record.
        var updates: [PersistentIdentifier: Int] = [:]
        for index in result.indices {
            switch result[index].change {
            case let .update(snapshot, fields)?:
                updates[result[index].id] = index
                for constraint in constraints(snapshot.entityName)
                where fields.map({ set in constraint.fields.contains(where: set.contains) }) ?? true {
                    if let key = self.key(snapshot, constraint), claimed[key] == nil { claimed[key] = index }
                }
            case let .replace(snapshot)?:
                for constraint in constraints(snapshot.entityName) {
                    if let key = self.key(snapshot, constraint), claimed[key] == nil { claimed[key] = index }
                }
            case .insert?, .delete?, nil:
                break
            }
        }

        var redirects: [UUID: UUID] = [:]
        for index in result.indices {
            guard case let .insert(snapshot)? = result[index].change else { continue }
            let entityConstraints = constraints(snapshot.entityName)
            if entityConstraints.isEmpty { continue }
            // The records holding each of the insert's keys: batch positions, or stored records by ID.
            var inBatch: [Int] = []
            var stored: [UUID] = []
            for constraint in entityConstraints {
                guard let key = self.key(snapshot, constraint) else { continue }
                if let position = claimed[key] {
                    if !inBatch.contains(position) { inBatch.append(position) }
                    continue
                }
                for id in try storedHolders(of: key, constraint: constraint, entity: snapshot.entityName, excluding: snapshot.id) {
                    let pid = PersistentIdentifier(entityName: snapshot.entityName, id: id)
                    if wasDeleted(pid) { continue }
                    if let position = updates[pid] {
                        // Its pending update decides its key.
                        guard let update = result[position].change?.snapshot, self.key(update, constraint) == key else { continue }
                        if !inBatch.contains(position) { inBatch.append(position) }
                    } else if !stored.contains(id) {
                        stored.append(id)
                    }
                }
            }
            guard inBatch.count + stored.count == 1 else {
                // A new key, or an ambiguous one (the uniqueness check reports it): the insert holds its keys.
                for constraint in entityConstraints {
                    if let key = self.key(snapshot, constraint), claimed[key] == nil { claimed[key] = index }
                }
                continue
            }
            let target: Int
            let existing: UUID
            if let position = inBatch.first {
                // The record the entry writes (an earlier upsert's entry writes the stored record it resolved to).
                existing = result[position].change?.snapshot?.id ?? result[position].id.id
                target = position
            } else {
                existing = stored[0]
                target = index
            }
            var merged = snapshot
            merged.id = existing
            switch result[target].change {
            case .insert?: result[target].change = target == index ? .update(merged, fields: nil) : .insert(merged)
            case .replace?: result[target].change = .replace(merged)
            case .update?, .delete?, nil: result[target].change = .update(merged, fields: nil)
            }
            if target != index {
                result[index].change = nil
            } else {
                // Now a pending update of the stored record: a later insert of the same save sees its new key.
                updates[PersistentIdentifier(entityName: snapshot.entityName, id: existing)] = index
            }
            redirects[snapshot.id] = existing
            upserts.append((snapshot.persistentModelID, PersistentIdentifier(entityName: snapshot.entityName, id: existing)))
            for constraint in entityConstraints {
                if let key = self.key(merged, constraint), claimed[key] == nil { claimed[key] = target }
            }
        }
        guard !redirects.isEmpty else { return batch }
        // Point the save's references to upserted inserts at the records they became.
        let redirectedValues = Dictionary(uniqueKeysWithValues: redirects.map { ($0.key.sqliteValue, $0.value.sqliteValue) })
        for index in result.indices {
            guard let change = result[index].change, var snapshot = change.snapshot else { continue }
            let (entity, _) = entity(snapshot.entityName)
            var changed = false
            for offset in entity.toOneRelationships.indices {
                let field = entity.attributes.count + offset
                if field < snapshot.values.count, let target = redirectedValues[snapshot.values[field]] {
                    snapshot.values[field] = target
                    changed = true
                }
            }
            for (relationship, members) in snapshot.toManyMembers.enumerated() where members.contains(where: { redirects[$0] != nil }) {
                var seen = Set<UUID>()
                snapshot.toManyMembers[relationship] = members.map { redirects[$0] ?? $0 }.filter { seen.insert($0).inserted }
                changed = true
            }
            guard changed else { continue }
            switch change {
            case .insert: result[index].change = .insert(snapshot)
            case .replace: result[index].change = .replace(snapshot)
            case let .update(_, fields): result[index].change = .update(snapshot, fields: fields)
            case .delete: break
            }
        }
        return result
    }

    /// The stored records other than `id` whose key of `constraint` equals `key` (at most a few: the key is unique).
    private func storedHolders(of key: Key, constraint: (position: Int, fields: [Int]), entity entityName: String,
                               excluding id: UUID) throws -> [UUID] {
        let (entity, sql) = entity(entityName)
        let names = entity.uniquenessConstraints[constraint.position]
        let statement = try db.cachedStatement(owner: sql, kind: Self.upsertStatementKind, variant: [constraint.position]) {
            let condition = names.map { "\(quoted($0)) = ?" }.joined(separator: " AND ")
            return "SELECT \"id\" FROM \(sql.table) WHERE \(condition) AND \"id\" <> ? ORDER BY \"id\" LIMIT 4"
        }
        defer { statement.reset() }
        try statement.bind(key.values + [id.sqliteValue])
        var ids: [UUID] = []
        while try statement.step() {
            if let found = try? UUID(sqliteValue: statement.value(0)) { ids.append(found) }
        }
        return ids
    }
}

extension ModelContext {
    /// How many upserts a context remembers for ``resolvedIdentifier(for:)`` (the oldest are forgotten first).
    public static let upsertMemory = 4_096

    /// The record an inserted model was saved as: `id` itself, or — when a save of this context found that the insert
    /// carried the unique key of an existing record and updated that record instead (an upsert) — the existing
    /// record's identifier. Models are values, so the copy ``insert(_:)`` returned keeps the ID it was given; read,
    /// update or reference the record through the identifier this returns.
    ///
    /// Remembers the most recent ``upsertMemory`` upserts of this context's saves; ``model(for:as:)`` follows them too.
    /// - Complexity: O(1).
    public func resolvedIdentifier(for id: PersistentIdentifier) -> PersistentIdentifier {
        upsertRedirects[id] ?? id
    }

    /// The upserts of the last save, in save order: the ID each insert carried and the existing record it updated.
    func rememberUpserts(_ upserts: [(inserted: PersistentIdentifier, existing: PersistentIdentifier)]) {
        for (inserted, existing) in upserts {
            if upsertRedirects.updateValue(existing, forKey: inserted) == nil { upsertOrder.append(inserted) }
        }
        if upsertOrder.count > Self.upsertMemory {
            let excess = upsertOrder.count - Self.upsertMemory
            for id in upsertOrder[..<excess] { upsertRedirects[id] = nil }
            upsertOrder.removeFirst(excess)
        }
    }
}
