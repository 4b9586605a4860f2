import Foundation

/// A unit of work over a container's stores (SwiftData's `ModelContext`): register inserts, updates and deletes,
/// then ``save()`` them, or ``rollback()``.
///
/// Models are values: a fetched model is a copy. Change it and hand it back with ``update(_:)``; the save writes only
/// the fields the app changed (see ``update(_:)`` for how a copy's changes are told apart from another writer's).
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
        /// New values; `fields` lists the field indices the app changed relative to the versions the context handed
        /// out or wrote (`nil` when it holds none: then every field that differs from the stored row counts).
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
    /// The versions of records this context has handed out (fetched) or written (saved): the bases of field-level
    /// change tracking. Fetches register their results (see ReadRegistry).
    let reads = ReadRegistry()
    /// For a pending insert (or re-insert) that ``update(_:)`` changed: the copy ``insert(_:)`` handed out, the
    /// version later copies of it are compared with. Empty unless such updates happen.
    private var insertedCopies: [PersistentIdentifier: Snapshot] = [:]
    /// Unsaved changes; saves apply them in first-registration order, deterministically.
    private var pending = PendingChanges()
    /// First-registration order of pending IDs.
    private var pendingOrder: [PersistentIdentifier] { pending.order }
    /// The store of each model type looked up so far, in first-use order (a handful of types; a linear search of
    /// type identities costs less than reading a type's entity, which some model types compute).
    private var modelStores: [(type: ObjectIdentifier, index: Int)] = []
    /// The inserts this context's saves upserted into existing records (inserted ID → existing record), the most
    /// recent ``upsertMemory`` of them (see Upsert.swift).
    var upsertRedirects: [PersistentIdentifier: PersistentIdentifier] = [:]
    /// The keys of ``upsertRedirects`` oldest first, to forget the oldest beyond the bound.
    var upsertOrder: [PersistentIdentifier] = []
    /// Autosave settings and state (see Autosave.swift).
    var autosave = AutosaveState()
    /// Records each save of this context for undo and redo when set (SwiftData's `undoManager`; see
    /// ``ModelUndoManager``: Foundation's `UndoManager` is not available on Linux). One manager may serve several
    /// contexts; setting another manager (or `nil`) makes the previous one forget this context's groups.
    public var undoManager: ModelUndoManager? {
        didSet {
            if oldValue !== undoManager { oldValue?.detach(self) }
            undoManager?.attach(self)
        }
    }
    /// The checks of the undo or redo this context is saving, if any (see ``ModelUndoManager``).
    var undoApplication: UndoApplication?

    /// Creates a context on `container`, belonging to the isolation domain of the code that creates it: `isolation`
    /// is the caller's actor by default (`#isolation`; `nil` in nonisolated code). On an actor, the context can
    /// autosave there (see ``autosaveEnabled``).
    public init(_ container: ModelContainer, isolation: (any Actor)? = #isolation) {
        self.container = container
        self.connections = Array(repeating: nil, count: container.stores.count)
        if let isolation { bindAutosave(enabled: false, scheduler: Self.autosaveScheduler(for: self, on: isolation)) }
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
    /// from the container's environment when the model's ID is ``FoundationEssentials/UUID/unassigned``).
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
        case .delete?, .replace?:
            pending[id] = .replace(snapshot)
            forgetInsertedCopy(id)
        case .insert?: forgetInsertedCopy(id)
        case .update?, nil: break
        }
        if autosave.isEnabled { scheduleAutosave() }
        return model
    }

    private func forgetInsertedCopy(_ id: PersistentIdentifier) {
        if !insertedCopies.isEmpty { insertedCopies[id] = nil }
    }

    /// Registers new values for an existing model. At save, only the fields the app changed are written, so a stale
    /// copy never overwrites another writer's change.
    ///
    /// **Which fields the app changed.** Models are values without identity, so the context tells a copy's edits
    /// from the values of other versions by comparison: it keeps, per record, the versions it handed out or wrote —
    /// each copy a fetch returned, then the state each save of the record left (the last
    /// `ReadRegistry.versionLimit` = 8 versions per record, within the registry's overall bounds) — and the
    /// changed fields are those that differ from the version with the fewest differing fields (ties go to the newest
    /// version). So a copy read before this context saved another edit of the record writes only its own edits (the
    /// saved edit survives), a copy of the newest state writes only its new edits, and a copy read before another
    /// context changed the record never writes back the other context's values, also after this context read the
    /// record again. A record the context never read (or whose versions it dropped) has no versions: every field
    /// that differs from the stored row is written. A record inserted by this context and not yet saved has one
    /// version, the copy ``insert(_:)`` returned.
    ///
    /// **Setting values back.** A copy equal in every field to an earlier version, when this context saved a newer
    /// one, sets that save's edits back: it is compared with the newer versions, so a toggle saved and toggled back
    /// is written (read `isDone == false`, set it `true`, update and save; set it `false` on the same copy, update and
    /// save: the store holds `false`). **The ambiguous case** is a copy that sets a field back *and* edits others: it
    /// is nearest the earlier version, so only the other edits are written (that is what a stale copy with edits
    /// looks like, and a stale copy must not revert a saved edit). Values carry no identity, so the context cannot
    /// tell these apart; to say exactly which copy an edit starts from, use ``update(_:from:)``.
    ///
    /// **Several updates of one record before a save** add up: the pending values are the previous pending values
    /// with the new copy's changed fields laid over them (a later change of the same field wins); a copy without
    /// versions lays all its fields over them. Many-to-many members are the newest copy's.
    ///
    /// One-to-many arrays are filled on fetch and are not written back: change membership through the member's
    /// to-one reference (e.g. set `item.trip`), as the inverse is the stored side. Many-to-many arrays are written
    /// (links added and removed; see ``ModelEntity/Member/toMany(_:_:inverse:deleteRule:)``).
    ///
    /// Traps if the model was never inserted (its ID is ``FoundationEssentials/UUID/unassigned``), or if this context deleted the record
    /// and has not saved since (insert it again instead, which saves as a delete and a re-insert: a new incarnation)
    /// — programming errors.
    ///
    /// - Complexity: O(fields × versions of the record), plus indexing the fetch results registered since the last
    ///   update (once per fetched model).
    public func update<Model: PersistentModel>(_ model: Model) {
        precondition(model.id != .unassigned, "Replica: update(_:) needs an inserted model; call insert(_:) first")
        _ = storeIndex(of: Model.self)
        let snapshot = Model.entity.snapshot(of: model)
        let id = snapshot.persistentModelID
        switch pending[id] {
        case let .insert(current)?:
            register(id, .insert(insertedCopyUpdate(id, current, with: snapshot)))
        case let .replace(current)?:
            register(id, .replace(insertedCopyUpdate(id, current, with: snapshot)))
        case .delete?:
            preconditionFailure("Replica: update(_:) of \(id), which this context deleted and has not saved: to keep the record, "
                + "insert(_:) it again (saved as a delete and a re-insert, a new incarnation), or rollback() the delete")
        case .update(_, _)? where container.environment.canaries.contains(.lastCopyWins), nil where container.environment.canaries.contains(.lastCopyWins):
            register(id, .update(snapshot, fields: nil))
        case let .update(current, earlier)?:
            let versions = reads.versions(of: id)
            guard let fields = Self.changedFields(of: snapshot, versions: versions.snapshots, newestWritten: versions.newestWritten) else {
                register(id, .update(snapshot, fields: nil))
                return
            }
            register(id, .update(Self.overlay(snapshot, fields, on: current), fields: earlier.map { $0.union(fields) }))
        case nil:
            let versions = reads.versions(of: id)
            register(id, .update(snapshot, fields: Self.changedFields(of: snapshot, versions: versions.snapshots,
                                                                      newestWritten: versions.newestWritten)))
        }
    }

    /// Registers new values for an existing model, with the copy the edits start from: the fields in which `model`
    /// differs from `original` are the app's changes, and only those are written at save (those whose stored value
    /// differs). Use it where ``update(_:)``'s comparison with the versions the context keeps cannot know the copy's
    /// origin — a copy that sets some fields back to an earlier value and edits others. Several updates of one record
    /// before a save add up, as with ``update(_:)``.
    ///
    /// - Parameters:
    ///   - model: the edited copy.
    ///   - original: the copy `model` was made from (the same record: its ID must equal `model`'s).
    ///
    /// Traps if the model was never inserted, if `original` is another record, or if this context deleted the record
    /// and has not saved since — programming errors. Complexity: O(fields).
    public func update<Model: PersistentModel>(_ model: Model, from original: Model) {
        precondition(model.id != .unassigned, "Replica: update(_:from:) needs an inserted model; call insert(_:) first")
        precondition(model.id == original.id, "Replica: update(_:from:) needs the original copy of the same record")
        _ = storeIndex(of: Model.self)
        let snapshot = Model.entity.snapshot(of: model)
        let id = snapshot.persistentModelID
        let fields = Self.changedFields(of: snapshot, versions: [Model.entity.snapshot(of: original)]) ?? []
        switch pending[id] {
        case let .insert(current)?:
            register(id, .insert(Self.overlay(snapshot, fields, on: current)))
        case let .replace(current)?:
            register(id, .replace(Self.overlay(snapshot, fields, on: current)))
        case .delete?:
            preconditionFailure("Replica: update(_:from:) of \(id), which this context deleted and has not saved: to keep the "
                + "record, insert(_:) it again (saved as a delete and a re-insert, a new incarnation), or rollback() the delete")
        case let .update(current, earlier)?:
            register(id, .update(Self.overlay(snapshot, fields, on: current), fields: earlier.map { $0.union(fields) }))
        case nil:
            register(id, .update(snapshot, fields: fields))
        }
    }

    /// The pending insert `current` of `id` with the fields `copy` changed relative to the copy insert(_:) returned.
    private func insertedCopyUpdate(_ id: PersistentIdentifier, _ current: Snapshot, with copy: Snapshot) -> Snapshot {
        let inserted: Snapshot
        if let known = insertedCopies[id] {
            inserted = known
        } else {
            // The first update since the insert: the pending values are still the inserted copy's.
            inserted = current
            insertedCopies[id] = current
        }
        return Self.overlay(copy, Self.changedFields(of: copy, versions: [inserted]) ?? [], on: current)
    }

    /// The field indices in which `copy` differs from the nearest of `versions` (oldest first): the version with the
    /// fewest differing fields, the newest of those tied. A version the copy equals in every field is the nearest
    /// unless a save of this context wrote a newer version (position `newestWritten`): then the copy sets that save's
    /// edits back, and is compared with the others (a toggle saved and toggled back is an edit). `nil` without
    /// versions.
    static func changedFields(of copy: Snapshot, versions: [Snapshot], newestWritten: Int? = nil) -> Set<Int>? {
        guard !versions.isEmpty else { return nil }
        let values = copy.values
        func differs(_ version: [SQLiteValue], _ field: Int) -> Bool { field >= version.count || version[field] != values[field] }
        if values.count <= 64 {
            // One pass per version, the differing fields as bits.
            var best: (mask: UInt64, count: Int)?
            for index in versions.indices.reversed() {
                let version = versions[index].values
                var mask: UInt64 = 0
                for field in values.indices where differs(version, field) { mask |= 1 << UInt64(field) }
                let count = mask.nonzeroBitCount
                if count == 0 {
                    if let written = newestWritten, written > index { continue }
                    return []
                }
                if best.map({ count < $0.count }) ?? true { best = (mask, count) }
            }
            guard let best else { return [] }
            var fields = Set<Int>(minimumCapacity: best.count)
            var mask = best.mask
            while mask != 0 {
                fields.insert(mask.trailingZeroBitCount)
                mask &= mask - 1
            }
            return fields
        }
        var best: Set<Int>?
        for index in versions.indices.reversed() {
            let fields = Set(values.indices.filter { differs(versions[index].values, $0) })
            if fields.isEmpty {
                if let written = newestWritten, written > index { continue }
                return []
            }
            if best.map({ fields.count < $0.count }) ?? true { best = fields }
        }
        return best ?? []
    }

    /// `pending` with the values of `copy` at `fields`, and the copy's many-to-many members.
    static func overlay(_ copy: Snapshot, _ fields: Set<Int>, on pending: Snapshot) -> Snapshot {
        guard pending.values.count == copy.values.count else { return copy }
        var merged = pending
        for field in fields { merged.values[field] = copy.values[field] }
        merged.toManyMembers = copy.toManyMembers
        return merged
    }

    /// Registers `model` for deletion at the next save. Delete rules are applied at save.
    public func delete<Model: PersistentModel>(_ model: Model) {
        delete(model.persistentModelID)
    }

    /// Registers the record `id` for deletion at the next save.
    public func delete(_ id: PersistentIdentifier) {
        precondition(container.storeIndexByEntity[id.entityName] != nil, "Replica: entity '\(id.entityName)' is not in the container's schema")
        switch pending[id] {
        case .insert?:
            pending[id] = nil
            forgetInsertedCopy(id)
        case .replace?:
            register(id, .delete)
            forgetInsertedCopy(id)
        case .update?, .delete?, nil:
            register(id, .delete)
        }
    }

    /// Registers the insert of a record given as a snapshot (undo re-inserting a deleted record): as ``insert(_:)``.
    func registerInsert(_ snapshot: Snapshot) {
        let id = snapshot.persistentModelID
        switch pending.updateValue(.insert(snapshot), forKey: id) {
        case .delete?, .replace?: pending[id] = .replace(snapshot)
        case .insert?, .update?, nil: break
        }
        forgetInsertedCopy(id)
        if autosave.isEnabled { scheduleAutosave() }
    }

    /// Registers new values of `fields` of a record given as a snapshot (undo setting fields back).
    func registerUpdate(_ snapshot: Snapshot, fields: Set<Int>) {
        let id = snapshot.persistentModelID
        switch pending[id] {
        case let .insert(current)?: register(id, .insert(Self.overlay(snapshot, fields, on: current)))
        case let .replace(current)?: register(id, .replace(Self.overlay(snapshot, fields, on: current)))
        case let .update(current, earlier)?:
            register(id, .update(Self.overlay(snapshot, fields, on: current), fields: earlier.map { $0.union(fields) }))
        case .delete?: break
        case nil: register(id, .update(snapshot, fields: fields))
        }
    }

    private func register(_ id: PersistentIdentifier, _ change: PendingChange) {
        pending.updateValue(change, forKey: id)
        if autosave.isEnabled { scheduleAutosave() }
    }

    /// The pending values of `id` (a pending insert, re-insert or update), `nil` otherwise. O(1).
    func pendingSnapshot(of id: PersistentIdentifier) -> Snapshot? { pending[id]?.snapshot }

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
        if !insertedCopies.isEmpty { insertedCopies.removeAll() }
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
        autosave.isSaving = true
        defer { autosave.isSaving = false }
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
        var upserts: [(inserted: PersistentIdentifier, existing: PersistentIdentifier)] = []
        /// Stores whose external-storage files may hold garbage: once committed (references dropped), or if the save
        /// does not commit (files written).
        var assetGarbageIfCommitted: [Int] = [], assetGarbageIfRolledBack: [Int] = []
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
                writer.capturesPreviousValues = undoManager != nil
                writer.undoApplication = undoApplication
                defer {
                    if writer.droppedAssetReferences { assetGarbageIfCommitted.append(index) }
                    if writer.wroteAssetFiles { assetGarbageIfRolledBack.append(index) }
                }
                try writer.apply(byStore[index])
                failures += writer.failures
                upserts += writer.upserts
                var token: Int64?
                defer { tokens.append(token) }
                if writer.failures.isEmpty {
                    if container.stores[index].configuration.tracksHistory {
                        token = try HistoryLog.record(writer.changes, author: author, environment: container.environment, db: connection)
                        if let token { hub.willCommit(store: index, token: token, origin: .localSave) }
                    }
                    if container.stores[index].tracksSync {
                        try SyncLedger.recordLocalChanges(writer.changes, store: container.stores[index], db: connection,
                                                          environment: container.environment, ledgerBound: writer.ledgerBoundRead)
                    }
                    saved.append(writer.changes)
                }
            }
        } catch {
            open.forEach { $0.rollback() }
            abandonTokens()
            collectAssetGarbage(in: assetGarbageIfRolledBack)
            throw error
        }
        if !failures.isEmpty {
            open.forEach { $0.rollback() }
            abandonTokens()
            collectAssetGarbage(in: assetGarbageIfRolledBack)
            throw ReplicaError.modelValidationFailure(failures)
        }
        var committed: [Int] = []
        if let hook = container.environment.faultHook {
            do {
                for index in affected { try hook(.beforeCommit(store: container.stores[index].configuration.name)) }
            } catch {
                // A fault here stands for a crash before the commit: the files it wrote stay until a collection
                // (the next open of the store, or a save that drops references), as after a real crash.
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
                collectAssetGarbage(in: assetGarbageIfRolledBack.filter { !committed.contains($0) }
                                    + assetGarbageIfCommitted.filter { committed.contains($0) })
                for store in committed { forgetPending(inStore: store) }
                if committed.isEmpty { throw error }
                throw ReplicaError.partialSave(
                    committed: committed.map { container.stores[$0].configuration.name },
                    failed: container.stores[index].configuration.name, underlying: error)
            }
        }
        collectAssetGarbage(in: assetGarbageIfCommitted)
        // The versions of change tracking: deleted records are forgotten (also those a cascade deleted, and those
        // the save inserted again: a new incarnation), inserted ones (as written) begin their list, and updated ones
        // add the state the save left (the stored row).
        for changes in saved {
            for record in changes.deleted { reads.forget(record.id) }
            reads.register(inserted: changes.inserted)
            for (snapshot, _) in changes.updated where !snapshot.values.isEmpty { reads.register(saved: snapshot) }
        }
        rollback()
        undoManager?.recordSave(saved, in: self)
        autosave.lastError = nil
        rememberUpserts(upserts)
        handoutLoaderStorage?.invalidate()
        postDidSave(saved)
    }

    /// Removes the external-storage files no committed row or history tombstone references, in the given stores
    /// (after a save dropped references, or did not commit files it wrote). Best effort: what remains is removed at
    /// the next collection (the next such save, or the next open of the store).
    func collectAssetGarbage(in stores: [Int]) {
        for index in Set(stores).sorted() {
            guard let assets = container.stores[index].assets, let db = try? connection(for: index) else { continue }
            _ = try? assets.collectGarbage(db, entities: container.stores[index].entities)
        }
    }

    private func forgetPending(inStore index: Int) {
        pending.removeAll { container.storeIndexByEntity[$0.entityName] == index }
        insertedCopies = insertedCopies.filter { container.storeIndexByEntity[$0.key.entityName] != index }
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
