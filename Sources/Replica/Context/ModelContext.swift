import Foundation

/// A unit of work over a container's stores (SwiftData's `ModelContext`): register inserts, updates and deletes,
/// then ``save()`` them, or ``rollback()``.
///
/// Models are values: a fetched model is a copy. Change it and hand it back with ``update(_:)``; the save writes only
/// the fields whose stored value changed.
///
/// A context is not `Sendable`: it owns one SQLite connection per store it touches and stays on the task or actor
/// that created it. Create one context per task.
public final class ModelContext {
    /// The container whose stores this context reads and writes.
    public let container: ModelContainer
    /// Recorded as the author of the history transactions this context saves.
    public var author: String?

    enum PendingChange {
        case insert(Snapshot)
        /// New values; `fields` lists the field indices the app changed relative to the copy it fetched (`nil` when
        /// the context never read the record: then every field that differs from the stored row counts).
        case update(Snapshot, fields: Set<Int>?)
        case delete
        /// Deleted, then inserted again with the same ID.
        case replace(Snapshot)

        var snapshot: Snapshot? {
            switch self {
            case let .insert(s), let .update(s, _), let .replace(s): return s
            case .delete: return nil
            }
        }
    }

    private var connections: [Connection?]
    /// The stored snapshot of every record this context has read (or saved): the base of field-level change tracking.
    private var registered: [PersistentIdentifier: Snapshot] = [:]
    private var pending: [PersistentIdentifier: PendingChange] = [:]
    /// First-registration order of pending IDs: saves apply changes in this order, deterministically.
    private var pendingOrder: [PersistentIdentifier] = []

    /// Creates a context on `container`.
    public init(_ container: ModelContainer) {
        self.container = container
        self.connections = Array(repeating: nil, count: container.stores.count)
    }

    // MARK: Registering changes

    /// Registers `model` for insertion at the next save and returns it with its ID assigned (a new time-ordered ID
    /// from the container's environment when the model's ID is ``UUID/unassigned``).
    ///
    /// Traps if `Model`'s entity is not in the container's schema (a programming error).
    @discardableResult
    public func insert<Model: PersistentModel>(_ model: Model) -> Model {
        _ = storeIndex(of: Model.self)
        var model = model
        if model.id == .unassigned { model.id = container.environment.makeIdentifier() }
        let snapshot = Model.entity.snapshot(of: model)
        let id = snapshot.persistentModelID
        switch pending[id] {
        case .delete?, .replace?: register(id, .replace(snapshot))
        case .insert?: register(id, .insert(snapshot))
        case .update?, nil: register(id, .insert(snapshot))
        }
        return model
    }

    /// Registers new values for an existing model. At save, only fields whose value differs from the stored record
    /// are written.
    public func update<Model: PersistentModel>(_ model: Model) {
        precondition(model.id != .unassigned, "Replica: update(_:) needs an inserted model; call insert(_:) first")
        _ = storeIndex(of: Model.self)
        let snapshot = Model.entity.snapshot(of: model)
        let id = snapshot.persistentModelID
        // Field-level change tracking: only fields that differ from the copy this context handed out are the
        // app's changes, so a stale copy never writes back values another writer changed meanwhile.
        var fields: Set<Int>? = registered[id].map { base in
            Set(snapshot.values.indices.filter { $0 >= base.values.count || base.values[$0] != snapshot.values[$0] })
        }
        switch pending[id] {
        case .insert?: register(id, .insert(snapshot))
        case .replace?: register(id, .replace(snapshot))
        case .delete?: preconditionFailure("Replica: \(id) was deleted in this context; insert it again instead")
        case let .update(_, earlier)?:
            if let earlier, let now = fields { fields = earlier.union(now) } else { fields = nil }
            register(id, .update(snapshot, fields: fields))
        case nil: register(id, .update(snapshot, fields: fields))
        }
    }

    /// Registers `model` for deletion at the next save. Delete rules are applied at save.
    public func delete<Model: PersistentModel>(_ model: Model) {
        delete(model.persistentModelID)
    }

    /// Registers the record `id` for deletion at the next save.
    public func delete(_ id: PersistentIdentifier) {
        precondition(container.storeIndexByEntity[id.entityName] != nil, "Replica: entity '\(id.entityName)' is not in the container's schema")
        switch pending[id] {
        case .insert?: pending[id] = nil; pendingOrder.removeAll { $0 == id }
        default: register(id, .delete)
        }
    }

    private func register(_ id: PersistentIdentifier, _ change: PendingChange) {
        if pending.updateValue(change, forKey: id) == nil { pendingOrder.append(id) }
    }

    /// `true` when there are unsaved changes.
    public var hasChanges: Bool { !pending.isEmpty }

    /// Identifiers of models inserted (and not yet saved), in registration order.
    public var insertedIdentifiers: [PersistentIdentifier] {
        pendingOrder.filter { if case .insert = pending[$0] { return true } else { return false } }
    }

    /// Identifiers of models updated (and not yet saved), in registration order.
    public var updatedIdentifiers: [PersistentIdentifier] {
        pendingOrder.filter { if case .update? = pending[$0] { return true } else { return false } }
    }

    /// Identifiers of models deleted (and not yet saved), in registration order.
    public var deletedIdentifiers: [PersistentIdentifier] {
        pendingOrder.filter { if case .delete = pending[$0] { return true } else { return false } }
    }

    /// Discards every unsaved change.
    public func rollback() {
        pending.removeAll()
        pendingOrder.removeAll()
    }

    // MARK: Saving

    /// Writes every pending change: each affected store in one SQLite write transaction.
    ///
    /// **Guarantee.** All stores' transactions are opened and every change is applied and validated (delete rules,
    /// unique constraints, required relationships) before any store commits; a validation failure or SQLite error in
    /// that phase rolls back every store and nothing is written. Then the stores commit one after another. SQLite
    /// cannot commit several WAL databases atomically (<https://www.sqlite.org/lang_attach.html>), so an I/O failure
    /// *during* the commit of a later store leaves earlier stores committed: that is reported as
    /// ``ReplicaError/partialSave(committed:failed:underlying:)``, and the failed stores' changes stay pending.
    ///
    /// - Throws: ``ReplicaError/modelValidationFailure(_:)`` (every failure found), ``ReplicaError/readOnlyStore(configuration:)``,
    ///   ``ReplicaError/recordNotFound(_:)`` (an update of a record that no longer exists), ``SQLiteError``, or
    ///   ``ReplicaError/partialSave(committed:failed:underlying:)``. On any error, pending changes are kept.
    public func save() throws {
        guard hasChanges else { return }
        // Group changes by store, in registration order.
        var byStore: [[(PersistentIdentifier, PendingChange)]] = Array(repeating: [], count: container.stores.count)
        for id in pendingOrder {
            guard let change = pending[id], let index = container.storeIndexByEntity[id.entityName] else { continue }
            byStore[index].append((id, change))
        }
        let affected = byStore.indices.filter { !byStore[$0].isEmpty }
        for index in affected where !container.stores[index].configuration.allowsSave {
            throw ReplicaError.readOnlyStore(configuration: container.stores[index].configuration.name)
        }

        var open: [Connection] = []
        var failures: [ModelValidationFailure] = []
        var saved: [StoreChanges] = []
        do {
            for index in affected {
                let connection = try connection(for: index)
                try connection.begin(.immediate)
                open.append(connection)
                var writer = StoreWriter(store: container.stores[index], db: connection)
                try writer.apply(byStore[index])
                failures += writer.failures
                if writer.failures.isEmpty {
                    _ = try HistoryLog.record(writer.changes, author: author, environment: container.environment, db: connection)
                    if container.stores[index].configuration.isSynced {
                        try SyncLedger.recordLocalChanges(writer.changes, store: container.stores[index], db: connection,
                                                          environment: container.environment)
                    }
                    saved.append(writer.changes)
                }
            }
        } catch {
            open.forEach { $0.rollback() }
            throw error
        }
        if !failures.isEmpty {
            open.forEach { $0.rollback() }
            throw ReplicaError.modelValidationFailure(failures)
        }
        var committed: [Int] = []
        if let hook = container.environment.faultHook {
            do {
                for index in affected { try hook(.beforeCommit(store: container.stores[index].configuration.name)) }
            } catch {
                open.forEach { $0.rollback() }
                throw error
            }
        }
        for (position, index) in affected.enumerated() {
            do {
                try open[position].commit()
                committed.append(index)
                try? container.environment.faultHook?(.afterCommit(store: container.stores[index].configuration.name))
            } catch let error as SQLiteError {
                open[position...].forEach { $0.rollback() }
                for store in committed { forgetPending(inStore: store) }
                if committed.isEmpty { throw error }
                throw ReplicaError.partialSave(
                    committed: committed.map { container.stores[$0].configuration.name },
                    failed: container.stores[index].configuration.name, underlying: error)
            }
        }
        for id in pendingOrder {
            switch pending[id] {
            case let .insert(snapshot)?, let .replace(snapshot)?: registered[id] = snapshot
            default: registered[id] = nil  // updated or deleted: the next read registers the stored state again
            }
        }
        rollback()
        postDidSave(saved)
    }

    private func forgetPending(inStore index: Int) {
        pendingOrder.removeAll { id in
            guard container.storeIndexByEntity[id.entityName] == index else { return false }
            pending[id] = nil
            return true
        }
    }

    // MARK: Fetching

    /// The model with record ID `id`, or `nil` when there is none (pending changes included).
    /// - Throws: ``SQLiteError``, ``ReplicaError/valueConversion(_:)``.
    public func model<Model: PersistentModel>(_ type: Model.Type = Model.self, id: UUID) throws -> Model? {
        let pid = PersistentIdentifier(entityName: Model.entityName, id: id)
        if let change = pending[pid] {
            guard let snapshot = change.snapshot else { return nil }
            return try decodeModels(Model.self, [snapshot], store: storeIndex(of: Model.self)).first
        }
        let index = storeIndex(of: Model.self)
        let store = container.stores[index]
        let statements = store.statements[store.entityIndex[Model.entityName]!]
        let rows = try readSnapshots(Model.entityName, sql: statements.selectByID, [id.sqliteValue], store: index)
        return try decodeModels(Model.self, rows, store: index).first
    }

    /// The models `descriptor` selects, sorted, paged.
    ///
    /// Complexity: reads every record of the entity and filters in memory (O(n)); predicates are not yet compiled
    /// to SQL.
    /// - Throws: ``SQLiteError``, ``ReplicaError/valueConversion(_:)``, or an error the predicate throws.
    public func fetch<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) throws -> [Model] {
        let index = storeIndex(of: Model.self)
        let store = container.stores[index]
        let statements = store.statements[store.entityIndex[Model.entityName]!]
        var snapshots = try readSnapshots(Model.entityName, sql: statements.selectAll + " ORDER BY \"id\"", [], store: index)
        if descriptor.includePendingChanges {
            var position: [UUID: Int] = [:]
            for (i, snapshot) in snapshots.enumerated() { position[snapshot.id] = i }
            var removed = Set<Int>()
            for id in pendingOrder where id.entityName == Model.entityName {
                let existing = position[id.id]
                switch pending[id] {
                case let .update(snapshot, _)?, let .replace(snapshot)?, let .insert(snapshot)?:
                    if let existing { snapshots[existing] = snapshot } else { snapshots.append(snapshot) }
                case .delete?:
                    if let existing { removed.insert(existing) }
                case nil: break
                }
            }
            if !removed.isEmpty { snapshots = snapshots.enumerated().filter { !removed.contains($0.offset) }.map(\.element) }
            snapshots.sort { $0.id.bytes.lexicographicallyPrecedes($1.id.bytes) }
        }
        var models = try decodeModels(Model.self, snapshots, store: index, includePendingChanges: descriptor.includePendingChanges)
        if let predicate = descriptor.predicate {
            models = try models.filter { try predicate.evaluate($0) }
        }
        if !descriptor.sortBy.isEmpty {
            // Stable sort: ties keep ID order.
            models = models.enumerated().sorted { a, b in
                switch descriptor.sortBy.compare(a.element, b.element) {
                case .orderedAscending: return true
                case .orderedDescending: return false
                case .orderedSame: return a.offset < b.offset
                }
            }.map(\.element)
        }
        let offset = min(max(descriptor.fetchOffset ?? 0, 0), models.count)
        let end = descriptor.fetchLimit.map { offset + min(models.count - offset, max($0, 0)) } ?? models.count
        return Array(models[offset..<end])
    }

    /// Every model of `type`, in ID (creation) order.
    public func fetch<Model: PersistentModel>(_ type: Model.Type) throws -> [Model] {
        try fetch(FetchDescriptor<Model>())
    }

    // MARK: Internals

    func storeIndex<Model: PersistentModel>(of type: Model.Type) -> Int {
        guard let index = container.storeIndexByEntity[Model.entityName] else {
            preconditionFailure("Replica: \(Model.self) (entity '\(Model.entityName)') is not in the container's schema")
        }
        return index
    }

    func connection(for storeIndex: Int) throws -> Connection {
        if let connection = connections[storeIndex] { return connection }
        let connection = try container.stores[storeIndex].openConnection()
        connections[storeIndex] = connection
        return connection
    }

    private func readSnapshots(_ entityName: String, sql: String, _ values: [SQLiteValue], store index: Int) throws -> [Snapshot] {
        let db = try connection(for: index)
        let statement = try db.cachedStatement(sql)
        defer { statement.reset() }
        try statement.bind(values)
        let count = statement.columnCount
        var result: [Snapshot] = []
        while try statement.step() {
            guard let id = UUID(bytes: statement.data(0)) else { continue }
            var values: [SQLiteValue] = []
            values.reserveCapacity(Int(count) - 1)
            for column in 1..<count { values.append(statement.value(column)) }
            let snapshot = Snapshot(entityName: entityName, id: id, values: values)
            registered[snapshot.persistentModelID] = snapshot
            result.append(snapshot)
        }
        return result
    }

    /// Decodes snapshots into models, loading each to-many relationship with one query for the whole batch.
    private func decodeModels<Model: PersistentModel>(_ type: Model.Type, _ snapshots: [Snapshot], store index: Int,
                                                      includePendingChanges: Bool = true) throws -> [Model] {
        let entity = Model.entity
        var members: [String: [UUID: [UUID]]] = [:]
        for (relationship, _) in entity.toManyMembers {
            var loaded = try loadToMany(relationship, for: snapshots.map(\.id), store: index)
            if includePendingChanges { applyPendingMembers(relationship, for: snapshots.map(\.id), store: index, to: &loaded) }
            members[relationship.name] = loaded
        }
        do {
            return try snapshots.map { snapshot in
                var toMany: [String: [UUID]] = [:]
                for (relationship, _) in entity.toManyMembers {
                    toMany[relationship.name] = members[relationship.name]?[snapshot.id] ?? []
                }
                let row = ModelRow(id: snapshot.id, values: snapshot.values, entityName: Model.entityName,
                                   fieldIndexByName: entity.fieldIndexByName, toMany: toMany)
                return try Model(row: row)
            }
        } catch let error as ValueConversionError {
            throw ReplicaError.valueConversion(error)
        }
    }

    /// Members of a to-many relationship for each owner, in member ID order; one query per 500 owners.
    private func loadToMany(_ relationship: Schema.Relationship, for owners: [UUID], store index: Int) throws -> [UUID: [UUID]] {
        guard let inverse = relationship.inverse, !owners.isEmpty else { return [:] }
        let db = try connection(for: index)
        var result: [UUID: [UUID]] = [:]
        var start = 0
        while start < owners.count {
            let chunk = owners[start..<min(start + 500, owners.count)]
            start += chunk.count
            let placeholders = Array(repeating: "?", count: chunk.count).joined(separator: ", ")
            let sql = "SELECT \(quoted(inverse)), \"id\" FROM \(quoted(relationship.destination)) WHERE \(quoted(inverse)) IN (\(placeholders)) ORDER BY \"id\""
            for row in try db.rows(sql, chunk.map(\.sqliteValue), cache: chunk.count == 500) {
                guard case let .blob(ownerBytes) = row[0], case let .blob(memberBytes) = row[1],
                      let owner = UUID(bytes: ownerBytes), let member = UUID(bytes: memberBytes) else { continue }
                result[owner, default: []].append(member)
            }
        }
        return result
    }

    /// Applies this context's pending inserts, updates and deletes of `relationship`'s destination records to the
    /// stored members of each owner; a changed list stays in member ID order.
    private func applyPendingMembers(_ relationship: Schema.Relationship, for owners: [UUID], store index: Int,
                                     to members: inout [UUID: [UUID]]) {
        let store = container.stores[index]
        guard let inverse = relationship.inverse, let destination = store.entityIndex[relationship.destination],
              let field = store.entities[destination].fieldNames.firstIndex(of: inverse) else { return }
        let changed = pendingOrder.filter { $0.entityName == relationship.destination }
        if changed.isEmpty || owners.isEmpty { return }
        let changedIDs = Set(changed.map(\.id))
        for owner in owners {
            if let list = members[owner], list.contains(where: changedIDs.contains) {
                members[owner] = list.filter { !changedIDs.contains($0) }
            }
        }
        let ownerSet = Set(owners)
        var touched: [UUID] = []
        for id in changed {
            guard case let .blob(bytes)? = pending[id]?.snapshot?.values[field], let owner = UUID(bytes: bytes),
                  ownerSet.contains(owner) else { continue }
            members[owner, default: []].append(id.id)
            touched.append(owner)
        }
        for owner in touched { members[owner]?.sort { $0.bytes.lexicographicallyPrecedes($1.bytes) } }
    }
}
