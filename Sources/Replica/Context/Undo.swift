import Foundation

/// Undo and redo of a context's saves, in the shape of Foundation's `UndoManager` (SwiftData's `context.undoManager`).
///
/// Foundation's `UndoManager` is not available in swift-corelibs-foundation on Linux (Swift 6.3), so Replica brings
/// this small manager with the same API shape: ``beginUndoGrouping()`` / ``endUndoGrouping()``, ``undo()``,
/// ``redo()``, ``canUndo``, ``canRedo``, ``groupsByEvent``, ``levelsOfUndo``, ``removeAllActions()``.
///
/// **Grouping.** Each save of the context is one undo group (`groupsByEvent`, the default), unless an explicit group
/// is open: then every save until the matching ``endUndoGrouping()`` joins that group. Changes are recorded when they
/// are saved (SwiftData registers them at `processPendingChanges()`). Unsaved changes are the newest change: ``undo()``
/// and ``redo()`` first save them, as ``ModelContext/save()`` would (one group), so ``undo()`` undoes them — never the
/// save before them with them lost — and ``redo()`` finds its stack cleared by that new change, as after any save.
/// ``ModelContext/rollback()`` discards unsaved changes instead.
///
/// **What undo does.** ``undo()`` registers the inverse of the group's saves on the context — records the group
/// inserted are deleted, records it deleted (cascaded children included) are inserted again with the values they had,
/// fields it updated are set back — and saves. That save is an ordinary one: it writes history, is announced on
/// ``ModelContainer/changes``, and in a synced store is a new change with new stamps (it replicates to other devices
/// like any edit and never rewinds anyone's clock; a re-inserted record is a new incarnation, R4). ``redo()`` does the
/// same with the inverse of the undo. A new save after an undo clears the redo stack.
///
/// **Links.** Undo of a delete inserts the record again with the many-to-many links it had (a relationship that is
/// its own inverse: the links the record held); redo removes them again. Undo of a save that changed a record's
/// many-to-many links sets every many-to-many relationship of that record back to its members before the save. In a
/// synced store the restored links are a new local change, stamped and uploaded like any other (R17).
///
/// **Undo never overwrites newer changes, and never leaves anything pending.** Other writers (another context,
/// another process, a device through sync) may change or delete the group's records after its save. The undo's save
/// checks, inside its write transaction:
/// - a record the group updated that no longer exists (deleted elsewhere) is skipped, and the rest of the group is
///   applied — as Core Data, where an undo applies to the objects that still exist; the record is reported in
///   ``UndoResult/deletedRecords``;
/// - a field is set back only where it still holds the value the group's save wrote; a field a newer edit changed
///   keeps that edit (the stale-copy rule: an undo never writes an old value over another writer's change), reported
///   in ``UndoResult/keptFields``;
/// - a record the group inserted is deleted only while every field still holds what the group's saves wrote; a record
///   another writer edited since is kept with that edit, reported in ``UndoResult/keptRecords`` (so a redo has
///   nothing to insert again for it);
/// - a record the group deleted is inserted again as itself (its own ID), never upserted onto another record that
///   took its unique key meanwhile: then the undo fails with the save's
///   ``ModelValidationFailure/uniqueConstraintViolation(entity:attributes:id:)``.
///
/// An undo (or redo) whose inverse cannot be saved — a validation failure such as that unique key, a required
/// relationship or a deny rule — throws the save's error, rolls back exactly the inverse's changes (the user's own
/// pending edits were saved before it, so nothing of theirs is lost) and drops the group from the stack, so the
/// groups before it stay reachable. A save that fails for another reason (``SQLiteError`` such as a busy database, a
/// read-only store) also leaves nothing pending, but keeps the group, to be tried again.
///
/// **Contexts.** One manager may serve several contexts (SwiftUI's pattern: one undo manager for a window's contexts):
/// each group undoes on the context whose saves it recorded, newest group first, whichever context it came from;
/// ``undo()`` and ``redo()`` first save the pending changes of every context the manager serves. Setting a context's
/// ``ModelContext/undoManager`` to another manager or `nil` forgets that context's groups. A group whose context is
/// gone (deinitialized) is forgotten: a manager that outlives its contexts has nothing to undo (``canUndo`` is
/// `false`, ``undo()`` does nothing).
///
/// **Limits.** To-one references a delete rule nullified are not restored. Many-to-many links are set back as they
/// were before the save, without the per-field check (nor are they checked before a record the group inserted is
/// deleted). Records that deleting an inserted record cascades to follow the delete rule.
///
/// Not `Sendable`: it belongs to its contexts' isolation domain.
public final class ModelUndoManager {
    /// One record change of an undo group, in the form that undoes it.
    fileprivate enum Step {
        /// Deletes a record the undone save inserted with the values `inserted`: the record is deleted only while every
        /// field still holds what the undone saves wrote.
        case delete(PersistentIdentifier, inserted: [SQLiteValue])
        case insert(Snapshot)
        /// The values to set back at `fields`, and the values the undone save wrote there (`wrote`): a field is set
        /// back only while it still holds what the save wrote.
        case update(Snapshot, fields: Set<Int>, wrote: [Int: SQLiteValue])
    }

    /// The inverse of one context's saves, applied in order in one save of that context.
    fileprivate struct Part {
        weak var context: ModelContext?
        var steps: [Step]
    }

    /// The inverse of one or more saves (of one or more contexts), applied part by part.
    fileprivate struct Group {
        var parts: [Part] = []
        /// Whether a context of the group is still alive.
        var isLive: Bool { parts.contains { $0.context != nil } }

        /// Adds the inverse of a newer save: it is applied first.
        mutating func prepend(_ steps: [Step], of context: ModelContext) {
            if let first = parts.first, first.context === context {
                parts[0].steps.insert(contentsOf: steps, at: 0)
            } else {
                parts.insert(Part(context: context, steps: steps), at: 0)
            }
        }
    }

    /// A context the manager serves.
    private struct Served {
        weak var context: ModelContext?
    }

    private var undoStack: [Group] = []
    private var redoStack: [Group] = []
    private var openGroup: Group?
    private var openLevels = 0
    /// The contexts whose ``ModelContext/undoManager`` this is (kept by that property), in the order they were set.
    private var served: [Served] = []
    private enum Mode { case normal, undoing, redoing }
    private var mode = Mode.normal
    /// While ``undo()`` or ``redo()`` runs: the inverse of what its saves did, pushed onto the other stack at the end.
    private var collecting: Group?

    /// Whether each save outside an explicit group is one undo group (the default). When `false`, only saves inside
    /// ``beginUndoGrouping()`` / ``endUndoGrouping()`` are recorded.
    public var groupsByEvent = true
    /// The most undo groups kept (the oldest are dropped first); 0 keeps every group.
    public var levelsOfUndo = 0 {
        didSet { trim() }
    }

    /// A manager serving no context yet: set it as a context's ``ModelContext/undoManager``.
    public init() {}

    /// Whether there is a group to undo (of a context that still exists).
    public var canUndo: Bool { undoStack.contains(where: \.isLive) }
    /// Whether there is an undone group to redo (of a context that still exists).
    public var canRedo: Bool { redoStack.contains(where: \.isLive) }
    /// Whether ``undo()`` is running.
    public var isUndoing: Bool { mode == .undoing }
    /// Whether ``redo()`` is running.
    public var isRedoing: Bool { mode == .redoing }
    /// How many explicit groups are open.
    public var groupingLevel: Int { openLevels }

    /// Opens a group: the saves until the matching ``endUndoGrouping()`` undo together. Groups nest; the outermost
    /// one is recorded.
    public func beginUndoGrouping() {
        if openLevels == 0 { openGroup = Group() }
        openLevels += 1
    }

    /// Closes the group ``beginUndoGrouping()`` opened. Traps without an open group (a programming error, as
    /// Foundation's `UndoManager` raises).
    public func endUndoGrouping() {
        precondition(openLevels > 0, "Replica: endUndoGrouping() without beginUndoGrouping()")
        openLevels -= 1
        if openLevels == 0, let group = openGroup {
            openGroup = nil
            if !group.parts.isEmpty { push(group) }
        }
    }

    /// Undoes the newest group: one save of the group's inverse on the context whose saves it recorded (one per
    /// context, for a group of several contexts). Nothing without a group (also when its contexts are gone). Traps
    /// while a group is open (a programming error, as Foundation's `UndoManager` raises).
    ///
    /// Unsaved changes on the contexts the manager serves are saved first, as their own groups, and the newest of
    /// them is the one undone. Records deleted, fields changed and inserted records edited by other writers since the
    /// group's save are left alone (see the type's documentation) and reported in the result.
    /// - Returns: what the undo left alone (``UndoResult/isComplete`` when it set everything back).
    /// - Throws: the save's error. Of the unsaved changes: nothing is undone, they stay pending. Of the inverse:
    ///   nothing of the inverse stays pending; after a validation failure (``ReplicaError/modelValidationFailure(_:)``,
    ///   e.g. a unique key another record took) the group is dropped, after any other error it stays to be undone.
    @discardableResult
    public func undo() throws -> UndoResult {
        precondition(openLevels == 0, "Replica: undo() while an undo group is open; call endUndoGrouping() first")
        try savePendingChanges(undoing: true)
        guard let group = popLive(&undoStack) else { return UndoResult() }
        return try run(group, mode: .undoing) { undoStack.append($0) }
    }

    /// Redoes the newest undone group: one save of the undo's inverse, with the same checks as ``undo()``. Nothing
    /// without one. Traps as ``undo()``. Unsaved changes on the contexts are saved first: a new change, which clears
    /// the redo stack as any save does, so nothing is redone then.
    /// - Returns: what the redo left alone.
    /// - Throws: as ``undo()``; the group stays to be redone unless the error is a validation failure.
    @discardableResult
    public func redo() throws -> UndoResult {
        precondition(openLevels == 0, "Replica: redo() while an undo group is open; call endUndoGrouping() first")
        try savePendingChanges()
        guard let group = popLive(&redoStack) else { return UndoResult() }
        return try run(group, mode: .redoing) { redoStack.append($0) }
    }

    /// Forgets every undo and redo group.
    public func removeAllActions() {
        undoStack.removeAll()
        redoStack.removeAll()
        openGroup = openGroup.map { _ in Group() }
    }

    /// Starts serving `context` (its ``ModelContext/undoManager`` was set to this manager).
    func attach(_ context: ModelContext) {
        served.removeAll { $0.context == nil }
        if !served.contains(where: { $0.context === context }) { served.append(Served(context: context)) }
    }

    /// Stops serving `context` and forgets its groups (its ``ModelContext/undoManager`` was set to another one).
    func detach(_ context: ModelContext) {
        served.removeAll { $0.context == nil || $0.context === context }
        func forget(_ stack: inout [Group]) {
            for index in stack.indices { stack[index].parts.removeAll { $0.context == nil || $0.context === context } }
            stack.removeAll { $0.parts.isEmpty }
        }
        forget(&undoStack)
        forget(&redoStack)
        if openGroup != nil { openGroup!.parts.removeAll { $0.context === context } }
    }

    /// Whether the manager serves `context`.
    func serves(_ context: ModelContext) -> Bool { served.contains { $0.context === context } }

    private func savePendingChanges(undoing: Bool = false) throws {
        served.removeAll { $0.context == nil }
        for entry in served {
            guard let context = entry.context, context.hasChanges else { continue }
            // The canary: undo() as before the fix, folding the pending edit into the inverse.
            if undoing && context.container.environment.canaries.contains(.undoDropsPendingEdit) { continue }
            try context.save()
        }
    }

    /// Removes and returns the newest group of `stack` whose contexts are not all gone (dropping those that are).
    private func popLive(_ stack: inout [Group]) -> Group? {
        while let group = stack.popLast() {
            if group.isLive { return group }
        }
        return nil
    }

    /// Applies `group` in `mode`; on an error that is no validation failure and before any part was saved, gives
    /// the group back to `restore`.
    private func run(_ group: Group, mode: Mode, restore: (Group) -> Void) throws -> UndoResult {
        self.mode = mode
        collecting = Group()
        var savedParts = 0
        defer {
            let inverse = collecting
            collecting = nil
            self.mode = .normal
            if let inverse, !inverse.parts.isEmpty {
                if mode == .undoing { redoStack.append(inverse) } else { undoStack.append(inverse) }
                trim()
            }
        }
        var result = UndoResult()
        do {
            for part in group.parts {
                guard let context = part.context else { continue }
                try apply(part.steps, to: context, into: &result)
                savedParts += 1
            }
        } catch {
            if savedParts == 0, !Self.isValidationFailure(error) { restore(group) }
            throw error
        }
        return result
    }

    private static func isValidationFailure(_ error: any Error) -> Bool {
        switch error as? ReplicaError {
        case .modelValidationFailure?, .recordNotFound?, .partialSave?: return true
        default: return false
        }
    }

    /// One save of `steps` on `context` (which has no pending changes), checked as the type's documentation says.
    /// On an error the steps' changes are rolled back: nothing stays pending.
    private func apply(_ steps: [Step], to context: ModelContext, into result: inout UndoResult) throws {
        let application = UndoApplication()
        for step in steps {
            switch step {
            case let .delete(id, inserted):
                // What the store holds now: the inserted values, with the fields newer saves of the group updated
                // (their steps ran before this one).
                var holds = inserted
                for (field, value) in application.expected[id] ?? [:] where field < holds.count { holds[field] = value }
                application.inserted[id] = holds
                context.delete(id)
            case let .insert(snapshot): context.registerInsert(snapshot)
            case let .update(snapshot, fields, wrote):
                let id = snapshot.persistentModelID
                // The newest save's values are what the store holds now (steps run newest save first).
                for (field, value) in wrote where application.expected[id]?[field] == nil {
                    application.expected[id, default: [:]][field] = value
                }
                context.registerUpdate(snapshot, fields: fields)
            }
        }
        context.undoApplication = application
        defer { context.undoApplication = nil }
        do {
            try context.save()
        } catch {
            context.rollback()
            throw error
        }
        for id in application.deletedRecords where !result.deletedRecords.contains(id) { result.deletedRecords.append(id) }
        result.keptFields += application.keptFields
        result.keptRecords += application.keptRecords
    }

    private func push(_ group: Group) {
        switch mode {
        case .undoing:
            redoStack.append(group)
        case .redoing:
            undoStack.append(group)
        case .normal:
            undoStack.append(group)
            redoStack.removeAll()
        }
        trim()
    }

    private func trim() {
        if levelsOfUndo > 0, undoStack.count > levelsOfUndo { undoStack.removeFirst(undoStack.count - levelsOfUndo) }
    }

    /// Records the inverse of a committed save of `context`.
    func recordSave(_ saved: [StoreChanges], in context: ModelContext) {
        var steps: [Step] = []
        for changes in saved.reversed() {
            steps += Self.inverse(of: changes, in: context)
        }
        guard !steps.isEmpty else { return }
        if mode != .normal, collecting != nil {
            collecting?.prepend(steps, of: context)
            return
        }
        if mode == .normal, openLevels > 0 {
            openGroup?.prepend(steps, of: context)
            return
        }
        if mode == .normal && !groupsByEvent { return }
        push(Group(parts: [Part(context: context, steps: steps)]))
    }

    /// The changes that undo `changes`: deletes of what it inserted, inserts of what it deleted (with the values
    /// they had), then the updated fields set back.
    private static func inverse(of changes: StoreChanges, in context: ModelContext) -> [Step] {
        var steps: [Step] = []
        // Updates first, newest first: a record updated by the save is set back before anything else touches it.
        for index in changes.updated.indices.reversed() {
            let (after, names) = changes.updated[index]
            guard let before = changes.previousValues[index], !after.values.isEmpty,
                  let entity = context.container.schema.entity(named: after.entityName) else { continue }
            let fieldNames = entity.fieldNames
            let fields = Set(names.compactMap { fieldNames.firstIndex(of: $0) })
            let links = changes.previousLinks[index]
            guard !fields.isEmpty || links != nil else { continue }
            var restored = after
            var wrote: [Int: SQLiteValue] = [:]
            for field in fields where field < before.count {
                wrote[field] = after.values[field]
                restored.values[field] = before[field]
            }
            if let links { restored.toManyMembers = links }
            steps.append(.update(restored, fields: fields, wrote: wrote))
        }
        for snapshot in changes.inserted.reversed() { steps.append(.delete(snapshot.persistentModelID, inserted: snapshot.values)) }
        for record in changes.deleted.reversed() where !record.values.isEmpty {
            steps.append(.insert(Snapshot(entityName: record.id.entityName, id: record.id.id, values: record.values,
                                          toManyMembers: record.links)))
        }
        return steps
    }
}

/// What an ``ModelUndoManager/undo()`` or ``ModelUndoManager/redo()`` left alone because other writers changed the
/// group's records after its save (see ``ModelUndoManager``).
public struct UndoResult: Sendable, Hashable {
    /// Fields of one record that a newer edit changed, so the undo kept that edit.
    public struct KeptFields: Sendable, Hashable {
        /// The record.
        public var id: PersistentIdentifier
        /// The fields' names (stored names), in schema order.
        public var fields: [String]

        /// Fields `fields` of record `id`.
        public init(id: PersistentIdentifier, fields: [String]) {
            self.id = id
            self.fields = fields
        }
    }

    /// Records the group changed that another writer deleted since: their part was skipped.
    public var deletedRecords: [PersistentIdentifier] = []
    /// Fields that another writer changed since the group's save: they keep that writer's value.
    public var keptFields: [KeptFields] = []
    /// Records the group inserted that another writer changed since (the fields that no longer hold what the group
    /// wrote): the undo kept them instead of deleting them, with that writer's values.
    public var keptRecords: [KeptFields] = []

    /// A result with nothing left alone.
    public init() {}

    /// Whether the undo (or redo) set everything back: nothing was deleted or changed by another writer.
    public var isComplete: Bool { deletedRecords.isEmpty && keptFields.isEmpty && keptRecords.isEmpty }
}

/// The checks of one undo (or redo) save, shared with the writers of its stores (see ``ModelUndoManager``).
final class UndoApplication {
    /// The values the undone save wrote, by record and field index: a field is set back only while it holds them.
    var expected: [PersistentIdentifier: [Int: SQLiteValue]] = [:]
    /// Updated records that no longer exist (skipped).
    var deletedRecords: [PersistentIdentifier] = []
    /// Fields left alone because they no longer hold what the undone save wrote.
    var keptFields: [UndoResult.KeptFields] = []
    /// The values the undone saves left in records they inserted, by record: such a record is deleted only while it
    /// holds them.
    var inserted: [PersistentIdentifier: [SQLiteValue]] = [:]
    /// Inserted records left alone because fields of theirs no longer hold what the undone saves wrote.
    var keptRecords: [UndoResult.KeptFields] = []
}
