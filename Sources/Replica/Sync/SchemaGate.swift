import Foundation
import Synchronization

/// One way a device's schema contradicts the union schema its zone keeps (DESIGN.md, "Additive-only schema").
public enum SchemaDifference: Hashable, Sendable, CustomStringConvertible {
    /// An entity the zone has is missing from a device at the zone's version or later (removed or renamed).
    case entityRemoved(String)
    /// An attribute the zone has is missing from a device at the zone's version or later (removed or renamed).
    case attributeRemoved(entity: String, attribute: String)
    /// An attribute has another type than in the zone.
    case attributeRetyped(entity: String, attribute: String, zoneType: Schema.AttributeType, localType: Schema.AttributeType)
    /// A relationship the zone has is missing from a device at the zone's version or later.
    case relationshipRemoved(entity: String, relationship: String)
    /// A relationship points elsewhere or changed between to-one and to-many.
    case relationshipChanged(entity: String, relationship: String)
    /// An option that changes what the cloud holds (``Schema/Attribute/cloudOptions``) differs between an existing
    /// attribute of the zone and this device's: `zone` tells whether the zone's union has it. Turning cloud
    /// encryption on for an attribute that already has values would leave every existing value in plaintext (and
    /// readable by no device that expects it sealed); turning it off would upload plaintext into a field other
    /// devices seal. Use a new attribute instead (Specs R13).
    case attributeOptionChanged(entity: String, attribute: String, option: CloudOption, zone: Bool)
    /// Another app version sharing this device's store file (an app-group store) declares `entity.attribute`
    /// encrypted, and this process's sync engine has no encryption configuration: it could upload that field only in
    /// plaintext, so it syncs nothing (E2).
    case sharedFieldNeedsEncryption(entity: String, attribute: String)
    /// This device declares entities, attributes or relationships the zone's union schema lacks (`additions`, named
    /// `Entity.attribute`, `entity Entity` and `relationship Entity.relationship`) at a ``Schema/version`` (`version`)
    /// not above the zone's (`zoneVersion`). Accepting them would label the new union with an old version, and every
    /// device still at that version would then seem to have removed them. Raise ``Schema/version`` in the build that
    /// adds to the schema. Nothing is written until then (Specs R13).
    case addedWithoutRaisingVersion(additions: [String], version: Schema.Version, zoneVersion: Schema.Version)
    /// Follows the removals (``entityRemoved(_:)``, ``attributeRemoved(entity:attribute:)``,
    /// ``relationshipRemoved(entity:relationship:)``) in a refusal: the version this device declares and the highest
    /// version of the builds that wrote the zone's union. A device at or past the zone's version may not lack what
    /// the union has; when the two are equal and this device removed nothing, a newer build added to the schema
    /// without raising its version.
    case versions(device: Schema.Version, zone: Schema.Version)

    /// An attribute option that is part of the zone's union schema.
    public enum CloudOption: String, Hashable, Sendable, CaseIterable {
        case allowsCloudEncryption, externalStorage

        var option: Schema.Attribute.Options { self == .allowsCloudEncryption ? .allowsCloudEncryption : .externalStorage }
    }

    public var description: String {
        switch self {
        case let .entityRemoved(e): return "entity \(e) was removed or renamed"
        case let .attributeRemoved(e, a): return "\(e).\(a) was removed or renamed"
        case let .attributeRetyped(e, a, zone, local):
            return "\(e).\(a) changed type from \(zone.rawValue) to \(local.rawValue); a synced attribute cannot be retyped (the cloud schema is additive-only): declare a new attribute of the new type and copy the values into it"
        case let .relationshipRemoved(e, r): return "relationship \(e).\(r) was removed or renamed"
        case let .relationshipChanged(e, r): return "relationship \(e).\(r) changed destination or cardinality"
        case let .attributeOptionChanged(e, a, option, zone):
            return "\(e).\(a) \(zone ? "drops" : "adds") the option \(option.rawValue), which the zone's schema \(zone ? "has" : "does not have"); an existing attribute cannot change it (use a new attribute)"
        case let .sharedFieldNeedsEncryption(e, a):
            return "\(e).\(a) is encrypted in another app version sharing this store, and this sync engine has no encryption configuration"
        case let .addedWithoutRaisingVersion(additions, version, zoneVersion):
            let listed = additions.count < 2 ? additions.joined()
                : additions.dropLast().joined(separator: ", ") + " and " + additions[additions.count - 1]
            let declared = version == zoneVersion ? "" : "; this device declares \(version)"
            return "this device adds \(listed) without raising Schema.version above \(zoneVersion) (the zone's version\(declared))"
        case let .versions(device, zone):
            return "this device declares \(device); the zone was written by \(zone)"
        }
    }
}

/// The union schema a zone keeps: every entity, attribute and relationship any device that synced has declared,
/// and the highest schema version seen. Stored as JSON in the zone metadata key `schema`.
struct ZoneSchema: Codable, Hashable {
    var version: Schema.Version
    var entities: [Schema.Entity]

    /// Compares a device's schema with the zone's and returns the differences that make it incompatible, and the
    /// union to store when there are none. A device older than the zone may lack things (it keeps them as unknown
    /// fields); a device at or past the zone's version may not (and is then told both versions). A device that adds
    /// something the zone lacks must declare a higher version than the zone's: otherwise the union would carry the
    /// additions under an old version, and devices at that version would seem to have removed them. The first device
    /// on an empty zone (`zone == nil`) is always accepted.
    /// - Parameter comparesOptions: `false` only for the canary ``Canary/gateIgnoresOptions``.
    static func check(local: ZoneSchema, zone: ZoneSchema?, comparesOptions: Bool = true) -> (differences: [SchemaDifference], union: ZoneSchema) {
        guard let zone else { return ([], local) }
        let current = local.version >= zone.version
        var differences: [SchemaDifference] = []
        var union = zone
        union.version = max(zone.version, local.version)
        for (index, zoneEntity) in zone.entities.enumerated() {
            guard let mine = local.entities.first(where: { $0.name == zoneEntity.name }) else {
                if current { differences.append(.entityRemoved(zoneEntity.name)) }
                continue
            }
            for attribute in zoneEntity.attributes {
                guard let own = mine.attribute(named: attribute.name) else {
                    if current { differences.append(.attributeRemoved(entity: mine.name, attribute: attribute.name)) }
                    continue
                }
                if own.type != attribute.type {
                    differences.append(.attributeRetyped(entity: mine.name, attribute: attribute.name, zoneType: attribute.type, localType: own.type))
                }
                for option in SchemaDifference.CloudOption.allCases
                where comparesOptions && own.options.contains(option.option) != attribute.options.contains(option.option) {
                    differences.append(.attributeOptionChanged(entity: mine.name, attribute: attribute.name, option: option,
                                                               zone: attribute.options.contains(option.option)))
                }
            }
            for relationship in zoneEntity.relationships {
                guard let own = mine.relationship(named: relationship.name) else {
                    if current { differences.append(.relationshipRemoved(entity: mine.name, relationship: relationship.name)) }
                    continue
                }
                if own.destination != relationship.destination || own.isToMany != relationship.isToMany {
                    differences.append(.relationshipChanged(entity: mine.name, relationship: relationship.name))
                }
            }
            var merged = zoneEntity
            for attribute in mine.attributes where zoneEntity.attribute(named: attribute.name) == nil { merged.attributes.append(attribute) }
            for relationship in mine.relationships where zoneEntity.relationship(named: relationship.name) == nil {
                merged.relationships.append(relationship)
            }
            union.entities[index] = merged
        }
        for entity in local.entities where zone.entities.first(where: { $0.name == entity.name }) == nil {
            union.entities.append(entity)
        }
        if differences.contains(where: \.isRemoval) {
            differences.append(.versions(device: local.version, zone: zone.version))
        }
        if local.version <= zone.version {
            let additions = local.additions(over: zone)
            if !additions.isEmpty {
                differences.append(.addedWithoutRaisingVersion(additions: additions, version: local.version, zoneVersion: zone.version))
            }
        }
        return (differences, union)
    }
}

extension ZoneSchema {
    /// What this schema declares that `zone` lacks, in this schema's order: `Entity.attribute`, `relationship
    /// Entity.relationship`, and `entity Entity` for a whole new entity.
    func additions(over zone: ZoneSchema) -> [String] {
        var additions: [String] = []
        for entity in entities {
            guard let theirs = zone.entities.first(where: { $0.name == entity.name }) else {
                additions.append("entity \(entity.name)")
                continue
            }
            for attribute in entity.attributes where theirs.attribute(named: attribute.name) == nil {
                additions.append("\(entity.name).\(attribute.name)")
            }
            for relationship in entity.relationships where theirs.relationship(named: relationship.name) == nil {
                additions.append("relationship \(entity.name).\(relationship.name)")
            }
        }
        return additions
    }
}

extension SchemaDifference {
    /// Whether this difference is something the zone has and the device lacks.
    var isRemoval: Bool {
        switch self {
        case .entityRemoved, .attributeRemoved, .relationshipRemoved: true
        default: false
        }
    }
}

extension ZoneSchema {
    /// Zone schemas decoded lately, by their stored bytes: every engine start (and every full resync) reads the zone's
    /// union schema again, usually the same bytes, and decoding it with JSONDecoder costs far more than comparing them.
    private static let recentlyDecoded = Mutex<[Data: ZoneSchema]>([:])
    private static let recentlyDecodedLimit = 16

    /// The zone schema stored as `data`, or `nil` when it does not decode (a union this build cannot read, or damage).
    /// Decoding is a function of the bytes, so a remembered result is the same as a fresh one.
    static func decode(_ data: Data) -> ZoneSchema? {
        if let known = recentlyDecoded.withLock({ $0[data] }) { return known }
        guard let schema = try? ReplicaJSON.decoder().decode(ZoneSchema.self, from: data) else { return nil }
        recentlyDecoded.withLock { cache in
            if cache.count >= recentlyDecodedLimit { cache.removeAll(keepingCapacity: true) }
            cache[data] = schema
        }
        return schema
    }

    private static let recentlyEncoded = Mutex<[ZoneSchema: Data]>([:])

    /// The stored form of `schema` (sorted keys, so a remembered encoding is the same as a fresh one).
    static func encode(_ schema: ZoneSchema) throws -> Data {
        if let known = recentlyEncoded.withLock({ $0[schema] }) { return known }
        let data = try ReplicaJSON.encoder().encode(schema)
        recentlyEncoded.withLock { cache in
            if cache.count >= recentlyDecodedLimit { cache.removeAll(keepingCapacity: true) }
            cache[schema] = data
        }
        return data
    }
}
