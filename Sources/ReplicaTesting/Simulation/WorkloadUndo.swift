// The undo and redo operations: each process's context has a `ModelUndoManager` in scenarios that use them, and the
// simulator keeps a model of its stacks. Every save of the context pushes a group; the saves of the simple operations
// (insert, re-insert, delete, update and encrypted edit of a record of an entity without relationships or unique
// attributes) are modelled record by record, every other one is a group the model does not follow. An undo or redo
// step is predicted only in the simple cases (one process, its own records, nothing written to them since):
// - with an edit left pending first, `undo()` saves it as its own group and undoes that group (the record ends as it
//   was before the edit; the save before it stays undoable), and `redo()` saves it, which clears the redo stack, so
//   nothing is redone;
// - without one, the newest modelled group is applied when each of its records is still as the group left it (read
//   through the observer); a group the model does not follow, or one whose records changed since, is not undone: the
//   step clears the manager's history instead (`removeAllActions()`).
// Every save an undo or redo makes is acknowledged like any other write, so the end checks (reference model, no lost
// writes, convergence) cover them; the records' rows are checked right after the call (invariant `local-saves`).

import Foundation
@_spi(Simulation) import Replica

/// One record an undo group moves: applying the group takes it from `from` to `to` (`nil`: no row).
struct UndoRecord {
    let store: Scenario.Store
    let entity: SimEntity
    let id: UUID
    let from: [SQLiteValue]?
    let to: [SQLiteValue]?

    /// The move back.
    var reversed: UndoRecord { UndoRecord(store: store, entity: entity, id: id, from: to, to: from) }
}

extension SimulationRun {
    /// Whether the model predicts undoing a change of a record of `entity`: no relationships (delete rules, parents and
    /// links an undo does not always restore) and no unique attribute (an undo may find its key taken meanwhile).
    func undoable(_ entity: Schema.Entity) -> Bool {
        entity.relationships.isEmpty && !entity.attributes.contains(where: \.isUnique)
    }

    /// The moves of a save of the simple operations that leaves `records`, or `nil` (a save the model does not follow).
    func undoGroup(of records: [ExpectedRecord], outcome: Outcome) -> [UndoRecord]? {
        guard usesUndo, [.insert, .reinsert, .delete, .update, .encryptedEdit].contains(outcome.operation), records.count == 1,
              let record = records.first, undoable(record.entity.entity), record.before != record.after else { return nil }
        return [UndoRecord(store: outcome.store, entity: record.entity, id: record.id, from: record.before, to: record.after)]
    }

    /// After a committed save of the process's own context: the manager pushed a group (a new change clears redo).
    func noteUndoableSave(_ outcome: Outcome, context: ModelContext) {
        let process = outcome.process
        guard usesUndo, context === process.context else { return }
        process.undoStack.append(outcome.undoGroup.map { $0.reversed().map(\.reversed) })
        process.redoStack.removeAll()
    }

    /// `undo()` or `redo()` on the process's context, variant 1 with an edit of a record left pending first.
    func undoStep(_ outcome: inout Outcome, context: ModelContext, pool: String, redo: Bool) throws {
        let process = outcome.process
        guard let manager = context.undoManager, let observer = observer(of: process) else { outcome.result = "no undo manager"; return }
        let verb = redo ? "redo" : "undo"
        var pending: UndoRecord?
        if try dice.below(2) == 1, undoable(outcome.entity), let id = try pickRecord(pool) {
            let info = process.view.info(outcome.entity)
            if let before = try info.access.values(context, id: id) {
                let attributes = outcome.entity.attributes
                let index = try dice.below(attributes.count)
                var after = before
                after[index] = try newValue(attributes[index], store: outcome.store, collide: false)
                if after != before {
                    info.access.update(context, id: id, values: after, from: before)
                    pending = UndoRecord(store: outcome.store, entity: info, id: id, from: before, to: after)
                    outcome.record = id
                    outcome.fields = [info.fieldNames[index]]
                }
            }
        }
        // What the call must apply after saving the pending edit.
        var group: [UndoRecord] = []
        if let pending {
            if !redo { group = [pending.reversed] }
        } else {
            guard let top = (redo ? process.redoStack : process.undoStack).last else { outcome.result = "nothing to \(verb)"; return }
            var current = top != nil
            for record in top ?? [] where try record.entity.access.values(observer, id: record.id) != record.from {
                current = false
                break
            }
            guard current, let top else {
                manager.removeAllActions()
                process.undoStack = []
                process.redoStack = []
                outcome.result = top == nil ? "newest group not modelled: history cleared" : "changed since: history cleared"
                return
            }
            group = top
            outcome.record = top.first?.id
            outcome.entity = top.first?.entity.entity ?? outcome.entity
            outcome.store = top.first?.store ?? outcome.store
        }
        do {
            if redo { try manager.redo() } else { try manager.undo() }
        } catch let simulated as SimulatedCrash {
            outcome.result = "crash \(simulated.point)"
            context.rollback()
            // The pending edit's own save may have committed before the crash: then it was written.
            if let pending, try pending.entity.access.values(observer, id: pending.id) == pending.to {
                try acknowledgeMove(&outcome, pending)
            }
            crash(process, reason: simulated.point, restartAfter: process.pendingRestartDelay)
            return
        } catch {
            context.rollback()
            throw InvariantViolation(.unexpectedError, "\(process.label) \(verb)() threw \(error)")
        }
        stats.acknowledgedSaves += 1
        func check(_ record: UndoRecord, _ what: String) throws {
            let row = try record.entity.access.values(observer, id: record.id)
            guard row != record.to else { return }
            let label = "\(process.label) store '\(record.store.name)', \(verb)\(pending == nil ? "" : " with an edit pending")"
            guard let row, let expected = record.to else {
                throw InvariantViolation(.localSaves, "\(label): \(alias(record.id)) \(row == nil ? "has no row" : "still has a row"); \(what) must leave "
                    + (record.to == nil ? "none" : "one"))
            }
            let index = row.indices.first { row[$0] != expected[$0] }!
            let name = record.entity.fieldNames[index]
            let encrypted = record.entity.entity.attribute(named: name)?.isEncrypted ?? false
            throw InvariantViolation(.localSaves, "\(label): \(alias(record.id)).\(name) is \(show(row[index], encrypted: encrypted)), not "
                + "\(show(expected[index], encrypted: encrypted)) (\(what))")
        }
        if let pending {
            // Saved as its own group first. (Undone at once, it is not acknowledged on its own: the undo's save
            // overwrote its stamps before any upload could read them; the undo's write is.)
            if redo {
                try check(pending, "the pending edit saved, nothing redone")
                try acknowledgeMove(&outcome, pending)
            }
            if redo {
                process.undoStack.append([pending.reversed])
                process.redoStack.removeAll()
            } else {
                process.redoStack.append([pending])
            }
        } else if redo {
            process.redoStack.removeLast()
            process.undoStack.append(group.reversed().map(\.reversed))
        } else {
            process.undoStack.removeLast()
            process.redoStack.append(group.reversed().map(\.reversed))
        }
        for record in group {
            try check(record, pending != nil ? "the pending edit undone" : "the newest group \(verb)ne")
            try acknowledgeMove(&outcome, record)
        }
        outcome.result = pending == nil ? "\(verb)ne" : (redo ? "saved the pending edit, nothing to redo" : "undid the pending edit")
        wakeEngines(outcome)
    }

    /// Acknowledges the write that moved `record` (an insert, a delete or an update of the fields that differ).
    func acknowledgeMove(_ outcome: inout Outcome, _ record: UndoRecord) throws {
        var move = outcome
        move.store = record.store
        move.entity = record.entity.entity
        switch (record.from, record.to) {
        case let (nil, to?):
            try acknowledge(&move, kind: .insert, id: record.id, values: to, changed: Array(record.entity.fieldNames.indices), before: nil)
        case (.some, nil):
            try acknowledge(&move, kind: .delete, id: record.id, values: [], changed: [], before: nil)
        case let (from?, to?):
            try acknowledgeUpdate(&move, id: record.id, before: from, after: to)
        case (nil, nil):
            break
        }
    }
}
