import Foundation

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

extension SchemaDifference {
    /// Whether this difference is something the zone has and the device lacks.
    var isRemoval: Bool {
        switch self {
        case .entityRemoved, .attributeRemoved, .relationshipRemoved: true
        default: false
        }
    }
}
