// A store reopened under another configuration than last time: the app closes its container (gracefully: engines
// give up the upload lease) and opens it again with sync turned off for a synced store, or on again, or with field
// encryption configured for a store that had none. Only processes whose stores are all files: an in-memory store
// lives as long as its container.
//
// Writes made while a store's sync is off have no engine to acknowledge them to; they are acknowledged when sync is
// turned on again (at a later reopen, or at heal), from what the ledger holds then: a synced store must upload what it
// holds once sync is on (R3: records saved while the store was opened local-only are adopted as inserts), and updates
// and deletes made meanwhile must not be lost either.

import Foundation
@_spi(Simulation) import Replica

/// What a process wrote to a synced store while its sync was off, per record (acknowledged when sync is on again).
struct OffSyncWrite {
    let entity: SimEntity
    /// Inserted while off (the record had no live row before).
    var inserted = false
    /// Deleted (last) while off.
    var deleted = false
    /// Field positions updated while off.
    var updated = Set<Int>()
}

extension SimulationRun {
    /// Reopens the process's container: variant 0 with the same configuration, 1 with the store's sync turned off
    /// (or on again, when it is off), 2 with field encryption configured for the store.
    func reopenStep(_ outcome: inout Outcome) throws {
        let process = outcome.process, store = outcome.store
        let variant = try dice.below(3)
        var syncOff = process.syncOff, encryptionOn = process.encryptionOn
        switch variant {
        case 1:
            if syncOff.remove(store.name) == nil { syncOff.insert(store.name) }
            outcome.result = syncOff.contains(store.name) ? "sync turned off" : "sync turned on"
        case 2:
            encryptionOn.insert(store.name)
            outcome.result = "encryption configured"
        default:
            outcome.result = "same configuration"
        }
        try reopen(process, syncOff: syncOff, encryptionOn: encryptionOn)
    }

    /// Closes `process`'s container gracefully and opens it again with sync off for `syncOff` and field encryption
    /// for `encryptionOn`; then acknowledges what was written while sync was off to each store whose sync is on again.
    func reopen(_ process: SimProcess, syncOff: Set<String>, encryptionOn: Set<String>) throws {
        close(process)
        let turnedOn = process.syncOff.subtracting(syncOff)
        process.syncOff = syncOff
        process.encryptionOn = encryptionOn
        trace.event(now, "reopen") { line in
            line.add("process", process.label)
            line.add("sync_off", syncOff.sorted())
            line.add("encryption", encryptionOn.sorted())
        }
        try start(process)
        for store in process.stores where turnedOn.contains(store.name) { try acknowledgeOffSyncWrites(process, store) }
        for engine in orderedEngines(process) { enqueuePump(engine) }
    }

    /// Drops `process`'s engines, context, live queries and container (a graceful close: the stores' file locks go with them).
    /// Closing a closed process does nothing.
    func close(_ process: SimProcess) {
        for engine in orderedEngines(process) { engines[engine.serial] = nil }
        process.engines = [:]
        process.context = nil
        process.observer = nil
        process.keptCopy = nil
        // The live queries hold the context and the container too (``start(_:)`` makes new ones).
        observers.byProcess[ObjectIdentifier(process)] = nil
        process.container = nil
    }

    /// Notes a write to a synced store whose sync is off on `process` (see ``OffSyncWrite``).
    func noteOffSyncWrite(_ process: SimProcess, store: Scenario.Store, entity: SimEntity, id: UUID, kind: AckWrite.Kind, changed: [Int]) {
        var write = process.offSyncWrites[store.name]?[id] ?? OffSyncWrite(entity: entity)
        switch kind {
        case .insert:
            write.inserted = true
            write.deleted = false
            write.updated = []
        case .update: write.updated.formUnion(changed)
        case .delete: write.deleted = true
        }
        if process.offSyncWrites[store.name]?[id] == nil { process.offSyncOrder[store.name, default: []].append(id) }
        process.offSyncWrites[store.name, default: [:]][id] = write
    }

    /// Acknowledges, now that `store` syncs again on `process`, the writes made while it did not: each record as it
    /// is now (an insert of every field, an update of the fields changed, or a delete), with the stamps the ledger
    /// holds now.
    func acknowledgeOffSyncWrites(_ process: SimProcess, _ store: Scenario.Store) throws {
        let order = process.offSyncOrder[store.name] ?? []
        let writes = process.offSyncWrites[store.name] ?? [:]
        process.offSyncOrder[store.name] = nil
        process.offSyncWrites[store.name] = nil
        guard let context = process.context else { return }
        for id in order {
            guard let write = writes[id] else { continue }
            var outcome = Outcome(operation: .reopen, process: process, store: store, entity: write.entity.entity)
            outcome.record = id
            let row = try write.entity.access.values(context, id: id)
            if write.deleted || row == nil {
                // (A record both created and deleted while sync was off left nothing to sync.)
                guard try ledgerCausalLength(id, store: store, on: process) ?? 0 > 0 else { continue }
                try acknowledge(&outcome, kind: .delete, id: id, values: [], changed: [], before: nil)
            } else if let row, write.inserted {
                try acknowledge(&outcome, kind: .insert, id: id, values: row, changed: Array(write.entity.fieldNames.indices), before: nil,
                                checksClock: false)
            } else if let row, !write.updated.isEmpty {
                try acknowledge(&outcome, kind: .update, id: id, values: row, changed: write.updated.sorted(), before: nil, checksClock: false)
            }
        }
    }
}
