// Workload steps: device operations (insert, update, delete, re-insert, relationship edits, unique-key collisions,
// encrypted edits; and, in WorkloadCopies.swift, delete and re-insert in one save, copies of one record, stale copies,
// batch deletes) made through each process's ModelContext; every save checked against the local reference model
// (LocalSaves.swift), and the reference model's record of what was acknowledged.

import Foundation
@_spi(Simulation) import Replica

enum WorkloadOperation: Int, CaseIterable {
    case insert, update, delete, reinsert, relationshipEdit, uniqueCollision, encryptedEdit
    case deleteReinsert, copies, staleCopy, batchDelete, reopen, linkEdit, undo, redo, unversionedOpen

    var name: String {
        switch self {
        case .insert: return "insert"
        case .update: return "update"
        case .delete: return "delete"
        case .reinsert: return "reinsert"
        case .relationshipEdit: return "relationship-edit"
        case .uniqueCollision: return "unique-collision"
        case .encryptedEdit: return "encrypted-edit"
        case .deleteReinsert: return "delete-reinsert"
        case .copies: return "copies"
        case .staleCopy: return "stale-copy"
        case .batchDelete: return "batch-delete"
        case .reopen: return "reopen"
        case .linkEdit: return "link-edit"
        case .undo: return "undo"
        case .redo: return "redo"
        case .unversionedOpen: return "unversioned-open"
        }
    }
}

extension Schema.Attribute {
    var isEncrypted: Bool { options.contains(.allowsCloudEncryption) }
    var isUnique: Bool { options.contains(.unique) }
}

extension SimulationRun {
    /// The pool of record IDs that operations on `entity` in `store` pick from (synced stores share one pool
    /// across devices; local stores have one per device).
    func poolKey(_ store: Scenario.Store, _ entity: String, device: SimDevice) -> String {
        store.isSynced ? "s|\(store.name)|\(entity)" : "l|\(device.index)|\(store.name)|\(entity)"
    }

    /// The (store, entity) pairs an operation can apply to on `process`.
    private func targets(for operation: WorkloadOperation, on process: SimProcess) -> [(Scenario.Store, Schema.Entity)] {
        if let cached = process.workloadTargets[operation.rawValue] { return cached }
        var result: [(Scenario.Store, Schema.Entity)] = []
        for store in process.stores {
            for entity in process.view.entities(of: store) {
                switch operation {
                case .relationshipEdit: if entity.toOneRelationships.isEmpty { continue }
                case .linkEdit: if manyToManySlots(of: entity, on: process).isEmpty { continue }
                case .uniqueCollision: if !entity.attributes.contains(where: \.isUnique) { continue }
                case .encryptedEdit: if !entity.attributes.contains(where: \.isEncrypted) { continue }
                case .reopen:
                    // One target per synced store (not per entity), of processes whose stores all outlive their container.
                    if store.kind != .synced || !process.stores.allSatisfy(usesFile)
                        || entity.name != process.view.entities(of: store).first?.name { continue }
                case .unversionedOpen:
                    // One target per local store, of processes whose stores are all files, in scenarios with a plan.
                    if scenario.migration == nil || store.isSynced || !process.stores.allSatisfy(usesFile)
                        || entity.name != process.view.entities(of: store).first?.name { continue }
                default: break
                }
                result.append((store, entity))
            }
        }
        process.workloadTargets[operation.rawValue] = result
        return result
    }

    func workloadStep() throws {
        let device = devices[try dice.below(devices.count)]
        let process = device.processes[try dice.below(device.processes.count)]
        var operation = WorkloadOperation(rawValue: try dice.pick(workloadWeights)) ?? .insert
        var candidates = targets(for: operation, on: process)
        if candidates.isEmpty {
            operation = .insert
            candidates = targets(for: .insert, on: process)
        }
        let (store, entity) = candidates[try dice.below(candidates.count)]
        var outcome = Outcome(operation: operation, process: process, store: store, entity: entity)
        defer { report(outcome) }
        guard process.isUp, let context = process.context else {
            outcome.result = "skipped: process down"
            return
        }
        stats.workloadOperations += 1
        // The single-change operations are checked against the local reference model only in scenarios that use the
        // later operations (checking every save costs about a third of a run): elsewhere their acknowledgement and the
        // end checks cover them.
        let checks = checksEverySave
        let info = process.view.info(entity)
        let access = info.access
        let pool = poolKey(store, entity.name, device: device)
        switch operation {
        case .insert, .uniqueCollision:
            let values = try newRecordValues(entity, store: store, process: process, collide: operation == .uniqueCollision)
            if operation == .uniqueCollision, let holders = try uniqueKeyHolders(entity, values: values, process: process), !holders.isEmpty {
                try upsertStep(&outcome, context: context, values: values, holders: holders, checks: checks)
                return
            }
            let baseline = checks ? try saveBaseline(store, on: process) : nil
            let id = access.insert(context, id: .unassigned, values: values)
            outcome.record = id
            let expected = ExpectedRecord(id: id, entity: info, before: nil, after: values, causalLengthBefore: store.isSynced ? 0 : nil,
                                          changes: [.insert])
            if try saveChecked(&outcome, context: context, records: [expected], baseline: baseline, operation: operation.name) {
                pools[pool, default: []].append(id)
                aliases[id] = store.isSynced ? "\(entity.name)#\(pools[pool]!.count - 1)" : "\(entity.name)@\(device.name)#\(pools[pool]!.count - 1)"
                try acknowledge(&outcome, kind: .insert, id: id, values: values, changed: Array(info.fieldNames.indices), before: nil)
                wakeEngines(outcome)
            }
        case .reinsert:
            guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
            outcome.record = id
            guard try access.values(context, id: id) == nil else { outcome.result = "still alive here"; return }
            let values = try newRecordValues(entity, store: store, process: process, collide: false)
            let length = checks ? try ledgerCausalLength(id, store: store, on: process) : nil
            let baseline = checks ? try saveBaseline(store, on: process) : nil
            _ = access.insert(context, id: id, values: values)
            let expected = ExpectedRecord(id: id, entity: info, before: nil, after: values, causalLengthBefore: length, changes: [.insert])
            if try saveChecked(&outcome, context: context, records: [expected], baseline: baseline, operation: operation.name) {
                try acknowledge(&outcome, kind: .insert, id: id, values: values, changed: Array(info.fieldNames.indices), before: nil)
                wakeEngines(outcome)
            }
        case .delete:
            guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
            outcome.record = id
            guard let before = try access.values(context, id: id) else { outcome.result = "not here"; return }
            let length = checks ? try ledgerCausalLength(id, store: store, on: process) : nil
            let baseline = checks ? try saveBaseline(store, on: process) : nil
            context.delete(PersistentIdentifier(entityName: entity.name, id: id))
            let expected = ExpectedRecord(id: id, entity: info, before: before, after: nil, causalLengthBefore: length, changes: [.delete])
            if try saveChecked(&outcome, context: context, records: [expected], baseline: baseline, operation: operation.name) {
                try acknowledge(&outcome, kind: .delete, id: id, values: [], changed: [], before: nil)
                wakeEngines(outcome)
            }
        case .update, .encryptedEdit, .relationshipEdit:
            guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
            outcome.record = id
            guard let before = try access.values(context, id: id) else { outcome.result = "not here"; return }
            var values = before
            let fieldNames = info.fieldNames
            if operation == .relationshipEdit {
                let relationships = entity.toOneRelationships
                let relationship = relationships[try dice.below(relationships.count)]
                let index = fieldNames.firstIndex(of: relationship.name)!
                values[index] = try parentReference(relationship, store: store, process: process)
            } else {
                let eligible = entity.attributes.enumerated().filter { operation == .encryptedEdit ? $0.element.isEncrypted : true }
                let count = 1 + (try dice.below(min(scenario.workload.maxFieldsPerUpdate, eligible.count)))
                for _ in 0..<count {
                    let (index, attribute) = eligible[try dice.below(eligible.count)]
                    values[index] = try newValue(attribute, store: store, collide: false)
                }
            }
            let changed = values.indices.filter { values[$0] != before[$0] }
            guard !changed.isEmpty else { outcome.result = "no change"; return }
            outcome.fields = changed.map { fieldNames[$0] }
            let length = checks ? try ledgerCausalLength(id, store: store, on: process) : nil
            let baseline = checks ? try saveBaseline(store, on: process) : nil
            // The edit starts from the copy just read, so it names it: `update(_:)` alone cannot tell a fresh copy
            // that sets a field back to a value this context saved before from a stale copy with an edit (R3a's
            // ambiguous case); the copies and stale-copy operations exercise `update(_:)` itself.
            access.update(context, id: id, values: values, from: before)
            let expected = ExpectedRecord(id: id, entity: info, before: before, after: values, causalLengthBefore: length, changes: [.update])
            if try saveChecked(&outcome, context: context, records: [expected], baseline: baseline, operation: operation.name) {
                try acknowledge(&outcome, kind: .update, id: id, values: values, changed: changed, before: before)
                wakeEngines(outcome)
            }
        case .deleteReinsert:
            try deleteReinsertStep(&outcome, context: context, pool: pool)
        case .copies:
            try copiesStep(&outcome, context: context, pool: pool)
        case .staleCopy:
            try staleCopyStep(&outcome, context: context, pool: pool)
        case .batchDelete:
            try batchDeleteStep(&outcome, context: context, pool: pool)
        case .reopen:
            try reopenStep(&outcome)
        case .linkEdit:
            try linkEditStep(&outcome, context: context, pool: pool)
        case .undo, .redo:
            try undoStep(&outcome, context: context, pool: pool, redo: operation == .redo)
        case .unversionedOpen:
            try unversionedOpenStep(&outcome)
        }
    }

    /// The many-to-many relationships of `entity` in `process`'s schema, with their slot among the entity's to-many
    /// relationships (the dynamic model's members).
    func manyToManySlots(of entity: Schema.Entity, on process: SimProcess) -> [(slot: Int, relationship: Schema.Relationship)] {
        entity.relationships.filter(\.isToMany).enumerated().compactMap { slot, relationship in
            guard let destination = process.view.schema.entity(named: relationship.destination),
                  relationship.inverse.flatMap(destination.relationship(named:))?.isToMany == true else { return nil }
            return (slot, relationship)
        }
    }

    /// Adds a link from a record to a record of the relationship's destination (from the shared pool), or removes one
    /// it has. Links are not tracked by the reference model: the convergence invariant compares every device's links
    /// with the link sets the cloud's records carry.
    private func linkEditStep(_ outcome: inout Outcome, context: ModelContext, pool: String) throws {
        let access = outcome.process.view.info(outcome.entity).access
        // (Records of the shared pool may not have reached this device yet: up to four draws find one that has.)
        var picked: (id: UUID, members: [[UUID]])?
        for _ in 0..<4 {
            guard let id = try pickRecord(pool) else { outcome.result = "no record yet"; return }
            outcome.record = id
            if let members = try access.members(context, id: id) { picked = (id, members); break }
        }
        guard let (id, found) = picked else { outcome.result = "not here"; return }
        var members = found
        let slots = manyToManySlots(of: outcome.entity, on: outcome.process)
        let (slot, relationship) = slots[try dice.below(slots.count)]
        outcome.fields = [relationship.name]
        let current = members[slot]
        if !current.isEmpty, try dice.below(3) == 0 {
            let removed = current[try dice.below(current.count)]
            members[slot] = current.filter { $0 != removed }
            outcome.result = "removed \(alias(removed))"
        } else {
            let targets = poolKey(outcome.store, relationship.destination, device: outcome.process.device)
            let destination = outcome.process.view.info(outcome.process.view.schema.entity(named: relationship.destination)!).access
            var chosen: UUID?
            for _ in 0..<4 {
                guard let target = try pickRecord(targets) else { outcome.result = "no target yet"; return }
                if try destination.values(context, id: target) != nil { chosen = target; break }
            }
            guard let target = chosen else { outcome.result = "target not here"; return }
            guard !current.contains(target) else { outcome.result = "already linked"; return }
            members[slot] = current + [target]
            outcome.result = "added \(alias(target))"
        }
        let result = outcome.result
        guard try access.setMembers(context, id: id, slot: slot, members: members[slot]) else { outcome.result = "not here"; return }
        if try save(&outcome, context: context) {
            outcome.result = result
            wakeEngines(outcome)
        }
    }

    struct Outcome {
        var operation: WorkloadOperation
        var process: SimProcess
        var store: Scenario.Store
        var entity: Schema.Entity
        var record: UUID?
        var fields: [String] = []
        var result = "ok"
        /// What the save undoes, for the undo model (`nil`: a save the model does not follow, see WorkloadUndo.swift).
        var undoGroup: [UndoRecord]?
    }

    func report(_ outcome: Outcome) {
        let record = outcome.record.map(alias) ?? outcome.entity.name
        let fields = outcome.fields.isEmpty ? "" : " [\(outcome.fields.joined(separator: ", "))]"
        // As `note(_:)` words it, in one string.
        witness.append("\(step). \(outcome.operation.name) \(record)\(fields) on \(outcome.process.label) (\(outcome.store.name)): \(outcome.result)")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", outcome.operation.name)
            line.add("process", outcome.process.label)
            line.add("store", outcome.store.name)
            line.add("entity", outcome.entity.name)
            line.add("record", outcome.record.map(alias))
            if !outcome.fields.isEmpty { line.add("fields", outcome.fields) }
            line.add("result", outcome.result)
        }
    }

    /// Saves; returns whether the save committed (acknowledged).
    func save(_ outcome: inout Outcome, context: ModelContext) throws -> Bool {
        let process = outcome.process
        do {
            try context.save()
        } catch let simulated as SimulatedCrash {
            outcome.result = "crash \(simulated.point)"
            context.rollback()
            crash(process, reason: simulated.point, restartAfter: process.pendingRestartDelay)
            return false
        } catch let error as ReplicaError {
            context.rollback()
            switch error {
            case let .modelValidationFailure(failures):
                stats.rejectedSaves += 1
                outcome.result = "rejected: " + failures.map { failure -> String in
                    switch failure {
                    case .uniqueConstraintViolation: return "unique key taken"
                    case .duplicateIdentifier: return "duplicate ID"
                    case .deleteDenied: return "delete denied"
                    case .missingRequiredRelationship: return "missing relationship"
                    case .unrepresentableValue: return "unrepresentable value"
                    }
                }.joined(separator: ", ")
                return false
            case .recordNotFound:
                stats.rejectedSaves += 1
                outcome.result = "rejected: record gone"
                return false
            default:
                // A typed refusal is a legitimate answer when the simulator corrupted the store's bookkeeping.
                if wasCorrupted(process.device, outcome.store.name) {
                    stats.rejectedSaves += 1
                    outcome.result = "rejected: \(error)"
                    return false
                }
                throw InvariantViolation(.unexpectedError, "\(process.label) save of \(outcome.operation.name) threw \(error)")
            }
        } catch {
            context.rollback()
            throw InvariantViolation(.unexpectedError, "\(process.label) save of \(outcome.operation.name) threw \(error)")
        }
        stats.acknowledgedSaves += 1
        noteUndoableSave(outcome, context: context)
        return true
    }

    /// After a save: the store's engines on the device (both processes of an app-group store) have work.
    func wakeEngines(_ outcome: Outcome) {
        for sibling in outcome.process.device.processes where sibling.isUp {
            if let engine = sibling.engines[outcome.store.name] {
                if runtimesDrive { noteLocalSave(engine) }
                enqueuePump(engine)
            }
        }
    }

    /// Records an acknowledged write in the reference model (and checks its stamps against what the device had seen).
    /// - Parameter causalLength: for a delete that the same save followed by a re-insert of the ID: the causal length
    ///   the delete reached (the ledger holds the re-insert's by now).
    func acknowledge(_ outcome: inout Outcome, kind: AckWrite.Kind, id: UUID, values: [SQLiteValue], changed: [Int],
                     before: [SQLiteValue]?, causalLength ended: Int64? = nil, checksClock: Bool = true) throws {
        let store = outcome.store
        let entity = outcome.entity
        let device = outcome.process.device
        let info = outcome.process.view.info(entity)
        let names = info.fieldNames
        if !store.isSynced {
            let key = "\(device.index)/\(store.name)"
            var model = reference.localStores[key] ?? LocalStoreModel()
            switch kind {
            case .insert: model.insert(entity: entity.name, id: id, values: values)
            case .update: model.update(entity: entity.name, id: id, values: values)
            case .delete: model.delete(entity: entity.name, id: id, schema: device.schema)
            }
            reference.localStores[key] = model
            for index in changed where !values[index].isNull {
                if case .text = values[index] { reference.localOnlyValues.insert(values[index]) }
                if case .blob = values[index] { reference.localOnlyValues.insert(values[index]) }
            }
            return
        }
        guard let engine = outcome.process.engines[store.name] else {
            if outcome.process.syncOff.contains(store.name) {
                noteOffSyncWrite(outcome.process, store: store, entity: info, id: id, kind: kind, changed: changed)
            }
            return
        }
        if kind == .delete, let ended {
            let storeKey = "\(device.index)/\(store.name)"
            reference.ownCausalLength[storeKey, default: [:]][id] = max(ended, reference.ownCausalLength[storeKey]?[id] ?? 0)
            reference.record(zone: store.name, id: id, write: AckWrite(kind: .delete, causalLength: ended, fields: [], step: step, device: device.name))
            return
        }
        // (Only the causal length and stamps are checked: read without the rest of the ledger row.)
        guard let state = try engine.engine.replicationStamps(of: id) else {
            throw InvariantViolation(.noLostWrites, "\(outcome.process.label): the acknowledged \(kind.rawValue) of \(alias(id)) has no ledger entry")
        }
        // A device's own operations on a record never go back: an insert of a record it deleted orders after the delete.
        let storeKey = "\(device.index)/\(store.name)"
        if let previous = reference.ownCausalLength[storeKey]?[id],
           state.causalLength < previous || (kind == .insert && state.causalLength <= previous) {
            throw InvariantViolation(.noLostWrites, "\(outcome.process.label): the acknowledged \(kind.rawValue) of \(alias(id)) got causal length "
                + "\(state.causalLength), not after the \(previous) of this store's own earlier write: it would lose to it")
        }
        reference.ownCausalLength[storeKey, default: [:]][id] = max(state.causalLength, reference.ownCausalLength[storeKey]?[id] ?? 0)
        if kind == .delete {
            guard state.causalLength % 2 != 1 else {
                throw InvariantViolation(.noLostWrites, "\(outcome.process.label): the acknowledged delete of \(alias(id)) left it alive in the ledger")
            }
            reference.record(zone: store.name, id: id, write: AckWrite(kind: .delete, causalLength: state.causalLength, fields: [],
                                                                       step: step, device: device.name))
            return
        }
        if checksClock, let index = changed.first, let stamp = state.stamps[names[index]] {
            try checkClock(stamp, device: device, store: store.name, record: id, engine: engine)
        }
        var fields: [(name: String, stamp: FieldStamp, value: SQLiteValue, isAttribute: Bool)] = []
        for index in changed {
            let name = names[index]
            guard let stamp = state.stamps[name] else {
                throw InvariantViolation(.noLostWrites, "\(outcome.process.label): the acknowledged \(kind.rawValue) of \(alias(id)).\(name) got no stamp")
            }
            // Only attribute values identify their write (a reference value is just the parent's ID).
            let attribute = info.attributes[index]
            let isAttribute = attribute != nil
            if isAttribute, let before, let seen = reference.writerStamp(zone: store.name, id: id, field: name, value: before[index]), stamp <= seen {
                throw InvariantViolation(.noLostWrites, "\(outcome.process.label) wrote \(alias(id)).\(name) after seeing an earlier write of it, "
                    + "but its stamp orders before that write (\(stamp) <= \(seen)): the newer write would lose")
            }
            fields.append((name, stamp, values[index], isAttribute))
            if let attribute, attribute.isEncrypted, !values[index].isNull {
                reference.encryptedPlaintexts[store.name, default: []].append(values[index])
            }
        }
        reference.record(zone: store.name, id: id, write: AckWrite(kind: kind, causalLength: state.causalLength, fields: fields,
                                                                   step: step, device: device.name))
    }

    // MARK: Values

    /// A record of the pool: choice 0 is the newest, and recent records are picked more often (users keep editing
    /// what they just created).
    func pickRecord(_ pool: String) throws -> UUID? {
        guard let ids = pools[pool], !ids.isEmpty else { return nil }
        return ids[ids.count - 1 - (try dice.skewed(ids.count - 1, small: 2, probability: 0.5))]
    }

    /// Values for a new record: every attribute gets a fresh value, every to-one relationship maybe a live parent.
    func newRecordValues(_ entity: Schema.Entity, store: Scenario.Store, process: SimProcess, collide: Bool) throws -> [SQLiteValue] {
        var values: [SQLiteValue] = []
        for attribute in entity.attributes { values.append(try newValue(attribute, store: store, collide: collide)) }
        for relationship in entity.toOneRelationships {
            values.append(try dice.chance(0.8) ? try parentReference(relationship, store: store, process: process) : .null)
        }
        return values
    }

    /// A reference to a record of the relationship's destination that is alive on the process's device, or null.
    private func parentReference(_ relationship: Schema.Relationship, store: Scenario.Store, process: SimProcess) throws -> SQLiteValue {
        guard let context = process.context, let destination = process.view.schema.entity(named: relationship.destination),
              let id = try pickRecord(poolKey(store, destination.name, device: process.device)) else { return .null }
        let access = process.view.info(destination).access
        return try access.values(context, id: id) != nil ? id.sqliteValue : .null
    }

    /// `count` bytes of `unit` repeated (the last copy cut short), built by doubling: a large value costs a few
    /// copies, not a closure call per byte.
    static func repeated(_ unit: [UInt8], count: Int) -> Data {
        var data = Data(unit.prefix(count))
        data.reserveCapacity(count)
        while data.count < count { data.append(data.prefix(min(data.count, count - data.count))) }
        return data
    }

    /// A value no other write of the run produces (except booleans and nulls), so values identify their writes.
    func newValue(_ attribute: Schema.Attribute, store: Scenario.Store, collide: Bool) throws -> SQLiteValue {
        if attribute.isOptional, scenario.workload.nullPercent > 0, try dice.chance(Double(scenario.workload.nullPercent) / 100) {
            return .null
        }
        valueSerial += 1
        let n = valueSerial
        switch attribute.type {
        case .string:
            if attribute.isUnique {
                if collide { return .text("\(store.name)-key\(try dice.below(scenario.workload.uniqueKeys))@collide.example") }
                return .text("u\(n)@example.com")
            }
            if attribute.isEncrypted { return .text("secret-\(n);") }
            return .text(store.isSynced ? "v\(n);" : "local-\(n);")
        case .integer:
            return .integer(Int64(1_000 + n))
        case .double:
            return .real(Double(n) + 0.5)
        case .date:
            return .real(Double(1_767_225_600 + n))
        case .bool:
            return .integer(Int64(n % 2))
        case .data:
            // A unique key of a colliding insert: one of a small shared pool of values (external ones 512 bytes, so
            // they are stored in files and compared by reference), marked as a shared key as text keys are.
            let unit = attribute.isUnique && collide ? Array("\(store.name)-key\(try dice.below(scenario.workload.uniqueKeys))@collide.example;".utf8)
                : Array("blob-\(n);".utf8)
            guard attribute.options.contains(.externalStorage) else { return .blob(Data((0..<24).map { unit[$0 % unit.count] })) }
            let percent = scenario.workload.largeAssetPercent
            if percent > 0, !(attribute.isUnique && collide), try dice.chance(Double(percent) / 100) {
                let sizes = Scenario.Workload.largeAssetSizes
                return .blob(Self.repeated(unit, count: sizes[try dice.below(sizes.count)]))
            }
            return .blob(Data((0..<512).map { unit[$0 % unit.count] }))
        case .uuid:
            return .blob(Data(repeating: UInt8(truncatingIfNeeded: n), count: 16))
        case .url:
            return .text("https://example.com/\(n)")
        case .composite:
            return .text("{\"n\":\(n)}")
        }
    }
}
