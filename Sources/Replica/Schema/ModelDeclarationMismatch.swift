/// A disagreement between a model type's entity description (its ``ModelEntity``) and the Swift type it describes,
/// found when a container opens (``ReplicaError/invalidModelDeclaration(_:)``) instead of at the first read.
///
/// Each case names both sides: the entity and its attribute or relationship (with the key path it is bound to), and
/// the Swift property (its coding key) with the type the model's decoding reads. Types are named, values never.
/// The check reads one sample record through the model's own `init(row:)` and writes it back through the entity's
/// key paths (see ``ModelEntity``); it is data (strings), so the schema layer can carry it.
public enum ModelDeclarationMismatch: Error, Sendable, Hashable, CustomStringConvertible {
    /// The model's decoding reads property `property` (of type `type`), but the entity has no attribute or
    /// relationship of that name: its value is never stored, and a required one fails every read.
    case propertyWithoutMember(entity: String, property: String, type: String)
    /// Attribute or relationship `member` (bound to `keyPath`) is stored, but the model's decoding never reads a
    /// property of that name: the stored value is lost on every read (or the read fails).
    case memberWithoutProperty(entity: String, member: String, keyPath: String)
    /// Attribute `attribute` is declared as `attributeType` (through `keyPath`), but the property of that name
    /// decodes as `propertyType`.
    case typeMismatch(entity: String, attribute: String, attributeType: String, keyPath: String, property: String,
                      propertyType: String)
    /// The declared default of `attribute` (stored as `storedForm`, a storage class such as `REAL`) cannot be read as
    /// the property's type `propertyType`: a record created without the field would fail to read.
    case defaultOfWrongType(entity: String, attribute: String, storedForm: String, propertyType: String)
    /// `attribute` is declared as an attribute, but its property `property` is a relationship
    /// (`propertyType`, a `Reference` or a list of them).
    case relationshipDeclaredAsAttribute(entity: String, attribute: String, property: String, propertyType: String)
    /// `relationship` (to `destination`) is declared as a relationship, but its property `property` decodes as
    /// `propertyType`, which is not a reference to `destination` (or, for to-many, a list of them).
    case attributeDeclaredAsRelationship(entity: String, relationship: String, destination: String, property: String,
                                         propertyType: String)
    /// `member` is declared optional (its key path's type is optional), but the property of that name is not
    /// (`propertyType`): a record holding no value fails to read.
    case optionalMemberOnRequiredProperty(entity: String, member: String, keyPath: String, property: String,
                                          propertyType: String)
    /// Field `field` does not survive a read and a write: saving the model read from a record stores another value
    /// in the field than the record held, so the key path it is bound to (`keyPath`) is not the property its
    /// reading fills (or a hand-written `init(row:)` does not read the field, and a save would overwrite it).
    case fieldDoesNotRoundTrip(entity: String, field: String, keyPath: String)
    /// Reading a sample record through the model's `init(row:)` failed (`reason`, which holds no stored value).
    case unreadableRecord(entity: String, reason: String)

    /// The entity the mismatch is about.
    public var entity: String {
        switch self {
        case let .propertyWithoutMember(entity, _, _), let .memberWithoutProperty(entity, _, _),
             let .typeMismatch(entity, _, _, _, _, _), let .defaultOfWrongType(entity, _, _, _),
             let .relationshipDeclaredAsAttribute(entity, _, _, _), let .attributeDeclaredAsRelationship(entity, _, _, _, _),
             let .optionalMemberOnRequiredProperty(entity, _, _, _, _), let .fieldDoesNotRoundTrip(entity, _, _),
             let .unreadableRecord(entity, _):
            return entity
        }
    }

    public var description: String {
        switch self {
        case let .propertyWithoutMember(entity, property, type):
            return "\(entity).\(property) (\(type)) is a stored property with no attribute or relationship of that name in \(entity)'s entity"
        case let .memberWithoutProperty(entity, member, keyPath):
            return "\(entity).\(member) (bound to \(keyPath)) is stored, but decoding \(entity) reads no property '\(member)'; when the property has another name, map it in CodingKeys (case <property> = \"\(member)\")"
        case let .typeMismatch(entity, attribute, attributeType, keyPath, property, propertyType):
            return "\(entity).\(attribute) is declared as \(attributeType) (through \(keyPath)), but property '\(property)' decodes as \(propertyType)"
        case let .defaultOfWrongType(entity, attribute, storedForm, propertyType):
            return "the default of \(entity).\(attribute) (stored as \(storedForm)) cannot be read as its property's type \(propertyType)"
        case let .relationshipDeclaredAsAttribute(entity, attribute, property, propertyType):
            return "\(entity).\(attribute) is declared as an attribute, but property '\(property)' is a relationship (\(propertyType)); declare it with .toOne or .toMany"
        case let .attributeDeclaredAsRelationship(entity, relationship, destination, property, propertyType):
            return "\(entity).\(relationship) is declared as a relationship to \(destination), but property '\(property)' decodes as \(propertyType)"
        case let .optionalMemberOnRequiredProperty(entity, member, keyPath, property, propertyType):
            return "\(entity).\(member) is declared optional (through \(keyPath)), but property '\(property)' is not optional (\(propertyType))"
        case let .fieldDoesNotRoundTrip(entity, field, keyPath):
            return "\(entity).\(field) does not survive a read and a save: it is written from \(keyPath), which does not hold the value the model's reading took from '\(field)' (bound to another property, or not read)"
        case let .unreadableRecord(entity, reason):
            return "a record of \(entity) cannot be read through its init(row:): \(reason)"
        }
    }
}
