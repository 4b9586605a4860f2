// The check phase: every invariant, in order, over the quiesced world.

import Foundation
@_spi(Simulation) import Replica

/// One device's view of one store after quiescence.
struct StoreView {
    /// Live rows by entity, then ID (values in the device schema's field order).
    var rows: [String: [UUID: [SQLiteValue]]] = [:]
    /// Replication states by ID (synced stores).
    var states: [UUID: ReplicationState] = [:]
    /// Records of types the device's schema does not know.
    var unknownTypes: [UUID: CloudRecord] = [:]
    /// History transactions.
    var history: [HistoryTransaction] = []
    /// Many-to-many links by "Entity.relationship" of the owner side (the side that carries the link sets), then
    /// owner ID: the linked IDs as a set.
    var links: [String: [UUID: Set<UUID>]] = [:]
}

extension SimulationRun {
    func check() throws {
        phase = .check
        trace.event(now, "phase") { $0.add("phase", "check") }
        if !corruptions.isEmpty { try checkUnreadableBookkeeping() }
        if hasOptionChanges { try checkSchemaGate() }
        var views = try collectViews()
        var cloudRecords = zones.reduce(into: [String: [UUID: CloudRecord]]()) { result, zone in
            result[zone] = Dictionary(uniqueKeysWithValues: cloud.records(in: zone).map { ($0.recordID, $0) })
        }
        // Hostile records, corrupted records and the stores of engines that refused to go on are left out (see
        // BookkeepingFaults.swift); nothing is left out of a run without those faults.
        if !corruptions.isEmpty || !hostileIDs.isEmpty || !brokenStores.isEmpty {
            let unconverged = try unconvergedStores()
            for key in unconverged { views[key] = nil }
            for zone in zones {
                let exempt = exemptRecords(zone)
                exemptFromChecks[zone] = exempt
                cloudRecords[zone] = cloudRecords[zone]?.filter { !exempt.contains($0.key) }
                for id in exempt { reference.acks[zone]?[id] = nil }
                for (storeKey, lengths) in reference.ownCausalLength where storeKey.hasSuffix("/\(zone)") {
                    reference.ownCausalLength[storeKey] = lengths.filter { !exempt.contains($0.key) }
                }
            }
        }
        try checkCrashConsistency(views)
        try checkResurrection(views, cloudRecords)
        try checkConvergence(views, cloudRecords)
        try checkLostWrites(cloudRecords)
        try checkReferenceModel(views, cloudRecords)
        try checkReferentialIntegrity(views)
        try checkUniqueKeys(views)
        try checkHistory(views)
        try checkLocalOnly(cloudRecords)
        try checkPlaintext()
        try checkIdempotence(views)
        try checkConflictLog(views)
        trace.event(now, "checked") { $0.add("invariants", Invariant.checkedAtEnd.count + (corruptions.isEmpty ? 0 : 1) + (hasOptionChanges ? 1 : 0)) }
    }

    func viewKey(_ device: SimDevice, _ store: String) -> String { "\(device.index)/\(store)" }

    /// Reads every device's stores (through the app process, which opens all of them). With `before` (the views of
    /// the idempotence check's first read) the views leave out the records of unknown types, which that check does
    /// not compare, and keep the history of `before` when it is provably unchanged (see `storeHistory(_:storeName:unlessUnchangedFrom:)`).
    func collectViews(before: [String: StoreView]? = nil) throws -> [String: StoreView] {
        var views: [String: StoreView] = [:]
        for device in devices {
            guard let process = device.processes.first, let context = process.context else { continue }
            for store in process.stores {
                var view = StoreView()
                for entity in entities(of: store, on: device) {
                    let access = device.info(entity).access
                    let all = try access.all(context)
                    var rows: [UUID: [SQLiteValue]] = [:]
                    rows.reserveCapacity(all.count)
                    for (id, values) in all { rows[id] = values }
                    view.rows[entity.name] = rows
                    for (slot, relationship) in ownedManyToMany(of: entity, on: device) {
                        var links: [UUID: Set<UUID>] = [:]
                        for (id, members) in try access.allMembers(context) where slot < members.count { links[id] = Set(members[slot]) }
                        view.links["\(entity.name).\(relationship.name)"] = links
                    }
                }
                if let engine = process.engines[store.name] {
                    let states = try engine.engine.replicationStates()
                    view.states.reserveCapacity(states.count)
                    for state in states { view.states[state.id.id] = state }
                    if before == nil {
                        for record in try engine.engine.unknownTypeRecords() { view.unknownTypes[record.recordID] = record }
                    }
                }
                let name = configurationName(store.name)
                if let old = before?[viewKey(device, store.name)]?.history {
                    view.history = try storeHistory(context, storeName: name, unlessUnchangedFrom: old)
                } else {
                    view.history = try context.fetchHistory(HistoryDescriptor(storeNames: [name]))
                }
                views[viewKey(device, store.name)] = view
            }
        }
        return views
    }

    /// The values a device holds for a cloud record of `entity`: each field written in the current incarnation,
    /// else the declared default.
    func materialize(_ record: CloudRecord, as entity: SimEntity) -> [SQLiteValue] {
        let current = incarnation(of: record.causalLength)
        return entity.fieldNames.indices.map { index in
            if let field = record.fields[entity.fieldNames[index]], field.stamp.incarnation == current { return field.value }
            return entity.defaults[index]
        }
    }

    /// Whether a device's value agrees with the cloud's: equal, or the cloud holds the asset reference of the
    /// device's bytes (an `.externalStorage` value travels as an asset, R19).
    static func agrees(_ device: SQLiteValue, _ cloud: SQLiteValue) -> Bool { valuesAgree(device, cloud) }

    /// A value for messages: never the value of an encrypted attribute.
    func show(_ value: SQLiteValue, encrypted: Bool) -> String {
        if encrypted && !value.isNull { return "«sealed»" }
        switch value {
        case .null: return "null"
        case let .integer(v): return String(v)
        case let .real(v): return String(v)
        case let .text(v): return JSONLine.quote(String(v.prefix(40)))
        case let .blob(v):
            if let id = uuid(from: v) { return alias(id) }
            return "blob(\(v.count) bytes)"
        }
    }

    // MARK: Crash consistency

    private func checkCrashConsistency(_ views: [String: StoreView]) throws {
        for device in devices {
            guard let process = device.processes.first else { continue }
            for store in process.stores {
                if usesFile(store) { try checkIntegrity(process, store) }
                guard store.isSynced, let view = views[viewKey(device, store.name)] else { continue }
                // (Disagreements are looked for without sorting; only one sorts, to name the first in ID order.)
                func disagrees(_ id: UUID, _ state: ReplicationState) -> Bool {
                    guard let rows = view.rows[state.id.entityName], !isExempt(store.name, id) else { return false }
                    return state.isAlive != (rows[id] != nil)
                }
                for (id, state) in view.states.contains(where: { disagrees($0.key, $0.value) }) ? view.states.sorted(by: { uuidPrecedes($0.key, $1.key) }) : [] {
                    guard let rows = view.rows[state.id.entityName], !isExempt(store.name, id) else { continue }
                    let hasRow = rows[id] != nil
                    if state.isAlive != hasRow {
                        throw InvariantViolation(.crashConsistency, "\(device.name) store '\(store.name)': \(alias(id)) is "
                            + "\(state.isAlive ? "alive" : "deleted") in the sync ledger (causal length \(state.causalLength)) but "
                            + "\(hasRow ? "has" : "has no") row")
                    }
                }
                for id in (reference.ownCausalLength[viewKey(device, store.name)] ?? [:]).keys.sorted(by: uuidPrecedes) where view.states[id] == nil {
                    throw InvariantViolation(.crashConsistency, "\(device.name) store '\(store.name)': the sync ledger forgot \(alias(id)), "
                        + "which this store wrote (a tombstone must be kept)")
                }
                for (entity, rows) in view.rows.sorted(by: { $0.key < $1.key }) {
                    for id in rows.keys.sorted(by: uuidPrecedes) where view.states[id] == nil && !isExempt(store.name, id) {
                        throw InvariantViolation(.crashConsistency, "\(device.name) store '\(store.name)': \(entity) \(alias(id)) has a row but no sync ledger entry")
                    }
                }
            }
        }
    }

    // MARK: Resurrection

    /// Whether some device acknowledged a write of record `id` in `zone`, but none an insert that produced
    /// `causalLength` (the resurrection check's condition, without building the list of acknowledged inserts).
    private func isResurrected(_ zone: String, _ id: UUID, at causalLength: Int64) -> Bool {
        guard let acks = reference.acks[zone]?[id] else { return false }
        return !acks.contains { $0.kind == .insert && $0.causalLength == causalLength }
    }

    private func checkResurrection(_ views: [String: StoreView], _ cloudRecords: [String: [UUID: CloudRecord]]) throws {
        for zone in zones {
            let records = cloudRecords[zone] ?? [:]
            // (Violations are looked for without sorting; only a violation sorts, to name the first in ID order.)
            if records.values.contains(where: { $0.isAlive && isResurrected(zone, $0.recordID, at: $0.causalLength) }) {
                for record in records.values.sorted(by: { uuidPrecedes($0.recordID, $1.recordID) })
                where record.isAlive && isResurrected(zone, record.recordID, at: record.causalLength) {
                    throw InvariantViolation(.noResurrection, "\(alias(record.recordID)) is alive in the cloud at causal length "
                        + "\(record.causalLength), which no acknowledged insert produced (acknowledged: \(describeAcks(zone, record.recordID)))")
                }
            }
            for device in devices where device.spec.stores.contains(zone) {
                guard let view = views[viewKey(device, zone)] else { continue }
                guard view.states.contains(where: { $0.value.isAlive && !isExempt(zone, $0.key) && isResurrected(zone, $0.key, at: $0.value.causalLength) })
                else { continue }
                for (id, state) in view.states.sorted(by: { uuidPrecedes($0.key, $1.key) })
                where state.isAlive && !isExempt(zone, id) && isResurrected(zone, id, at: state.causalLength) {
                    throw InvariantViolation(.noResurrection, "\(alias(id)) is alive on \(device.name) at causal length \(state.causalLength), "
                        + "which no acknowledged insert produced (acknowledged: \(describeAcks(zone, id)))")
                }
            }
        }
    }

    private func describeAcks(_ zone: String, _ id: UUID) -> String {
        let acks = reference.acks[zone]?[id] ?? []
        if acks.isEmpty { return "none" }
        return acks.map { "\($0.kind.rawValue)@\($0.causalLength) by \($0.device) at step \($0.step)" }.joined(separator: ", ")
    }

    // MARK: Convergence

    /// The many-to-many relationships of `entity` whose link sets its records carry (the pair's side whose
    /// (entity, relationship) sorts first), with their slot among the entity's to-many relationships.
    func ownedManyToMany(of entity: Schema.Entity, on device: SimDevice) -> [(slot: Int, relationship: Schema.Relationship)] {
        entity.relationships.filter(\.isToMany).enumerated().compactMap { slot, relationship in
            guard let inverse = relationship.inverse, let destination = device.schema.entity(named: relationship.destination),
                  destination.relationship(named: inverse)?.isToMany == true,
                  (entity.name, relationship.name) < (destination.name, inverse) else { return nil }
            return (slot, relationship)
        }
    }

    /// Convergence of many-to-many links: each live owner links exactly to the present links of its cloud record's
    /// link set whose targets are alive in the cloud (a losing duplicate's winner standing in for it).
    private func checkLinks(of store: Scenario.Store, on device: SimDevice, view: StoreView, records: [UUID: CloudRecord], label: String) throws {
        for entity in entities(of: store, on: device) {
            for (_, relationship) in ownedManyToMany(of: entity, on: device) {
                let links = view.links["\(entity.name).\(relationship.name)"] ?? [:]
                for id in links.keys.sorted(by: uuidPrecedes) {
                    guard let record = records[id], record.isAlive, !isExempt(store.name, id) else { continue }
                    var expected = Set<UUID>()
                    for target in record.linkedRecords(through: relationship.name) ?? [] {
                        var current = target
                        for _ in 0..<16 {
                            guard let other = records[current], other.recordType == relationship.destination else { break }
                            if other.isAlive { expected.insert(current); break }
                            guard let next = other.redirect else { break }
                            current = next
                        }
                    }
                    let actual = links[id] ?? []
                    if actual != expected {
                        let missing = expected.subtracting(actual).map(alias).sorted(), extra = actual.subtracting(expected).map(alias).sorted()
                        throw InvariantViolation(.convergence, "\(label): \(alias(id)).\(relationship.name) links differ from the cloud's link set "
                            + "(missing \(missing), extra \(extra))")
                    }
                }
            }
        }
    }

    private func checkConvergence(_ views: [String: StoreView], _ cloudRecords: [String: [UUID: CloudRecord]]) throws {
        for zone in zones {
            let records = cloudRecords[zone] ?? [:]
            let sortedRecords = records.values.sorted { uuidPrecedes($0.recordID, $1.recordID) }
            var base: (device: SimDevice, view: StoreView)?
            for device in devices where device.spec.stores.contains(zone) {
                guard let store = scenario.store(named: zone), let view = views[viewKey(device, zone)] else { continue }
                let label = "\(device.name) store '\(zone)'"
                // Rows equal the cloud's records.
                for entity in entities(of: store, on: device) {
                    let rows = view.rows[entity.name] ?? [:]
                    let info = device.info(entity)
                    let fieldNames = info.fieldNames
                    for record in sortedRecords where record.recordType == entity.name {
                        let id = record.recordID
                        if record.isAlive {
                            guard let row = rows[id] else {
                                throw InvariantViolation(.convergence, "\(label): \(alias(id)) is alive in the cloud (causal length \(record.causalLength)) but not on the device")
                            }
                            let expected = materialize(record, as: info)
                            for (index, name) in fieldNames.enumerated() where !Self.agrees(row[index], expected[index]) {
                                if record.fields[name]?.isEncrypted == true { continue }
                                let encrypted = entity.attribute(named: name)?.isEncrypted ?? false
                                throw InvariantViolation(.convergence, "\(label): \(alias(id)).\(name) is \(show(row[index], encrypted: encrypted)) "
                                    + "on the device but \(show(expected[index], encrypted: encrypted)) in the cloud")
                            }
                        } else if rows[id] != nil {
                            throw InvariantViolation(.convergence, "\(label): \(alias(id)) is alive on the device but deleted in the cloud (causal length \(record.causalLength))")
                        }
                    }
                    for id in rows.keys.sorted(by: uuidPrecedes) where records[id] == nil && !isExempt(zone, id) {
                        throw InvariantViolation(.convergence, "\(label): \(alias(id)) is on the device but not in the cloud")
                    }
                }
                try checkLinks(of: store, on: device, view: view, records: records, label: label)
                // The ledger equals the cloud (stamps included), known fields and unknown fields alike.
                var knownFields: [String: Set<String>] = [:]
                for record in sortedRecords {
                    let id = record.recordID
                    if let entity = device.schema.entity(named: record.recordType), store.entities.contains(entity.name) {
                        guard let state = view.states[id] else {
                            throw InvariantViolation(.convergence, "\(label): the ledger has no entry for \(alias(id)), which the cloud has")
                        }
                        if state.causalLength != record.causalLength {
                            throw InvariantViolation(.convergence, "\(label): \(alias(id)) has causal length \(state.causalLength) on the device "
                                + "but \(record.causalLength) in the cloud")
                        }
                        let current = incarnation(of: record.causalLength)
                        let known = knownFields[entity.name] ?? {
                            let names = Set(device.info(entity).fieldNames)
                            knownFields[entity.name] = names
                            return names
                        }()
                        // The same comparisons first without building and sorting the name sets; on a difference they run
                        // again in name order, for the message.
                        if record.isAlive && !stampsAgree(state.stamps, record.fields, known: known, incarnation: current) {
                            for name in (Set(state.stamps.keys).union(record.fields.keys.filter { known.contains($0) })).sorted() {
                                let cloudStamp = record.fields[name].flatMap { $0.stamp.incarnation == current ? $0.stamp : nil }
                                if state.stamps[name] != cloudStamp {
                                    throw InvariantViolation(.convergence, "\(label): \(alias(id)).\(name) has stamp \(state.stamps[name].map { "\($0)" } ?? "none") "
                                        + "on the device but \(cloudStamp.map { "\($0)" } ?? "none") in the cloud")
                                }
                            }
                        }
                        if record.isAlive && !unknownFieldsAgree(state.unknownFields, record.fields, known: known, incarnation: current) {
                            let unknownCloud = record.fields.filter { !known.contains($0.key) && $0.value.stamp.incarnation == current }
                            if unknownCloud.mapValues(\.stamp) != state.unknownFields.mapValues(\.stamp) {
                                throw InvariantViolation(.convergence, "\(label): the fields of \(alias(id)) this app version does not know differ "
                                    + "(device: \(state.unknownFields.keys.sorted()), cloud: \(unknownCloud.keys.sorted()))")
                            }
                        }
                    } else if scenario.store(named: zone)?.entities.contains(record.recordType) == true {
                        guard let kept = view.unknownTypes[id], kept.causalLength == record.causalLength else {
                            throw InvariantViolation(.convergence, "\(label): \(alias(id)) of type \(record.recordType), unknown to this app version, "
                                + "is \(view.unknownTypes[id] == nil ? "not kept" : "kept at another causal length")")
                        }
                    }
                }
                for id in view.states.keys.sorted(by: uuidPrecedes) where records[id] == nil && !isExempt(zone, id) {
                    throw InvariantViolation(.convergence, "\(label): the ledger has \(alias(id)), which the cloud does not have")
                }
                // Devices agree with each other on every value (encrypted ones too), as far as both schemas go.
                if let (other, otherView) = base {
                    for entity in entities(of: store, on: device) {
                        guard let otherEntity = other.schema.entity(named: entity.name) else { continue }
                        let mine = view.rows[entity.name] ?? [:]
                        let theirs = otherView.rows[entity.name] ?? [:]
                        let fieldNames = device.info(entity).fieldNames
                        let otherIndices = fieldNames.map(other.info(otherEntity).fieldNames.firstIndex(of:))
                        for id in mine.keys.sorted(by: uuidPrecedes) {
                            guard let row = mine[id], let otherRow = theirs[id], !isExempt(zone, id) else { continue }
                            for (index, name) in fieldNames.enumerated() {
                                guard let otherIndex = otherIndices[index], row[index] != otherRow[otherIndex] else { continue }
                                let encrypted = entity.attribute(named: name)?.isEncrypted ?? false
                                throw InvariantViolation(.convergence, "\(alias(id)).\(name) is \(show(row[index], encrypted: encrypted)) on \(device.name) "
                                    + "but \(show(otherRow[otherIndex], encrypted: encrypted)) on \(other.name)")
                            }
                        }
                    }
                } else {
                    base = (device, view)
                }
            }
        }
    }

    // MARK: Lost writes

    private func checkLostWrites(_ cloudRecords: [String: [UUID: CloudRecord]]) throws {
        for zone in zones {
            for (id, acks) in (reference.acks[zone] ?? [:]).sorted(by: { uuidPrecedes($0.key, $1.key) }) {
                guard let record = cloudRecords[zone]?[id] else {
                    // (Writes of a device that erased the zone's data later survive only where another device held them.)
                    if acks.allSatisfy(\.mayBeLost) { continue }
                    throw InvariantViolation(.noLostWrites, "\(alias(id)) was written (\(describeAcks(zone, id))) but never reached the cloud")
                }
                for ack in acks where !ack.mayBeLost {
                    if record.causalLength < ack.causalLength {
                        throw InvariantViolation(.noLostWrites, "the \(ack.kind.rawValue) of \(alias(id)) by \(ack.device) at step \(ack.step) "
                            + "(causal length \(ack.causalLength)) was lost: the record ended at causal length \(record.causalLength)")
                    }
                    guard record.isAlive, ack.kind != .delete, incarnation(of: record.causalLength) == incarnation(of: ack.causalLength) else { continue }
                    for field in ack.fields {
                        let final = record.fields[field.name]?.stamp
                        if final.map({ $0 < field.stamp }) ?? true {
                            throw InvariantViolation(.noLostWrites, "the write of \(alias(id)).\(field.name) by \(ack.device) at step \(ack.step) was lost "
                                + "(its stamp \(field.stamp), final stamp \(final.map { "\($0)" } ?? "none"))")
                        }
                    }
                }
            }
        }
    }

    // MARK: Reference model

    private func checkReferenceModel(_ views: [String: StoreView], _ cloudRecords: [String: [UUID: CloudRecord]]) throws {
        let full = scenario.schema.schema()
        var cascadeTargets = Set<String>()
        for entity in full.entities {
            for relationship in entity.relationships where relationship.deleteRule == .cascade { cascadeTargets.insert(relationship.destination) }
        }
        for zone in zones {
            let records = cloudRecords[zone] ?? [:]
            // Duplicates of unique keys: each loser became a tombstone that redirects to its winner (R15).
            for record in records.values.sorted(by: { uuidPrecedes($0.recordID, $1.recordID) }) { reference.noteRedirect(zone: zone, record) }
            let redirected = reference.absorbed[zone] ?? [:]
            for record in records.values.sorted(by: { uuidPrecedes($0.recordID, $1.recordID) }) {
                let id = record.recordID
                let acks = reference.acks[zone]?[id] ?? []
                guard let maximum = acks.map(\.causalLength).max() else {
                    throw InvariantViolation(.referenceModel, "\(alias(id)) is in the cloud but no device ever acknowledged writing it")
                }
                let final = record.causalLength
                // Writes of a device that erased the zone's data later (R18) may survive or not: the record ends at the
                // causal length of one of them at most, and at that of the writes that must survive at least.
                if acks.contains(where: \.mayBeLost) {
                    let required = acks.filter { !$0.mayBeLost }.map(\.causalLength).max() ?? 0
                    let reached = acks.contains { $0.causalLength == final || ($0.causalLength + 1 == final && $0.causalLength % 2 == 1
                        && (cascadeTargets.contains(record.recordType) || record.redirect != nil)) }
                    if final < required || !reached {
                        throw InvariantViolation(.referenceModel, "\(alias(id)) ended at causal length \(final); the acknowledged writes "
                            + "(\(describeAcks(zone, id)), some of a device that erased the zone since) give at least \(required)")
                    }
                    if final != maximum && !acks.contains(where: { $0.causalLength == final }) { continue }
                } else if final != maximum {
                    // The only changes no workload operation acknowledges: a delete rule that cascaded, and a duplicate
                    // of a unique key resolved into a tombstone that redirects to the winner.
                    let consequence = final == maximum + 1 && maximum % 2 == 1
                        && (cascadeTargets.contains(record.recordType) || record.redirect != nil)
                    if !consequence {
                        throw InvariantViolation(.referenceModel, "\(alias(id)) ended at causal length \(final); the acknowledged writes "
                            + "(\(describeAcks(zone, id))) give \(maximum)")
                    }
                    continue
                }
                guard record.isAlive, let entity = full.entity(named: record.recordType) else { continue }
                // The winner of a duplicate absorbs the fields of every loser (transitively) by clock, re-stamped into
                // its own incarnation: each loser contributes the writes of the incarnation it ended.
                var losers: [(id: UUID, incarnation: Int64)] = []
                var frontier = redirected[id] ?? []
                var visited: Set<UUID> = [id]
                while let next = frontier.first {
                    frontier.removeFirst()
                    losers.append(next)
                    guard visited.insert(next.id).inserted else { continue }
                    frontier += redirected[next.id] ?? []
                }
                let lenient = acks.contains(where: \.mayBeLost) || losers.contains { reference.acks[zone]?[$0.id]?.contains(where: \.mayBeLost) == true }
                for attribute in entity.attributes {
                    var winner: (stamp: FieldStamp, value: SQLiteValue, ack: AckWrite)?
                    // The candidates, when some may be lost: the stored write must be one of them, and not older than
                    // the newest that must survive (then `winner`).
                    var candidates: [(stamp: FieldStamp, value: SQLiteValue, ack: AckWrite)] = []
                    func consider(_ stamp: FieldStamp, _ value: SQLiteValue, _ ack: AckWrite) {
                        if lenient { candidates.append((stamp, value, ack)) }
                        if lenient && ack.mayBeLost { return }
                        if winner.map({ stamp > $0.stamp }) ?? true { winner = (stamp, value, ack) }
                    }
                    for ack in acks {
                        for field in ack.fields where field.name == attribute.name && field.stamp.incarnation == final {
                            consider(field.stamp, field.value, ack)
                        }
                    }
                    for loser in losers {
                        for ack in reference.acks[zone]?[loser.id] ?? [] {
                            for field in ack.fields where field.name == attribute.name && field.stamp.incarnation == loser.incarnation {
                                consider(FieldStamp(incarnation: final, clock: field.stamp.clock), field.value, ack)
                            }
                        }
                    }
                    let stored = record.fields[attribute.name].flatMap { $0.stamp.incarnation == final ? $0 : nil }
                    if lenient, let stored, let match = candidates.first(where: { $0.stamp == stored.stamp }),
                       winner.map({ $0.stamp <= stored.stamp }) ?? true {
                        winner = match
                    }
                    // (The message text is built only for a violation.)
                    func label() -> String { "\(alias(id)).\(attribute.name)" }
                    if let winner {
                        guard let stored, stored.stamp == winner.stamp else {
                            throw InvariantViolation(.referenceModel, "\(label()) should hold the write by \(winner.ack.device) at step \(winner.ack.step) "
                                + "(stamp \(winner.stamp)) but holds \(stored.map { "the write stamped \($0.stamp)" } ?? "no write")")
                        }
                        if !stored.isEncrypted && !Self.agrees(winner.value, stored.value) {
                            throw InvariantViolation(.referenceModel, "\(label()) holds \(show(stored.value, encrypted: attribute.isEncrypted)) under the stamp "
                                + "of a write of \(show(winner.value, encrypted: attribute.isEncrypted))")
                        }
                    } else if let stored {
                        throw InvariantViolation(.referenceModel, "\(label()) holds a write stamped \(stored.stamp) that no device acknowledged "
                            + "(expected the default \(show(attribute.defaultValue ?? .null, encrypted: attribute.isEncrypted)))")
                    }
                }
            }
        }
        // Local stores: the replay of their acknowledged operations.
        for device in devices {
            for store in device.spec.stores.compactMap(scenario.store(named:)) where !store.isSynced {
                guard let view = views[viewKey(device, store.name)] else { continue }
                let model = reference.localStores[viewKey(device, store.name)] ?? LocalStoreModel()
                for entity in entities(of: store, on: device) {
                    let actual = view.rows[entity.name] ?? [:]
                    let expected = model.rows[entity.name] ?? [:]
                    let fieldNames = device.info(entity).fieldNames
                    for id in Set(actual.keys).union(expected.keys).sorted(by: uuidPrecedes) {
                        guard let row = actual[id] else {
                            throw InvariantViolation(.referenceModel, "\(device.name) local store '\(store.name)' lost \(alias(id))")
                        }
                        guard let wanted = expected[id] else {
                            throw InvariantViolation(.referenceModel, "\(device.name) local store '\(store.name)' has \(alias(id)), which was deleted or never saved")
                        }
                        for (index, name) in fieldNames.enumerated() where row[index] != wanted[index] {
                            throw InvariantViolation(.referenceModel, "\(device.name) local store '\(store.name)': \(alias(id)).\(name) is "
                                + "\(show(row[index], encrypted: false)) instead of \(show(wanted[index], encrypted: false))")
                        }
                    }
                }
            }
        }
    }

    // MARK: Referential integrity

    private func checkReferentialIntegrity(_ views: [String: StoreView]) throws {
        for device in devices {
            guard let process = device.processes.first else { continue }
            for store in process.stores {
                guard let view = views[viewKey(device, store.name)] else { continue }
                for entity in entities(of: store, on: device) {
                    for relationship in entity.toOneRelationships {
                        guard let destination = device.schema.entity(named: relationship.destination),
                              let inverse = relationship.inverse.flatMap(destination.relationship(named:)),
                              inverse.deleteRule == .cascade || inverse.deleteRule == .nullify,
                              let index = entity.fieldNames.firstIndex(of: relationship.name) else { continue }
                        let targets = view.rows[destination.name] ?? [:]
                        for (id, row) in (view.rows[entity.name] ?? [:]).sorted(by: { uuidPrecedes($0.key, $1.key) }) {
                            guard case let .blob(bytes) = row[index], let target = uuid(from: bytes) else { continue }
                            if targets[target] == nil {
                                throw InvariantViolation(.referentialIntegrity, "\(device.name) store '\(store.name)': \(alias(id)).\(relationship.name) "
                                    + "points at \(alias(target)), which is not a live \(destination.name) there")
                            }
                        }
                    }
                }
                if let engine = process.engines[store.name], try engine.engine.status().waitingForParent > 0 {
                    throw InvariantViolation(.referentialIntegrity, "\(device.name) store '\(store.name)': records still wait for a parent after quiescence")
                }
            }
        }
    }

    // MARK: Unique keys

    /// A unique key's part as text that tells every two values apart (unlike ``show(_:encrypted:)``, which shortens
    /// text and shows only a blob's size: every 512-byte external value was one key): text whole, a blob by its size
    /// and SHA-256.
    private func uniqueKeyText(_ value: SQLiteValue) -> String {
        switch value {
        case let .text(text): return JSONLine.quote(text)
        case let .blob(bytes) where uuid(from: bytes) == nil: return "blob(\(bytes.count) bytes, sha256 \(CloudAssetReference(of: bytes).hash))"
        default: return show(value, encrypted: false)
        }
    }

    private func checkUniqueKeys(_ views: [String: StoreView]) throws {
        for store in scenario.stores {
            for entityName in store.entities {
                var resolutions: [(device: String, keys: [String: [String]])] = []
                for device in devices where device.spec.stores.contains(store.name) {
                    guard let entity = device.schema.entity(named: entityName), let view = views[viewKey(device, store.name)] else { continue }
                    for constraint in entity.uniquenessConstraints where !constraint.isEmpty {
                        let indices = constraint.compactMap { entity.fieldNames.firstIndex(of: $0) }
                        var holders: [String: [String]] = [:]
                        for (id, row) in view.rows[entityName] ?? [:] {
                            let key = indices.map { row[$0] }
                            if key.contains(where: \.isNull) { continue }
                            holders[key.map(uniqueKeyText).joined(separator: "+"), default: []].append(alias(id))
                        }
                        for key in holders.keys { holders[key]!.sort() }
                        let duplicated = holders.filter { $0.value.count > 1 }.sorted { $0.key < $1.key }
                        if let (key, ids) = duplicated.first, !store.isSynced || scenario.expect.uniqueKeysDeduplicated {
                            throw InvariantViolation(.uniqueKeys, "\(device.name) store '\(store.name)': \(entityName).\(constraint.joined(separator: "+")) "
                                + "\(key) is held by \(ids.count) live records (\(ids.joined(separator: ", ")))")
                        }
                        resolutions.append((device.name, holders))
                    }
                }
                guard store.isSynced, let first = resolutions.first else { continue }
                for other in resolutions.dropFirst() where other.keys != first.keys {
                    let key = Set(first.keys.keys).union(other.keys.keys).sorted().first { first.keys[$0] != other.keys[$0] } ?? "?"
                    throw InvariantViolation(.uniqueKeys, "\(entityName) key \(key) resolves to \(first.keys[key] ?? []) on \(first.device) "
                        + "but to \(other.keys[key] ?? []) on \(other.device)")
                }
            }
        }
    }

    // MARK: History

    private func checkHistory(_ views: [String: StoreView]) throws {
        for device in devices {
            guard let process = device.processes.first else { continue }
            for store in process.stores {
                guard let view = views[viewKey(device, store.name)] else { continue }
                let label = "\(device.name) store '\(store.name)'"
                var expected: Int64 = 1
                var alive: [String: Set<UUID>] = [:]
                for transaction in view.history {
                    guard transaction.token.value == expected else {
                        throw InvariantViolation(.history, "\(label): history token \(transaction.token.value) follows \(expected - 1) (a gap or a step back)")
                    }
                    expected += 1
                    for change in transaction.changes {
                        switch change {
                        case let .insert(id): alive[id.entityName, default: []].insert(id.id)
                        case let .delete(id, _): alive[id.entityName, default: []].remove(id.id)
                        case .update: break
                        }
                    }
                }
                for entity in entities(of: store, on: device) {
                    let rows = Set((view.rows[entity.name] ?? [:]).keys)
                    let replayed = alive[entity.name] ?? []
                    if let id = rows.subtracting(replayed).sorted(by: uuidPrecedes).first {
                        throw InvariantViolation(.history, "\(label): \(alias(id)) is in the store but its history never inserted it (or deleted it last)")
                    }
                    if let id = replayed.subtracting(rows).sorted(by: uuidPrecedes).first {
                        throw InvariantViolation(.history, "\(label): history says \(alias(id)) exists but the store has no such record")
                    }
                }
                if let last = lastHistoryToken[viewKey(device, store.name)], expected - 1 < last {
                    throw InvariantViolation(.history, "\(label): the history ends at token \(expected - 1), before the token \(last) seen earlier")
                }
            }
        }
    }

    // MARK: Local-only data and plaintext

    private func checkLocalOnly(_ cloudRecords: [String: [UUID: CloudRecord]]) throws {
        let localEntities = Set(scenario.stores.filter { !$0.isSynced }.flatMap(\.entities))
        for zone in zones {
            for record in (cloudRecords[zone] ?? [:]).values.sorted(by: { uuidPrecedes($0.recordID, $1.recordID) }) {
                if localEntities.contains(record.recordType) {
                    throw InvariantViolation(.localOnly, "zone '\(zone)' holds \(alias(record.recordID)) of local-only type \(record.recordType)")
                }
                for name in record.fields.keys.sorted() where reference.localOnlyValues.contains(record.fields[name]!.value) {
                    throw InvariantViolation(.localOnly, "zone '\(zone)': \(alias(record.recordID)).\(name) holds a value written only to a local store")
                }
            }
        }
    }

    private func checkPlaintext() throws {
        guard scenario.expect.cloudEncryption else {
            if !reference.encryptedPlaintexts.isEmpty { stats.skippedChecks.append("\(Invariant.noPlaintext.rawValue) (no cipher configured)") }
            return
        }
        for zone in zones {
            // Without a plaintext to look for there is nothing to scan (encoding the whole zone is not free).
            let plaintexts = reference.encryptedPlaintexts[zone] ?? []
            if plaintexts.isEmpty { continue }
            let bytes = cloud.storedBytes(of: zone)
            for value in plaintexts {
                let needles: [[UInt8]]
                switch value {
                case let .text(text): needles = [Array(text.utf8)]
                case let .blob(data): needles = [Array(data), Array(data.base64EncodedString().utf8)]
                default: continue
                }
                for needle in needles where !needle.isEmpty && contains(bytes, needle) {
                    throw InvariantViolation(.noPlaintext, "zone '\(zone)' holds the plaintext of an encrypted attribute (\(needle.count) bytes)")
                }
            }
        }
    }

    private func contains(_ haystack: Data, _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count, !needle.isEmpty else { return false }
        // Foundation's search (compiled optimised), not a loop of this module: the zone holds megabytes of assets in
        // scenarios with large ones (`largeAssetPercent`), and a byte-by-byte scan per plaintext took most of a debug run.
        return haystack.range(of: Data(needle)) != nil
    }

    // MARK: Idempotence

    private func checkIdempotence(_ before: [String: StoreView]) throws {
        trace.event(now, "phase") { $0.add("phase", "idempotence") }
        for zone in zones { cloud.expireChangeTokens(in: zone) }
        let saves = stats.cloudSaves
        for engine in currentEngines {
            engine.engine.setNeedsFetch()
            enqueuePump(engine)
        }
        try runPumps()
        try runUntilIdle(deadline: now + Int64(scenario.timing.livenessBoundMs), what: "re-reading every zone")
        if stats.cloudSaves != saves && corruptions.isEmpty {
            throw InvariantViolation(.idempotence, "re-reading every zone made the devices upload \(stats.cloudSaves - saves) records again")
        }
        let after = try collectViews(before: before)
        for key in before.keys.sorted() {
            guard let old = before[key], let new = after[key] else { continue }
            let storeName = key.split(separator: "/").last.map(String.init) ?? key
            let label = "store \(storeName) on \(devices[Int(key.split(separator: "/")[0])!].name)"
            // (A store whose bookkeeping was corrupted may repair it while re-reading: only its other records count.)
            let exempt = exemptFromChecks[storeName] ?? []
            if !exempt.isEmpty {
                var old = old, new = new
                old.rows = old.rows.mapValues { $0.filter { !exempt.contains($0.key) } }
                new.rows = new.rows.mapValues { $0.filter { !exempt.contains($0.key) } }
                old.states = old.states.filter { !exempt.contains($0.key) }
                new.states = new.states.filter { !exempt.contains($0.key) }
                try compareReread(old, new, label: label, history: corruptions.isEmpty)
                continue
            }
            try compareReread(old, new, label: label, history: true)
        }
    }

    /// The idempotence check's comparison of one store's views before and after a full re-read.
    private func compareReread(_ old: StoreView, _ new: StoreView, label: String, history: Bool) throws {
        if history && new.history.count != old.history.count {
            throw InvariantViolation(.idempotence, "\(label): re-reading the zone added \(new.history.count - old.history.count) history transactions")
        }
        for entity in old.rows.keys.sorted() where old.rows[entity]! != (new.rows[entity] ?? [:]) {
            throw InvariantViolation(.idempotence, "\(label): re-reading the zone changed \(entity) rows")
        }
        func unchanged(_ a: ReplicationState, _ id: UUID) -> Bool {
            guard let b = new.states[id] else { return false }
            return a.causalLength == b.causalLength && a.stamps == b.stamps && a.created == b.created && a.tombstone == b.tombstone
        }
        // (Changes are looked for without sorting; only a change sorts, to name the first in ID order.)
        guard old.states.contains(where: { !unchanged($0.value, $0.key) }) else { return }
        for id in old.states.keys.sorted(by: uuidPrecedes) {
            guard let a = old.states[id], unchanged(a, id) else {
                throw InvariantViolation(.idempotence, "\(label): re-reading the zone changed the replication state of \(alias(id))")
            }
        }
    }

    /// Whether the end checks leave record `id` of `zone` out (see ``exemptRecords(_:)``).
    func isExempt(_ zone: String, _ id: UUID) -> Bool {
        exemptFromChecks[zone]?.contains(id) ?? false
    }
}

/// A store's history, read in full only when it may differ from `before` (an earlier full read of it): the
/// idempotence check compares the history after its re-read of every zone with the one before.
/// History is append-only with increasing tokens, and the only removal is pruning, which takes a prefix and moves the
/// store's expiry watermark (the simulator never prunes). So when reading after the token just before `before`'s
/// first transaction is not expired (nothing from it on was pruned), the newest transaction is still `before`'s
/// last and the store holds as many transactions as `before` (so none between them went missing either, should a
/// bug delete one), the history holds the same transactions: `before` is returned, without reading and decoding
/// every transaction again. Otherwise (or when `before` is empty) the whole history is read.
func storeHistory(_ context: ModelContext, storeName: String, unlessUnchangedFrom before: [HistoryTransaction]) throws -> [HistoryTransaction] {
    // (The conditions of reading the newest transaction after `first.value - 1`: the token is the store's and not
    // expired, and that transaction is `last`, i.e. the newest of all is `last`, as `last` is after `first.value - 1`.)
    if let first = before.first?.token, let last = before.last?.token, let span = try? context.historySpan(storeName: storeName),
       first.storeIdentity == span.storeIdentity, first.value - 1 >= span.prunedThrough,
       last.storeIdentity == span.storeIdentity, span.newest == last.value, span.count == before.count { return before }
    return try context.fetchHistory(HistoryDescriptor(storeNames: [storeName]))
}

/// Whether a ledger's field stamps equal a cloud record's, compared over the ledger's field names and the cloud's
/// fields in `known` (a cloud field counts only in `incarnation`): the convergence check's comparison, without
/// building and sorting the union of names.
func stampsAgree(_ stamps: [String: FieldStamp], _ fields: [String: CloudField], known: Set<String>, incarnation: Int64) -> Bool {
    for (name, stamp) in stamps {
        guard let field = fields[name], field.stamp.incarnation == incarnation, field.stamp == stamp else { return false }
    }
    for (name, field) in fields where stamps[name] == nil && field.stamp.incarnation == incarnation && known.contains(name) {
        return false
    }
    return true
}

/// Whether a ledger's unknown fields have exactly the names and stamps of a cloud record's fields outside `known`
/// in `incarnation` (the convergence check's comparison, without building the filtered dictionaries).
func unknownFieldsAgree(_ unknown: [String: CloudField], _ fields: [String: CloudField], known: Set<String>, incarnation: Int64) -> Bool {
    var count = 0
    for (name, field) in fields where field.stamp.incarnation == incarnation && !known.contains(name) {
        count += 1
        guard unknown[name]?.stamp == field.stamp else { return false }
    }
    return count == unknown.count
}

/// The UUID stored in a 16-byte blob.
func uuid(from data: Data) -> UUID? {
    guard data.count == 16 else { return nil }
    let b = Array(data)
    return UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
}

/// Byte order of UUIDs (time order for Replica's identifiers), without formatting them as text.
func uuidPrecedes(_ a: UUID, _ b: UUID) -> Bool {
    withUnsafeBytes(of: a.uuid) { x in withUnsafeBytes(of: b.uuid) { y in x.lexicographicallyPrecedes(y) } }
}
