import Foundation

/// Marks the attribute value types a store file's query reads as handles to their files, not their bytes:
/// ``ExternalData`` and `ExternalData?` (Store/ExternalData.swift conforms them; see `QueryEngine.selectList`). Internal.
protocol ExternalDataAttribute {}

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
            case toMany(Schema.Relationship, assign: (inout Model, [UUID], (any ReferenceLoading)?) -> Void, members: (Model) -> [UUID])
        }
        var kind: Kind
        let keyPath: PartialKeyPath<Model>
        /// The same member reached through a reference: `\Reference<Model>.[dynamicMember: keyPath]`.
        let referenceKeyPath: AnyKeyPath
        /// What predicates and sort descriptors may do with the member.
        var query: QueryMember
        /// For relationships: resolves the references of a batch of models.
        let prefetch: Prefetch?
        /// For to-one relationships: lets the model's unresolved reference load its target through a loader.
        var attachLoader: ((inout Model, any ReferenceLoading) -> Void)?
        /// For relationships: whether two models' references carry equal targets (both none, or equal values, their
        /// own carried targets compared likewise). Live queries compare results with it.
        var sameTargets: ((Model, Model) -> Bool)?
        /// For an attribute that is a stored property of a common type: where and how to load it directly.
        var load: FieldLoad?
        /// For an attribute: a stored value of its type that reads back as itself, distinct per seed where the type
        /// allows (what the declaration check of ``ModelEntity/declarationMismatches()`` reads the model from), or
        /// `nil` when none can be made.
        var sample: ((_ seed: Int, _ declaredDefault: SQLiteValue?) -> SQLiteValue?)?
        /// For an attribute of type ``ExternalData`` (or its optional): fetched as a handle to its file, not its bytes.
        var readsHandle = false

        /// This member with, for a non-optional attribute that declares no default, the value `model` holds at its
        /// key path as the default (what ``ModelEntity/init(defaults:_:uniquenessConstraints:originalName:)`` does).
        func takingDefault(from model: Model) -> Member {
            guard case let .attribute(attribute, encode) = kind, attribute.defaultValue == nil, !attribute.isOptional else {
                return self
            }
            var updated = attribute
            updated.defaultValue = encode(model)
            var member = self
            member.kind = .attribute(updated, encode: encode)
            if case let .attribute(_, composite) = query { member.query = .attribute(updated, composite: composite) }
            return member
        }

        /// For a member whose value is optional: the same member reached through a reference's flattening
        /// subscript (`\Reference<Model>.[dynamicMember:]` over `KeyPath<Model, Wrapped?>`), which is what
        /// `$0.trip?.destination` spells in a predicate. ``referenceKeyPath`` is the other subscript's key path.
        var flattenedReferenceKeyPath: AnyKeyPath? {
            guard let optional = type(of: keyPath).valueType as? any OptionalReferenceKeyPaths.Type else { return nil }
            return optional.flattenedReferenceKeyPath(keyPath, root: Model.self)
        }

        /// A stored attribute.
        /// - Parameters:
        ///   - name: the attribute name; equal to the property name for `Decodable` models.
        ///   - keyPath: the property.
        ///   - defaultValue: the declared default, used for records created without this field (older app versions).
        ///     Synced entities need one for every non-optional attribute. Without one, an entity made with
        ///     ``ModelEntity/init(defaults:_:uniquenessConstraints:originalName:)`` takes the property's initial value.
        ///   - options: ``Schema/Attribute/Options``.
        ///   - originalName: the attribute's name in an earlier schema version (``Schema/Attribute/originalName``):
        ///     a local store renames its column. Local entities only.
        public static func attribute<Value: AttributeValue>(
            _ name: String, _ keyPath: WritableKeyPath<Model, Value>, default defaultValue: Value? = nil,
            options: Schema.Attribute.Options = [], originalName: String? = nil
        ) -> Member {
            let attribute = Schema.Attribute(
                name: name, type: Value.attributeType, isOptional: Value.isOptionalAttribute,
                defaultValue: defaultValue?.sqliteValue, options: options, originalName: originalName)
            var member = Member(kind: .attribute(attribute, encode: fieldReader(keyPath) { $0.sqliteValue }), keyPath: keyPath,
                                referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                                query: .attribute(attribute, composite: CompositeTypeInfo.of(Value.self)), prefetch: nil)
            member.load = FieldLoad.stored(keyPath)
            member.sample = { seed, declaredDefault in sampleValue(Value.self, seed: seed, declaredDefault: declaredDefault) }
            if Value.self is any ExternalDataAttribute.Type {
                precondition(options.contains(.externalStorage),
                             "Replica: attribute '\(name)' of \(Model.self) is ExternalData: declare it with options: .externalStorage")
                member.readsHandle = true
            }
            return member
        }

        /// A getter for the property at `keyPath` followed by `convert`. A key path to a stored property of a struct
        /// is read straight from the property's offset in the value (`MemoryLayout.offset(of:)`), several times
        /// cheaper than a key-path projection; other key paths (computed properties, classes) are projected.
        static func fieldReader<Value, Result>(_ keyPath: WritableKeyPath<Model, Value>,
                                              _ convert: @escaping (Value) -> Result) -> (Model) -> Result {
            guard let offset = MemoryLayout<Model>.offset(of: keyPath) else {
                return { convert($0[keyPath: keyPath]) }
            }
            return { model in
                withUnsafePointer(to: model) { pointer in
                    convert(UnsafeRawPointer(pointer).load(fromByteOffset: offset, as: Value.self))
                }
            }
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
            var member = Member(kind: .toOne(relationship, encode: fieldReader(keyPath) { $0?.id.sqliteValue ?? .null }), keyPath: keyPath,
                                referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                                query: .toOne(relationship, target: Target.self), prefetch: prefetch)
            member.attachLoader = { model, loader in model[keyPath: keyPath]?.attach(loader) }
            member.sameTargets = { a, b in sameCarriedTarget(a[keyPath: keyPath]?.resolved, b[keyPath: keyPath]?.resolved) }
            return member
        }

        /// A required to-one relationship (local stores only: synced relationships must be optional).
        /// A reference to ``FoundationEssentials/UUID/unassigned`` means "not set yet": it is stored as no reference, and a save reports it as
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
            var member = Member(kind: .toOne(relationship, encode: fieldReader(keyPath) { reference in
                reference.id == .unassigned ? .null : reference.id.sqliteValue
            }), keyPath: keyPath,
                                referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                                query: .toOne(relationship, target: Target.self), prefetch: prefetch)
            member.attachLoader = { model, loader in model[keyPath: keyPath].attach(loader) }
            member.sameTargets = { a, b in sameCarriedTarget(a[keyPath: keyPath].resolved, b[keyPath: keyPath].resolved) }
            return member
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
            var member = Member(kind: .toMany(relationship, assign: { model, ids, loader in
                model[keyPath: keyPath] = ids.map { Reference<Target>($0, loader: loader) }
            }, members: { $0[keyPath: keyPath].map(\.id) }), keyPath: keyPath,
                                referenceKeyPath: \Reference<Model>.[dynamicMember: keyPath],
                                query: .toMany(relationship, target: Target.self), prefetch: prefetch)
            member.sameTargets = { a, b in
                let x = a[keyPath: keyPath], y = b[keyPath: keyPath]
                return x.count == y.count && zip(x, y).allSatisfy { sameCarriedTarget($0.resolved, $1.resolved) }
            }
            return member
        }
    }

    /// To-many relationships with the closures that assign (with the loader their references load targets through)
    /// and read their members.
    typealias ToManyMember = (relationship: Schema.Relationship, assign: (inout Model, [UUID], (any ReferenceLoading)?) -> Void,
                              members: (Model) -> [UUID])

    /// The entity's description and encoders, built once and shared: copying a `ModelEntity` (every access to a
    /// model's `static let entity`) costs one retain.
    final class Storage: @unchecked Sendable {
        let schemaEntity: Schema.Entity
        let fieldNames: [String]
        let fieldEncoders: [(Model) -> SQLiteValue]
        /// How ``snapshot(of:)`` reads each field directly (`nil`: through its encoder).
        let fieldLoads: [FieldLoad?]
        let fieldIndexByKeyPath: [PartialKeyPath<Model>: Int]
        let fieldIndexByName: [String: Int]
        let toManyMembers: [ToManyMember]
        /// `!toManyMembers.isEmpty`, stored: reading the array of `ToManyMember` tuples in unspecialized generic
        /// code looks up the tuple's and closures' type metadata on every access (about 1.5k instructions).
        let hasToManyMembers: Bool
        let prefetchByName: [String: Prefetch]
        /// One per to-one relationship: attaches a loader to the model's unresolved reference (see
        /// ``Member/attachLoader``).
        let loaderAttachers: [(inout Model, any ReferenceLoading) -> Void]
        /// One per relationship: compares two models' carried targets (see ``Member/sameTargets``).
        let targetComparers: [(Model, Model) -> Bool]
        let query: EntityQueryInfo
        let codableEncoder: ((Model) -> [SQLiteValue])?
        /// Every member as the declaration check compares it with the type: fields in ``fieldNames`` order, then the
        /// to-many relationships.
        let declaredMembers: [DeclaredMember]
        /// The entity's stored table as a query source (quoted name), and the one-ID lookup that
        /// ``QueryEngine/loadModels(_:ids:prefetch:)`` runs on it when the entity has no pending changes (every
        /// field, `WHERE "id" = ?`): built once, its prepared statement cached by key (no SQL text to build or
        /// hash per `model(_:id:)`). Kept by this storage, and by each connection that caches its statement.
        let table: String
        let oneIDLookup: StatementKey
        /// Every field index, `0..<fieldNames.count` (the fields a full-row read selects).
        let allFields: [Int]
        /// The fields of ``ExternalData`` attributes: a store file's query reads them as handles to their files.
        let handleFields: Set<Int>

        init(schemaEntity: Schema.Entity, fieldEncoders: [(Model) -> SQLiteValue], fieldLoads: [FieldLoad?],
             fieldIndexByKeyPath: [PartialKeyPath<Model>: Int], toManyMembers: [ToManyMember],
             prefetchByName: [String: Prefetch], loaderAttachers: [(inout Model, any ReferenceLoading) -> Void],
             targetComparers: [(Model, Model) -> Bool], query: EntityQueryInfo, declaredMembers: [DeclaredMember],
             handleFields: Set<Int>) {
            self.schemaEntity = schemaEntity
            self.handleFields = handleFields
            self.declaredMembers = declaredMembers
            self.fieldNames = schemaEntity.fieldNames
            self.fieldEncoders = fieldEncoders
            self.fieldLoads = fieldLoads
            self.fieldIndexByKeyPath = fieldIndexByKeyPath
            var byName: [String: Int] = [:]
            for (index, name) in fieldNames.enumerated() { byName[name] = index }
            self.fieldIndexByName = byName
            self.toManyMembers = toManyMembers
            self.hasToManyMembers = !toManyMembers.isEmpty
            self.prefetchByName = prefetchByName
            self.loaderAttachers = loaderAttachers
            self.targetComparers = targetComparers
            self.query = query
            self.table = quoted(schemaEntity.name)
            self.allFields = Array(fieldNames.indices)
            // The text of the store's `EntityStatements.selectByID` (same columns, same order): a connection that
            // both fetches and saves this entity prepares one statement for both.
            self.oneIDLookup = StatementKey("SELECT \(([quoted("id")] + fieldNames.map(quoted)).joined(separator: ", ")) FROM \(table) WHERE \"id\" = ?")
            if let codable = Model.self as? any CodablePersistentModel.Type {
                self.codableEncoder = (makeCodableRowEncoder(codable, layout: RowEncodingLayout(entity: schemaEntity), fallback: fieldEncoders)
                    as! (Model) -> [SQLiteValue])
            } else {
                self.codableEncoder = nil
            }
        }
    }

    let storage: Storage

    /// The type-erased schema entity.
    public var schemaEntity: Schema.Entity { storage.schemaEntity }
    /// The entity name (``PersistentModel/entityName``, computed once).
    var name: String { storage.schemaEntity.name }
    /// Field encoders in ``Schema/Entity/fieldNames`` order.
    var fieldEncoders: [(Model) -> SQLiteValue] { storage.fieldEncoders }
    /// Field index (in ``Schema/Entity/fieldNames`` order) by key path.
    var fieldIndexByKeyPath: [PartialKeyPath<Model>: Int] { storage.fieldIndexByKeyPath }
    /// Field index by name.
    var fieldIndexByName: [String: Int] { storage.fieldIndexByName }
    /// To-many relationships, in declaration order, with the closures that assign and read their members.
    var toManyMembers: [ToManyMember] { storage.toManyMembers }
    /// Relationship resolvers by relationship name.
    var prefetchByName: [String: Prefetch] { storage.prefetchByName }
    /// Key paths to members, for predicates and sort descriptors (type-erased).
    var query: EntityQueryInfo { storage.query }
    /// For a ``CodablePersistentModel``: encodes every field value through `encode(to:)`.
    var codableEncoder: ((Model) -> [SQLiteValue])? { storage.codableEncoder }

    /// Describes the entity of `Model` (named ``PersistentModel/entityName``).
    /// - Parameters:
    ///   - members: attributes and relationships, in declaration order.
    ///   - uniquenessConstraints: compound unique keys (SwiftData's `#Unique`), as lists of attribute names.
    ///   - originalName: the entity's name in an earlier schema version (``Schema/Entity/originalName``): a local
    ///     store renames its table. Local entities only.
    public init(_ members: [Member], uniquenessConstraints: [[String]] = [], originalName: String? = nil) {
        self.init(members: members, uniquenessConstraints: uniquenessConstraints, originalName: originalName)
    }

    /// Describes the entity of `Model`, taking the default of every non-optional attribute that declares none from
    /// `defaults`: the value `defaults` holds at the attribute's key path. Pass `Model()` to use the initial values the
    /// type already declares (`var name = ""`), instead of repeating them in `.attribute(…, default:)`:
    ///
    /// ```swift
    /// struct Trip: PersistentModel, Codable {
    ///     var id = UUID.unassigned
    ///     var name = ""
    ///     var rating = 3
    ///     static let entity = ModelEntity<Trip>(defaults: Trip(), [
    ///         .attribute("name", \.name),      // default ""
    ///         .attribute("rating", \.rating),  // default 3
    ///     ])
    /// }
    /// ```
    ///
    /// An explicit `default:` wins; optional attributes keep "no default" (a record without the field reads `nil`).
    /// - Parameters:
    ///   - defaults: a model whose attribute values are the defaults (read once, when the entity is built).
    ///   - members: attributes and relationships, in declaration order.
    ///   - uniquenessConstraints: compound unique keys, as ``init(_:uniquenessConstraints:originalName:)``.
    ///   - originalName: the entity's name in an earlier schema version, as ``init(_:uniquenessConstraints:originalName:)``.
    public init(defaults: Model, _ members: [Member], uniquenessConstraints: [[String]] = [], originalName: String? = nil) {
        self.init(members: members.map { $0.takingDefault(from: defaults) }, uniquenessConstraints: uniquenessConstraints,
                  originalName: originalName)
    }

    private init(members: [Member], uniquenessConstraints: [[String]], originalName: String?) {
        var attributes: [Schema.Attribute] = []
        var relationships: [Schema.Relationship] = []
        var attributeEncoders: [(Model) -> SQLiteValue] = []
        var referenceEncoders: [(Model) -> SQLiteValue] = []
        var attributeLoads: [FieldLoad?] = []
        var attributeKeyPaths: [PartialKeyPath<Model>] = []
        var referenceKeyPaths: [PartialKeyPath<Model>] = []
        var toMany: [ToManyMember] = []
        var prefetch: [String: Prefetch] = [:]
        var attachers: [(inout Model, any ReferenceLoading) -> Void] = []
        var comparers: [(Model, Model) -> Bool] = []
        var declaredAttributes: [DeclaredMember] = []
        var handleFields = Set<Int>()
        var declaredToOne: [DeclaredMember] = []
        var declaredToMany: [DeclaredMember] = []
        var queryMembers: [AnyKeyPath: QueryMember] = [
            \Model.persistentModelID: .persistentModelID,
            \Reference<Model>.id: .id,
            \Reference<Model>.persistentModelID: .persistentModelID,
        ]
        for member in members {
            switch member.kind {
            case let .attribute(attribute, encode):
                if member.readsHandle { handleFields.insert(attributes.count) }
                attributes.append(attribute)
                attributeEncoders.append(encode)
                attributeLoads.append(member.load)
                attributeKeyPaths.append(member.keyPath)
                declaredAttributes.append(DeclaredMember(kind: .attribute(attribute), keyPath: member.keyPath, sample: member.sample))
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
                declaredToOne.append(DeclaredMember(kind: .toOne(relationship), keyPath: member.keyPath, sample: nil))
            case let .toMany(relationship, assign, read):
                relationships.append(relationship)
                toMany.append((relationship, assign, read))
                declaredToMany.append(DeclaredMember(kind: .toMany(relationship), keyPath: member.keyPath, sample: nil))
            }
            if let attach = member.attachLoader { attachers.append(attach) }
            if let compare = member.sameTargets { comparers.append(compare) }
            queryMembers[member.keyPath] = member.query
            queryMembers[member.referenceKeyPath] = member.query
            if let flattened = member.flattenedReferenceKeyPath { queryMembers[flattened] = member.query }
            if let resolve = member.prefetch, case let .toOne(relationship, _) = member.query { prefetch[relationship.name] = resolve }
            if let resolve = member.prefetch, case let .toMany(relationship, _) = member.query { prefetch[relationship.name] = resolve }
        }
        let entity = Schema.Entity(name: Model.entityName, attributes: attributes, relationships: relationships,
                                   uniquenessConstraints: uniquenessConstraints, originalName: originalName)
        var byKeyPath: [PartialKeyPath<Model>: Int] = [:]
        for (index, keyPath) in (attributeKeyPaths + referenceKeyPaths).enumerated() { byKeyPath[keyPath] = index }
        storage = Storage(schemaEntity: entity, fieldEncoders: attributeEncoders + referenceEncoders,
                          fieldLoads: attributeLoads + referenceEncoders.map { _ in nil },
                          fieldIndexByKeyPath: byKeyPath, toManyMembers: toMany, prefetchByName: prefetch,
                          loaderAttachers: attachers, targetComparers: comparers,
                          query: EntityQueryInfo(name: Model.entityName, modelType: Model.self, schemaEntity: entity,
                                                 members: queryMembers),
                          declaredMembers: declaredAttributes + declaredToOne + declaredToMany, handleFields: handleFields)
    }

    /// The snapshot of `model`: its ID, every field's stored value and the members of its to-many relationships,
    /// read with the key paths (or, for a ``CodablePersistentModel``, the fields through `encode(to:)`).
    /// Complexity: O(fields + to-many members), no reflection.
    public func snapshot(of model: Model) -> Snapshot {
        let storage = storage
        let toMany = storage.hasToManyMembers ? storage.toManyMembers.map { $0.members(model) } : []
        return Snapshot(entityName: storage.schemaEntity.name, id: model.id, values: fieldValues(of: model),
                        toManyMembers: toMany)
    }

    /// The field values of `model`, without to-many members: what a fetch registers as the base of field-level
    /// change tracking. Complexity: O(fields).
    func fieldSnapshot(of model: Model) -> Snapshot {
        Snapshot(entityName: storage.schemaEntity.name, id: model.id, values: fieldValues(of: model))
    }

    /// Every field's stored value, in ``Schema/Entity/fieldNames`` order: loaded from the stored properties'
    /// offsets where possible, else through the fields' encoders (or `encode(to:)` for a ``CodablePersistentModel``).
    private func fieldValues(of model: Model) -> [SQLiteValue] {
        let storage = storage
        if let codableEncoder = storage.codableEncoder { return codableEncoder(model) }
        let loads = storage.fieldLoads
        let encoders = storage.fieldEncoders
        return [SQLiteValue](unsafeUninitializedCapacity: loads.count) { buffer, count in
            withUnsafePointer(to: model) { pointer in
                let base = UnsafeRawPointer(pointer)
                for index in 0..<loads.count {
                    (buffer.baseAddress! + index).initialize(to: loads[index]?.value(base) ?? encoders[index](model))
                }
            }
            count = loads.count
        }
    }

    /// The model a snapshot describes (for history and sync, which hold snapshots): fields from its values, to-many
    /// members from ``Snapshot/toManyMembers`` when it carries them.
    /// - Throws: ``ValueConversionError`` when a value does not fit its property.
    func model(from snapshot: Snapshot) throws -> Model {
        let layout = RowLayout(entity: schemaEntity, fieldIndexByName: fieldIndexByName)
        var model = try Model(row: ModelRow(id: snapshot.id, values: snapshot.values, layout: layout))
        for (slot, member) in toManyMembers.enumerated() where slot < snapshot.toManyMembers.count {
            member.assign(&model, snapshot.toManyMembers[slot], nil)
        }
        return model
    }

    /// The field name bound to `keyPath`, if it is an attribute or to-one relationship of this entity.
    public func fieldName(for keyPath: PartialKeyPath<Model>) -> String? {
        storage.fieldIndexByKeyPath[keyPath].map { storage.fieldNames[$0] }
    }
}

/// How ``snapshot(of:)`` reads one field: straight from a stored property's offset for the common attribute
/// types, without a closure call or generic dispatch (other fields go through their encoders).
enum FieldLoad {
    case string(Int), int(Int), double(Int), bool(Int), date(Int), data(Int), uuid(Int)
    case optionalString(Int), optionalInt(Int), optionalDouble(Int), optionalBool(Int), optionalDate(Int)
    case optionalData(Int), optionalUUID(Int)

    /// The direct load of the stored property at `keyPath`, or `nil` (not a stored property of the model's own
    /// storage, per `MemoryLayout.offset(of:)`, or another type).
    static func stored<Model, Value: AttributeValue>(_ keyPath: WritableKeyPath<Model, Value>) -> FieldLoad? {
        guard let offset = MemoryLayout<Model>.offset(of: keyPath) else { return nil }
        switch Value.self {
        case is String.Type: return .string(offset)
        case is Int.Type: return .int(offset)
        case is Double.Type: return .double(offset)
        case is Bool.Type: return .bool(offset)
        case is Date.Type: return .date(offset)
        case is Data.Type: return .data(offset)
        case is UUID.Type: return .uuid(offset)
        case is String?.Type: return .optionalString(offset)
        case is Int?.Type: return .optionalInt(offset)
        case is Double?.Type: return .optionalDouble(offset)
        case is Bool?.Type: return .optionalBool(offset)
        case is Date?.Type: return .optionalDate(offset)
        case is Data?.Type: return .optionalData(offset)
        case is UUID?.Type: return .optionalUUID(offset)
        default: return nil
        }
    }

    /// The stored value of this field of the model at `base`.
    @inline(__always)
    func value(_ base: UnsafeRawPointer) -> SQLiteValue {
        switch self {
        case let .string(o): return base.load(fromByteOffset: o, as: String.self).sqliteValue
        case let .int(o): return base.load(fromByteOffset: o, as: Int.self).sqliteValue
        case let .double(o): return base.load(fromByteOffset: o, as: Double.self).sqliteValue
        case let .bool(o): return base.load(fromByteOffset: o, as: Bool.self).sqliteValue
        case let .date(o): return base.load(fromByteOffset: o, as: Date.self).sqliteValue
        case let .data(o): return base.load(fromByteOffset: o, as: Data.self).sqliteValue
        case let .uuid(o): return base.load(fromByteOffset: o, as: UUID.self).sqliteValue
        case let .optionalString(o): return base.load(fromByteOffset: o, as: String?.self).sqliteValue
        case let .optionalInt(o): return base.load(fromByteOffset: o, as: Int?.self).sqliteValue
        case let .optionalDouble(o): return base.load(fromByteOffset: o, as: Double?.self).sqliteValue
        case let .optionalBool(o): return base.load(fromByteOffset: o, as: Bool?.self).sqliteValue
        case let .optionalDate(o): return base.load(fromByteOffset: o, as: Date?.self).sqliteValue
        case let .optionalData(o): return base.load(fromByteOffset: o, as: Data?.self).sqliteValue
        case let .optionalUUID(o): return base.load(fromByteOffset: o, as: UUID?.self).sqliteValue
        }
    }
}

/// Builds the key path of ``Reference``'s flattening member subscript for an optional member. Internal.
protocol OptionalReferenceKeyPaths {
    static func flattenedReferenceKeyPath<Root: PersistentModel>(_ keyPath: AnyKeyPath, root: Root.Type) -> AnyKeyPath?
}

extension Optional: OptionalReferenceKeyPaths {
    static func flattenedReferenceKeyPath<Root: PersistentModel>(_ keyPath: AnyKeyPath, root: Root.Type) -> AnyKeyPath? {
        guard let typed = keyPath as? KeyPath<Root, Wrapped?> else { return nil }
        return \Reference<Root>.[dynamicMember: typed]
    }
}

/// Whether two carried targets are the same: both absent, or equal in every field, to-many member and carried target
/// of their own. Internal (live queries compare results with it).
func sameCarriedTarget<Target: PersistentModel>(_ a: Target?, _ b: Target?) -> Bool {
    switch (a, b) {
    case (nil, nil): return true
    case let (x?, y?): return Target.entity.sameValue(x, y)
    default: return false
    }
}

extension ModelEntity {
    /// Whether `a` and `b` hold the same values: ID, every field, every to-many member, and the targets their
    /// references carry (compared the same way). Complexity: O(fields + members) per model, plus its carried targets.
    func sameValue(_ a: Model, _ b: Model) -> Bool {
        guard a.id == b.id, snapshot(of: a) == snapshot(of: b) else { return false }
        for compare in storage.targetComparers where !compare(a, b) { return false }
        return true
    }

    /// Lets every unresolved reference of `models` load its target through `loader` (to-many members get it when
    /// they are assigned). O(models × to-one relationships).
    func attach(_ loader: any ReferenceLoading, to models: inout [Model]) {
        let attachers = storage.loaderAttachers
        guard !attachers.isEmpty else { return }
        for index in models.indices {
            for attach in attachers { attach(&models[index], loader) }
        }
    }
}
