import Foundation

extension Schema {
    /// A schema of the entities of the given model types, in the given order.
    ///
    /// Each type's entity description is checked against the type (``ModelDeclarationMismatch``): a container opened
    /// with this schema throws ``ReplicaError/invalidModelDeclaration(_:)`` when one disagrees, instead of failing at
    /// the first read. Complexity: one sample read and write per model type, plus one read per declared default.
    ///
    /// A store created from this schema records no schema version: the schema knows no migration plan, and its
    /// `version` is a default, not the version of a ``VersionedSchema`` (matching its models to one would take a plan
    /// this container does not have). A plan that later opens the store decides from its tables where to start, and
    /// refuses it when schemas with a custom stage between them share those tables. Create stores that a migration
    /// plan will open from ``init(versionedSchema:)`` (``VersionedSchema/schema``), which records the version.
    public init(_ models: [any PersistentModel.Type], version: Version = Version(1, 0, 0)) {
        self.init(entities: models.map { $0.schemaEntity }, version: version)
        declarationMismatches = models.flatMap { $0.declarationMismatches }
    }
}

extension PersistentModel {
    /// Where this type's entity description disagrees with the type (see ``ModelEntity/declarationMismatches()``).
    static var declarationMismatches: [ModelDeclarationMismatch] { entity.declarationMismatches() }
}

/// One member of an entity as the declaration check compares it with the model type. Internal.
struct DeclaredMember {
    enum Kind {
        case attribute(Schema.Attribute)
        case toOne(Schema.Relationship)
        case toMany(Schema.Relationship)
    }
    let kind: Kind
    let keyPath: AnyKeyPath
    /// For attributes: a sample stored value (see ``ModelEntity/Member/sample``).
    let sample: ((_ seed: Int, _ declaredDefault: SQLiteValue?) -> SQLiteValue?)?

    var name: String {
        switch kind {
        case let .attribute(attribute): return attribute.name
        case let .toOne(relationship), let .toMany(relationship): return relationship.name
        }
    }
}

extension ModelEntity {
    /// Where this entity description disagrees with `Model`, found without a store:
    ///
    /// 1. A sample record (a value of each field's type, distinct per field where the type allows; a reference for
    ///    each to-one relationship) is read through `Model(row:)`. When that read goes through `Decodable` (the
    ///    default `init(row:)`), the decoder records every key and type the model reads: a key that names no member,
    ///    a member no key reads, a key whose type is not the member's (another attribute type, a `Reference` for an
    ///    attribute, a plain value for a relationship) and an optional member read as a required property are
    ///    mismatches. A key the entity does not store reads as a zero value, so the read goes on and every mismatch is
    ///    found at once.
    /// 2. The model read is written back through the entity's key paths (or `encode(to:)` for a
    ///    ``CodablePersistentModel``): a field that does not come back as the sample was is bound to a key path that
    ///    is not the property its reading fills.
    /// 3. The sample is read once more with each declared default in place of its field's sample: a default that
    ///    does not read as the property's type is a mismatch.
    ///
    /// What it cannot see: a stored property that the model's decoding does not read (excluded from `CodingKeys`, or
    /// a hand-written `init(row:)` that skips it); key paths of two fields of the same type that are swapped *and*
    /// whose samples cannot differ (two `Bool`s); a field whose type admits no sample value (a composite attribute
    /// that cannot be built from zero values and has no default), for which step 2 and the checks of members not read
    /// are skipped. Complexity: O(fields) reads of one sample record.
    func declarationMismatches() -> [ModelDeclarationMismatch] {
        let storage = storage
        let entityName = storage.schemaEntity.name
        let members = storage.declaredMembers
        let fieldCount = storage.fieldNames.count
        var samples: [SQLiteValue] = []
        var complete = true
        for index in 0..<fieldCount {
            switch members[index].kind {
            case let .attribute(attribute):
                if let sample = members[index].sample?(index, attribute.defaultValue) {
                    samples.append(sample)
                } else {
                    samples.append(attribute.defaultValue ?? .null)
                    complete = false
                }
            case .toOne, .toMany:
                samples.append(sampleIdentifier(index).sqliteValue)
            }
        }
        let recordID = sampleIdentifier(fieldCount)
        let probe = DeclarationProbe()
        var mismatches: [ModelDeclarationMismatch] = []
        var flagged = Set<String>()
        let decoded: Model?
        var readError: (any Error)?
        do {
            decoded = try readSample(samples, id: recordID, probe: probe)
        } catch {
            decoded = nil
            if !(error is ProbeStop) { readError = error }
        }

        var propertyTypes: [String: String] = [:]
        if probe.usedDecoder {
            var byName: [String: DeclaredMember] = [:]
            for member in members where byName[member.name] == nil { byName[member.name] = member }
            var seen = Set<String>()
            for read in probe.reads where seen.insert(read.key).inserted && read.key != "id" {
                let typeName = read.type == Any.self ? "an optional value" : read.optional ? "\(read.type)?" : "\(read.type)"
                propertyTypes[read.key] = typeName
                guard let member = byName[read.key] else {
                    mismatches.append(.propertyWithoutMember(entity: entityName, property: read.key, type: typeName))
                    continue
                }
                let found = mismatchesOf(member, read: read, typeName: typeName, entity: entityName)
                if !found.isEmpty { flagged.insert(member.name) }
                mismatches += found
            }
            if decoded != nil {
                for member in members where !seen.contains(member.name) {
                    // To-many members are assigned through the key path after `init(row:)`, so a model need not decode them.
                    if case .toMany = member.kind { continue }
                    mismatches.append(.memberWithoutProperty(entity: entityName, member: member.name,
                                                             keyPath: member.keyPath.readableDescription))
                    flagged.insert(member.name)
                }
            }
        }

        if let model = decoded, complete {
            let written = snapshot(of: model).values
            for index in 0..<fieldCount where written[index] != samples[index] && !flagged.contains(members[index].name) {
                mismatches.append(.fieldDoesNotRoundTrip(entity: entityName, field: members[index].name,
                                                         keyPath: members[index].keyPath.readableDescription))
                flagged.insert(members[index].name)
            }
        }

        if decoded != nil {
            for index in 0..<fieldCount {
                guard case let .attribute(attribute) = members[index].kind, let declared = attribute.defaultValue,
                      declared != samples[index] else { continue }
                var values = samples
                values[index] = declared
                do {
                    // Through a probe, as the first read, so that this default is the only difference from it.
                    _ = try readSample(values, id: recordID, probe: DeclarationProbe())
                } catch {
                    let keyPathType = "\(type(of: members[index].keyPath).valueType)"
                    mismatches.append(.defaultOfWrongType(entity: entityName, attribute: attribute.name,
                                                          storedForm: declared.description,
                                                          propertyType: propertyTypes[attribute.name] ?? keyPathType))
                }
            }
        }

        if let readError, complete, mismatches.isEmpty {
            mismatches.append(.unreadableRecord(entity: entityName, reason: "\(readError)"))
        }
        return mismatches
    }

    /// The model a sample record reads as, through `Model(row:)` (recording into `probe` when given).
    private func readSample(_ values: [SQLiteValue], id: UUID, probe: DeclarationProbe?) throws -> Model {
        let layout = RowLayout(entity: schemaEntity, fieldIndexByName: fieldIndexByName)
        layout.probe = probe
        return try Model(row: ModelRow(id: id, values: values, layout: layout))
    }

    /// The mismatches between `member` and the property of its name, as the model's decoding read it.
    private func mismatchesOf(_ member: DeclaredMember, read: DeclarationProbe.Read, typeName: String,
                              entity: String) -> [ModelDeclarationMismatch] {
        let readType = unwrappedOptional(read.type)
        var found: [ModelDeclarationMismatch] = []
        switch member.kind {
        case let .attribute(attribute):
            let keyPathType = type(of: member.keyPath).valueType
            if readType is any ReferenceTargetNaming.Type || readType is any ReferenceListTargetNaming.Type {
                found.append(.relationshipDeclaredAsAttribute(entity: entity, attribute: attribute.name, property: read.key,
                                                              propertyType: typeName))
            } else if let propertyType = readType as? any AttributeValue.Type, propertyType.attributeType == attribute.type,
                      attribute.type != .composite || unwrappedOptional(keyPathType) == readType {
                // The same attribute type (and, for composites, the same Swift type).
            } else {
                found.append(.typeMismatch(entity: entity, attribute: attribute.name, attributeType: "\(keyPathType)",
                                           keyPath: member.keyPath.readableDescription, property: read.key,
                                           propertyType: typeName))
            }
            if attribute.isOptional && !read.optional {
                found.append(.optionalMemberOnRequiredProperty(entity: entity, member: attribute.name,
                                                               keyPath: member.keyPath.readableDescription,
                                                               property: read.key, propertyType: typeName))
            }
        case let .toOne(relationship):
            if (readType as? any ReferenceTargetNaming.Type)?.targetEntityName != relationship.destination {
                found.append(.attributeDeclaredAsRelationship(entity: entity, relationship: relationship.name,
                                                              destination: relationship.destination, property: read.key,
                                                              propertyType: typeName))
            }
            if relationship.isOptional && !read.optional {
                found.append(.optionalMemberOnRequiredProperty(entity: entity, member: relationship.name,
                                                               keyPath: member.keyPath.readableDescription,
                                                               property: read.key, propertyType: typeName))
            }
        case let .toMany(relationship):
            if (readType as? any ReferenceListTargetNaming.Type)?.targetEntityName != relationship.destination {
                found.append(.attributeDeclaredAsRelationship(entity: entity, relationship: relationship.name,
                                                              destination: relationship.destination, property: read.key,
                                                              propertyType: typeName))
            }
        }
        return found
    }
}

/// A record ID for sample records: never the unassigned ID, distinct per `seed`.
private func sampleIdentifier(_ seed: Int) -> UUID {
    var bytes = [UInt8](repeating: 0x5A, count: 16)
    bytes[14] = UInt8(truncatingIfNeeded: seed >> 8)
    bytes[15] = UInt8(truncatingIfNeeded: seed)
    return UUID(bytes: Data(bytes))!
}

/// A stored value of `Value` that reads back as itself: a plain one of its attribute type (distinct per `seed`),
/// else the declared default, else (for `Decodable` types such as composite attributes) a value built from zeros;
/// `nil` when none reads back.
func sampleValue<Value: AttributeValue>(_ type: Value.Type, seed: Int, declaredDefault: SQLiteValue?) -> SQLiteValue? {
    func readsBack(_ stored: SQLiteValue) -> Bool {
        guard let value = try? Value(sqliteValue: stored) else { return false }
        return value.sqliteValue == stored
    }
    let wrapped = (Value.self as? any OptionalAttributeMarker.Type)?.wrappedAttributeType ?? Value.self
    var candidates: [SQLiteValue] = []
    switch wrapped.attributeType {
    case .string: candidates.append(.text("sample \(seed)"))
    case .integer: candidates.append(.integer(Int64(1000 + seed)))
    // Whole numbers: an integer property bound to a double attribute reads them, so that its default is checked too.
    case .double: candidates.append(.real(Double(1000 + seed)))
    case .bool: candidates.append(.integer(Int64(seed % 2)))
    case .date: candidates.append(.real(Double(1_000_000 + seed)))
    case .data: candidates.append(.blob(Data([0xA5, UInt8(truncatingIfNeeded: seed)])))
    case .uuid: candidates.append(.blob(sampleIdentifier(seed).bytes))
    case .url: candidates.append(.text("https://sample.invalid/\(seed)"))
    case .composite: break
    }
    if let declaredDefault, !declaredDefault.isNull { candidates.append(declaredDefault) }
    if let candidate = candidates.first(where: readsBack) { return candidate }
    if let decodable = wrapped as? any Decodable.Type, let value = ZeroDecoder.make(decodable) as? any AttributeValue,
       readsBack(value.sqliteValue) {
        return value.sqliteValue
    }
    return nil
}

/// The type an optional type wraps (`Optional<T>` → `T`), or the type itself.
private func unwrappedOptional(_ type: Any.Type) -> Any.Type {
    (type as? any AnyOptionalType.Type)?.wrappedAnyType ?? type
}

private protocol AnyOptionalType {
    static var wrappedAnyType: Any.Type { get }
}

extension Optional: AnyOptionalType {
    fileprivate static var wrappedAnyType: Any.Type { Wrapped.self }
}

/// A ``Reference`` type, as the declaration check names its target.
private protocol ReferenceTargetNaming {
    static var targetEntityName: String { get }
}

extension Reference: ReferenceTargetNaming {
    fileprivate static var targetEntityName: String { Target.entityName }
}

/// A list of ``Reference``s (a to-many relationship's property), as the declaration check names its target.
private protocol ReferenceListTargetNaming {
    static var targetEntityName: String { get }
}

extension Array: ReferenceListTargetNaming where Element: ReferenceTargetNaming {
    fileprivate static var targetEntityName: String { Element.targetEntityName }
}

// MARK: - Recording what a model's decoding reads

/// What a model's `Decodable` path read from the sample record: each key with the type asked for. Internal.
final class DeclarationProbe {
    struct Read {
        let key: String
        let type: Any.Type
        /// Read with `decodeIfPresent` (an optional property), or after asking whether the key is there.
        let optional: Bool
    }
    var reads: [Read] = []
    /// Whether `init(row:)` decoded through ``ModelRowDecoder`` (the default) rather than reading the row by hand.
    var usedDecoder = false
    /// Keys asked about (`contains`, `decodeNil`) before being read.
    var checkedKeys = Set<String>()
}

/// Ends a sample read that cannot go on (a property the entity does not store, of a type with no zero value).
private struct ProbeStop: Error {}

/// The keyed container of the sample read: reads through the real one (so the check sees what a fetch would) and
/// records each key and type.
struct ProbeKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let base: RowKeyedContainer<Key>
    let probe: DeclarationProbe

    init(base: RowKeyedContainer<Key>, probe: DeclarationProbe) {
        self.base = base
        self.probe = probe
        probe.usedDecoder = true
    }

    var codingPath: [any CodingKey] { base.codingPath }
    var allKeys: [Key] { base.allKeys }

    func contains(_ key: Key) -> Bool {
        probe.checkedKeys.insert(key.stringValue)
        if !base.contains(key) {
            // Asked before reading an optional property that is not stored: no read follows, so record it here.
            probe.reads.append(.init(key: key.stringValue, type: Any.self, optional: true))
            return false
        }
        return true
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        probe.checkedKeys.insert(key.stringValue)
        if !base.contains(key) {
            // Asked before reading an optional property: record the read here, since none may follow.
            probe.reads.append(.init(key: key.stringValue, type: Any.self, optional: true))
        }
        return try base.decodeNil(forKey: key)
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        probe.reads.append(.init(key: key.stringValue, type: T.self, optional: probe.checkedKeys.contains(key.stringValue)))
        if base.contains(key) { return try base.decode(T.self, forKey: key) }
        // A property the entity does not store: go on with a zero value, to find every other mismatch too.
        if let zero = ZeroDecoder.make(T.self) as? T { return zero }
        throw ProbeStop()
    }

    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        probe.reads.append(.init(key: key.stringValue, type: T.self, optional: true))
        guard base.contains(key), try !base.decodeNil(forKey: key) else { return nil }
        return try base.decode(T.self, forKey: key)
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try base.nestedContainer(keyedBy: type, forKey: key)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try base.nestedUnkeyedContainer(forKey: key)
    }

    func superDecoder() throws -> any Decoder { try base.superDecoder() }
    func superDecoder(forKey key: Key) throws -> any Decoder { try base.superDecoder(forKey: key) }
}

// MARK: - Values built from zeros

/// A decoder that answers every question with the simplest value: empty strings, zeros, `false`, no optional
/// values, empty collections, the first case of a `CaseIterable` enum. Builds sample values of composite attributes
/// (and stands in for properties the entity does not store). Internal.
struct ZeroDecoder: Decoder {
    let depth: Int
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    /// A value of `type` built from zeros, or `nil` when the type refuses them (or nests deeper than 16 levels).
    static func make(_ type: any Decodable.Type, depth: Int = 0) -> Any? {
        guard depth < 16 else { return nil }
        switch type {
        case is String.Type: return ""
        case is Bool.Type: return false
        case is Int.Type: return 0
        case is Double.Type: return 0.0
        case is Date.Type: return Date(timeIntervalSince1970: 0)
        case is Data.Type: return Data()
        case is UUID.Type: return UUID.unassigned
        case is URL.Type: return URL(string: "https://sample.invalid")
        default: break
        }
        if let enumeration = type as? any CaseIterable.Type, let first = firstCase(of: enumeration) { return first }
        return try? type.init(from: ZeroDecoder(depth: depth + 1))
    }

    private static func firstCase<C: CaseIterable>(of type: C.Type) -> Any? { C.allCases.first }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(ZeroKeyedContainer<Key>(depth: depth))
    }
    func unkeyedContainer() -> any UnkeyedDecodingContainer { ZeroUnkeyedContainer() }
    func singleValueContainer() -> any SingleValueDecodingContainer { ZeroSingleValueContainer(depth: depth) }
}

private struct ZeroUnavailable: Error {}

private struct ZeroKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let depth: Int
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] { [] }
    func contains(_ key: Key) -> Bool { true }
    func decodeNil(forKey key: Key) -> Bool { true }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        guard let value = ZeroDecoder.make(T.self, depth: depth + 1) as? T else { throw ZeroUnavailable() }
        return value
    }
    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) -> KeyedDecodingContainer<NestedKey> {
        KeyedDecodingContainer(ZeroKeyedContainer<NestedKey>(depth: depth + 1))
    }
    func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedDecodingContainer { ZeroUnkeyedContainer() }
    func superDecoder() -> any Decoder { ZeroDecoder(depth: depth + 1) }
    func superDecoder(forKey key: Key) -> any Decoder { ZeroDecoder(depth: depth + 1) }
}

private struct ZeroUnkeyedContainer: UnkeyedDecodingContainer {
    var codingPath: [any CodingKey] { [] }
    var count: Int? { 0 }
    var isAtEnd: Bool { true }
    var currentIndex: Int { 0 }
    mutating func decodeNil() -> Bool { true }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { throw ZeroUnavailable() }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        throw ZeroUnavailable()
    }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer { throw ZeroUnavailable() }
    mutating func superDecoder() throws -> any Decoder { throw ZeroUnavailable() }
}

private struct ZeroSingleValueContainer: SingleValueDecodingContainer {
    let depth: Int
    var codingPath: [any CodingKey] { [] }
    func decodeNil() -> Bool { true }
    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        guard let value = ZeroDecoder.make(T.self, depth: depth + 1) as? T else { throw ZeroUnavailable() }
        return value
    }
}
