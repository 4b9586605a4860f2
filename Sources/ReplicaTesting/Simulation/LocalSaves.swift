// The reference model of the local API: what one save must leave in the store — rows, the history transaction and,
// in a synced store, each touched record's causal length, outbox flag and stamps — computed from the operations the
// workload registered, not from the library. Checked after every workload save (invariant `local-saves`).
//
// The semantics (Specs/replication-protocol.md, R3 and R5; ModelContext):
// - A save applies the pending changes in registration order.
// - An update writes exactly the fields the app changed relative to the copy it read: a stale copy never reverts a
//   field changed since (by this context or another), and two copies' edits in one save both land (the later
//   registration wins where both changed one field).
// - Deleting a live record and inserting its ID again in one save is a new incarnation: the row exists with the new
//   values, the causal length grows by 2 to an odd number, every field is stamped in the new incarnation, and the
//   history transaction lists the delete, then the insert.
// - A batch delete (`delete(model:where:)`) beside inserts of the same IDs follows registration order too: an insert
//   registered after it re-inserts; an insert registered before it is taken back (the pending insert is deleted).

import Foundation
@_spi(Simulation) import Replica

/// One record a save touched, with what the save must leave.
struct ExpectedRecord {
    enum Change: String { case insert, update, delete }

    let id: UUID
    let entity: SimEntity
    /// The row before the save (`nil`: none).
    var before: [SQLiteValue]?
    /// The row the save must leave (`nil`: none).
    var after: [SQLiteValue]?
    /// The record's causal length in the ledger before the save (0: no ledger entry); `nil` outside synced stores.
    var causalLengthBefore: Int64?
    /// The changes the save's history transaction must list for the record, in order.
    var changes: [Change]

    /// The causal length the changes lead to: a delete of a live record and an insert of a dead (or new) one each add 1.
    var causalLengthAfter: Int64? {
        guard var length = causalLengthBefore else { return nil }
        for change in changes {
            switch change {
            case .delete: if length % 2 == 1 { length += 1 }
            case .insert: if length % 2 == 0 { length += 1 }
            case .update: break
            }
        }
        return length
    }

    /// The fields whose stored value the save changes (what an update's history entry names).
    var changedFields: [String] {
        guard let before, let after else { return [] }
        return entity.fieldNames.indices.filter { before[$0] != after[$0] }.map { entity.fieldNames[$0] }
    }
}

/// What the local-save check reads before a save: the store's newest history token.
struct SaveBaseline {
    let token: HistoryToken
}

extension SimulationRun {
    /// A context of `process` that only reads (rows, history) for the checks, so that the workload's contexts never
    /// register a read they did not make (a read is the base of the next update's change tracking).
    func observer(of process: SimProcess) -> ModelContext? {
        if let observer = process.observer { return observer }
        guard let container = process.container else { return nil }
        let made = ModelContext(container)
        process.observer = made
        return made
    }

    /// The causal length of `id` in `store`'s ledger on `process` (0: none), or `nil` when the store has no engine there.
    func ledgerCausalLength(_ id: UUID, store: Scenario.Store, on process: SimProcess) throws -> Int64? {
        guard store.isSynced, let engine = process.engines[store.name] else { return nil }
        return try engine.engine.replicationStamps(of: id)?.causalLength ?? 0
    }

    /// Reads what the check of the next save of `store` on `process` compares with.
    func saveBaseline(_ store: Scenario.Store, on process: SimProcess) throws -> SaveBaseline? {
        guard let observer = observer(of: process) else { return nil }
        return SaveBaseline(token: try observer.currentHistoryToken(of: configurationName(store.name)))
    }

    /// Checks that the save just committed on `process` left exactly `records` (rows, history and ledger).
    /// - Throws: ``InvariantViolation`` (`local-saves`) naming the record and what differs.
    func checkLocalSave(_ records: [ExpectedRecord], operation: String, store: Scenario.Store, process: SimProcess,
                        baseline: SaveBaseline?) throws {
        guard let observer = observer(of: process) else { return }
        let label = "\(process.label) store '\(store.name)', \(operation)"
        func fail(_ text: String) -> InvariantViolation { InvariantViolation(.localSaves, "\(label): \(text)") }
        for record in records {
            let entity = record.entity.entity
            let actual = try record.entity.access.values(observer, id: record.id)
            switch (record.after, actual) {
            case (nil, nil): break
            case (nil, .some):
                throw fail("\(alias(record.id)) still has a row; the save must leave none")
            case (.some, nil):
                throw fail("\(alias(record.id)) has no row; the save must leave one")
            case let (expected?, row?):
                for (index, name) in record.entity.fieldNames.enumerated() where row[index] != expected[index] {
                    let encrypted = entity.attribute(named: name)?.isEncrypted ?? false
                    let kept = record.before.map { $0[index] == row[index] } ?? false
                    let note = kept ? " (the app's change of it was not written)"
                        : record.before.map { " (before the save: \(show($0[index], encrypted: encrypted)))" } ?? ""
                    throw fail("\(alias(record.id)).\(name) is \(show(row[index], encrypted: encrypted)), not "
                        + "\(show(expected[index], encrypted: encrypted))\(note)")
                }
            }
            guard let expectedLength = record.causalLengthAfter, let engine = process.engines[store.name] else { continue }
            let state = try engine.engine.replicationStamps(of: record.id)
            let length = state?.causalLength ?? 0
            if length != expectedLength {
                let history = record.changes.map(\.rawValue).joined(separator: ", ")
                throw fail("\(alias(record.id)) has causal length \(length) in the ledger; [\(history)] from \(record.causalLengthBefore ?? 0) "
                    + "gives \(expectedLength)\(expectedLength % 2 == 1 && length % 2 == 0 ? " (alive, but the ledger says deleted)" : "")")
            }
            guard let state, !record.changes.isEmpty else { continue }
            if !state.isPending { throw fail("\(alias(record.id)) is not in the outbox after a save that changed it") }
            // Stamps: a new incarnation stamps every field in it; an update stamps the fields it changed.
            let stamped: [String] = record.changes.last == .insert ? record.entity.fieldNames
                : (record.changes == [.update] ? record.changedFields : [])
            for name in stamped where state.stamps[name]?.incarnation != length {
                throw fail("\(alias(record.id)).\(name) has \(state.stamps[name].map { "a stamp of incarnation \($0.incarnation)" } ?? "no stamp") "
                    + "after the save; it must be stamped in incarnation \(length)")
            }
        }
        guard let baseline else { return }
        let transactions = try observer.fetchHistory(HistoryDescriptor(after: baseline.token, storeNames: [configurationName(store.name)]))
        let changed = records.contains { !$0.changes.isEmpty }
        if transactions.count != (changed ? 1 : 0) {
            throw fail("the save added \(transactions.count) history transactions, not \(changed ? 1 : 0)")
        }
        let changes = transactions.first?.changes ?? []
        for record in records {
            let pid = PersistentIdentifier(entityName: record.entity.entity.name, id: record.id)
            let mine = changes.filter { $0.changedPersistentIdentifier == pid }
            let kinds = mine.map { change -> String in
                switch change {
                case .insert: return "insert"
                case .update: return "update"
                case .delete: return "delete"
                }
            }
            let expected = record.changes.map(\.rawValue)
            if kinds != expected {
                throw fail("history lists [\(kinds.joined(separator: ", "))] for \(alias(record.id)), not [\(expected.joined(separator: ", "))]")
            }
            if case let .update(_, fields)? = mine.first, record.changes == [.update], Set(fields) != Set(record.changedFields) {
                throw fail("history names the fields [\(fields.sorted().joined(separator: ", "))] of the update of \(alias(record.id)), "
                    + "not [\(record.changedFields.sorted().joined(separator: ", "))]")
            }
        }
    }
}
