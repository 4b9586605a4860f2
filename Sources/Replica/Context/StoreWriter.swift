import Foundation

/// Applies one save's changes to one store inside an open write transaction. Internal.
///
/// Order: deletes (with delete rules), then the resolution of upserts (Upsert.swift), then inserts and updates, then the deny rules and required relationships of
/// the deleted records and uniqueness checks over every record written, so keys may be swapped between records, and a
/// record may be deleted together with (or after moving) the records that depend on it, in one save. Validation failures are collected, not thrown, so that
/// the caller can report all of them at once and roll back.
struct StoreWriter {
    let store: Store
    let db: Connection
    private(set) var failures: [ModelValidationFailure] = []
    /// What this save did, for history and notifications.
    var changes = StoreChanges()
    private(set) var deleted = Set<PersistentIdentifier>()
    /// The records of ``deleted`` that the save inserts again (see ``apply(_:)-([PendingChanges.Entry])``).
    private var reinserted = Set<PersistentIdentifier>()
    /// The inserts this save turned into updates of existing records with the same unique key (see Upsert.swift):
    /// the ID each insert carried and the ID of the record it updated, in batch order.
    var upserts: [(inserted: PersistentIdentifier, existing: PersistentIdentifier)] = []
    /// Whether updates keep the row they replaced in ``StoreChanges/previousValues`` (for undo).
    var capturesPreviousValues = false
    /// Set while the save applies an undo or redo (see ``ModelUndoManager``): inserts are not upserted (a re-inserted
    /// record is itself), updates of records that no longer exist are skipped, and fields that no longer hold the
    /// value the undone save wrote are left alone; both are recorded in it.
    var undoApplication: UndoApplication?
    /// Whether this save wrote a new external-storage file (garbage if the save does not commit).
    private(set) var wroteAssetFiles = false
    /// Whether this save dropped a row's reference to an external-storage file (deleted or replaced the value): the
    /// file may be garbage once the save commits.
    private(set) var droppedAssetReferences = false
    /// Delete rules that can only be judged once every change is applied (see ``checkDeletedRelationships()``).
    private var deferredChecks: [DeferredCheck] = []
    /// What inserts of the entity written last need, looked up once per entity rather than once per row.
    private var insertContext: InsertContext?
    /// The largest record ID in the sync ledger (`nil`: none), read at the first insert of an ``apply(_:)`` into a
    /// synced store (nothing writes the ledger while it runs): an inserted ID beyond it has no ledger row, so
    /// ``idBelongsToAnotherEntity(_:)`` skips that lookup for new, time-ordered IDs.
    private var ledgerBound: UUID??
    /// The bound ``apply(_:)`` read (`nil`: not read), for the ledger writes of the same save: nothing but those
    /// writes the ledger in a save's write transaction, so it still holds when they begin.
    var ledgerBoundRead: UUID?? { ledgerBound }

    /// An entity's description, SQL, prepared INSERT and the facts row checks need.
    private final class InsertContext {
        let entity: Schema.Entity
        let sql: EntityStatements
        let insert: Statement
        /// Field indices of required to-one relationships.
        let requiredReferences: [(field: Int, relationship: Schema.Relationship)]
        let hasUniquenessConstraints: Bool

        init(entity: Schema.Entity, sql: EntityStatements, insert: Statement,
             requiredReferences: [(field: Int, relationship: Schema.Relationship)], hasUniquenessConstraints: Bool) {
            self.entity = entity
            self.sql = sql
            self.insert = insert
            self.requiredReferences = requiredReferences
            self.hasUniquenessConstraints = hasUniquenessConstraints
        }
    }
    /// Deny rules of many-to-many relationships, judged at the end too (see StoreWriter+Links.swift): the deleted
    /// record's links stay until then, so that the same save may delete or detach the linked records.
    var deferredLinkChecks: [(entity: String, relationship: Schema.Relationship, table: LinkTable, id: UUID)] = []

    /// A deleted record's relationship whose related records must be gone (or point elsewhere) by the end of the save.
    private struct DeferredCheck {
        enum Kind {
            /// The relationship has the deny rule: no related record may remain.
            case deny
            /// The related records' inverse to-one relationship is required: none may still point to the record.
            case requiredInverse(String)
        }
        let kind: Kind
        let entity: String
        let relationship: Schema.Relationship
        let id: UUID
        /// The related records when the record was deleted.
        let targets: [UUID]
    }

    init(store: Store, db: Connection) {
        self.store = store
        self.db = db
    }

    /// Applies `batch`, given as (ID, change) pairs in registration order.
    mutating func apply(_ batch: [(PersistentIdentifier, ModelContext.PendingChange)]) throws {
        try apply(batch.map { PendingChanges.Entry(id: $0.0, change: $0.1) })
    }

    /// Applies `batch` (a context's pending changes in registration order; `nil` entries are skipped).
    mutating func apply(_ batch: [PendingChanges.Entry]) throws {
        ledgerBound = nil
        upserts = []
        for index in batch.indices {
            switch batch[index].change {
            case .delete?:
                if let undoApplication, let inserted = undoApplication.inserted[batch[index].id],
                   try keptByUndo(batch[index].id, inserted: inserted, undoApplication) { continue }
                try deleteRecord(batch[index].id)
            case .replace?: try deleteRecord(batch[index].id)
            case .insert?, .update?, nil: break
            }
        }
        changes.updatesBeforeDeletes = changes.updated.count
        // Records the deletes removed that this save inserts again (a re-insert, or a cascade's child inserted anew)
        // are alive once it is applied: links to them are kept and written.
        if !deleted.isEmpty {
            for index in batch.indices {
                switch batch[index].change {
                case .insert?, .replace?: if deleted.contains(batch[index].id) { reinserted.insert(batch[index].id) }
                case .update?, .delete?, nil: break
                }
            }
        }
        // Inserts of a unique key an existing record holds update that record instead (SwiftData's upsert).
        let batch = undoApplication == nil ? try resolveUpserts(batch) : batch
        // Records whose unique keys must be checked once everything is written.
        var written: [Snapshot] = []
        changes.inserted.reserveCapacity(batch.count)
        for index in batch.indices {
            switch batch[index].change {
            case let .insert(snapshot)?, let .replace(snapshot)?:
                if try insert(snapshot), insertContext?.hasUniquenessConstraints ?? true { written.append(snapshot) }
            case let .update(snapshot, fields)?:
                if let stored = try update(snapshot, fields: fields) { written.append(stored) }
            case .delete?, nil:
                break
            }
        }
        try checkDeletedRelationships()
        for snapshot in written { try checkUniqueness(snapshot) }
    }

    /// The insert context of `entityName` (the one used last, or a new one).
    private mutating func insertContext(for entityName: String) throws -> InsertContext {
        if let context = insertContext, context.entity.name == entityName { return context }
        let (entity, sql) = entity(entityName)
        let references = entity.toOneRelationships.enumerated().compactMap { offset, relationship in
            relationship.isOptional ? nil : (entity.attributes.count + offset, relationship)
        }
        let context = InsertContext(entity: entity, sql: sql, insert: try db.cachedStatement(sql.insertKey),
                                    requiredReferences: references,
                                    hasUniquenessConstraints: entity.uniquenessConstraints.contains { !$0.isEmpty })
        insertContext = context
        return context
    }

    func entity(_ name: String) -> (Schema.Entity, EntityStatements) {
        let index = store.entityIndex[name]!
        return (store.entities[index], store.statements[index])
    }

    // MARK: Insert and update

    /// Inserts a record. Returns `false` (and records a failure) when it cannot be written.
    private mutating func insert(_ snapshot: Snapshot) throws -> Bool {
        let snapshot = try inliningExternalData(snapshot)
        let context = try insertContext(for: snapshot.entityName)
        for (field, relationship) in context.requiredReferences where snapshot.values[field].isNull {
            failures.append(.missingRequiredRelationship(entity: context.entity.name, relationship: relationship.name, id: snapshot.persistentModelID))
            return false
        }
        if !representable(snapshot, entity: context.entity, fields: nil) { return false }
        if store.tracksSync, try idBelongsToAnotherEntity(snapshot) {
            failures.append(.duplicateIdentifier(snapshot.persistentModelID))
            return false
        }
        var values = snapshot.values
        let external = store.externalFields[store.entityIndex[snapshot.entityName]!]
        for index in external { values[index] = try externalized(values[index], snapshot: snapshot, field: index) }
        let statement = context.insert
        // Every parameter is bound again for each row, from bytes the statement owns: no need to clear them.
        defer { statement.reset(clearingBindings: false) }
        do {
            try statement.withBound(id: snapshot.id, values) {
                while try statement.step() {}
            }
        } catch let error as SQLiteError where error.extendedResultCode == SQLiteError.constraintPrimaryKey
                                            || error.extendedResultCode == SQLiteError.constraintUnique {
            failures.append(.duplicateIdentifier(snapshot.persistentModelID))
            return false
        }
        changes.inserted.append(snapshot)
        _ = try writeLinks(snapshot)
        return true
    }

    /// Whether the record ID of `snapshot` is already used in this synced store by a record of another entity, alive
    /// (in its table, perhaps inserted earlier in this save) or known to sync (a tombstone, a record received): sync
    /// tracks, uploads and merges records by ID alone, so one ID cannot name two records of a synced store.
    /// Cost per inserted record: one indexed lookup per other entity of the store, and one in the ledger unless the
    /// ID sorts after every ID there, through prepared statements with the ID bound from the statement's own buffer
    /// (no `Data`, no hashing of SQL text).
    private mutating func idBelongsToAnotherEntity(_ snapshot: Snapshot) throws -> Bool {
        if ledgerBound == nil { ledgerBound = .some(try SyncLedger.largestID(SyncLedger.ledgerLargestIDSQL, db)) }
        if !(ledgerBound!.map { $0.bytesPrecede(snapshot.id) } ?? true) {
            let ledger = try db.cachedStatement(SyncLedger.entityOfRecordSQL)
            defer { ledger.reset() }
            if try ledger.withBound(id: snapshot.id, [], { try ledger.step() }),
               case let .text(owner) = ledger.value(0), owner != snapshot.entityName {
                return true
            }
        }
        for (index, other) in store.entities.enumerated() where other.name != snapshot.entityName {
            let exists = try db.cachedStatement(store.statements[index].selectByIDKey)
            defer { exists.reset() }
            if try exists.withBound(id: snapshot.id, [], { try exists.step() }) { return true }
        }
        return false
    }

    /// Writes the fields of `snapshot` whose stored value differs. Returns whether anything was written.
    /// - Throws: ``ReplicaError/recordNotFound(_:)`` when the record does not exist.
    /// Returns the record as stored after the update, or `nil` when nothing was written.
    private mutating func update(_ snapshot: Snapshot, fields: Set<Int>?) throws -> Snapshot? {
        let snapshot = try inliningExternalData(snapshot)
        let (entity, sql) = entity(snapshot.entityName)
        // The stored row (at most one: the ID is the primary key), read with the ID bound from the statement's buffer.
        let select = try db.cachedStatement(sql.selectByIDKey)
        let row: [SQLiteValue]? = try {
            defer { select.reset() }
            return try select.withBound(id: snapshot.id, []) {
                try select.step() ? (0..<select.columnCount).map { select.value($0) } : nil
            }
        }()
        guard let current = row else {
            if let undoApplication {
                // Deleted by another writer since the save being undone: that part of the undo is skipped.
                undoApplication.deletedRecords.append(snapshot.persistentModelID)
                return nil
            }
            throw ReplicaError.recordNotFound(snapshot.persistentModelID)
        }
        let names = sql.fieldNames
        // External-storage values compare (and are written) as references to their files.
        var values = snapshot.values
        let external = store.externalFields[store.entityIndex[snapshot.entityName]!]
        for index in external where fields?.contains(index) ?? true {
            switch values[index] {
            case let .blob(data): values[index] = .text(AssetStore.reference(for: data))
            case let .text(text): if let file = FileHandleForm(text: text) { values[index] = .text(file.reference) }
            default: break
            }
        }
        var changed: [Int] = []
        for (i, value) in values.enumerated() where current[i + 1] != value && (fields?.contains(i) ?? true) {
            changed.append(i)
        }
        if let undoApplication, let expected = undoApplication.expected[snapshot.persistentModelID] {
            // An undo sets a field back only while it holds what the undone save wrote: a newer edit is kept.
            let kept = changed.filter { field in
                expected[field].map { !Self.holds(current[field + 1], wrote: $0, external: external.contains(field)) } ?? false
            }
            if !kept.isEmpty {
                changed.removeAll(where: kept.contains)
                undoApplication.keptFields.append(.init(id: snapshot.persistentModelID, fields: kept.map { names[$0] }))
            }
        }
        for index in external where changed.contains(index) {
            if case .text = current[index + 1] { droppedAssetReferences = true }
            values[index] = try externalized(snapshot.values[index], snapshot: snapshot, field: index)
        }
        // For undo: the many-to-many members before this save's links are written.
        let linksBefore = capturesPreviousValues && !snapshot.toManyMembers.isEmpty ? try manyToManyMembers(of: snapshot.persistentModelID) : nil
        let changedLinks = try writeLinks(snapshot)
        guard !changed.isEmpty || !changedLinks.isEmpty else { return nil }
        if !representable(snapshot, entity: entity, fields: Set(changed)) { return nil }
        var stored = Snapshot(entityName: snapshot.entityName, id: snapshot.id, values: Array(current.dropFirst()))
        for index in changed { stored.values[index] = snapshot.values[index] }
        for (offset, relationship) in entity.toOneRelationships.enumerated() where !relationship.isOptional {
            if stored.values[entity.attributes.count + offset].isNull {
                failures.append(.missingRequiredRelationship(entity: entity.name, relationship: relationship.name, id: snapshot.persistentModelID))
                return nil
            }
        }
        if !changed.isEmpty {
            // One statement per set of changed columns, found without building or hashing its text.
            let statement = try db.cachedStatement(owner: sql, kind: Self.updateStatementKind, variant: changed) {
                let assignments = changed.map { "\(quoted(names[$0])) = ?" }.joined(separator: ", ")
                return "UPDATE \(sql.table) SET \(assignments) WHERE \"id\" = ?"
            }
            try statement.run(changed.map { values[$0] } + [snapshot.id.sqliteValue])
        }
        // Only the changed fields' previous values are ever restored (Undo's inverse): resolving an unchanged
        // external field would read its whole file at every save of the record (a rename read the image).
        if capturesPreviousValues {
            changes.previousValues[changes.updated.count] = resolvedForUndo(Array(current.dropFirst()), external: external.filter(changed.contains))
        }
        if let linksBefore, !changedLinks.isEmpty { changes.previousLinks[changes.updated.count] = linksBefore }
        changes.updated.append((stored, changed.map { names[$0] } + changedLinks))
        return stored
    }

    /// Whether a stored value still is what a save wrote. An external-storage field holds a reference to its file:
    /// the bytes the save wrote compare as theirs.
    private static func holds(_ stored: SQLiteValue, wrote: SQLiteValue, external: Bool) -> Bool {
        if external, case let .blob(data) = wrote { return stored == .text(AssetStore.reference(for: data)) }
        if external, case let .text(text) = wrote, let file = FileHandleForm(text: text) { return stored == .text(file.reference) }
        return stored == wrote
    }

    /// For an undo deleting record `id` that the undone saves inserted and left holding `inserted`: whether another
    /// writer changed a field of it since, so the undo keeps it (reported with those fields). A record gone already
    /// is not kept (the delete skips it).
    private mutating func keptByUndo(_ id: PersistentIdentifier, inserted: [SQLiteValue], _ undoApplication: UndoApplication) throws -> Bool {
        let (_, sql) = entity(id.entityName)
        guard let row = try db.rows(sql.selectByIDKey, [id.id.sqliteValue]).first else { return false }
        let external = store.externalFields[store.entityIndex[id.entityName]!]
        let changed = inserted.indices.filter { $0 + 1 < row.count && !Self.holds(row[$0 + 1], wrote: inserted[$0], external: external.contains($0)) }
        guard !changed.isEmpty else { return false }
        undoApplication.keptRecords.append(.init(id: id, fields: changed.map { sql.fieldNames[$0] }))
        return true
    }

    /// The stored form of external-storage field `field` of `snapshot`: for a value with bytes, the reference to
    /// its file, written now (before the save commits) unless it exists; anything else as it is.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when the file cannot be written.
    private mutating func externalized(_ value: SQLiteValue, snapshot: Snapshot, field: Int) throws -> SQLiteValue {
        guard let assets = store.assets else { return value }
        do {
            switch value {
            case let .blob(data):
                let reference = AssetStore.reference(for: data)
                if try assets.write(data, reference: reference) { wroteAssetFiles = true }
                return .text(reference)
            case let .text(text):
                // An `ExternalData` handle: its file is this store's, or is copied here in chunks.
                guard let file = FileHandleForm(text: text) else {
                    // A file description that does not parse is never stored as it is (no fetch could read it).
                    if text.hasPrefix(FileHandleForm.prefix) { throw ExternalStorageError.Problem.malformedReference }
                    return value
                }
                if try assets.adopt(file) { wroteAssetFiles = true }
                return .text(file.reference)
            default:
                return value
            }
        } catch let problem as ExternalStorageError.Problem {
            throw externalStorageError(problem, snapshot: snapshot, field: field)
        }
    }

    /// `snapshot` with the ``ExternalData`` file handles of an in-memory store's external-storage fields read into
    /// bytes (the store keeps them in its rows), checked against their hashes.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when a handle's file cannot be read.
    private func inliningExternalData(_ snapshot: Snapshot) throws -> Snapshot {
        let fields = store.inlineExternalFields[store.entityIndex[snapshot.entityName]!]
        guard !fields.isEmpty else { return snapshot }
        var snapshot = snapshot
        for field in fields {
            guard case let .text(text) = snapshot.values[field] else { continue }
            do {
                guard let file = FileHandleForm(text: text) else {
                    if text.hasPrefix(FileHandleForm.prefix) { throw ExternalStorageError.Problem.malformedReference }
                    continue
                }
                var data = Data()
                data.reserveCapacity(file.size)
                try ExternalFileIO.forEachChunk(path: file.path, size: Int64(file.size), hash: file.hash, chunkSize: 1 << 20) { data.append($0) }
                snapshot.values[field] = .blob(data)
            } catch let problem as ExternalStorageError.Problem {
                throw externalStorageError(problem, snapshot: snapshot, field: field)
            }
        }
        return snapshot
    }

    private func externalStorageError(_ problem: ExternalStorageError.Problem, snapshot: Snapshot, field: Int) -> ReplicaError {
        ReplicaError.externalStorage(ExternalStorageError(store: store.configuration.name, entity: snapshot.entityName, recordID: snapshot.id,
                                                          attribute: store.statements[store.entityIndex[snapshot.entityName]!].fieldNames[field],
                                                          problem: problem))
    }

    /// A row's values as undo restores them: external-storage references replaced by their bytes, so that undoing
    /// after the collector removed the file (the save dropped its last reference) writes it again. A file that
    /// cannot be read keeps its reference (undo then restores that).
    private func resolvedForUndo(_ row: [SQLiteValue], external: [Int]) -> [SQLiteValue] {
        guard let assets = store.assets, !external.isEmpty else { return row }
        var row = row
        for index in external {
            if case let .text(reference) = row[index], let data = try? assets.read(reference) { row[index] = .blob(data) }
        }
        return row
    }

    /// Records a failure for every NaN among `fields` (all fields when `nil`): SQLite would store it as NULL.
    private mutating func representable(_ snapshot: Snapshot, entity: Schema.Entity, fields: Set<Int>?) -> Bool {
        var ok = true
        for (index, value) in snapshot.values.enumerated() {
            if case let .real(v) = value, v.isNaN, fields?.contains(index) ?? true {
                failures.append(.unrepresentableValue(entity: entity.name, attribute: entity.fieldNames[index], id: snapshot.persistentModelID))
                ok = false
            }
        }
        return ok
    }

    // MARK: Uniqueness

    /// `value` of field `field` of `entityName` as a row of this store holds it, for comparing with stored rows
    /// (uniqueness, upserts): an external-storage value of a store file is the reference to its file (bytes are hashed,
    /// no file is written); anything else is itself.
    func comparableStoredValue(_ value: SQLiteValue, field: Int, entity entityName: String) -> SQLiteValue {
        guard !store.comparesExternalValuesAsBytes, let index = store.entityIndex[entityName],
              store.externalFields[index].contains(field) else { return value }
        switch value {
        case let .blob(data): return .text(AssetStore.reference(for: data))
        case let .text(text): return FileHandleForm(text: text).map { .text($0.reference) } ?? value
        default: return value
        }
    }

    /// The kinds of ``Connection/cachedStatement(owner:kind:variant:sql:)`` statements a writer caches per entity.
    private static let updateStatementKind = 0
    private static let uniquenessStatementKind = 1

    private mutating func checkUniqueness(_ snapshot: Snapshot) throws {
        let (entity, sql) = entity(snapshot.entityName)
        for (position, constraint) in entity.uniquenessConstraints.enumerated() where !constraint.isEmpty {
            let indices = constraint.compactMap { name in sql.fieldIndex[name] }
            let values = indices.map { comparableStoredValue(snapshot.values[$0], field: $0, entity: snapshot.entityName) }
            // As in SQL, a key with a NULL part never collides.
            if values.contains(where: \.isNull) { continue }
            let statement = try db.cachedStatement(owner: sql, kind: Self.uniquenessStatementKind, variant: [position]) {
                let condition = constraint.map { "\(quoted($0)) = ?" }.joined(separator: " AND ")
                return "SELECT 1 FROM \(sql.table) WHERE \(condition) AND \"id\" <> ? LIMIT 1"
            }
            let clash: SQLiteValue? = try {
                defer { statement.reset() }
                try statement.bind(values + [snapshot.id.sqliteValue])
                return try statement.step() ? statement.value(0) : nil
            }()
            if clash != nil {
                failures.append(.uniqueConstraintViolation(entity: entity.name, attributes: constraint, id: snapshot.persistentModelID))
            }
        }
    }

    // MARK: Delete with delete rules

    /// Whether this save has deleted `id` so far, and does not insert it again.
    func wasDeleted(_ id: PersistentIdentifier) -> Bool { deleted.contains(id) && !reinserted.contains(id) }

    /// Records a validation failure (used by the link-table code in StoreWriter+Links.swift).
    mutating func recordFailure(_ failure: ModelValidationFailure) {
        failures.append(failure)
    }

    /// Records that the membership of `relationship` of the records `ids` changed (for history).
    mutating func recordMembershipChange(of ids: [UUID], entity: String, relationship: String) {
        for id in ids { changes.updated.append((Snapshot(entityName: entity, id: id, values: []), [relationship])) }
    }

    /// Deletes a record and applies its relationships' delete rules (recursively for cascades).
    /// A record that does not exist (deleted earlier, or never saved) is skipped.
    mutating func deleteRecord(_ id: PersistentIdentifier, viaCascade: Bool = false) throws {
        guard let frame = try beginDelete(id, viaCascade: viaCascade) else { return }
        try runDeletes(from: frame)
    }

    /// Applies the delete rules of a record a sync import has already removed: its to-many relationships' members
    /// (found through their inverse reference) are cascaded or nullified like a local delete, so every device
    /// treats the children of a deleted parent the same way.
    mutating func applyDeleteRulesAfterRemoteDelete(of id: PersistentIdentifier) throws {
        guard deleted.insert(id).inserted else { return }
        try runDeletes(from: DeleteFrame(id: id, row: nil, viaCascade: false))
    }

    /// One record being deleted. The delete rules of its relationships are applied one relationship at a time, and a
    /// cascade deletes its targets one after another — each completely, its own cascades first — before the next
    /// relationship: the order of a recursive walk, kept on an explicit stack so that a cascade chain of any length
    /// cannot overflow the call stack.
    private struct DeleteFrame {
        let id: PersistentIdentifier
        /// The record's row; `nil` when it is already gone (a remote delete): only its delete rules are applied.
        let row: [SQLiteValue]?
        let viaCascade: Bool
        /// The record's many-to-many members before its delete removes them (by to-many slot), kept for undo when
        /// the writer captures previous values; empty otherwise.
        var links: [[UUID]] = []
        /// The next of the entity's relationships whose rule to apply.
        var nextRelationship = 0
        /// The records the cascade in progress deletes, their entity, and the next one to delete.
        var cascade: [UUID] = []
        var cascadeEntity = ""
        var nextTarget = 0
    }

    /// Marks `id` deleted and reads its row; `nil` when it was already deleted in this save or does not exist.
    private mutating func beginDelete(_ id: PersistentIdentifier, viaCascade: Bool) throws -> DeleteFrame? {
        guard deleted.insert(id).inserted else { return nil }
        let (_, sql) = entity(id.entityName)
        guard let row = try db.rows(sql.selectByIDKey, [id.id.sqliteValue]).first else { return nil }
        var frame = DeleteFrame(id: id, row: row, viaCascade: viaCascade)
        if capturesPreviousValues { frame.links = try manyToManyMembers(of: id) }
        return frame
    }

    private mutating func runDeletes(from first: DeleteFrame) throws {
        var stack = [first]
        while var frame = stack.popLast() {
            if frame.nextTarget < frame.cascade.count {
                let target = PersistentIdentifier(entityName: frame.cascadeEntity, id: frame.cascade[frame.nextTarget])
                frame.nextTarget += 1
                stack.append(frame)
                if let child = try beginDelete(target, viaCascade: true) { stack.append(child) }
                continue
            }
            let (entity, sql) = entity(frame.id.entityName)
            if frame.nextRelationship < entity.relationships.count {
                let relationship = entity.relationships[frame.nextRelationship]
                frame.nextRelationship += 1
                if let targets = try applyDeleteRule(relationship, of: frame.id, row: frame.row) {
                    frame.cascade = targets
                    frame.cascadeEntity = relationship.destination
                    frame.nextTarget = 0
                }
                stack.append(frame)
                continue
            }
            guard let row = frame.row else { continue }
            try db.run(sql.delete, [frame.id.id.sqliteValue])
            let external = store.externalFields[store.entityIndex[entity.name]!]
            if external.contains(where: { if case .text = row[$0 + 1] { true } else { false } }) { droppedAssetReferences = true }
            let preserved = entity.attributes.enumerated().filter { $0.element.options.contains(.preserveValueOnDeletion) }
            changes.deleted.append(DeletedRecord(
                id: frame.id, preservedValues: preserved.map { ($0.element.name, row[$0.offset + 1]) }, viaCascade: frame.viaCascade,
                values: capturesPreviousValues ? resolvedForUndo(Array(row.dropFirst()), external: external) : Array(row.dropFirst()),
                links: frame.links))
        }
    }

    /// A live record `child` references a deleted record through its to-one `reference`: follow `rule` (the delete
    /// rule of the deleted record's inverse relationship) — cascade deletes the child, nullify clears the reference.
    mutating func followDeletedReference(child: PersistentIdentifier, reference: String, rule: Schema.DeleteRule) throws {
        switch rule {
        case .cascade:
            try deleteRecord(child)
        case .nullify:
            let (_, sql) = entity(child.entityName)
            try db.run("UPDATE \(sql.table) SET \(quoted(reference)) = NULL WHERE \"id\" = ?", [child.id.sqliteValue])
            if db.changes > 0 { changes.updated.append((Snapshot(entityName: child.entityName, id: child.id, values: []), [reference])) }
        case .deny, .noAction:
            break
        }
    }

    /// Points every to-one reference to `loser` at `winner` instead (a resolved duplicate), as local updates.
    mutating func retargetReferences(from loser: PersistentIdentifier, to winner: UUID) throws {
        for entity in store.entities {
            for relationship in entity.toOneRelationships where relationship.destination == loser.entityName {
                let (_, sql) = self.entity(entity.name)
                let children = try db.rows("SELECT \"id\" FROM \(sql.table) WHERE \(quoted(relationship.name)) = ? ORDER BY \"id\"",
                                           [loser.id.sqliteValue]).compactMap { try? UUID(sqliteValue: $0[0]) }
                for child in children {
                    try retargetReference(child: PersistentIdentifier(entityName: entity.name, id: child), reference: relationship.name, to: winner)
                }
            }
        }
    }

    /// Points one record's to-one `reference` at `target`, as a local update.
    mutating func retargetReference(child: PersistentIdentifier, reference: String, to target: UUID) throws {
        let (_, sql) = entity(child.entityName)
        try db.run("UPDATE \(sql.table) SET \(quoted(reference)) = ? WHERE \"id\" = ?", [target.sqliteValue, child.id.sqliteValue])
        if db.changes > 0 { changes.updated.append((Snapshot(entityName: child.entityName, id: child.id, values: []), [reference])) }
    }

    /// Applies the delete rule of one relationship of record `id` (with `row == nil`, the row is already gone and
    /// only to-many relationships can be followed). Returns the records a cascade must delete, `nil` otherwise.
    private mutating func applyDeleteRule(_ relationship: Schema.Relationship, of id: PersistentIdentifier,
                                          row: [SQLiteValue]?) throws -> [UUID]? {
        let (entity, _) = entity(id.entityName)
        let (destination, destinationSQL) = self.entity(relationship.destination)
        if let table = LinkTable.of(relationship, in: entity.name, destination: destination) {
            // Many-to-many: the links go; the members follow the rule (see StoreWriter+Links).
            try deleteLinks(of: id, relationship: relationship, table: table, destination: destination)
            return nil
        }
        let targets: [UUID]
        if relationship.isToMany {
            guard let inverse = relationship.inverse else { return nil }
            targets = try db.rows("SELECT \"id\" FROM \(destinationSQL.table) WHERE \(quoted(inverse)) = ? ORDER BY \"id\"",
                                  [id.id.sqliteValue]).compactMap { try? UUID(sqliteValue: $0[0]) }
        } else {
            guard let row, let index = entity.fieldNames.firstIndex(of: relationship.name) else { return nil }
            targets = [try? UUID(sqliteValue: row[index + 1])].compactMap { $0 }
        }
        if targets.isEmpty { return nil }
        switch relationship.deleteRule {
        case .deny:
            deferredChecks.append(DeferredCheck(kind: .deny, entity: entity.name, relationship: relationship, id: id.id, targets: targets))
        case .cascade:
            return targets
        case .nullify:
            guard let inverseName = relationship.inverse, let inverse = destination.relationship(named: inverseName),
                  !inverse.isToMany else { return nil }
            if !inverse.isOptional {
                deferredChecks.append(DeferredCheck(kind: .requiredInverse(inverseName), entity: entity.name,
                                                    relationship: relationship, id: id.id, targets: targets))
                return nil
            }
            try db.run("UPDATE \(destinationSQL.table) SET \(quoted(inverseName)) = NULL WHERE \(quoted(inverseName)) = ?",
                       [id.id.sqliteValue])
            for target in targets {
                changes.updated.append((Snapshot(entityName: destination.name, id: target, values: []), [inverseName]))
            }
        case .noAction:
            break
        }
        return nil
    }
}

extension StoreWriter {
    /// Applies the deny rules and required inverse relationships of the records this save deleted, now that every
    /// delete, insert and update is applied: related records deleted or moved elsewhere by the same save do not
    /// count, whatever order the changes were registered in.
    private mutating func checkDeletedRelationships() throws {
        try checkDeletedLinks()
        for check in deferredChecks {
            let (destination, sql) = entity(check.relationship.destination)
            func referencing(_ column: String) throws -> [UUID] {
                try db.rows("SELECT \"id\" FROM \(sql.table) WHERE \(quoted(column)) = ? ORDER BY \"id\"",
                            [check.id.sqliteValue]).compactMap { try? UUID(sqliteValue: $0[0]) }
            }
            switch check.kind {
            case .deny:
                let remaining: [UUID]
                if check.relationship.isToMany, let inverse = check.relationship.inverse {
                    remaining = try referencing(inverse)
                } else {
                    remaining = try check.targets.filter { try db.scalar(sql.selectByIDKey, [$0.sqliteValue]) != nil }
                }
                if !remaining.isEmpty {
                    failures.append(.deleteDenied(entity: check.entity, relationship: check.relationship.name, count: remaining.count))
                }
            case let .requiredInverse(inverse):
                for target in try referencing(inverse) {
                    failures.append(.missingRequiredRelationship(entity: destination.name, relationship: inverse,
                                                                 id: PersistentIdentifier(entityName: destination.name, id: target)))
                }
            }
        }
    }
}
