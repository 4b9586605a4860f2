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
/// **Limits.** To-one references a delete rule nullified are not restored. An undo that cannot be saved (a unique key taken meanwhile, a record
/// deleted by another writer) throws the save's error, keeps the group on its stack and leaves the changes pending
/// on the context (``ModelContext/rollback()`` them).
///
/// Not `Sendable`: it belongs to its context's isolation domain.
public final class ModelUndoManager {
    /// One record change of an undo group, in the form that undoes it.
    fileprivate enum Step {
        case delete(PersistentIdentifier)
        case insert(Snapshot)
        case update(Snapshot, fields: Set<Int>)
    }

    /// The inverse of one or more saves, applied in order.
    fileprivate struct Group {
        var steps: [Step] = []
    }

    private var undoStack: [Group] = []
    private var redoStack: [Group] = []
    private var openGroup: Group?
    private var openLevels = 0
    /// The context whose ``ModelContext/undoManager`` this is (set by that property).
    weak var context: ModelContext?
    private enum Mode { case normal, undoing, redoing }
    private var mode = Mode.normal

    /// Whether each save outside an explicit group is one undo group (the default). When `false`, only saves inside
    /// ``beginUndoGrouping()`` / ``endUndoGrouping()`` are recorded.
    public var groupsByEvent = true
    /// The most undo groups kept (the oldest are dropped first); 0 keeps every group.
    public var levelsOfUndo = 0 {
        didSet { trim() }
    }

    public init() {}

    /// Whether there is a group to undo.
    public var canUndo: Bool { !undoStack.isEmpty }
    /// Whether there is an undone group to redo.
    public var canRedo: Bool { !redoStack.isEmpty }
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

    /// Closes the group ``beginUndoGrouping()`` opened. Traps without an open group (a programming error).
    public func endUndoGrouping() {
        precondition(openLevels > 0, "Replica: endUndoGrouping() without beginUndoGrouping()")
        openLevels -= 1
        if openLevels == 0, let group = openGroup {
            openGroup = nil
            if !group.steps.isEmpty { push(group) }
        }
    }

    /// Undoes the newest group on the context this manager is the ``ModelContext/undoManager`` of: one save of the
    /// group's inverse. Nothing without a group. Traps while a group is open, or when the manager belongs to no
    /// context (programming errors).
    /// Unsaved changes on the context are saved first, as their own group, and that group is the one undone.
    /// - Throws: the save's error (of the unsaved changes: nothing is undone, they stay pending; of the inverse: the
    ///   group stays to be undone and its inverse stays pending on the context).
    public func undo() throws {
        precondition(openLevels == 0, "Replica: undo() while an undo group is open; call endUndoGrouping() first")
        let context = attachedContext()
        if context.hasChanges && !context.container.environment.canaries.contains(.undoDropsPendingEdit) { try context.save() }
        guard let group = undoStack.last else { return }
        mode = .undoing
        defer { mode = .normal }
        try apply(group, to: context)
        undoStack.removeLast()
    }

    /// Redoes the newest undone group: one save of the undo's inverse. Nothing without one. Traps as ``undo()``.
    /// Unsaved changes on the context are saved first: a new change, which clears the redo stack as any save does,
    /// so nothing is redone then.
    /// - Throws: the save's error; the group stays to be redone.
    public func redo() throws {
        precondition(openLevels == 0, "Replica: redo() while an undo group is open; call endUndoGrouping() first")
        let context = attachedContext()
        if context.hasChanges { try context.save() }
        guard let group = redoStack.last else { return }
        mode = .redoing
        defer { mode = .normal }
        try apply(group, to: context)
        redoStack.removeLast()
    }

    /// Forgets every undo and redo group.
    public func removeAllActions() {
        undoStack.removeAll()
        redoStack.removeAll()
        openGroup = openGroup.map { _ in Group() }
    }

    private func attachedContext() -> ModelContext {
        guard let context else { preconditionFailure("Replica: this ModelUndoManager is no context's undoManager") }
        return context
    }

    private func apply(_ group: Group, to context: ModelContext) throws {
        for step in group.steps {
            switch step {
            case let .delete(id): context.delete(id)
            case let .insert(snapshot): context.registerInsert(snapshot)
            case let .update(snapshot, fields): context.registerUpdate(snapshot, fields: fields)
            }
        }
        try context.save()
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
        if mode == .normal, openLevels > 0 {
            openGroup?.steps.insert(contentsOf: steps, at: 0)
            return
        }
        if mode == .normal && !groupsByEvent { return }
        push(Group(steps: steps))
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
            for field in fields where field < before.count { restored.values[field] = before[field] }
            if let links { restored.toManyMembers = links }
            steps.append(.update(restored, fields: fields))
        }
        for snapshot in changes.inserted.reversed() { steps.append(.delete(snapshot.persistentModelID)) }
        for record in changes.deleted.reversed() where !record.values.isEmpty {
            steps.append(.insert(Snapshot(entityName: record.id.entityName, id: record.id.id, values: record.values,
                                          toManyMembers: record.links)))
        }
        return steps
    }
}
