import Foundation

/// The planned parts of a hierarchy fetch. Internal.
struct HierarchyPlan {
    var members: [any PersistentModel.Type]
    /// The UNION ALL over the member tables: columns `"e"` (member index), `"id"` and the sort keys.
    var union: String
    var unionArgs: [SQLiteValue]
    var order: String
    var filtersInMemory: Bool
    var sortsInMemory: Bool
    var reasons: [String]
    var residualTree: PrefetchTree
    var offset: Int
    var limit: Int?

    var pagesInSQL: Bool { !filtersInMemory && !sortsInMemory }

    var paging: (text: String, args: [SQLiteValue]) { pagingSQL(countOnly: false) }

    /// LIMIT/OFFSET when they can go into the SQL; a count needs no order, so only an in-memory filter prevents it.
    func pagingSQL(countOnly: Bool) -> (text: String, args: [SQLiteValue]) {
        guard countOnly ? !filtersInMemory : pagesInSQL, limit != nil || offset > 0 else { return ("", []) }
        return (" LIMIT ? OFFSET ?", [.integer(Int64(limit ?? -1)), .integer(Int64(offset))])
    }
}

/// Reading and deleting through entity hierarchies (see ``EntityHierarchy``).
extension ModelContext {
    /// The values `descriptor` selects from every member entity of its hierarchy, sorted and paged in one SQL query
    /// (a `UNION ALL` over the member tables), then read with one query per member entity.
    ///
    /// - Returns: the values as `Base` (each keeps its concrete model type), in sort order (ties by ID).
    /// - Throws: ``FetchError`` (an inconsistent hierarchy, a key path that is no inherited member, forbidden in-memory
    ///   evaluation), ``SQLiteError``, ``ReplicaError/valueConversion(_:)``.
    /// - Complexity: one query for the selection plus one per member entity (and per relationship).
    public func fetch<Base>(_ descriptor: HierarchyFetchDescriptor<Base>) throws -> [Base] {
        let (engine, plan) = try hierarchyPlan(descriptor)
        return try runHierarchy(engine, plan, descriptor)
    }

    /// The number of values ``fetch(_:)-(HierarchyFetchDescriptor<Base>)`` would return, counted in SQL unless part
    /// of the predicate is evaluated in memory.
    /// - Throws: as `fetch`.
    public func fetchCount<Base>(_ descriptor: HierarchyFetchDescriptor<Base>) throws -> Int {
        let (engine, plan) = try hierarchyPlan(descriptor)
        if plan.filtersInMemory { return try runHierarchy(engine, plan, descriptor).count }
        let paging = plan.pagingSQL(countOnly: true)
        let value = try engine.db.scalar("SELECT count(*) FROM (SELECT \"e\" FROM (\(plan.union))\(paging.text))", plan.unionArgs + paging.args)
        if case let .integer(count)? = value { return Int(count) }
        return 0
    }

    /// The identifiers of the values ``fetch(_:)-(HierarchyFetchDescriptor<Base>)`` would return, in order, each
    /// naming its concrete entity.
    /// - Throws: as `fetch`.
    public func fetchIdentifiers<Base>(_ descriptor: HierarchyFetchDescriptor<Base>) throws -> [PersistentIdentifier] {
        let (engine, plan) = try hierarchyPlan(descriptor)
        if plan.pagesInSQL {
            return try selection(engine, plan).map { PersistentIdentifier(entityName: plan.members[$0.member].entityName, id: $0.id) }
        }
        return try runHierarchy(engine, plan, descriptor).compactMap { ($0 as? any PersistentModel)?.persistentModelID }
    }

    /// Registers every record of the hierarchy that `predicate` selects (all when `nil`) for deletion at the next
    /// ``save()``, which applies the delete rules of each record's entity in the same transaction.
    /// - Parameters:
    ///   - hierarchy: the hierarchy.
    ///   - predicate: which records; evaluated now.
    ///   - includeSubentities: `false` deletes records of the base entity only.
    /// - Returns: the number of records registered for deletion.
    /// - Throws: as ``fetchIdentifiers(_:)-(HierarchyFetchDescriptor<Base>)``.
    @discardableResult
    public func delete<Base>(_ hierarchy: EntityHierarchy<Base>, where predicate: Predicate<Base>? = nil,
                             includeSubentities: Bool = true) throws -> Int {
        let ids = try fetchIdentifiers(HierarchyFetchDescriptor(hierarchy, predicate: predicate, includeSubentities: includeSubentities))
        for id in ids { delete(id) }
        return ids.count
    }

    /// How ``fetch(_:)-(HierarchyFetchDescriptor<Base>)`` would run `descriptor`.
    /// - Throws: as `fetch`, without running the query.
    public func queryPlan<Base>(for descriptor: HierarchyFetchDescriptor<Base>) throws -> QueryPlan {
        let (_, plan) = try hierarchyPlan(descriptor)
        let paging = plan.paging
        return QueryPlan(sql: "SELECT \"e\", \"id\" FROM (\(plan.union))\(plan.order)\(paging.text)",
                         filtersInMemory: plan.filtersInMemory, sortsInMemory: plan.sortsInMemory, reasons: plan.reasons)
    }

    // MARK: Internals

    private func hierarchyPlan<Base>(_ descriptor: HierarchyFetchDescriptor<Base>) throws -> (QueryEngine, HierarchyPlan) {
        let hierarchy = descriptor.hierarchy
        let members = hierarchy.members(includeSubentities: descriptor.includeSubentities)
        guard let storeIndex = container.storeIndexByEntity[hierarchy.base.entityName] else {
            throw FetchError.invalidHierarchy("\(hierarchy.base.entityName) is not in the container's schema")
        }
        for member in members {
            guard container.storeIndexByEntity[member.entityName] == storeIndex else {
                throw FetchError.invalidHierarchy("\(member.entityName) is not in the same store as \(hierarchy.base.entityName)")
            }
            let info = queryInfo(member)
            for name in hierarchy.inherited.values.sorted() where name != "id" && info.memberByName(name) == nil {
                throw FetchError.invalidHierarchy("\(member.entityName) has no member '\(name)'")
            }
        }
        let engine = try QueryEngine(context: self, storeIndex: storeIndex, includePendingChanges: descriptor.includePendingChanges)

        var branches: [String] = []
        var args: [SQLiteValue] = []
        var reasons: [String] = []
        var sortReasons: [String] = []
        var residualTree = PrefetchTree()
        var filtersInMemory = false
        var keyCount = 0
        var branchKeys: [[SQLExpr]] = []
        var branchWheres: [SQLExpr?] = []
        for member in members {
            let info = queryInfo(member)
            let translator = PredicateTranslator(sources: engine)
            let root = RecordRef(entity: info, access: .row(alias: "t0"), path: [], inherited: hierarchy.inherited)
            var conditions: [SQLExpr] = []
            var failed = false
            if let predicate = descriptor.predicate {
                let variable = predicate.variable.key
                let conjuncts = (predicate.expression as? any ConjunctionSplitting)?.conjuncts ?? [predicate.expression]
                try translator.with(variable, bound: .record(root)) {
                    for conjunct in conjuncts {
                        do {
                            let condition = try translator.condition(conjunct)
                            if condition.mayFail && failed { throw Untranslatable("a force unwrap after an untranslatable condition") }
                            conditions.append(condition)
                        } catch let error as Untranslatable {
                            failed = true
                            if !reasons.contains(error.reason) { reasons.append(error.reason) }
                        }
                    }
                }
                if failed {
                    filtersInMemory = true
                    let collector = PredicateTranslator(sources: engine)
                    collector.lenient = true
                    _ = try? collector.with(variable, bound: .record(root)) { try collector.translate(predicate.expression) }
                    residualTree.merge(collector.relationships)
                    if collector.lostRelationship {
                        throw FetchError.unsupportedPredicate(reasons: reasons + ["a relationship reached through an expression that has no SQL form"])
                    }
                }
            }
            var keys: [SQLExpr] = []
            for sort in descriptor.sortBy {
                guard sort.stringComparator == nil, let keyPath = sort.keyPath else {
                    sortReasons.append("a sort without an SQL form")
                    continue
                }
                do {
                    guard case let .sql(expression) = try translator.member(of: .record(root), keyPath: keyPath) else {
                        throw Untranslatable("not a stored value")
                    }
                    keys.append(expression)
                } catch is Untranslatable {
                    sortReasons.append("a sort by \(keyPath.readableDescription)")
                } catch is FetchError {
                    sortReasons.append("a sort by \(keyPath.readableDescription), which is not an inherited attribute")
                }
            }
            keyCount = keys.count
            branchKeys.append(keys)
            var combined: SQLExpr?
            for next in conditions {
                guard let current = combined else { combined = next; continue }
                let text = next.mayFail ? "(CASE WHEN \(current.text) THEN \(next.text) ELSE 0 END)" : "\(current.text) AND \(next.text)"
                combined = SQLExpr(text, current.args + next.args, nullable: false, mayFail: current.mayFail || next.mayFail)
            }
            branchWheres.append(combined)
        }
        let sortsInMemory = !sortReasons.isEmpty
        for (index, member) in members.enumerated() {
            var columns = ["\(index) AS \"e\"", "t0.\"id\" AS \"id\""]
            if !sortsInMemory {
                for (k, key) in branchKeys[index].enumerated() {
                    columns.append("\(key.text) AS \"k\(k)\"")
                    args += key.args
                }
            }
            var branch = "SELECT \(columns.joined(separator: ", ")) FROM \(try engine.table(member.entityName)) AS t0"
            if let condition = branchWheres[index] {
                branch += " WHERE " + condition.text
                args += condition.args
            }
            branches.append(branch)
        }
        var order: [String] = []
        if !sortsInMemory {
            for (k, sort) in descriptor.sortBy.enumerated() where k < keyCount {
                order.append("\"k\(k)\" \(sort.order == .forward ? "ASC" : "DESC")")
            }
        }
        order += ["\"id\" ASC", "\"e\" ASC"]
        if sortsInMemory {
            for member in members { residualTree.merge(QueryEngine.toOneTree(queryInfo(member), depth: 2)) }
        }
        let plan = HierarchyPlan(
            members: members, union: branches.joined(separator: " UNION ALL "), unionArgs: args,
            order: " ORDER BY " + order.joined(separator: ", "), filtersInMemory: filtersInMemory, sortsInMemory: sortsInMemory,
            reasons: reasons + sortReasons, residualTree: residualTree,
            offset: max(descriptor.fetchOffset ?? 0, 0), limit: descriptor.fetchLimit.map { max($0, 0) })
        if !descriptor.allowsInMemoryEvaluation {
            if plan.filtersInMemory { throw FetchError.unsupportedPredicate(reasons: reasons) }
            if plan.sortsInMemory { throw FetchError.unsupportedSortDescriptor(reasons: sortReasons) }
        }
        return (engine, plan)
    }

    /// The selected (member index, ID) pairs in order.
    private func selection(_ engine: QueryEngine, _ plan: HierarchyPlan) throws -> [(member: Int, id: UUID)] {
        let paging = plan.paging
        let statement = try engine.db.cachedStatement("SELECT \"e\", \"id\" FROM (\(plan.union))\(plan.order)\(paging.text)")
        defer { statement.reset() }
        try statement.bind(plan.unionArgs + paging.args)
        var result: [(member: Int, id: UUID)] = []
        do {
            while try statement.step() {
                if let id = statement.uuid(1) { result.append((Int(statement.int64(0)), id)) }
            }
        } catch let error as SQLiteError where error.message.contains(SQLFunctions.unwrapFailureMessage) {
            throw PredicateError.forceUnwrapFailure
        }
        return result
    }

    private func runHierarchy<Base>(_ engine: QueryEngine, _ plan: HierarchyPlan, _ descriptor: HierarchyFetchDescriptor<Base>) throws -> [Base] {
        let selected = try selection(engine, plan)
        var loaded: [[UUID: Base]] = []
        engine.strictResolution = !plan.residualTree.isEmpty
        defer { engine.strictResolution = false }
        for (index, member) in plan.members.enumerated() {
            let ids = selected.filter { $0.member == index }.map(\.id)
            loaded.append(try loadValues(member, as: Base.self, ids: ids, engine: engine, prefetch: plan.residualTree))
        }
        var values: [Base] = selected.compactMap { loaded[$0.member][$0.id] }
        if plan.filtersInMemory, let predicate = descriptor.predicate {
            values = try values.filter { try predicate.evaluate($0) }
        }
        if plan.sortsInMemory {
            values = values.enumerated().sorted { a, b in
                switch descriptor.sortBy.compare(a.element, b.element) {
                case .orderedAscending: return true
                case .orderedDescending: return false
                case .orderedSame: return a.offset < b.offset
                }
            }.map(\.element)
        }
        if !plan.pagesInSQL {
            let start = min(plan.offset, values.count)
            let end = plan.limit.map { min(values.count, start + $0) } ?? values.count
            values = Array(values[start..<end])
        }
        return values
    }

    private func loadValues<Base>(_ type: any PersistentModel.Type, as: Base.Type, ids: [UUID], engine: QueryEngine,
                                  prefetch: PrefetchTree) throws -> [UUID: Base] {
        func open<T: PersistentModel>(_: T.Type) throws -> [UUID: Base] {
            var result: [UUID: Base] = [:]
            for (id, model) in try engine.loadModels(T.self, ids: ids, prefetch: prefetch) {
                guard let value = model as? Base else {
                    throw FetchError.invalidHierarchy("\(T.self) does not conform to \(Base.self)")
                }
                result[id] = value
            }
            return result
        }
        return try open(type)
    }
}
