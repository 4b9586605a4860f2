import Foundation

/// The typed description of a model's entity: each attribute and relationship bound to its key path.
///
/// Built once per model type (a `static let`). Encoding a model to a ``Snapshot`` goes through the stored key paths
/// (one typed getter per field, no reflection); predicates and sort descriptors map key paths to columns through it.
public struct ModelEntity<Model: PersistentModel>: @unchecked Sendable {
    // @unchecked: key paths are immutable and thread-safe; the closures capture only key paths.

    /// One member of an entity: an attribute or a relationship.
    public struct Member {
        enum Kind {
            case attribute(Schema.Attribute, encode: (Model) -> SQLiteValue)
            case toOne(Schema.Relationship, encode: (Model) -> SQLiteValue)
            case toMany(Schema.Relationship, assign: (inout Model, [UUID]) -> Void)
        }
        let kind: Kind
        let keyPath: PartialKeyPath<Model>

        /// A stored attribute.
        /// - Parameters:
        ///   - name: the attribute name; equal to the property name for `Decodable` models.
        ///   - keyPath: the property.
        ///   - defaultValue: the declared default, used for records created without this field (older app versions).
        ///     Synced entities need one for every non-optional attribute.
        ///   - options: ``Schema/Attribute/Options``.
        public static func attribute<Value: AttributeValue>(
            _ name: String, _ keyPath: WritableKeyPath<Model, Value>, default defaultValue: Value? = nil,
            options: Schema.Attribute.Options = []
        ) -> Member {
            let attribute = Schema.Attribute(
                name: name, type: Value.attributeType, isOptional: Value.isOptionalAttribute,
                defaultValue: defaultValue?.sqliteValue, options: options)
            return Member(kind: .attribute(attribute, encode: { $0[keyPath: keyPath].sqliteValue }), keyPath: keyPath)
        }

        /// A to-one relationship, stored as the referenced record's ID.
        /// - Parameters:
        ///   - inverse: the name of the inverse relationship on `Target`, if any.
        ///   - deleteRule: applied to the referenced record when this record is deleted.
        public static func toOne<Target: PersistentModel>(
            _ name: String, _ keyPath: WritableKeyPath<Model, Reference<Target>?>, inverse: String? = nil,
            deleteRule: Schema.DeleteRule = .nullify
        ) -> Member {
            let relationship = Schema.Relationship(
                name: name, destination: Target.entityName, inverse: inverse, isToMany: false, deleteRule: deleteRule, isOptional: true)
            return Member(kind: .toOne(relationship, encode: { $0[keyPath: keyPath]?.id.sqliteValue ?? .null }), keyPath: keyPath)
        }

        /// A required to-one relationship (local stores only: synced relationships must be optional).
        /// A reference to ``UUID/unassigned`` means "not set yet": it is stored as no reference, and a save reports it as
        /// ``ModelValidationFailure/missingRequiredRelationship(entity:relationship:id:)``.
        public static func toOne<Target: PersistentModel>(
            _ name: String, _ keyPath: WritableKeyPath<Model, Reference<Target>>, inverse: String? = nil,
            deleteRule: Schema.DeleteRule = .nullify
        ) -> Member {
            let relationship = Schema.Relationship(
                name: name, destination: Target.entityName, inverse: inverse, isToMany: false, deleteRule: deleteRule, isOptional: false)
            return Member(kind: .toOne(relationship, encode: { model in
                let id = model[keyPath: keyPath].id
                return id == .unassigned ? .null : id.sqliteValue
            }), keyPath: keyPath)
        }

        /// A to-many relationship. It is not stored in this record: its members are the `Target` records whose
        /// `inverse` to-one relationship points here, and it is filled when the model is fetched.
        /// - Parameters:
        ///   - inverse: the to-one relationship on `Target` that points back (required).
        ///   - deleteRule: applied to the related records when this record is deleted.
        public static func toMany<Target: PersistentModel>(
            _ name: String, _ keyPath: WritableKeyPath<Model, [Reference<Target>]>, inverse: String,
            deleteRule: Schema.DeleteRule = .nullify
        ) -> Member {
            let relationship = Schema.Relationship(
                name: name, destination: Target.entityName, inverse: inverse, isToMany: true, deleteRule: deleteRule)
            return Member(kind: .toMany(relationship, assign: { model, ids in
                model[keyPath: keyPath] = ids.map(Reference<Target>.init)
            }), keyPath: keyPath)
        }
    }

    /// The type-erased schema entity.
    public let schemaEntity: Schema.Entity
    /// Field encoders in ``Schema/Entity/fieldNames`` order.
    let fieldEncoders: [(Model) -> SQLiteValue]
    /// Field index (in ``Schema/Entity/fieldNames`` order) by key path.
    let fieldIndexByKeyPath: [PartialKeyPath<Model>: Int]
    /// Field index by name.
    let fieldIndexByName: [String: Int]
    /// To-many relationships with the closure that assigns their members.
    let toManyMembers: [(relationship: Schema.Relationship, assign: (inout Model, [UUID]) -> Void)]

    /// Describes the entity of `Model` (named ``PersistentModel/entityName``).
    /// - Parameters:
    ///   - members: attributes and relationships, in declaration order.
    ///   - uniquenessConstraints: compound unique keys (SwiftData's `#Unique`), as lists of attribute names.
    public init(_ members: [Member], uniquenessConstraints: [[String]] = []) {
        var attributes: [Schema.Attribute] = []
        var relationships: [Schema.Relationship] = []
        var attributeEncoders: [(Model) -> SQLiteValue] = []
        var referenceEncoders: [(Model) -> SQLiteValue] = []
        var attributeKeyPaths: [PartialKeyPath<Model>] = []
        var referenceKeyPaths: [PartialKeyPath<Model>] = []
        var toMany: [(relationship: Schema.Relationship, assign: (inout Model, [UUID]) -> Void)] = []
        for member in members {
            switch member.kind {
            case let .attribute(attribute, encode):
                attributes.append(attribute)
                attributeEncoders.append(encode)
                attributeKeyPaths.append(member.keyPath)
            case let .toOne(relationship, encode):
                relationships.append(relationship)
                referenceEncoders.append(encode)
                referenceKeyPaths.append(member.keyPath)
            case let .toMany(relationship, assign):
                relationships.append(relationship)
                toMany.append((relationship, assign))
            }
        }
        let entity = Schema.Entity(name: Model.entityName, attributes: attributes, relationships: relationships,
                                   uniquenessConstraints: uniquenessConstraints)
        self.schemaEntity = entity
        self.fieldEncoders = attributeEncoders + referenceEncoders
        var byKeyPath: [PartialKeyPath<Model>: Int] = [:]
        for (index, keyPath) in (attributeKeyPaths + referenceKeyPaths).enumerated() { byKeyPath[keyPath] = index }
        self.fieldIndexByKeyPath = byKeyPath
        var byName: [String: Int] = [:]
        for (index, name) in entity.fieldNames.enumerated() { byName[name] = index }
        self.fieldIndexByName = byName
        self.toManyMembers = toMany
    }

    /// The snapshot of `model`: its ID and every field's stored value. Complexity: O(fields), no reflection.
    public func snapshot(of model: Model) -> Snapshot {
        Snapshot(entityName: schemaEntity.name, id: model.id, values: fieldEncoders.map { $0(model) })
    }

    /// The field name bound to `keyPath`, if it is an attribute or to-one relationship of this entity.
    public func fieldName(for keyPath: PartialKeyPath<Model>) -> String? {
        fieldIndexByKeyPath[keyPath].map { schemaEntity.fieldNames[$0] }
    }
}
