import Foundation

/// Reading: fetches, counts, identifiers, streaming enumeration and batch deletes, all in SQL.
extension ModelContext {
    /// The default batch size of ``enumerate(_:batchSize:block:)`` (SwiftData's).
    public static let defaultBatchSize = 5000

    func queryEngine<Model: PersistentModel>(_ type: Model.Type, includePendingChanges: Bool) throws -> QueryEngine {
        try QueryEngine(context: self, storeIndex: storeIndex(of: Model.self), includePendingChanges: includePendingChanges)
    }

    private func checkAllowed(_ plan: FetchPlan, allowsInMemoryEvaluation: Bool) throws {
        guard !allowsInMemoryEvaluation else { return }
        if plan.filtersInMemory { throw FetchError.unsupportedPredicate(reasons: plan.reasons) }
        if plan.sortsInMemory { throw FetchError.unsupportedSortDescriptor(reasons: plan.sortReasons) }
    }

    /// The model with record ID `id`, or `nil` when there is none (pending changes included).
    /// Complexity: one query, plus one per to-many relationship.
    /// - Throws: ``SQLiteError``, ``ReplicaError/valueConversion(_:)``.
    public func model<Model: PersistentModel>(_ type: Model.Type = Model.self, id: UUID) throws -> Model? {
        try model(Model.self, id: id, registeringReads: true)
    }

    /// ``model(_:id:)``; with `registeringReads` false, the model is not kept as a base of change tracking.
    func model<Model: PersistentModel>(_ type: Model.Type, id: UUID, registeringReads: Bool) throws -> Model? {
        let engine = try queryEngine(Model.self, includePendingChanges: true)
        engine.registersReads = registeringReads
        return try engine.loadModel(Model.self, id: id)
    }

    /// The models `descriptor` selects, sorted and paged, read in SQL. Traps if `Model`'s entity is not in the
    /// container's schema (a programming error).
    ///
    /// The predicate and sort are translated to one SQL query; rows are decoded straight from the statement. Each
    /// to-many relationship adds one query per 5000 models, and each prefetched relationship one more. Parts of the
    /// predicate or sort without an SQL form are evaluated in memory over the rows the SQL selects (see
    /// ``queryPlan(for:)-(FetchDescriptor<Model>)``), with the same results.
    ///
    /// - Parameter descriptor: predicate, sort, paging and loading options.
    /// - Returns: the models, in sort order (ties in ID order).
    /// - Throws: ``FetchError`` (a key path that is no attribute, in-memory evaluation that the descriptor forbids),
    ///   ``SQLiteError``, ``ReplicaError/valueConversion(_:)``, or an error the predicate throws when evaluated
    ///   (`PredicateError.forceUnwrapFailure`).
    /// - Complexity: one SQL query; O(n) decoding for n returned rows.
    public func fetch<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) throws -> [Model] {
        try fetch(descriptor, registeringReads: true)
    }

    /// ``fetch(_:)-(FetchDescriptor<Model>)``; with `registeringReads` false, the models are not kept as bases of
    /// change tracking (observers, which fetch again and again, hold no old results that way).
    func fetch<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>, registeringReads: Bool) throws -> [Model] {
        let engine = try queryEngine(Model.self, includePendingChanges: descriptor.includePendingChanges)
        engine.registersReads = registeringReads
        let plan = try engine.plan(descriptor)
        try checkAllowed(plan, allowsInMemoryEvaluation: descriptor.allowsInMemoryEvaluation)
        var result: [Model] = []
        try engine.run(plan, descriptor, batchSize: plan.needsBatchWork ? Self.defaultBatchSize : .max, streaming: false) { batch in
            if result.isEmpty { result = batch } else { result.append(contentsOf: batch) }
            return true
        }
        return result
    }

    /// Every model of `type`, in ID (creation) order.
    /// - Throws: as ``fetch(_:)-(FetchDescriptor<Model>)``.
    public func fetch<Model: PersistentModel>(_ type: Model.Type) throws -> [Model] {
        try fetch(FetchDescriptor<Model>())
    }

    /// The number of models ``fetch(_:)-(FetchDescriptor<Model>)`` would return, counted in SQL (`count(*)`)
    /// without reading any model, unless part of the predicate is evaluated in memory.
    /// - Throws: as `fetch`.
    /// - Complexity: one SQL query.
    public func fetchCount<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) throws -> Int {
        try fetchCount(descriptor, registeringReads: true)
    }

    /// ``fetchCount(_:)``; with `registeringReads` false, models read for an in-memory filter are not kept as bases
    /// of change tracking.
    func fetchCount<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>, registeringReads: Bool) throws -> Int {
        let engine = try queryEngine(Model.self, includePendingChanges: descriptor.includePendingChanges)
        engine.registersReads = registeringReads
        var plan = try engine.plan(descriptor)
        try checkAllowed(plan, allowsInMemoryEvaluation: descriptor.allowsInMemoryEvaluation)
        if !plan.filtersInMemory { return try engine.count(plan) }
        // Order does not change a count.
        plan.sortsInMemory = false
        plan.order = " ORDER BY t0.\"id\" ASC"
        plan.orderArgs = []
        var count = 0
        try engine.run(plan, descriptor, batchSize: Self.defaultBatchSize, streaming: false) { batch in
            count += batch.count
            return true
        }
        return count
    }

    /// The identifiers of the models ``fetch(_:)-(FetchDescriptor<Model>)`` would return, in the same order, read
    /// in SQL without decoding models (unless part of the predicate or sort is evaluated in memory).
    /// - Throws: as `fetch`.
    /// - Complexity: one SQL query; O(n) for n identifiers.
    public func fetchIdentifiers<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) throws -> [PersistentIdentifier] {
        let engine = try queryEngine(Model.self, includePendingChanges: descriptor.includePendingChanges)
        let plan = try engine.plan(descriptor)
        try checkAllowed(plan, allowsInMemoryEvaluation: descriptor.allowsInMemoryEvaluation)
        if plan.pagesInSQL {
            return try engine.identifiers(plan).map { PersistentIdentifier(entityName: Model.entityName, id: $0) }
        }
        var ids: [PersistentIdentifier] = []
        try engine.run(plan, descriptor, batchSize: Self.defaultBatchSize, streaming: false) { batch in
            ids += batch.map(\.persistentModelID)
            return true
        }
        return ids
    }

    /// Calls `block` with every model `descriptor` selects, in order, holding at most `batchSize` models in memory
    /// at a time: one SQL statement is stepped throughout, and each batch's to-many members and prefetched
    /// relationships are loaded with one query per relationship.
    ///
    /// `block` may register changes (`insert`, `update`, `delete`) and run other fetches; it should not call
    /// ``save()``, which would write to the tables being read. With a sort that has no SQL form, every selected
    /// model is read and sorted before the first call (memory is then not flat).
    ///
    /// - Parameters:
    ///   - descriptor: predicate, sort, paging and loading options.
    ///   - batchSize: models decoded per batch (default 5000).
    ///   - block: called once per model; an error it throws stops the enumeration and is rethrown.
    /// - Throws: ``FetchError/invalidArgument(_:)`` for a batch size below 1, errors of `fetch`, and errors of `block`.
    /// - Complexity: one SQL query plus one per relationship per batch; O(batchSize) memory.
    public func enumerate<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>, batchSize: Int = ModelContext.defaultBatchSize,
                                                  block: (Model) throws -> Void) throws {
        guard batchSize > 0 else { throw FetchError.invalidArgument("batchSize must be at least 1, not \(batchSize)") }
        let engine = try queryEngine(Model.self, includePendingChanges: descriptor.includePendingChanges)
        let plan = try engine.plan(descriptor)
        try checkAllowed(plan, allowsInMemoryEvaluation: descriptor.allowsInMemoryEvaluation)
        queryState.streamingDepth += 1
        defer { queryState.streamingDepth -= 1 }
        // Each batch is the base of field-level change tracking while the block sees it, then forgotten, so that
        // memory stays flat.
        engine.registersReads = false
        try engine.run(plan, descriptor, batchSize: batchSize, streaming: true) { batch in
            let token = reads.register(batch)
            defer { reads.remove(token) }
            for model in batch { try block(model) }
            return true
        }
    }

    /// Registers every model of `model` that `predicate` selects (all when `nil`, pending inserts included) for
    /// deletion at the next ``save()``, which applies each relationship's delete rule (cascade, nullify, deny) in
    /// the same transaction.
    ///
    /// The predicate is evaluated now, in SQL; changes registered afterwards do not change the selection.
    /// - Returns: the number of models registered for deletion.
    /// - Throws: as ``fetchIdentifiers(_:)-(FetchDescriptor<Model>)``.
    /// - Complexity: one SQL query; O(n) for n selected models.
    @discardableResult
    public func delete<Model: PersistentModel>(model: Model.Type, where predicate: Predicate<Model>? = nil) throws -> Int {
        let ids = try fetchIdentifiers(FetchDescriptor<Model>(predicate: predicate))
        for id in ids { delete(id) }
        return ids.count
    }

    /// How ``fetch(_:)-(FetchDescriptor<Model>)`` would run `descriptor`: its SQL and whether it filters or sorts
    /// in memory, with the reasons. Runs no query (only prepares pending-change overlays when there are any).
    /// - Throws: ``FetchError/unsupportedKeyPath(entity:keyPath:)`` and ``SQLiteError``.
    public func queryPlan<Model: PersistentModel>(for descriptor: FetchDescriptor<Model>) throws -> QueryPlan {
        let engine = try queryEngine(Model.self, includePendingChanges: descriptor.includePendingChanges)
        let plan = try engine.plan(descriptor)
        return engine.describe(plan, fields: engine.selectList(Model.self, fields: plan.fields))
    }
}
