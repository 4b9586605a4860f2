// The soak's check: the simulator's invariants (`Simulation/Invariants.swift`), restated over real stores — what
// device processes journaled, what their stores hold after healing, and every byte the cloud keeps.

import Foundation
import Replica

/// An invariant a soak run broke, with what shows it.
public struct SoakViolation: Hashable, Sendable, CustomStringConvertible {
    public enum Invariant: String, CaseIterable, Sendable {
        /// Every device finished healing up to date.
        case healed
        /// Every device holds the same rows, and they are the cloud's live records.
        case convergence
        /// Every write a device's store acknowledged reached the cloud (or was overtaken by a newer write).
        case noLostWrites
        /// Nothing alive that no insert produced; no value that no write wrote.
        case noResurrection
        /// At most one live record per unique key.
        case uniqueKeys
        /// Every reference of a live record points to a live record.
        case referentialIntegrity
        /// No plaintext of an encrypted field anywhere in the cloud.
        case noPlaintext
    }

    public var invariant: Invariant
    public var message: String

    public var description: String { "\(invariant.rawValue): \(message)" }
}

/// What a soak run left behind, read back.
public struct SoakOutcome: Sendable {
    public var journal: [SoakJournalEntry]
    public var devices: [SoakDeviceDump]
    public var cloud: SoakCloudDump
    public var schema: SoakSchema

    public init(journal: [SoakJournalEntry], devices: [SoakDeviceDump], cloud: SoakCloudDump, schema: SoakSchema = .notes) {
        self.journal = journal
        self.devices = devices
        self.cloud = cloud
        self.schema = schema
    }

    /// Every invariant, in order; the violations found (empty: every one held).
    /// - Throws: ``SoakFormatError`` when a cloud body does not decode as a record.
    public func check() throws -> [SoakViolation] {
        var violations: [SoakViolation] = []
        func fail(_ invariant: SoakViolation.Invariant, _ message: String) {
            violations.append(SoakViolation(invariant: invariant, message: message))
        }
        var cloudRecords: [UUID: CloudRecord] = [:]
        var bodies: [Data] = []
        for stored in cloud.records {
            guard let body = Data(base64Encoded: stored.body), var record = try? CloudRecordBody.decode(body),
                  record.recordID == stored.id else {
                throw SoakFormatError(description: "the cloud's record \(stored.id) does not decode")
            }
            record.changeTag = stored.changeTag
            cloudRecords[record.recordID] = record
            bodies.append(body)
        }
        bodies += cloud.metadata.compactMap { Data(base64Encoded: $0) }
        let aborted = Set(journal.filter { $0.phase == .abort }.map { "\($0.device)/\($0.generation)/\($0.index)" })
        let intents = journal.filter { $0.phase == .intent && !aborted.contains("\($0.device)/\($0.generation)/\($0.index)") }
        let acks = journal.filter { $0.phase == .ack }
        // Records whose unique key another record also took: duplicate resolution merges their fields into the winner.
        var slugOwners: [String: Set<UUID>] = [:]
        for entry in intents where entry.operation == .insert {
            for field in schema.entities[entry.entity] ?? [] where field.isUnique {
                if case let .text(key)? = entry.fields[field.name] { slugOwners["\(entry.entity).\(field.name)=\(key)", default: []].insert(entry.id) }
            }
        }
        let contested = Set(slugOwners.values.filter { $0.count > 1 }.flatMap { $0 })
        let sortedIDs = cloudRecords.keys.sorted { $0.uuidString < $1.uuidString }

        // Healed.
        for device in devices where !device.upToDate { fail(.healed, "\(device.device) did not finish healing up to date") }

        // Unique keys and referential integrity, on every device.
        for device in devices {
            for (entity, fields) in schema.entities.sorted(by: { $0.key < $1.key }) {
                let rows = device.rows[entity] ?? [:]
                for field in fields where field.isUnique {
                    var seen: [SoakValue: String] = [:]
                    for (id, values) in rows.sorted(by: { $0.key < $1.key }) {
                        guard let value = values[field.name] else { continue }
                        if let other = seen[value] {
                            fail(.uniqueKeys, "\(device.device): \(entity) \(other) and \(id) both hold \(field.name) \(value)")
                        }
                        seen[value] = id
                    }
                }
                for field in fields where field.kind == .reference {
                    let target = SoakSchema.referenceTargets["\(entity).\(field.name)"] ?? ""
                    for (id, values) in rows.sorted(by: { $0.key < $1.key }) {
                        guard case let .text(parent)? = values[field.name] else { continue }
                        if device.rows[target]?[parent] == nil {
                            fail(.referentialIntegrity, "\(device.device): \(entity) \(id).\(field.name) points to \(target) \(parent), which it does not hold")
                        }
                    }
                }
            }
        }
        var liveKeys: [String: UUID] = [:]
        for id in sortedIDs {
            let record = cloudRecords[id]!
            guard record.isAlive else { continue }
            for field in schema.entities[record.recordType] ?? [] where field.isUnique {
                guard let value = record.fields[field.name]?.value else { continue }
                let key = "\(record.recordType).\(field.name)=\(SoakValue(value))"
                if let other = liveKeys[key] { fail(.uniqueKeys, "the cloud holds live \(record.recordType) \(other) and \(id) with \(key)") }
                liveKeys[key] = id
            }
        }

        // Convergence: devices agree with each other and with the cloud.
        if let first = devices.first {
            for device in devices.dropFirst() {
                if let difference = Self.difference(first.rows, device.rows) {
                    fail(.convergence, "\(first.device) and \(device.device) differ: \(difference)")
                }
            }
            for device in devices {
                for (entity, fields) in schema.entities.sorted(by: { $0.key < $1.key }) {
                    let rows = device.rows[entity] ?? [:]
                    let live = sortedIDs.filter { cloudRecords[$0]!.recordType == entity && cloudRecords[$0]!.isAlive }
                    for id in live where rows[id.uuidString] == nil {
                        fail(.convergence, "\(device.device) lacks \(entity) \(id), alive in the cloud")
                    }
                    for id in rows.keys.sorted() {
                        guard let uuid = UUID(uuidString: id), let record = cloudRecords[uuid], record.isAlive else {
                            fail(.convergence, "\(device.device) holds \(entity) \(id), which the cloud does not hold alive")
                            continue
                        }
                        let values = rows[id]!
                        let current = Self.incarnation(record.causalLength)
                        for field in fields where field.kind != .encrypted {
                            let cloudValue = record.fields[field.name].flatMap { $0.stamp.incarnation == current ? SoakValue($0.value) : nil }
                                ?? field.defaultValue
                            let deviceValue = values[field.name] ?? .null
                            if cloudValue != deviceValue {
                                fail(.convergence, "\(device.device): \(entity) \(id).\(field.name) is \(deviceValue), the cloud's \(cloudValue)")
                            }
                        }
                    }
                }
                for id in sortedIDs {
                    guard let state = device.states[id.uuidString] else {
                        fail(.convergence, "\(device.device)'s ledger lacks \(id), which the cloud holds")
                        continue
                    }
                    if state.causalLength != cloudRecords[id]!.causalLength {
                        fail(.convergence, "\(device.device) holds \(id) at causal length \(state.causalLength), the cloud at \(cloudRecords[id]!.causalLength)")
                    }
                }
            }
        }

        // No lost acknowledged writes.
        for ack in acks {
            guard let record = cloudRecords[ack.id] else {
                fail(.noLostWrites, "the \(ack.operation.rawValue) of \(ack.entity) \(ack.id) by \(ack.device) (generation \(ack.generation), "
                     + "write \(ack.index)) never reached the cloud")
                continue
            }
            let acknowledged = ack.causalLength ?? 1
            if record.causalLength < acknowledged {
                fail(.noLostWrites, "the \(ack.operation.rawValue) of \(ack.id) by \(ack.device) (causal length \(acknowledged)) was lost: "
                     + "the cloud's record is at \(record.causalLength)")
            }
            guard record.isAlive, ack.operation != .delete, Self.incarnation(record.causalLength) == Self.incarnation(acknowledged),
                  !contested.contains(ack.id) else { continue }
            for (name, text) in (ack.stamps ?? [:]).sorted(by: { $0.key < $1.key }) {
                guard let kind = schema.entities[ack.entity]?.first(where: { $0.name == name })?.kind, kind != .reference,
                      let stamp = FieldStamp(text) else { continue }
                let final = record.fields[name]?.stamp
                if final.map({ $0 < stamp }) ?? true {
                    fail(.noLostWrites, "the write of \(ack.id).\(name) by \(ack.device) (generation \(ack.generation), write \(ack.index), "
                         + "stamp \(text)) was lost: the cloud's stamp is \(final.map { "\($0)" } ?? "none")")
                }
            }
        }

        // No resurrection: every live record comes from an insert (the workload never re-inserts), and every value
        // from a write of it.
        var inserted = Set<UUID>()
        var written: [String: Set<SoakValue>] = [:]
        for entry in intents {
            if entry.operation == .insert { inserted.insert(entry.id) }
            for (name, value) in entry.fields { written["\(entry.id)/\(name)", default: []].insert(value) }
        }
        for id in sortedIDs {
            let record = cloudRecords[id]!
            guard record.isAlive else { continue }
            if record.causalLength != 1 || !inserted.contains(id) {
                fail(.noResurrection, "\(record.recordType) \(id) is alive at causal length \(record.causalLength), which no insert produced")
                continue
            }
            guard !contested.contains(id) else { continue }
            for field in schema.entities[record.recordType] ?? [] where field.kind == .attribute {
                guard let value = record.fields[field.name]?.value else { continue }
                if written["\(id)/\(field.name)"]?.contains(SoakValue(value)) != true {
                    fail(.noResurrection, "\(record.recordType) \(id).\(field.name) holds \(SoakValue(value)), which no write wrote")
                }
            }
        }

        // No plaintext of an encrypted field in the cloud, in any byte it keeps.
        var secrets = Set<String>()
        for entry in intents {
            for field in schema.entities[entry.entity] ?? [] where field.kind == .encrypted {
                if case let .text(secret)? = entry.fields[field.name], secret.count >= 8 { secrets.insert(secret) }
            }
        }
        for secret in secrets.sorted() {
            let needle = Data(secret.utf8)
            if bodies.contains(where: { $0.range(of: needle) != nil }) {
                fail(.noPlaintext, "the cloud holds the plaintext of an encrypted value (\(secret.prefix(12))…)")
            }
        }
        for id in sortedIDs {
            let record = cloudRecords[id]!
            for field in schema.entities[record.recordType] ?? [] where field.kind == .encrypted {
                guard let stored = record.fields[field.name], !stored.value.isNull else { continue }
                if !stored.isEncrypted { fail(.noPlaintext, "\(record.recordType) \(id).\(field.name) is in the cloud unsealed") }
            }
        }
        return violations
    }

    static func incarnation(_ causalLength: Int64) -> Int64 { causalLength % 2 == 1 ? causalLength : causalLength - 1 }

    /// The first difference between two devices' rows, or `nil`.
    static func difference(_ a: [String: [String: [String: SoakValue]]], _ b: [String: [String: [String: SoakValue]]]) -> String? {
        for entity in Set(a.keys).union(b.keys).sorted() {
            let left = a[entity] ?? [:], right = b[entity] ?? [:]
            for id in Set(left.keys).union(right.keys).sorted() {
                guard let l = left[id] else { return "\(entity) \(id) is only on the second" }
                guard let r = right[id] else { return "\(entity) \(id) is only on the first" }
                for name in Set(l.keys).union(r.keys).sorted() where l[name] != r[name] {
                    return "\(entity) \(id).\(name): \(l[name] ?? .null) vs \(r[name] ?? .null)"
                }
            }
        }
        return nil
    }
}
