// The conflict-log check (invariant `conflict-log`, R16 in Specs/replication-protocol.md): every local write that a
// merge discarded before the cloud held it is in the conflict log of the store that wrote it.
//
// From the acknowledged writes and the versions the cloud saved alone, not from the library's merge: an acknowledged
// attribute write whose stamp no cloud version ever carried never reached the cloud. Once every store has converged
// on what the cloud holds, such a write is gone from every store. Its own device may have removed it (a later write of
// the field, a delete, a re-insert, a delete rule of its own delete) — otherwise a merge discarded it, and the log
// must name the record with the write's stamp, or the record's loss as a duplicate of a unique key.
//
// Writes whose value does not identify them (booleans, null, shared unique keys) are left out: a remote write of an
// equal value is not a loss. Records of entities that a delete rule cascades to are left out once their device
// acknowledged any delete at or after the write (the cascade removed them without a write of their own), as are
// writes a zone erase may have lost and records exempt from the checks (see BookkeepingFaults.swift).

import Foundation
@_spi(Simulation) import Replica

extension SimulationRun {
    func checkConflictLog(_ views: [String: StoreView]) throws {
        var cascadeTargets = Set<String>()
        for device in devices {
            for entity in device.schema.entities {
                for relationship in entity.relationships where relationship.deleteRule == .cascade {
                    cascadeTargets.insert(relationship.destination)
                }
            }
        }
        for zone in zones {
            let seen = reference.cloudStamps[zone] ?? [:]
            let losers = Set((reference.absorbed[zone] ?? [:]).values.flatMap { $0.map(\.id) })
            // Per device name: the lost writes, in record order.
            var expected: [String: [(id: UUID, field: String, stamp: FieldStamp, step: Int)]] = [:]
            for (id, acks) in (reference.acks[zone] ?? [:]).sorted(by: { uuidPrecedes($0.key, $1.key) }) where !losers.contains(id) {
                for write in acks where write.kind != .delete && !write.mayBeLost {
                    let own = acks.filter { $0.device == write.device }
                    if own.contains(where: { $0.kind == .delete && $0.step >= write.step }) { continue }
                    if own.contains(where: { $0.kind == .insert && $0.causalLength > write.causalLength }) { continue }
                    for field in write.fields where field.isAttribute && field.value.isIdentifying {
                        if seen[id]?.contains(field.stamp) == true { continue }
                        if own.contains(where: { later in later.fields.contains { $0.name == field.name && $0.stamp > field.stamp } }) { continue }
                        expected[write.device, default: []].append((id, field.name, field.stamp, write.step))
                    }
                }
            }
            for device in devices {
                guard let lost = expected[device.name], !lost.isEmpty,
                      let view = views[viewKey(device, zone)],
                      let engine = device.processes.first?.engines[zone]?.engine else { continue }
                let deletes = reference.deleteSteps[zone]?[device.name] ?? []
                let log = try engine.conflictLog(limit: 1_000_000)
                for loss in lost {
                    if let entity = view.states[loss.id]?.id.entityName, cascadeTargets.contains(entity),
                       deletes.contains(where: { $0 >= loss.step }) { continue }
                    if log.contains(where: { $0.id.id == loss.id && ($0.localStamp == loss.stamp || $0.field == "*") }) { continue }
                    throw InvariantViolation(.conflictLog, "\(device.name)'s write of \(alias(loss.id)).\(loss.field) at step \(loss.step) "
                        + "(stamp \(loss.stamp)) never reached the cloud and is gone after convergence, but its conflict log has no entry for it")
                }
            }
        }
    }
}
