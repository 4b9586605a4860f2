// App updates during a run (`Scenario.Upgrade`): a device starts at an older schema version and, at a chaos step,
// every process of it closes its container gracefully and opens it again at the device's own version. Local stores
// then rename the columns of renamed attributes (original names) and add new ones; synced stores add columns. The
// update draws nothing from the tape, so scenarios without one run exactly as before.
//
// The local reference model holds rows in the old version's field order: it is carried over to the new order here,
// each field through the attribute it belongs to (a renamed attribute keeps its values), new fields with their
// declared default (what the store's new column holds for existing rows).

import Foundation
import Replica

extension SimulationRun {
    /// Updates every device whose update is due at `step`.
    func upgradeDevices(atStep step: Int) throws {
        for device in devices {
            guard let upgrade = device.spec.upgrade, upgrade.atStep == step, device.schemaVersion == upgrade.fromVersion else { continue }
            try self.upgrade(device, to: device.spec.schemaVersion)
        }
    }

    /// Moves `device` to schema `version`: the new schema for every process, the local reference model in the new
    /// field order, and each running process's container reopened (a process that is down restarts at the new version).
    func upgrade(_ device: SimDevice, to version: Int) throws {
        let old = device.view, oldVersion = device.schemaVersion
        let new = SchemaView(scenario.librarySchema(version: version))
        for store in device.spec.stores.compactMap(scenario.store(named:)) where !store.isSynced {
            let key = viewKey(device, store.name)
            guard var model = reference.localStores[key] else { continue }
            for entity in new.entities(of: store) {
                guard let rows = model.rows[entity.name], let oldEntity = old.schema.entity(named: entity.name) else { continue }
                let oldNames = old.info(oldEntity).fieldNames
                let info = new.info(entity)
                let sources = info.fieldNames.map { name in
                    oldNames.firstIndex(of: previousName(of: name, entity: entity.name, from: version, to: oldVersion))
                }
                var moved: [UUID: [SQLiteValue]] = [:]
                for (id, row) in rows {
                    moved[id] = sources.enumerated().map { index, source in source.map { row[$0] } ?? info.defaults[index] }
                }
                model.rows[entity.name] = moved
            }
            applyStages(&model, view: new, from: oldVersion, to: version)
            reference.localStores[key] = model
        }
        device.view = new
        device.schemaVersion = version
        note("update \(device.name) from schema v\(oldVersion) to v\(version)")
        trace.event(now, "upgrade") { line in
            line.add("device", device.name)
            line.add("from", oldVersion)
            line.add("to", version)
        }
        for process in device.processes {
            process.view = new
            process.workloadTargets = Array(repeating: nil, count: WorkloadOperation.allCases.count)
        }
        // Every running process closes before any opens again: a store whose columns are renamed is migrated under
        // the exclusive store lock, which the library refuses while another process of the device holds the store
        // (`ReplicaError.storeInUse`). (An armed crash would fire while the container opens: the update is a clean
        // close and open.)
        let running = device.processes.filter(\.isUp)
        for process in running {
            process.faults.disarm()
            close(process)
        }
        try noPlanOpenBeforeUpdate(device)
        for process in running { try reopen(process, syncOff: process.syncOff, encryptionOn: process.encryptionOn) }
    }

    /// The name field `name` of `entity` (as schema `version` declares it to the library) had in schema `earlier`: a
    /// renamed attribute's earlier name in a local-only store; any other field's own name.
    func previousName(of name: String, entity: String, from version: Int, to earlier: Int) -> String {
        let locallyRenamed = scenario.localEntities.contains(entity)
        guard let attribute = scenario.schema.entity(named: entity)?.attributes.first(where: {
            $0.storedName(version: version, locallyRenamed: locallyRenamed).name == name
        }) else { return name }
        return attribute.storedName(version: earlier, locallyRenamed: locallyRenamed).name
    }
}
