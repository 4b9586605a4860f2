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
    /// The copies of records this context has read (or saved): the bases of field-level change tracking. Fetches
    /// register their results (see ReadRegistry).
    let reads = ReadRegistry()
    /// Unsaved changes; saves apply them in first-registration order, deterministically.
    private var pending = PendingChanges()
    /// First-registration order of pending IDs.
    private var pendingOrder: [PersistentIdentifier] { pending.order }
    /// The store of each model type looked up so far, in first-use order (a handful of types; a linear search of
    /// type identities costs less than reading a type's entity, which some model types compute).
    private var modelStores: [(type: ObjectIdentifier, index: Int)] = []

    /// Creates a context on `container`.
    public init(_ container: ModelContainer) {
        self.container = container
        self.connections = Array(repeating: nil, count: container.stores.count)
    }

    /// Gives the context's connections back to their stores, for the next context or sync engine (see
    /// `Store.reuse(_:)`), and closes the loader of the references it handed out (they no longer load targets).
    deinit {
        if ownsHandoutLoader { handoutLoaderStorage?.close() }
        for (index, connection) in connections.enumerated() {
            if let connection { container.stores[index].reuse(connection) }
        }
    }

    // MARK: Loading reference targets

    private var handoutLoaderStorage: ReferenceLoader?
    private var ownsHandoutLoader = true

    /// The loader that the unresolved references this context hands out carry (see ``Reference/loadTarget()``),
    /// made on first use.
    var handoutLoader: ReferenceLoader {
        if let loader = handoutLoaderStorage { return loader }
        let loader = ReferenceLoader(container: container)
        handoutLoaderStorage = loader
        return loader
    }

    /// Makes this context (a reference loader's private one) hand out `loader`, which it does not own, so that
    /// targets loaded through a reference load their own references' targets through the same loader.
    func lendHandoutLoader(_ loader: ReferenceLoader) {
        handoutLoaderStorage = loader
        ownsHandoutLoader = false
    }

    /// The stored record `id` of `type` (no unsaved changes), not registered as a base of change tracking: what a
    /// reference loads on demand. One query, plus one per to-many relationship.
    func loadTarget<T: PersistentModel>(_ type: T.Type, id: UUID) throws -> T? {
        let engine = try queryEngine(T.self, includePendingChanges: false)
        engine.registersReads = false
        return try engine.loadModel(T.self, id: id)
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
        // One hash lookup in the usual case (a new record).
        switch pending.updateValue(.insert(snapshot), forKey: id) {
        case .delete?, .replace?: pending[id] = .replace(snapshot)
        case .insert?, .update?, nil: break
        }
        return model
    }

    /// Registers new values for an existing model. At save, only the fields the app changed are written: those that
    /// differ from the copy this context last read (or, for a record it never read, from the stored row).
    ///
    /// One-to-many arrays are filled on fetch and are not written back: change membership through the member's
    /// to-one reference (e.g. set `item.trip`), as the inverse is the stored side. Many-to-many arrays are written
    /// (links added and removed; see ``ModelEntity/Member/toMany(_:_:inverse:deleteRule:)``).
    ///
    /// Traps if the model was never inserted (its ID is ``UUID/unassigned``) — a programming error.
    public func update<Model: PersistentModel>(_ model: Model) {
        precondition(model.id != .unassigned, "Replica: update(_:) needs an inserted model; call insert(_:) first")
        _ = storeIndex(of: Model.self)
        let snapshot = Model.entity.snapshot(of: model)
        let id = snapshot.persistentModelID
        // Field-level change tracking: only fields that differ from the copy this context handed out are the
        // app's changes, so a stale copy never writes back values another writer changed meanwhile.
        var fields: Set<Int>? = reads.base(for: id).map { base in
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
        case .insert?: pending[id] = nil
        default: register(id, .delete)
        }
    }

    private func register(_ id: PersistentIdentifier, _ change: PendingChange) {
        pending.updateValue(change, forKey: id)
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
        // Group changes by store, in registration order (one store: the pending list itself, not a copy).
        var byStore: [[PendingChanges.Entry]]
        if container.stores.count == 1 {
            byStore = [pending.entries]
        } else {
            byStore = Array(repeating: [], count: container.stores.count)
            for entry in pending.entries {
                guard entry.change != nil, let index = container.storeIndexByEntity[entry.id.entityName] else { continue }
                byStore[index].append(entry)
            }
        }
        let affected = byStore.indices.filter { byStore[$0].contains { $0.change != nil } }
        for index in affected where !container.stores[index].configuration.allowsSave {
            throw ReplicaError.readOnlyStore(configuration: container.stores[index].configuration.name)
        }

        var open: [Connection] = []
        var failures: [ModelValidationFailure] = []
        var saved: [StoreChanges] = []
        /// The history token each store's transaction records (announced to the change hub before the commit).
        var tokens: [Int64?] = []
        let hub = container.changeHub
        func abandonTokens(from position: Int = 0) {
            for (offset, token) in tokens.enumerated() where offset >= position {
                if let token { hub.abandon(store: affected[offset], token: token) }
            }
        }
        do {
            for index in affected {
                let connection = try connection(for: index)
                try connection.begin(.immediate)
                open.append(connection)
                var writer = StoreWriter(store: container.stores[index], db: connection)
                try writer.apply(byStore[index])
                failures += writer.failures
                var token: Int64?
                defer { tokens.append(token) }
                if writer.failures.isEmpty {
                    if container.stores[index].configuration.tracksHistory {
                        token = try HistoryLog.record(writer.changes, author: author, environment: container.environment, db: connection)
                        if let token { hub.willCommit(store: index, token: token, origin: .localSave) }
                    }
                    if container.stores[index].configuration.isSynced {
                        try SyncLedger.recordLocalChanges(writer.changes, store: container.stores[index], db: connection,
                                                          environment: container.environment, ledgerBound: writer.ledgerBoundRead)
                    }
                    saved.append(writer.changes)
                }
            }
        } catch {
            open.forEach { $0.rollback() }
            abandonTokens()
            throw error
        }
        if !failures.isEmpty {
            open.forEach { $0.rollback() }
            abandonTokens()
            throw ReplicaError.modelValidationFailure(failures)
        }
        var committed: [Int] = []
        if let hook = container.environment.faultHook {
            do {
                for index in affected { try hook(.beforeCommit(store: container.stores[index].configuration.name)) }
            } catch {
                open.forEach { $0.rollback() }
                abandonTokens()
                throw error
            }
        }
        for (position, index) in affected.enumerated() {
            do {
                try open[position].commit()
                committed.append(index)
                // Announced before the fault hook: a simulated crash after the commit still leaves it announced, as
                // the history holds it.
                if let token = tokens[position] {
                    hub.didCommit(store: index, token: token, reading: open[position], changes: saved[position], author: author)
                } else {
                    hub.didCommitUntracked(store: index, changes: saved[position], author: author)
                }
                try? container.environment.faultHook?(.afterCommit(store: container.stores[index].configuration.name))
            } catch let error as SQLiteError {
                open[position...].forEach { $0.rollback() }
                abandonTokens(from: position)
                for store in committed { forgetPending(inStore: store) }
                if committed.isEmpty { throw error }
                throw ReplicaError.partialSave(
                    committed: committed.map { container.stores[$0].configuration.name },
                    failed: container.stores[index].configuration.name, underlying: error)
            }
        }
        // Inserted records (every pending insert and replace, as written) become the bases of change tracking;
        // updated and deleted ones are forgotten: the next read registers the stored state again.
        for changes in saved { reads.register(inserted: changes.inserted) }
        pending.forEachUpdateOrDelete { reads.forget($0) }
        rollback()
        handoutLoaderStorage?.invalidate()
        postDidSave(saved)
    }

    private func forgetPending(inStore index: Int) {
        pending.removeAll { container.storeIndexByEntity[$0.entityName] == index }
    }

    // MARK: Fetching
    // The query API (fetch, fetchCount, fetchIdentifiers, enumerate, batch delete, hierarchies) is in
    // ModelContext+Queries.swift; this section holds what it needs from the context's private state.

    /// Query bookkeeping: SQL functions registered per connection, nesting of streaming enumerations.
    let queryState = QueryState()

    /// The pending changes of the given entities, in registration order. Fetches overlay them on stored rows
    /// (``FetchDescriptor/includePendingChanges``). Complexity: O(pending changes).
    func pendingChanges(entities: Set<String>) -> [(PersistentIdentifier, PendingChange)] {
        pending.entries.compactMap { entry in
            guard let change = entry.change, entities.contains(entry.id.entityName) else { return nil }
            return (entry.id, change)
        }
    }

    /// Whether a change of a record of `entityName` is pending. O(1) without pending changes, else O(pending changes).
    func hasPendingChanges(ofEntity entityName: String) -> Bool {
        guard !pending.isEmpty else { return false }
        return pending.entries.contains { $0.change != nil && $0.id.entityName == entityName }
    }

    // MARK: Internals

    func storeIndex<Model: PersistentModel>(of type: Model.Type) -> Int {
        let key = ObjectIdentifier(Model.self)
        for known in modelStores where known.type == key { return known.index }
        let name = Model.entity.name
        guard let index = container.storeIndexByEntity[name] else {
            preconditionFailure("Replica: \(Model.self) (entity '\(name)') is not in the container's schema")
        }
        modelStores.append((key, index))
        return index
    }

    func connection(for storeIndex: Int) throws -> Connection {
        if let connection = connections[storeIndex] { return connection }
        let connection = try container.stores[storeIndex].openConnection()
        connections[storeIndex] = connection
        return connection
    }
}
