import Foundation
import Synchronization

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
