// The reference model: what every replica must end up holding, computed from acknowledged writes alone — not from
// the library's merge.
//
// Synced stores: after every successful save the simulator reads the written record's replication state (the
// stamps the save gave it) and logs each acknowledged write: (record, field, value, stamp, causal length). The
// expected final record is the join of those writes: the highest acknowledged causal length (plus one for a delete
// rule that cascaded, the only change no workload operation acknowledges), and per attribute the value of the
// acknowledged write with the highest stamp within that incarnation (else the declared default). Relationship fields
// are also written by delete rules, so they are checked by referential integrity and convergence instead.
//
// Local stores: the model replays acknowledged operations (with delete rules) and must equal the store.

import Foundation
import Replica

/// One acknowledged write to a synced record.
struct AckWrite {
    enum Kind: String { case insert, update, delete }
    var kind: Kind
    var causalLength: Int64
    /// Written fields with stamp and value, and whether the field is an attribute (empty for deletes).
    var fields: [(name: String, stamp: FieldStamp, value: SQLiteValue, isAttribute: Bool)]
    /// The chaos step that made it (for messages).
    var step: Int
    var device: String
    /// The device erased the zone's data after this write (a zone deletion, policy erase): the write survives only if
    /// another device held it, so the end checks accept its loss, and its survival.
    var mayBeLost = false
}

final class ReferenceModel {
    /// Acknowledged writes per zone, per record.
    var acks: [String: [UUID: [AckWrite]]] = [:]
    /// Who wrote a value (per zone, record and field), for the causality check.
    private var writers: [String: [WriterKey: FieldStamp]] = [:]
    /// Values written to local-only stores (must never reach the cloud).
    var localOnlyValues = Set<SQLiteValue>()
    /// Plaintext values written to attributes marked for cloud encryption, per zone.
    var encryptedPlaintexts: [String: [SQLiteValue]] = [:]
    /// Local stores: expected rows per (device, store), by entity then ID.
    var localStores: [String: LocalStoreModel] = [:]
    /// Per device store ("device/store"), per record: the highest causal length its own acknowledged operations
    /// reached (its ledger must keep every one of these records, and its operations never go back).
    var ownCausalLength: [String: [UUID: Int64]] = [:]

    /// Duplicates of unique keys the cloud ever saw resolved, per zone and winner: each loser with the incarnation it
    /// ended (its fields were absorbed into the winner, which keeps them even if the loser is re-inserted later).
    var absorbed: [String: [UUID: [(id: UUID, incarnation: Int64)]]] = [:]

    /// Per zone and record, every field stamp a version saved in the cloud ever carried: a write whose stamp is not here
    /// never reached the cloud (the conflict-log check).
    var cloudStamps: [String: [UUID: Set<FieldStamp>]] = [:]
    /// Per zone and device, the steps at which the device's own deletes were acknowledged (their delete rules may have
    /// removed other records without an acknowledged write of their own).
    var deleteSteps: [String: [String: [Int]]] = [:]

    /// Notes the stamps of a version the cloud saved.
    func noteCloudVersion(zone: String, _ record: CloudRecord) {
        guard !record.fields.isEmpty else { return }
        cloudStamps[zone, default: [:]][record.recordID, default: []].formUnion(record.fields.values.map(\.stamp))
    }

    /// Notes a saved tombstone that redirects to a winner.
    func noteRedirect(zone: String, _ record: CloudRecord) {
        guard !record.isAlive, let winner = record.redirect else { return }
        let loser = (id: record.recordID, incarnation: record.causalLength - 1)
        if absorbed[zone]?[winner]?.contains(where: { $0.id == loser.id && $0.incarnation == loser.incarnation }) == true { return }
        absorbed[zone, default: [:]][winner, default: []].append(loser)
    }

    struct WriterKey: Hashable {
        var id: UUID
        var field: String
        var value: SQLiteValue
    }

    func record(zone: String, id: UUID, write: AckWrite) {
        acks[zone, default: [:]][id, default: []].append(write)
        if write.kind == .delete { deleteSteps[zone, default: [:]][write.device, default: []].append(write.step) }
        for field in write.fields where field.isAttribute && field.value.isIdentifying {
            // A value written again (an undo sets a field back) keeps its first write's stamp: a writer that saw the
            // value may have seen only that one.
            let key = WriterKey(id: id, field: field.name, value: field.value)
            if let first = writers[zone]?[key], first <= field.stamp { continue }
            writers[zone, default: [:]][key] = field.stamp
        }
    }

    /// The stamp of the acknowledged write that produced `value` in `field` of record `id`, if it is known.
    func writerStamp(zone: String, id: UUID, field: String, value: SQLiteValue) -> FieldStamp? {
        guard value.isIdentifying else { return nil }
        return writers[zone]?[WriterKey(id: id, field: field, value: value)]
    }
}

extension SQLiteValue {
    /// Whether the value identifies one write (every written text, blob and number is unique per run; booleans, null
    /// and the shared keys of unique-key collisions are not).
    /// What the shared keys of unique-key collisions hold: text ends with it, a blob holds it in its first bytes.
    static let collisionMark = Data("@collide.example".utf8)

    var isIdentifying: Bool {
        switch self {
        case let .text(text): return !text.hasSuffix("@collide.example")
        case let .blob(bytes): return bytes.range(of: Self.collisionMark, in: 0..<min(bytes.count, 64)) == nil
        case .real: return true
        case let .integer(value): return value > 1 || value < 0
        case .null: return false
        }
    }
}

/// The expected contents of one local (unsynced) store.
struct LocalStoreModel {
    /// Rows by entity, then by ID (values in field order).
    var rows: [String: [UUID: [SQLiteValue]]] = [:]

    mutating func insert(entity: String, id: UUID, values: [SQLiteValue]) { rows[entity, default: [:]][id] = values }

    mutating func update(entity: String, id: UUID, values: [SQLiteValue]) { rows[entity, default: [:]][id] = values }

    /// Deletes a record and applies its delete rules like a local save does.
    mutating func delete(entity: String, id: UUID, schema: Schema) {
        guard rows[entity]?[id] != nil, let description = schema.entity(named: entity) else { return }
        rows[entity]?[id] = nil
        for relationship in description.relationships where relationship.isToMany {
            guard let inverse = relationship.inverse, let destination = schema.entity(named: relationship.destination),
                  let index = destination.fieldNames.firstIndex(of: inverse) else { continue }
            let children = (rows[destination.name] ?? [:]).filter { $0.value[index] == id.sqliteValue }.keys
                .sorted(by: uuidPrecedes)
            switch relationship.deleteRule {
            case .cascade:
                for child in children { delete(entity: destination.name, id: child, schema: schema) }
            case .nullify:
                for child in children { rows[destination.name]?[child]?[index] = .null }
            case .deny, .noAction:
                break
            }
        }
    }
}

// MARK: - Record dominance (the cloud never goes backwards)

/// Why `new` does not dominate `old` in the join order (nil when it does): a record version that replaces another in
/// the cloud must contain everything the old one did — the same or a higher causal length and, within the same
/// incarnation, every field with the same or a newer stamp.
func dominanceGap(new: CloudRecord, old: CloudRecord) -> String? {
    if new.causalLength < old.causalLength {
        return "causal length went from \(old.causalLength) to \(new.causalLength)"
    }
    guard new.causalLength == old.causalLength else { return nil }
    if new.created > old.created { return "creation stamp went forward" }
    let incarnation = old.causalLength % 2 == 1 ? old.causalLength : old.causalLength - 1
    for name in old.fields.keys.sorted() {
        let field = old.fields[name]!
        if old.isAlive && field.stamp.incarnation != incarnation { continue }
        guard let replacement = new.fields[name] else { return "field '\(name)' was dropped" }
        if replacement.stamp < field.stamp { return "field '\(name)' went back to an older write" }
        if replacement.stamp == field.stamp && !valuesAgree(replacement.value, field.value) && !field.isEncrypted {
            return "field '\(name)' changed value under the same stamp"
        }
    }
    return nil
}

/// Whether two values of a field are one write's: equal, or one holds bytes and the other the asset reference of
/// those bytes (an `.externalStorage` value travels as an asset; an older writer sent it inline, R19).
func valuesAgree(_ a: SQLiteValue, _ b: SQLiteValue) -> Bool {
    if a == b { return true }
    func reference(_ value: SQLiteValue) -> CloudAssetReference? {
        if case let .text(text) = value { CloudAssetReference(fieldValue: text) } else { nil }
    }
    if case let .blob(bytes) = a, let asset = reference(b) { return CloudAssetReference(of: bytes) == asset }
    if case let .blob(bytes) = b, let asset = reference(a) { return CloudAssetReference(of: bytes) == asset }
    return false
}

/// The incarnation (odd causal length) a causal length belongs to.
func incarnation(of causalLength: Int64) -> Int64 { causalLength % 2 == 1 ? causalLength : causalLength - 1 }
