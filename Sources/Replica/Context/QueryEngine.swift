import CSQLite
import Foundation

/// Per-context query bookkeeping, kept by ``ModelContext``. Internal.
final class QueryState {
    /// Enumerations streaming right now. Queries started inside one use their own overlay tables.
    var streamingDepth = 0
}

/// How a fetch runs: the SQL of its main query and what, if anything, happens in memory after it
/// (SwiftData's "prefer in-memory filter / sort").
public struct QueryPlan: Sendable, Hashable, CustomStringConvertible {
    /// The main query's SQL text; values are bound as `?` parameters.
    public let sql: String
    /// `true` when the predicate is evaluated in memory over the rows the SQL selects, because part of it has no
    /// SQL form (then `fetchLimit` and `fetchOffset` are applied in memory too).
    public let filtersInMemory: Bool
    /// `true` when the results are sorted in memory (a sort descriptor has no SQL form).
    public let sortsInMemory: Bool
    /// The parts of the predicate and sort descriptors that have no SQL form, in order.
    public let reasons: [String]

    public var description: String {
        var text = sql
        if filtersInMemory { text += "\n-- then filtered in memory" }
        if sortsInMemory { text += "\n-- then sorted in memory" }
        if !reasons.isEmpty { text += " (" + reasons.joined(separator: "; ") + ")" }
        return text
    }
}

/// The planned parts of one fetch. Internal.
struct FetchPlan {
    /// `FROM <source> AS t0 [WHERE ...]`.
    var fromWhere: String
    var whereArgs: [SQLiteValue]
    /// `ORDER BY ..., t0."id"`.
    var order: String
    var orderArgs: [SQLiteValue]
    var filtersInMemory: Bool
    var sortsInMemory: Bool
    var reasons: [String]
    var sortReasons: [String]
    /// Relationships to resolve before evaluating in memory (missing targets are then an error).
    var residualTree: PrefetchTree
    /// Relationships the descriptor asks to prefetch.
    var prefetchTree: PrefetchTree
    /// Fetched field indices, in field order.
    var fields: [Int]
    /// To-many relationships to load.
    var toManyNames: Set<String>?
    var offset: Int
    var limit: Int?

    /// Whether LIMIT/OFFSET go into the SQL (nothing happens in memory that could change which rows qualify).
    var pagesInSQL: Bool { !filtersInMemory && !sortsInMemory }

    var paging: (text: String, args: [SQLiteValue]) { pagingSQL(countOnly: false) }

    /// LIMIT/OFFSET when they can go into the SQL; a count needs no order, so only an in-memory filter prevents it.
    func pagingSQL(countOnly: Bool) -> (text: String, args: [SQLiteValue]) {
        guard countOnly ? !filtersInMemory : pagesInSQL, limit != nil || offset > 0 else { return ("", []) }
        return (" LIMIT ? OFFSET ?", [.integer(Int64(limit ?? -1)), .integer(Int64(offset))])
    }

    /// Whether a batch of decoded models needs work after decoding.
    var needsBatchWork: Bool {
        filtersInMemory || !residualTree.isEmpty || !prefetchTree.isEmpty || toManyNames.map { !$0.isEmpty } ?? true
    }
}

/// Runs the queries of one context against one store: translates, reads rows straight into models, loads to-many
/// members and prefetched relationships (one query per relationship per batch), and overlays unsaved changes.
/// One per operation. Internal.
final class QueryEngine: QuerySources, ModelLoading {
    unowned let context: ModelContext
    let store: Store
    let db: Connection
    let includePendingChanges: Bool
    /// Overlay tables are named with this depth so that nested queries do not overwrite them.
    let depth: Int
    /// When set, a relationship target that does not exist is an error (in-memory evaluation needs it).
    var strictResolution = false
    /// Whether the models handed out are registered with the context as the base of field-level change tracking
    /// (``ModelContext/update(_:)`` then writes only the fields the app changed). Streaming enumerations register
    /// batch by batch instead.
    var registersReads = true
    private var tableSources: [String: String] = [:]
    private var linkSources: [String: String] = [:]
    /// When set, the entities whose records the queries read (see `ModelContext.entitiesRead(by:)`).
    var readEntities: Set<String>?

    init(context: ModelContext, storeIndex: Int, includePendingChanges: Bool) throws {
        self.context = context
        self.store = context.container.stores[storeIndex]
        self.db = try context.connection(for: storeIndex)
        self.includePendingChanges = includePendingChanges
        self.depth = context.queryState.streamingDepth
        if !db.hasSQLFunctions {
            try SQLFunctions.register(on: db)
            db.hasSQLFunctions = true
        }
        if let assets = store.readAssets, db.assetReader == nil { try AssetReader.register(on: db, assets: assets) }
    }

    /// The external-storage fields of `entityName` whose values this store's rows may reference in files (see
    /// ``AssetStore`` and `Store.readAssets`).
    func externalFields(_ entityName: String) -> [Int] {
        guard store.readAssets != nil, let index = store.entityIndex[entityName] else { return [] }
        return store.readExternalFields[index]
    }

    /// The statement that reads one record of `storage`'s entity by ID, every field: the entity's prebuilt lookup, or,
    /// when the store keeps some of its fields in files, the same read through `replica_asset`.
    func oneIDLookup<T: PersistentModel>(_ storage: ModelEntity<T>.Storage) throws -> Statement {
        if externalFields(storage.schemaEntity.name).isEmpty { return try db.cachedStatement(storage.oneIDLookup) }
        return try db.cachedStatement("SELECT \(selectList(T.self, fields: storage.allFields)) FROM \(storage.table) AS t0 WHERE t0.\"id\" = ?")
    }

    func schemaEntity(_ name: String) -> Schema.Entity? {
        store.entityIndex[name].map { store.entities[$0] }
    }

    // MARK: Sources (with pending changes overlaid)

    func table(_ entity: String) throws -> String {
        readEntities?.insert(entity)
        if let source = tableSources[entity] { return source }
        var source = quoted(entity)
        if includePendingChanges, context.hasPendingChanges(ofEntity: entity), let schema = schemaEntity(entity) {
            source = try overlay(schema, context.pendingChanges(entities: [entity]))
        }
        tableSources[entity] = source
        return source
    }

    /// Fills a temporary table with the entity's pending rows and returns a source that replaces the stored rows
    /// by them: stored rows without a pending change, plus pending inserts and updates (deletes drop out).
    private func overlay(_ entity: Schema.Entity, _ changes: [(PersistentIdentifier, ModelContext.PendingChange)]) throws -> String {
        let temp = quoted("replica_pending_\(entity.name)_\(depth)")
        let columns = ([quoted("id")] + entity.fieldNames.map(quoted)).joined(separator: ", ")
        let definitions = entity.attributes.map { "\(quoted($0.name)) \($0.type.sqliteDeclaredType)" }
            + entity.toOneRelationships.map { "\(quoted($0.name)) BLOB" }
        try db.execute("CREATE TEMP TABLE IF NOT EXISTS \(temp) (\"replica_live\" INTEGER NOT NULL, \"id\" BLOB PRIMARY KEY NOT NULL"
                       + definitions.map { ", " + $0 }.joined() + ")")
        try db.run("DELETE FROM temp.\(temp)")
        let placeholders = Array(repeating: "?", count: entity.fieldNames.count + 2).joined(separator: ", ")
        let insert = try db.cachedStatement("INSERT OR REPLACE INTO temp.\(temp) (\"replica_live\", \(columns)) VALUES (\(placeholders))")
        for (id, change) in changes {
            defer { insert.reset() }
            let snapshot = change.snapshot
            try insert.bind(.integer(snapshot == nil ? 0 : 1), at: 0)
            try insert.bind(id.id.sqliteValue, at: 1)
            for index in entity.fieldNames.indices {
                let value = snapshot.map { index < $0.values.count ? $0.values[index] : .null } ?? .null
                try insert.bind(value, at: Int32(index + 2))
            }
            while try insert.step() {}
        }
        return "(SELECT \(columns) FROM main.\(quoted(entity.name)) WHERE \"id\" NOT IN (SELECT \"id\" FROM temp.\(temp)) "
            + "UNION ALL SELECT \(columns) FROM temp.\(temp) WHERE \"replica_live\" = 1)"
    }

    func links(_ table: LinkTable) throws -> String {
        readEntities?.formUnion([table.ownerEntity, table.memberEntity])
        if let source = linkSources[table.name] { return source }
        var source = table.quotedName
        if includePendingChanges {
            let changes = context.pendingChanges(entities: [table.ownerEntity, table.memberEntity])
            if !changes.isEmpty { source = try linkOverlay(table, changes) }
        }
        linkSources[table.name] = source
        return source
    }

    /// The links as they will be after saving the pending changes, replayed in registration order (a later change
    /// of either side wins, as in a save).
    private func linkOverlay(_ table: LinkTable, _ changes: [(PersistentIdentifier, ModelContext.PendingChange)]) throws -> String {
        guard let ownerSchema = schemaEntity(table.ownerEntity), let memberSchema = schemaEntity(table.memberEntity) else {
            return table.quotedName
        }
        let ownerSlot = ownerSchema.relationships.filter(\.isToMany).firstIndex { $0.name == table.ownerRelationship }
        let selfInverse = table.ownerEntity == table.memberEntity && table.ownerRelationship == table.memberRelationship
        let memberSlot = selfInverse ? nil : memberSchema.relationships.filter(\.isToMany).firstIndex { $0.name == table.memberRelationship }
        var owners: [UUID] = []
        var members: [UUID] = []
        for (id, _) in changes {
            if id.entityName == table.ownerEntity, !owners.contains(id.id) { owners.append(id.id) }
            if id.entityName == table.memberEntity, !selfInverse, !members.contains(id.id) { members.append(id.id) }
        }
        // Stored links touching an affected record, then the pending changes on top, in order.
        var links: [(UUID, UUID)] = []
        let stored = try db.rows("""
            SELECT "owner", "member" FROM \(table.quotedName) WHERE "owner" IN (SELECT replica_unhex(value) FROM json_each(?)) \
            OR "member" IN (SELECT replica_unhex(value) FROM json_each(?)) ORDER BY "owner", "member"
            """, [Self.idList(owners), Self.idList(members)])
        for row in stored {
            if let owner = try? UUID(sqliteValue: row[0]), let member = try? UUID(sqliteValue: row[1]) { links.append((owner, member)) }
        }
        for (id, change) in changes {
            if id.entityName == table.ownerEntity {
                if let snapshot = change.snapshot {
                    if let slot = ownerSlot, slot < snapshot.toManyMembers.count {
                        links.removeAll { $0.0 == id.id }
                        for member in snapshot.toManyMembers[slot] where !links.contains(where: { $0 == (id.id, member) }) {
                            links.append((id.id, member))
                        }
                    }
                } else {
                    links.removeAll { $0.0 == id.id }
                }
            }
            if id.entityName == table.memberEntity, !selfInverse {
                if let snapshot = change.snapshot {
                    if let slot = memberSlot, slot < snapshot.toManyMembers.count {
                        links.removeAll { $0.1 == id.id }
                        for owner in snapshot.toManyMembers[slot] where !links.contains(where: { $0 == (owner, id.id) }) {
                            links.append((owner, id.id))
                        }
                    }
                } else {
                    links.removeAll { $0.1 == id.id }
                }
            }
        }
        let temp = quoted("replica_pending_\(table.name)_\(depth)")
        try db.execute("CREATE TEMP TABLE IF NOT EXISTS \(temp) (\"kind\" INTEGER NOT NULL, \"a\" BLOB NOT NULL, \"b\" BLOB)")
        try db.run("DELETE FROM temp.\(temp)")
        for owner in owners { try db.run("INSERT INTO temp.\(temp) VALUES (0, ?, NULL)", [owner.sqliteValue]) }
        for member in members { try db.run("INSERT INTO temp.\(temp) VALUES (1, ?, NULL)", [member.sqliteValue]) }
        for (owner, member) in links { try db.run("INSERT INTO temp.\(temp) VALUES (2, ?, ?)", [owner.sqliteValue, member.sqliteValue]) }
        return "(SELECT \"owner\", \"member\" FROM main.\(table.quotedName) WHERE \"owner\" NOT IN (SELECT \"a\" FROM temp.\(temp) WHERE \"kind\" = 0) "
            + "AND \"member\" NOT IN (SELECT \"a\" FROM temp.\(temp) WHERE \"kind\" = 1) "
            + "UNION ALL SELECT \"a\" AS \"owner\", \"b\" AS \"member\" FROM temp.\(temp) WHERE \"kind\" = 2)"
    }

    /// A list of IDs as one parameter: a JSON array of hex strings, read with
    /// `IN (SELECT replica_unhex(value) FROM json_each(?))`.
    static func idList(_ ids: [UUID]) -> SQLiteValue {
        let digits: [UInt8] = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = [UInt8(ascii: "[")]
        bytes.reserveCapacity(ids.count * 35 + 2)
        for (index, id) in ids.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            bytes.append(UInt8(ascii: "\""))
            withUnsafeBytes(of: id.uuid) { raw in
                for byte in raw {
                    bytes.append(digits[Int(byte >> 4)])
                    bytes.append(digits[Int(byte & 0x0F)])
                }
            }
            bytes.append(UInt8(ascii: "\""))
        }
        bytes.append(UInt8(ascii: "]"))
        return .text(String(decoding: bytes, as: UTF8.self))
    }

    // MARK: Planning

    /// Plans a fetch of `descriptor`: translates what it can to SQL and notes what happens in memory.
    /// - Throws: ``FetchError/unsupportedKeyPath(entity:keyPath:)`` for key paths that name no attribute or relationship.
    func plan<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) throws -> FetchPlan {
        let entity = Model.entity
        let translator = PredicateTranslator(sources: self)
        let root = RecordRef(entity: entity.query, access: .row(alias: "t0"), path: [])
        var conditions: [SQLExpr] = []
        var reasons: [String] = []
        var residualTree = PrefetchTree()
        if let predicate = descriptor.predicate {
            let variable = predicate.variable.key
            let expression = predicate.expression
            let conjuncts = (expression as? any ConjunctionSplitting)?.conjuncts ?? [expression]
            try translator.with(variable, bound: .record(root)) {
                for conjunct in conjuncts {
                    do {
                        let condition = try translator.condition(conjunct)
                        // After an untranslatable conjunct, Swift may never reach a failing one: keep it in memory.
                        if condition.mayFail && !reasons.isEmpty { throw Untranslatable("a force unwrap after an untranslatable condition") }
                        conditions.append(condition)
                    } catch let error as Untranslatable {
                        reasons.append(error.reason)
                    }
                }
            }
            if !reasons.isEmpty {
                // Collect every relationship the predicate reaches, to resolve them for the in-memory evaluation.
                let collector = PredicateTranslator(sources: self)
                collector.lenient = true
                _ = try? collector.with(variable, bound: .record(root)) { try collector.translate(expression) }
                residualTree.merge(collector.relationships)
                if collector.lostRelationship {
                    // Evaluating it would read a reference nobody resolved: refuse rather than trap.
                    throw FetchError.unsupportedPredicate(reasons: reasons + ["a relationship reached through an expression that has no SQL form"])
                }
            }
        }
        var whereText = ""
        var whereArgs: [SQLiteValue] = []
        if let first = conditions.first {
            var combined = first
            for next in conditions.dropFirst() {
                let text = next.mayFail ? "(CASE WHEN \(combined.text) THEN \(next.text) ELSE 0 END)" : "\(combined.text) AND \(next.text)"
                combined = SQLExpr(text, combined.args + next.args, nullable: false, mayFail: combined.mayFail || next.mayFail)
            }
            whereText = " WHERE " + combined.text
            whereArgs = combined.args
        }

        // Sort: SQL for attributes (and members of composites); anything else sorts in memory.
        var orderParts: [String] = []
        var orderArgs: [SQLiteValue] = []
        var sortReasons: [String] = []
        for sort in descriptor.sortBy {
            let direction = sort.order == .forward ? "ASC" : "DESC"
            guard sort.stringComparator == nil else {
                sortReasons.append("a sort with a string comparator")
                continue
            }
            guard let keyPath = sort.keyPath else {
                sortReasons.append("a sort descriptor without a key path")
                continue
            }
            do {
                guard case let .sql(expression) = try translator.member(of: .record(root), keyPath: keyPath) else {
                    throw Untranslatable("a sort by \(keyPath.readableDescription), which is not a stored value")
                }
                orderParts.append("\(expression.text) \(direction)")
                orderArgs += expression.args
            } catch is Untranslatable {
                sortReasons.append("a sort by \(keyPath.readableDescription)")
            } catch is FetchError {
                // Key paths through relationships (\.trip?.name) cannot be split; they sort in memory.
                sortReasons.append("a sort by \(keyPath.readableDescription), which is not an attribute")
            }
        }
        let sortsInMemory = !sortReasons.isEmpty
        if sortsInMemory {
            orderParts = []
            orderArgs = []
            // Sorting in memory by a key path Replica cannot see into: resolve the to-one relationships it may use.
            residualTree.merge(Self.toOneTree(entity.query, depth: 2))
        }
        orderParts.append("t0.\"id\" ASC")

        // Fields: all, or the requested ones plus those that cannot be left out (no default to fill them with).
        var fields = Array(entity.schemaEntity.fieldNames.indices)
        var toManyNames: Set<String>? = Set(entity.schemaEntity.relationships.filter(\.isToMany).map(\.name))
        if !descriptor.propertiesToFetch.isEmpty {
            var wanted = Set<String>()
            for keyPath in descriptor.propertiesToFetch {
                switch entity.query.member(keyPath) {
                case let .attribute(attribute, _)?: wanted.insert(attribute.name)
                case let .toOne(relationship, _)?, let .toMany(relationship, _)?: wanted.insert(relationship.name)
                case .id?, .persistentModelID?: break
                default: throw FetchError.unsupportedKeyPath(entity: Model.entityName, keyPath: "\(keyPath.readableDescription)")
                }
            }
            let schema = entity.schemaEntity
            fields = schema.fieldNames.indices.filter { index in
                let name = schema.fieldNames[index]
                if wanted.contains(name) { return true }
                if index < schema.attributes.count {
                    let attribute = schema.attributes[index]
                    return !attribute.isOptional && attribute.defaultValue == nil
                }
                return !schema.toOneRelationships[index - schema.attributes.count].isOptional
            }
            // Many-to-many members are always read: they are saved from the model, so a partial model that left
            // them empty would unlink everything when updated.
            toManyNames = Set(schema.relationships.filter { relationship in
                guard relationship.isToMany else { return false }
                if wanted.contains(relationship.name) { return true }
                guard let destination = schemaEntity(relationship.destination) else { return false }
                return LinkTable.of(relationship, in: schema.name, destination: destination) != nil
            }.map(\.name))
        }
        var prefetchTree = PrefetchTree()
        for keyPath in descriptor.relationshipKeyPathsForPrefetching {
            switch entity.query.member(keyPath) {
            case let .toOne(relationship, _)?, let .toMany(relationship, _)?: prefetchTree.insert([relationship.name])
            default: throw FetchError.unsupportedKeyPath(entity: Model.entityName, keyPath: "\(keyPath.readableDescription)")
            }
        }
        if toManyNames != nil {
            for (name, _) in residualTree.children + prefetchTree.children { toManyNames?.insert(name) }
        }
        return FetchPlan(
            fromWhere: "FROM \(try table(Model.entityName)) AS t0" + whereText, whereArgs: whereArgs,
            order: " ORDER BY " + orderParts.joined(separator: ", "), orderArgs: orderArgs,
            filtersInMemory: !reasons.isEmpty, sortsInMemory: sortsInMemory, reasons: reasons, sortReasons: sortReasons,
            residualTree: residualTree, prefetchTree: prefetchTree, fields: fields, toManyNames: toManyNames,
            offset: max(descriptor.fetchOffset ?? 0, 0), limit: descriptor.fetchLimit.map { max($0, 0) })
    }

    /// The to-one relationships of `entity`, and theirs, to `depth` levels: what an in-memory sort by a key path
    /// through to-one relationships (`\.trip?.lodging?.city`) may read.
    static func toOneTree(_ entity: EntityQueryInfo, depth: Int) -> PrefetchTree {
        var tree = PrefetchTree()
        guard depth > 0 else { return tree }
        for relationship in entity.schemaEntity.toOneRelationships {
            guard case let .toOne(_, target)? = entity.memberByName(relationship.name) else { continue }
            tree.graft(relationship.name, toOneTree(queryInfo(target), depth: depth - 1))
        }
        return tree
    }

    /// The main query's SELECT list and row layout for `Model` with `fields`.
    func selectList<Model: PersistentModel>(_ type: Model.Type, fields: [Int], alias: String = "t0") -> String {
        let names = Model.entity.storage.fieldNames
        let external = externalFields(Model.entityName)
        if external.isEmpty { return Self.selectList(names: names, fields: fields, alias: alias) }
        // Fields kept in files are read through `replica_asset` (their bytes, checked against the reference), or, for
        // an `ExternalData` property, through `replica_asset_file` (a handle to the file, not opened).
        let handles = Model.entity.storage.handleFields
        func literal(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }
        return ([alias + ".\"id\""] + fields.map { field in
            let column = alias + "." + quoted(names[field])
            guard external.contains(field) else { return column }
            let function = handles.contains(field) ? "replica_asset_file" : "replica_asset"
            return "\(function)(\(column), \(alias).\"id\", \(literal(names[field])), \(literal(Model.entityName)))"
        }).joined(separator: ", ")
    }

    static func selectList(names: [String], fields: [Int], alias: String) -> String {
        // `alias."id", alias."a", ...`, appended to one string (no array of interpolated parts to join).
        var text = ""
        text.reserveCapacity((alias.utf8.count + 4) * (fields.count + 1) + fields.reduce(0) { $0 + names[$1].utf8.count + 2 })
        text += alias
        text += ".\"id\""
        for field in fields {
            text += ", "
            text += alias
            text += "."
            let name = names[field]
            if name.utf8.contains(UInt8(ascii: "\"")) {
                text += quoted(name)
            } else {
                text += "\""
                text += name
                text += "\""
            }
        }
        return text
    }

    /// `entity`: `Model.entity`, when the caller has it (reading it again can cost more than the rest).
    func layout<Model: PersistentModel>(_ type: Model.Type, fields: [Int], statement: Statement, entity: ModelEntity<Model>? = nil) -> RowLayout {
        // The entity and its field count are read once (the schema's `fieldNames` builds a new array per call).
        let entity = entity ?? Model.entity
        let schema = entity.schemaEntity
        let count = entity.storage.fieldNames.count
        var columns = [Int32](repeating: -1, count: count)
        for (position, field) in fields.enumerated() { columns[field] = Int32(position + 1) }
        // Attributes come first in field order: their declared defaults, then NULL for the to-one relationships.
        var defaults: [SQLiteValue] = []
        defaults.reserveCapacity(count)
        for attribute in schema.attributes where defaults.count < count { defaults.append(attribute.defaultValue ?? .null) }
        while defaults.count < count { defaults.append(.null) }
        return RowLayout(entity: schema, fieldIndexByName: entity.fieldIndexByName, statement: statement,
                         columns: columns, defaults: defaults)
    }

    // MARK: Reading

    /// Steps `statement` (bound, positioned before its first row) and decodes one `Model` per row straight from the
    /// statement, handing them to `handle` in batches of at most `batchSize`. Stops when `handle` returns `false`.
    /// `expectedRows`: room to reserve in the first batch when the caller knows how many rows there are at most.
    func stream<Model: PersistentModel>(_ statement: Statement, fields: [Int], batchSize: Int, expectedRows: Int? = nil,
                                        entity: ModelEntity<Model>? = nil, _ handle: (inout [Model]) throws -> Bool) throws {
        let layout = layout(Model.self, fields: fields, statement: statement, entity: entity)
        var batch: [Model] = []
        batch.reserveCapacity(min(batchSize, expectedRows ?? 4096))
        do {
            let statementHandle = statement.handle
            while try statement.step() {
                layout.generation &+= 1
                guard let idValue = sqlite3_column_value(statementHandle, 0), let id = UUID(statementValue: idValue) else {
                    throw ReplicaError.valueConversion(ValueConversionError(expected: "UUID", found: statement.value(0),
                                                                            attribute: "\(Model.entityName).id"))
                }
                let model = try Model(row: ModelRow(id: id, streaming: layout))
                batch.append(consume model)
                if batch.count >= batchSize {
                    guard try handle(&batch) else { return }
                    batch.removeAll(keepingCapacity: true)
                }
            }
        } catch let error as ValueConversionError {
            throw ReplicaError.valueConversion(error)
        } catch let error as SQLiteError where error.message.contains(SQLFunctions.unwrapFailureMessage) {
            throw PredicateError.forceUnwrapFailure
        } catch let error as SQLiteError where error.message.contains(AssetReader.failureMessage) {
            guard let failure = (db.assetReader as? AssetReader)?.lastError else { throw error }
            throw ReplicaError.externalStorage(failure)
        }
        if !batch.isEmpty { _ = try handle(&batch) }
    }

    /// Runs `sql` and decodes every row into a `Model` (all fields).
    func decodeAll<Model: PersistentModel>(_ type: Model.Type, sql: String, _ args: [SQLiteValue]) throws -> [Model] {
        try decodeAll(Model.self, statement: try db.cachedStatement(sql), fields: Model.entity.storage.allFields, args)
    }

    /// ``decodeAll(_:sql:_:)`` with the (cached) statement, which selects `fields` after the ID.
    func decodeAll<Model: PersistentModel>(_ type: Model.Type, statement: Statement, fields: [Int], _ args: [SQLiteValue]) throws -> [Model] {
        defer { statement.reset() }
        try statement.bind(args)
        var result: [Model] = []
        try stream(statement, fields: fields, batchSize: .max) { batch in
            result = batch
            return true
        }
        return result
    }

    /// Loads to-many members and resolves relationships of a batch of decoded models.
    func complete<Model: PersistentModel>(_ models: inout [Model], toMany names: Set<String>?, prefetch: PrefetchTree) throws {
        guard !models.isEmpty else { return }
        try loadToMany(&models, only: names)
        attachLoader(&models)
        for (name, subtree) in prefetch.children {
            guard let resolve = Model.entity.prefetchByName[name] else { continue }
            let dangling = try resolve(&models, self, subtree)
            if strictResolution, let first = dangling.first {
                throw FetchError.unresolvableReference(PersistentIdentifier(entityName: Model.entityName, id: first), relationship: name)
            }
        }
    }

    /// Assigns the members of the to-many relationships of `models`: one query per relationship.
    func loadToMany<Model: PersistentModel>(_ models: inout [Model], only names: Set<String>?) throws {
        let entity = Model.entity
        // The stored flag: reading the members array in unspecialized generic code looks up its type metadata.
        guard entity.storage.hasToManyMembers else { return }
        let owners = Self.idList(models.map(\.id))
        for (relationship, assign, _) in entity.toManyMembers {
            if let names, !names.contains(relationship.name) { continue }
            guard let destination = schemaEntity(relationship.destination) else { continue }
            let sql: String
            if let link = LinkTable.of(relationship, in: Model.entityName, destination: destination) {
                let (this, other) = link.columns(entity: Model.entityName, relationship: relationship.name)
                sql = "SELECT l.\(quoted(this)), l.\(quoted(other)) FROM \(try links(link)) AS l "
                    + "WHERE l.\(quoted(this)) IN (SELECT replica_unhex(value) FROM json_each(?)) ORDER BY 1, 2"
            } else {
                guard let inverse = relationship.inverse else { continue }
                sql = "SELECT t.\(quoted(inverse)), t.\"id\" FROM \(try table(destination.name)) AS t "
                    + "WHERE t.\(quoted(inverse)) IN (SELECT replica_unhex(value) FROM json_each(?)) ORDER BY 1, 2"
            }
            var members: [UUID: [UUID]] = [:]
            let statement = try db.cachedStatement(sql)
            defer { statement.reset() }
            try statement.bind([owners])
            while try statement.step() {
                guard let owner = statement.uuid(0), let member = statement.uuid(1) else { continue }
                members[owner, default: []].append(member)
            }
            let loader = context.handoutLoader
            for index in models.indices { assign(&models[index], members[models[index].id] ?? [], loader) }
        }
    }

    /// The model `id` (or `nil`), as ``loadModels(_:ids:prefetch:)`` with one ID and nothing to prefetch returns it:
    /// when the entity has no pending changes to overlay, one run of the entity's prebuilt lookup statement with the
    /// ID bound from the statement's own buffer, and no dictionary of results.
    func loadModel<T: PersistentModel>(_ type: T.Type, id: UUID) throws -> T? {
        if includePendingChanges && context.hasPendingChanges(ofEntity: T.entityName) {
            return try loadModels(T.self, ids: [id], prefetch: PrefetchTree())[id]
        }
        let entity = T.entity
        let storage = entity.storage
        let statement = try oneIDLookup(storage)
        var models: [T] = []
        do {
            defer { statement.reset() }
            try statement.withBound(id: id, []) {
                try stream(statement, fields: storage.allFields, batchSize: .max, expectedRows: 1, entity: entity) { batch in
                    models = batch
                    return true
                }
            }
        }
        try complete(&models, toMany: nil, prefetch: PrefetchTree())
        register(models)
        // At most one row (the ID is the primary key).
        guard let model = models.first, model.id == id else { return nil }
        return model
    }

    func loadModels<T: PersistentModel>(_ type: T.Type, ids: [UUID], prefetch: PrefetchTree) throws -> [UUID: T] {
        guard !ids.isEmpty else { return [:] }
        let source = try table(T.entityName)
        let storage = T.entity.storage
        var models: [T]
        if ids.count == 1 && source == storage.table {
            // One ID on the stored table (e.g. a prefetched reference, no pending changes of the entity): the
            // entity's prebuilt lookup statement (`model(_:id:)` runs it through `loadModel(_:id:)`).
            models = try decodeAll(T.self, statement: try oneIDLookup(storage), fields: storage.allFields, [ids[0].sqliteValue])
        } else {
            let select = "SELECT \(selectList(T.self, fields: storage.allFields)) FROM \(source) AS t0 "
            // One ID is a plain key lookup: no JSON list to build and walk.
            models = ids.count == 1
                ? try decodeAll(T.self, sql: select + "WHERE t0.\"id\" = ?", [ids[0].sqliteValue])
                : try decodeAll(T.self, sql: select + "WHERE t0.\"id\" IN (SELECT replica_unhex(value) FROM json_each(?))", [Self.idList(ids)])
        }
        try complete(&models, toMany: nil, prefetch: prefetch)
        var result: [UUID: T] = [:]
        for model in models { result[model.id] = model }
        register(models)
        return result
    }

    /// Lets the unresolved to-one references of `models` load their targets on demand through the context's
    /// loader (see ``Reference/loadTarget()``); to-many members get it when ``loadToMany(_:only:)`` assigns them.
    /// O(models) for an entity with to-one relationships, else O(1).
    func attachLoader<Model: PersistentModel>(_ models: inout [Model]) {
        let entity = Model.entity
        guard !entity.storage.loaderAttachers.isEmpty, !models.isEmpty else { return }
        entity.attach(context.handoutLoader, to: &models)
    }

    /// Registers the models a fetch hands out with the context (see ``registersReads``). O(1).
    func register<Model: PersistentModel>(_ models: [Model]) {
        guard registersReads else { return }
        context.reads.register(models)
    }

    // MARK: Running a plan

    /// Runs a planned fetch and hands the qualifying models to `emit` in result order and in batches; with an
    /// in-memory sort, everything is collected and sorted first. Stops when `emit` returns `false`.
    func run<Model: PersistentModel>(_ plan: FetchPlan, _ descriptor: FetchDescriptor<Model>, batchSize: Int, streaming: Bool,
                                     emit: ([Model]) throws -> Bool) throws {
        let paging = plan.paging
        let sql = "SELECT \(selectList(Model.self, fields: plan.fields)) \(plan.fromWhere)\(plan.order)\(paging.text)"
        // Streaming queries run user code between batches, which may query again: use a statement of their own.
        let statement = streaming ? try Statement(connection: db, sql: sql) : try db.cachedStatement(sql)
        defer { statement.reset() }
        try statement.bind(plan.whereArgs + plan.orderArgs + paging.args)

        var skip = plan.pagesInSQL ? 0 : plan.offset
        var remaining = plan.pagesInSQL ? Int.max : (plan.limit ?? .max)
        var collected: [Model] = []
        let needsWork = plan.needsBatchWork
        let resolveTree: PrefetchTree = {
            var tree = plan.prefetchTree
            tree.merge(plan.residualTree)
            return tree
        }()
        if remaining == 0 && !plan.sortsInMemory { return }

        try stream(statement, fields: plan.fields, batchSize: batchSize) { (batch: inout [Model]) in
            if needsWork {
                strictResolution = !plan.residualTree.isEmpty && (plan.filtersInMemory || plan.sortsInMemory)
                defer { strictResolution = false }
                try complete(&batch, toMany: plan.toManyNames, prefetch: resolveTree)
                if plan.filtersInMemory, let predicate = descriptor.predicate {
                    batch = try batch.filter { try predicate.evaluate($0) }
                }
            } else {
                attachLoader(&batch)
            }
            if plan.sortsInMemory {
                collected.append(contentsOf: batch)
                return true
            }
            if skip > 0 {
                let dropped = min(skip, batch.count)
                batch.removeFirst(dropped)
                skip -= dropped
            }
            if remaining < batch.count { batch.removeLast(batch.count - remaining) }
            remaining -= batch.count
            register(batch)
            if !batch.isEmpty, try !emit(batch) { return false }
            return remaining > 0
        }
        if plan.sortsInMemory {
            let sorted = collected.enumerated().sorted { a, b in
                switch descriptor.sortBy.compare(a.element, b.element) {
                case .orderedAscending: return true
                case .orderedDescending: return false
                case .orderedSame: return a.offset < b.offset
                }
            }.map(\.element)
            let start = min(plan.offset, sorted.count)
            let end = plan.limit.map { min(sorted.count, start + $0) } ?? sorted.count
            var index = start
            while index < end {
                let chunk = Array(sorted[index..<min(end, index + batchSize)])
                index += chunk.count
                register(chunk)
                if try !emit(chunk) { return }
            }
        }
    }

    /// The number of rows a fully translated predicate selects (after paging), counted in SQL.
    func count(_ plan: FetchPlan) throws -> Int {
        let paging = plan.pagingSQL(countOnly: true)
        let sql = "SELECT count(*) FROM (SELECT t0.\"id\" \(plan.fromWhere)\(paging.text))"
        do {
            guard case let .integer(count)? = try db.scalar(sql, plan.whereArgs + paging.args) else { return 0 }
            return Int(count)
        } catch let error as SQLiteError where error.message.contains(SQLFunctions.unwrapFailureMessage) {
            throw PredicateError.forceUnwrapFailure
        }
    }

    /// The IDs a fully translated fetch selects, in result order.
    func identifiers(_ plan: FetchPlan) throws -> [UUID] {
        let paging = plan.paging
        let sql = "SELECT t0.\"id\" \(plan.fromWhere)\(plan.order)\(paging.text)"
        let statement = try db.cachedStatement(sql)
        defer { statement.reset() }
        try statement.bind(plan.whereArgs + plan.orderArgs + paging.args)
        var ids: [UUID] = []
        do {
            while try statement.step() { if let id = statement.uuid(0) { ids.append(id) } }
        } catch let error as SQLiteError where error.message.contains(SQLFunctions.unwrapFailureMessage) {
            throw PredicateError.forceUnwrapFailure
        }
        return ids
    }

    /// The public description of a plan.
    func describe(_ plan: FetchPlan, fields: String) -> QueryPlan {
        let paging = plan.paging
        return QueryPlan(sql: "SELECT \(fields) \(plan.fromWhere)\(plan.order)\(paging.text)",
                         filtersInMemory: plan.filtersInMemory, sortsInMemory: plan.sortsInMemory,
                         reasons: plan.reasons + plan.sortReasons)
    }
}
