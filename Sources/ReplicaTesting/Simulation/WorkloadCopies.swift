// Workload operations beyond one change per save: delete and re-insert in one save, several copies of one record
// (in one context and across contexts), stale copies saved late, and batch deletes beside inserts of the same IDs.
// Each save is checked against the local reference model (LocalSaves.swift) before it is acknowledged.

import Foundation
@_spi(Simulation) import Replica

extension SimulationRun {
    /// Saves `context` and, when it committed, checks `records` against the local reference model (`baseline` nil:
    /// no check, see ``checksEverySave``).
    /// - Returns: whether the save committed.
    func saveChecked(_ outcome: inout Outcome, context: ModelContext, records: [ExpectedRecord], baseline: SaveBaseline?,
                     operation: String) throws -> Bool {
        outcome.undoGroup = undoGroup(of: records, outcome: outcome)
        guard try save(&outcome, context: context) else { return false }
        guard baseline != nil else { return true }
        try checkLocalSave(records, operation: operation, store: outcome.store, process: outcome.process, baseline: baseline)
        return true
    }

    /// An attribute index of `entity`, drawn (0: the first attribute).
    private func attributeIndex(_ info: SimEntity) throws -> Int {
        try dice.below(info.entity.attributes.count)
    }

    // MARK: Delete and re-insert in one save

    /// Deletes a live record and inserts its ID again with new values, in one save: a new incarnation.
    func deleteReinsertStep(_ outcome: inout Outcome, context: ModelContext, pool: String) throws {
        let info = outcome.process.view.info(outcome.entity)
        guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
        outcome.record = id
        guard let before = try info.access.values(context, id: id) else { outcome.result = "not here"; return }
        let store = outcome.store, process = outcome.process
        let length = try ledgerCausalLength(id, store: store, on: process)
        let baseline = try saveBaseline(store, on: process)
        let values = try newRecordValues(outcome.entity, store: store, process: process, collide: false)
        context.delete(PersistentIdentifier(entityName: outcome.entity.name, id: id))
        _ = info.access.insert(context, id: id, values: values)
        let expected = ExpectedRecord(id: id, entity: info, before: before, after: values, causalLengthBefore: length,
                                      changes: [.delete, .insert])
        guard try saveChecked(&outcome, context: context, records: [expected], baseline: baseline, operation: "delete and re-insert") else { return }
        try acknowledge(&outcome, kind: .delete, id: id, values: [], changed: [], before: nil, causalLength: length.map { $0 + 1 })
        try acknowledge(&outcome, kind: .insert, id: id, values: values, changed: Array(info.fieldNames.indices), before: nil)
        wakeEngines(outcome)
    }

    // MARK: Several copies of one record

    /// Two copies of one live record, each with one attribute changed: variant 0 registers both in one context and
    /// saves once (both edits land; the later registration wins a field both changed); variant 1 edits the second
    /// copy in another context of the process and saves it first, then saves the first copy (which must not
    /// revert the other context's edit).
    func copiesStep(_ outcome: inout Outcome, context: ModelContext, pool: String) throws {
        let info = outcome.process.view.info(outcome.entity)
        let store = outcome.store, process = outcome.process
        let acrossContexts = try dice.below(2) == 1
        guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
        outcome.record = id
        guard let before = try info.access.values(context, id: id) else { outcome.result = "not here"; return }
        let first = try attributeIndex(info), second = try attributeIndex(info)
        var copyA = before
        copyA[first] = try newValue(info.entity.attributes[first], store: store, collide: false)
        outcome.fields = [info.fieldNames[first], info.fieldNames[second]]
        if !acrossContexts {
            guard var copyB = try info.access.values(context, id: id) else { outcome.result = "not here"; return }
            copyB[second] = try newValue(info.entity.attributes[second], store: store, collide: false)
            // (A copy whose drawn value equals the one read is unedited: it changes nothing, R3a.)
            var expected = before
            expected[first] = copyA[first]
            if copyB[second] != before[second] { expected[second] = copyB[second] }
            let length = try ledgerCausalLength(id, store: store, on: process)
            let baseline = try saveBaseline(store, on: process)
            info.access.update(context, id: id, values: copyA)
            info.access.update(context, id: id, values: copyB)
            let record = ExpectedRecord(id: id, entity: info, before: before, after: expected, causalLengthBefore: length,
                                        changes: expected == before ? [] : [.update])
            guard try saveChecked(&outcome, context: context, records: [record], baseline: baseline, operation: "two copies in one save") else { return }
            if expected != before { try acknowledgeUpdate(&outcome, id: id, before: before, after: expected) }
            wakeEngines(outcome)
            return
        }
        guard let container = process.container else { outcome.result = "skipped: process down"; return }
        let other = ModelContext(container)
        guard var copyB = try info.access.values(other, id: id) else { outcome.result = "not here"; return }
        copyB[second] = try newValue(info.entity.attributes[second], store: store, collide: false)
        var afterOther = before
        afterOther[second] = copyB[second]
        let length = try ledgerCausalLength(id, store: store, on: process)
        let baseline = try saveBaseline(store, on: process)
        info.access.update(other, id: id, values: copyB)
        let record = ExpectedRecord(id: id, entity: info, before: before, after: afterOther, causalLengthBefore: length,
                                    changes: afterOther == before ? [] : [.update])
        guard try saveChecked(&outcome, context: other, records: [record], baseline: baseline, operation: "a copy saved in another context") else { return }
        if afterOther != before { try acknowledgeUpdate(&outcome, id: id, before: before, after: afterOther) }
        wakeEngines(outcome)
        // The first context's copy is stale now in the field the other context changed. (Unedited, it changes nothing:
        // this context saved no newer version, so the copy is read as the version it was read from, R3a.)
        var expected = afterOther
        if copyA[first] != before[first] { expected[first] = copyA[first] }
        let secondBaseline = try saveBaseline(store, on: process)
        info.access.update(context, id: id, values: copyA)
        let stale = ExpectedRecord(id: id, entity: info, before: afterOther, after: expected, causalLengthBefore: length,
                                   changes: expected == afterOther ? [] : [.update])
        outcome.result = "ok, then"
        guard try saveChecked(&outcome, context: context, records: [stale], baseline: secondBaseline,
                              operation: "a copy read before another context saved") else { return }
        outcome.result = "ok"
        if expected != afterOther { try acknowledgeUpdate(&outcome, id: id, before: afterOther, after: expected) }
        wakeEngines(outcome)
    }

    // MARK: Stale copies

    /// A copy saved after the record changed. Variant 0: the context reads a copy, then saves an edit of another
    /// copy of the record, then saves an edit of the first copy (which must not revert the saved edit). Variant 1:
    /// the first time, the process keeps a copy; the next time, it edits that copy and saves it, whatever happened
    /// to the record meanwhile (other operations, sync).
    func staleCopyStep(_ outcome: inout Outcome, context: ModelContext, pool: String) throws {
        let info = outcome.process.view.info(outcome.entity)
        let store = outcome.store, process = outcome.process
        let late = try dice.below(2) == 1
        if late, let kept = process.keptCopy, kept.store == store.name {
            // The kept copy's entity, whatever this step drew.
            let keptInfo = kept.entity
            outcome.entity = keptInfo.entity
            outcome.record = kept.id
            process.keptCopy = nil
            let index = try attributeIndex(keptInfo)
            outcome.fields = [keptInfo.fieldNames[index]]
            guard let observer = observer(of: process), let current = try keptInfo.access.values(observer, id: kept.id) else {
                outcome.result = "record gone since the copy was read"
                return
            }
            var copy = kept.values
            copy[index] = try newValue(keptInfo.entity.attributes[index], store: store, collide: false)
            // (An unedited copy equal to an older version than the context's newest could set edits back, R3a; which
            // ones depends on versions the model does not follow.)
            guard copy != kept.values else { outcome.result = "no change"; return }
            var expected = current
            expected[index] = copy[index]
            let length = try ledgerCausalLength(kept.id, store: store, on: process)
            let baseline = try saveBaseline(store, on: process)
            keptInfo.access.update(context, id: kept.id, values: copy)
            let record = ExpectedRecord(id: kept.id, entity: keptInfo, before: current, after: expected, causalLengthBefore: length,
                                        changes: expected == current ? [] : [.update])
            guard try saveChecked(&outcome, context: context, records: [record], baseline: baseline, operation: "a copy kept since an earlier step") else { return }
            if expected != current { try acknowledgeUpdate(&outcome, id: kept.id, before: current, after: expected) }
            wakeEngines(outcome)
            return
        }
        guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
        outcome.record = id
        guard let stale = try info.access.values(context, id: id) else { outcome.result = "not here"; return }
        if late {
            process.keptCopy = KeptCopy(store: store.name, entity: info, id: id, values: stale)
            outcome.result = "kept a copy"
            return
        }
        let first = try attributeIndex(info), second = try attributeIndex(info)
        outcome.fields = [info.fieldNames[first], info.fieldNames[second]]
        guard var fresh = try info.access.values(context, id: id) else { outcome.result = "not here"; return }
        fresh[first] = try newValue(info.entity.attributes[first], store: store, collide: false)
        let length = try ledgerCausalLength(id, store: store, on: process)
        let baseline = try saveBaseline(store, on: process)
        info.access.update(context, id: id, values: fresh)
        let record = ExpectedRecord(id: id, entity: info, before: stale, after: fresh, causalLengthBefore: length,
                                    changes: fresh == stale ? [] : [.update])
        guard try saveChecked(&outcome, context: context, records: [record], baseline: baseline, operation: "an edit saved after a copy was read") else { return }
        if fresh != stale { try acknowledgeUpdate(&outcome, id: id, before: stale, after: fresh) }
        wakeEngines(outcome)
        var copy = stale
        copy[second] = try newValue(info.entity.attributes[second], store: store, collide: false)
        var expected = fresh
        expected[second] = copy[second]
        // An unedited stale copy equals the version it was read from, older than the one this context saved: it sets
        // that save's edit back (R3a, as a toggle saved and toggled back is written).
        if copy == stale { expected = stale }
        let secondBaseline = try saveBaseline(store, on: process)
        info.access.update(context, id: id, values: copy)
        let late2 = ExpectedRecord(id: id, entity: info, before: fresh, after: expected, causalLengthBefore: length,
                                   changes: expected == fresh ? [] : [.update])
        outcome.result = "ok, then"
        guard try saveChecked(&outcome, context: context, records: [late2], baseline: secondBaseline,
                              operation: "a copy read before the same context saved another edit") else { return }
        outcome.result = "ok"
        if expected != fresh { try acknowledgeUpdate(&outcome, id: id, before: fresh, after: expected) }
        wakeEngines(outcome)
    }

    // MARK: Batch deletes beside inserts of the same IDs

    /// `delete(model:where:)` selecting up to three live records of the entity, with the first of them inserted again
    /// after it (variant 0: a re-insert, a new incarnation), or a new record and a re-insert of a dead ID registered
    /// before it and selected by it (variant 1: both inserts are taken back).
    func batchDeleteStep(_ outcome: inout Outcome, context: ModelContext, pool: String) throws {
        let info = outcome.process.view.info(outcome.entity)
        let store = outcome.store, process = outcome.process
        let insertsFirst = try dice.below(2) == 1
        let count = 1 + (try dice.below(3))
        var selected: [UUID] = []
        var rows: [[SQLiteValue]] = []
        for _ in 0..<count {
            guard let id = try pickRecord(pool), !selected.contains(id), let row = try info.access.values(context, id: id) else { continue }
            selected.append(id)
            rows.append(row)
        }
        guard let firstID = selected.first else { outcome.result = "no live record here"; return }
        outcome.record = firstID
        let baseline = try saveBaseline(store, on: process)
        var records: [ExpectedRecord] = []
        for (id, row) in zip(selected, rows) {
            records.append(ExpectedRecord(id: id, entity: info, before: row, after: nil,
                                          causalLengthBefore: try ledgerCausalLength(id, store: store, on: process), changes: [.delete]))
        }
        var reinserted: [SQLiteValue]?
        if insertsFirst {
            // A new record and (when the pool has one) a dead ID, inserted, then selected by the batch delete.
            let fresh = info.access.insert(context, id: .unassigned, values: try newRecordValues(outcome.entity, store: store, process: process, collide: false))
            records.append(ExpectedRecord(id: fresh, entity: info, before: nil, after: nil, causalLengthBefore: store.isSynced ? 0 : nil, changes: []))
            if let dead = try pickRecord(pool), !selected.contains(dead), try info.access.values(context, id: dead) == nil {
                let length = try ledgerCausalLength(dead, store: store, on: process)
                _ = info.access.insert(context, id: dead, values: try newRecordValues(outcome.entity, store: store, process: process, collide: false))
                records.append(ExpectedRecord(id: dead, entity: info, before: nil, after: nil, causalLengthBefore: length, changes: []))
                selected.append(dead)
            }
            selected.append(fresh)
            let deleted = try info.access.batchDelete(context, ids: selected)
            outcome.result = "ok"
            outcome.fields = ["\(deleted) selected"]
        } else {
            let deleted = try info.access.batchDelete(context, ids: selected)
            let values = try newRecordValues(outcome.entity, store: store, process: process, collide: false)
            _ = info.access.insert(context, id: firstID, values: values)
            records[0].after = values
            records[0].changes = [.delete, .insert]
            reinserted = values
            outcome.fields = ["\(deleted) selected"]
        }
        guard try saveChecked(&outcome, context: context, records: records, baseline: baseline,
                              operation: insertsFirst ? "inserts, then a batch delete selecting them" : "a batch delete, then a re-insert") else { return }
        for record in records where !record.changes.isEmpty {
            try acknowledge(&outcome, kind: .delete, id: record.id, values: [], changed: [], before: nil,
                            causalLength: record.causalLengthBefore.map { $0 + 1 })
        }
        if let reinserted {
            try acknowledge(&outcome, kind: .insert, id: firstID, values: reinserted, changed: Array(info.fieldNames.indices), before: nil)
        }
        wakeEngines(outcome)
    }

    /// Acknowledges an update from `before` to `after` (the fields that differ).
    func acknowledgeUpdate(_ outcome: inout Outcome, id: UUID, before: [SQLiteValue], after: [SQLiteValue]) throws {
        let changed = after.indices.filter { after[$0] != before[$0] }
        guard !changed.isEmpty else { return }
        try acknowledge(&outcome, kind: .update, id: id, values: after, changed: changed, before: before)
    }
}

/// A copy of a record a process keeps to save later (the late variant of the stale-copy operation).
struct KeptCopy {
    let store: String
    let entity: SimEntity
    let id: UUID
    let values: [SQLiteValue]
}

extension SimulationRun {
    // MARK: Upserts of unique keys

    /// The live local records of `entity` that hold one of the unique keys of `values` (a unique attribute's non-null
    /// value), read through the process's observer; `nil` without one.
    func uniqueKeyHolders(_ entity: Schema.Entity, values: [SQLiteValue], process: SimProcess) throws -> [(id: UUID, values: [SQLiteValue])]? {
        guard let observer = observer(of: process) else { return nil }
        let info = process.view.info(entity)
        let unique = entity.attributes.filter { $0.options.contains(.unique) }.compactMap { info.fieldNames.firstIndex(of: $0.name) }
        let keys = unique.filter { !values[$0].isNull }
        guard !keys.isEmpty else { return [] }
        return try info.access.all(observer).filter { record in keys.contains { record.values[$0] == values[$0] } }
    }

    /// Inserts a record whose unique key live records hold: with one holder, the save updates it with every field of
    /// the insert (an upsert: the holder keeps its identity, the inserted ID never exists); with several, the insert is
    /// ambiguous and the save is refused.
    func upsertStep(_ outcome: inout Outcome, context: ModelContext, values: [SQLiteValue],
                    holders: [(id: UUID, values: [SQLiteValue])], checks: Bool) throws {
        let info = outcome.process.view.info(outcome.entity)
        let inserted = info.access.insert(context, id: .unassigned, values: values)
        guard holders.count == 1, let holder = holders.first else {
            outcome.record = inserted
            if try save(&outcome, context: context) {
                throw InvariantViolation(.localSaves, "\(outcome.process.label) store '\(outcome.store.name)': an insert of a unique key "
                    + "\(holders.count) records hold was saved; it must be refused as ambiguous")
            }
            return
        }
        outcome.record = holder.id
        let store = outcome.store, process = outcome.process
        let length = checks ? try ledgerCausalLength(holder.id, store: store, on: process) : nil
        let baseline = checks ? try saveBaseline(store, on: process) : nil
        let changed = values.indices.filter { values[$0] != holder.values[$0] }
        outcome.fields = changed.map { info.fieldNames[$0] }
        let expected = ExpectedRecord(id: holder.id, entity: info, before: holder.values, after: values, causalLengthBefore: length,
                                      changes: changed.isEmpty ? [] : [.update])
        let gone = ExpectedRecord(id: inserted, entity: info, before: nil, after: nil, causalLengthBefore: store.isSynced ? 0 : nil, changes: [])
        if try saveChecked(&outcome, context: context, records: [expected, gone], baseline: baseline, operation: "upsert") {
            outcome.result = "upserted"
            try acknowledgeUpdate(&outcome, id: holder.id, before: holder.values, after: values)
            wakeEngines(outcome)
        }
    }
}
