import Foundation

/// The typed description of a model's entity: each attribute and relationship bound to its key path.
///
/// Built once per model type (a `static let`). Encoding a model to a ``Snapshot`` goes through the stored key paths
/// (one typed getter per field, no reflection); predicates and sort descriptors map key paths to columns through it.
public struct ModelEntity<Model: PersistentModel>: @unchecked Sendable {
    // @unchecked: key paths are immutable and thread-safe; the closures capture only key paths.

    /// Resolves one relationship of a batch of models: loads the targets (one query) and stores resolved
    /// ``Reference``s into the models. Returns the IDs of the models with a reference whose target does not exist.
    typealias Prefetch = (inout [Model], any ModelLoading, PrefetchTree) throws -> [UUID]

    /// One member of an entity: an attribute or a relationship.
    public struct Member {
        enum Kind {
            case attribute(Schema.Attribute, encode: (Model) -> SQLiteValue)
            case toOne(Schema.Relationship, encode: (Model) -> SQLiteValue)
            case toMany(Schema.Relationship, assign: (inout Model, [UUID]) -> Void, members: (Model) -> [UUID])
        }
        let kind: Kind
        let keyPath: PartialKeyPath<Model>
        /// The same member reached through a reference: `\Reference<Model>.[dynamicMember: keyPath]`.
        let referenceKeyPath: AnyKeyPath
        /// What predicates and sort descriptors may do with the member.
        let query: QueryMember
        /// For relationships: resolves the references of a batch of models.
        let prefetch: Prefetch?

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
            return Member(kind: .attribute(attribute, encode: { $0[keyPath: keyPath].sqliteValue }), keyPath: keyPath,
                          referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                          query: .attribute(attribute, composite: CompositeTypeInfo.of(Value.self)), prefetch: nil)
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
            let prefetch: Prefetch = { models, loader, nested in
                var ids: [UUID] = []
                var seen = Set<UUID>()
                for model in models { if let id = model[keyPath: keyPath]?.id, seen.insert(id).inserted { ids.append(id) } }
                let targets = try loader.loadModels(Target.self, ids: ids, prefetch: nested)
                var dangling: [UUID] = []
                for index in models.indices {
                    guard let reference = models[index][keyPath: keyPath] else { continue }
                    if let target = targets[reference.id] {
                        models[index][keyPath: keyPath] = reference.resolving(target)
                    } else {
                        dangling.append(models[index].id)
                    }
                }
                return dangling
            }
            return Member(kind: .toOne(relationship, encode: { $0[keyPath: keyPath]?.id.sqliteValue ?? .null }), keyPath: keyPath,
                          referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                          query: .toOne(relationship, target: Target.self), prefetch: prefetch)
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
            let prefetch: Prefetch = { models, loader, nested in
                var ids: [UUID] = []
                var seen = Set<UUID>()
                for model in models where seen.insert(model[keyPath: keyPath].id).inserted { ids.append(model[keyPath: keyPath].id) }
                let targets = try loader.loadModels(Target.self, ids: ids, prefetch: nested)
                var dangling: [UUID] = []
                for index in models.indices {
                    let reference = models[index][keyPath: keyPath]
                    if let target = targets[reference.id] {
                        models[index][keyPath: keyPath] = reference.resolving(target)
                    } else {
                        dangling.append(models[index].id)
                    }
                }
                return dangling
            }
            return Member(kind: .toOne(relationship, encode: { model in
                let id = model[keyPath: keyPath].id
                return id == .unassigned ? .null : id.sqliteValue
            }), keyPath: keyPath,
                          referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                          query: .toOne(relationship, target: Target.self), prefetch: prefetch)
        }

        /// A to-many relationship.
        ///
        /// - One-to-many (the inverse is a to-one relationship on `Target`): not stored in this record; its members
        ///   are the `Target` records whose inverse reference points here, filled when the model is fetched.
        /// - Many-to-many (the inverse is a to-many relationship on `Target`): stored in a link table. Saving a model
        ///   writes its side's members (adding and removing links relative to the store), so either side may be edited.
        ///
        /// - Parameters:
        ///   - inverse: the relationship on `Target` that points back (required).
        ///   - deleteRule: applied to the related records when this record is deleted.
        public static func toMany<Target: PersistentModel>(
            _ name: String, _ keyPath: WritableKeyPath<Model, [Reference<Target>]>, inverse: String,
            deleteRule: Schema.DeleteRule = .nullify
        ) -> Member {
            let relationship = Schema.Relationship(
                name: name, destination: Target.entityName, inverse: inverse, isToMany: true, deleteRule: deleteRule)
            let prefetch: Prefetch = { models, loader, nested in
                var ids: [UUID] = []
                var seen = Set<UUID>()
                for model in models {
                    for reference in model[keyPath: keyPath] where seen.insert(reference.id).inserted { ids.append(reference.id) }
                }
                let targets = try loader.loadModels(Target.self, ids: ids, prefetch: nested)
                var dangling: [UUID] = []
                for index in models.indices {
                    var complete = true
                    models[index][keyPath: keyPath] = models[index][keyPath: keyPath].map { reference in
                        if let target = targets[reference.id] { return reference.resolving(target) }
                        complete = false
                        return reference
                    }
                    if !complete { dangling.append(models[index].id) }
                }
                return dangling
            }
            return Member(kind: .toMany(relationship, assign: { model, ids in
                model[keyPath: keyPath] = ids.map(Reference<Target>.init)
            }, members: { $0[keyPath: keyPath].map(\.id) }), keyPath: keyPath,
                          referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                          query: .toMany(relationship, target: Target.self), prefetch: prefetch)
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
    /// To-many relationships, in declaration order, with the closures that assign and read their members.
    let toManyMembers: [(relationship: Schema.Relationship, assign: (inout Model, [UUID]) -> Void, members: (Model) -> [UUID])]
    /// Relationship resolvers by relationship name.
    let prefetchByName: [String: Prefetch]
    /// Key paths to members, for predicates and sort descriptors (type-erased).
    let query: EntityQueryInfo

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
        var toMany: [(relationship: Schema.Relationship, assign: (inout Model, [UUID]) -> Void, members: (Model) -> [UUID])] = []
        var prefetch: [String: Prefetch] = [:]
        var queryMembers: [AnyKeyPath: QueryMember] = [
            \Model.persistentModelID: .persistentModelID,
            \Reference<Model>.id: .id,
            \Reference<Model>.persistentModelID: .persistentModelID,
        ]
        for member in members {
            switch member.kind {
            case let .attribute(attribute, encode):
                attributes.append(attribute)
                attributeEncoders.append(encode)
                attributeKeyPaths.append(member.keyPath)
                // `\Model.composite.member` key paths (as sort descriptors spell them) reach into composite attributes.
                if case let .attribute(_, composite?) = member.query, !attribute.isOptional {
                    for (keyPath, path, leaf) in composite.flattenedMembers() {
                        if let full = (member.keyPath as AnyKeyPath).appending(path: keyPath) {
                            queryMembers[full] = .compositePath(attribute: attribute, path: path, leaf: leaf)
                        }
                    }
                }
            case let .toOne(relationship, encode):
                relationships.append(relationship)
                referenceEncoders.append(encode)
                referenceKeyPaths.append(member.keyPath)
            case let .toMany(relationship, assign, read):
                relationships.append(relationship)
                toMany.append((relationship, assign, read))
            }
            queryMembers[member.keyPath] = member.query
            queryMembers[member.referenceKeyPath] = member.query
            if let resolve = member.prefetch, case let .toOne(relationship, _) = member.query { prefetch[relationship.name] = resolve }
            if let resolve = member.prefetch, case let .toMany(relationship, _) = member.query { prefetch[relationship.name] = resolve }
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
        self.prefetchByName = prefetch
        self.query = EntityQueryInfo(name: Model.entityName, modelType: Model.self, schemaEntity: entity, members: queryMembers)
    }

    /// The snapshot of `model`: its ID, every field's stored value and the members of its to-many relationships.
    /// Complexity: O(fields + to-many members), no reflection.
    public func snapshot(of model: Model) -> Snapshot {
        Snapshot(entityName: schemaEntity.name, id: model.id, values: fieldEncoders.map { $0(model) },
                 toManyMembers: toManyMembers.map { $0.members(model) })
    }

    /// The field values of `model`, without to-many members: what a fetch registers as the base of field-level
    /// change tracking. Complexity: O(fields).
    func fieldSnapshot(of model: Model) -> Snapshot {
        Snapshot(entityName: schemaEntity.name, id: model.id, values: fieldEncoders.map { $0(model) })
    }

    /// The model a snapshot describes (for history and sync, which hold snapshots): fields from its values, to-many
    /// members from ``Snapshot/toManyMembers`` when it carries them.
    /// - Throws: ``ValueConversionError`` when a value does not fit its property.
    func model(from snapshot: Snapshot) throws -> Model {
        let layout = RowLayout(entity: schemaEntity, fieldIndexByName: fieldIndexByName)
        var model = try Model(row: ModelRow(id: snapshot.id, values: snapshot.values, layout: layout))
        for (slot, member) in toManyMembers.enumerated() where slot < snapshot.toManyMembers.count {
            member.assign(&model, snapshot.toManyMembers[slot])
        }
        return model
    }

    /// The field name bound to `keyPath`, if it is an attribute or to-one relationship of this entity.
    public func fieldName(for keyPath: PartialKeyPath<Model>) -> String? {
        fieldIndexByKeyPath[keyPath].map { schemaEntity.fieldNames[$0] }
    }
}
