import Foundation

/// One problem found in a schema or in a configuration's use of it.
public enum SchemaViolation: Sendable, Hashable, CustomStringConvertible {
    /// A name that is not a valid identifier (`[A-Za-z_][A-Za-z0-9_]*`, not starting with `replica_`, at most 64 chars).
    case invalidName(String)
    /// Two entities share a name.
    case duplicateEntity(String)
    /// Two members (attributes or relationships) of one entity share a name, or a member uses a reserved name (`id`).
    case duplicateMember(entity: String, member: String)
    /// A relationship points to an entity the schema does not have.
    case unknownDestination(entity: String, relationship: String, destination: String)
    /// A relationship names an inverse that the destination does not have, or whose own inverse is not this one.
    case inverseMismatch(entity: String, relationship: String, inverse: String)
    /// A uniqueness constraint names an attribute the entity does not have, or is empty.
    case unknownUniquenessAttribute(entity: String, attribute: String)
    /// A declared default value does not have the attribute's storage type.
    case defaultValueTypeMismatch(entity: String, attribute: String)
    /// In a synced configuration, every attribute must be optional or have a default value.
    case syncedAttributeNeedsDefault(entity: String, attribute: String)
    /// In a synced configuration, every to-one relationship must be optional.
    case syncedRelationshipNotOptional(entity: String, relationship: String)
    /// In a synced configuration, the deny delete rule is not supported (it cannot be enforced across devices).
    case syncedDenyRule(entity: String, relationship: String)
    /// In a synced configuration, a to-many relationship that is its own inverse (`Person.friends` ↔
    /// `Person.friends`) is not supported: its link table holds each link once, from whichever record made it, so a
    /// link would replicate as two (one from each end) that devices add and remove independently. Other many-to-many
    /// relationships replicate (R17 in `Specs/replication-protocol.md`). Reported once per relationship, after the
    /// other violations. Model the link as an entity with two to-one relationships, or as two relationships that are
    /// each other's inverse (`follows` ↔ `followers`).
    case syncedManyToMany(entity: String, relationship: String, inverse: String)
    /// In a synced configuration, an entity or attribute declares an original name: the cloud schema is additive-only,
    /// so a record type or field keeps its name forever (in CloudKit a renamed field is a new field). Keep the stored
    /// name and rename only the Swift property: `.attribute("title", \.heading)`. `member` is `nil` for the entity.
    case syncedRename(entity: String, member: String?, originalName: String)
    /// Two entities whose names differ only in letter case: SQLite compares table names case-insensitively, so they
    /// would share one table (and each fetch would return the other's rows). Reported on the later one.
    case entityNameCollision(entity: String, other: String)
    /// Two members of one entity (attributes or relationships, or a member and the record ID column `id`) whose
    /// names differ only in letter case: SQLite compares column names case-insensitively, so they would be one
    /// column. Reported on the later one.
    case memberNameCollision(entity: String, member: String, other: String)
    /// An entity name starting with a prefix SQLite reserves for its own tables (`sqlite_`, any letter case).
    case reservedEntityName(entity: String, prefix: String)
    /// A table or index name Replica derives from the schema — an entity's table, the index of a to-one relationship
    /// or uniqueness constraint (`replica_<Entity>_<relationship>`, `replica_<Entity>_unique<n>`), a many-to-many
    /// link table (`replica_link_<Entity>_<relationship>`) and its index — equals (ignoring letter case) another
    /// such name or one of Replica's own tables and indexes (`replica_metadata`, `replica_history_…`,
    /// `replica_sync_…`). `name` is the SQL name; `member` the relationship or constraint it comes from.
    case sqlNameCollision(entity: String, member: String, name: String)
    /// An entity with more stored fields than SQLite's default column limit (`SQLITE_MAX_COLUMN`, 2,000) allows:
    /// its table holds the record ID and one column per attribute and to-one relationship, and a query over unsaved
    /// changes one column more. `count` is the number of stored fields; at most `limit` fit.
    case tooManyColumns(entity: String, count: Int, limit: Int)

    public var description: String {
        switch self {
        case let .invalidName(name): return "'\(name)' is not a valid name (letters, digits and underscores, not starting with a digit or 'replica_', at most 64 characters)"
        case let .duplicateEntity(name): return "entity '\(name)' is declared more than once"
        case let .duplicateMember(entity, member): return "\(entity).\(member) is declared more than once or uses a reserved name"
        case let .unknownDestination(entity, relationship, destination): return "\(entity).\(relationship) points to unknown entity '\(destination)'"
        case let .inverseMismatch(entity, relationship, inverse): return "\(entity).\(relationship) names inverse '\(inverse)', which does not exist or does not point back"
        case let .unknownUniquenessAttribute(entity, attribute): return "a uniqueness constraint of \(entity) names unknown attribute '\(attribute)'"
        case let .defaultValueTypeMismatch(entity, attribute): return "the default value of \(entity).\(attribute) does not match its type"
        case let .syncedAttributeNeedsDefault(entity, attribute): return "\(entity).\(attribute) is synced, so it must be optional or have a default value"
        case let .syncedRelationshipNotOptional(entity, relationship): return "\(entity).\(relationship) is synced, so it must be optional"
        case let .syncedDenyRule(entity, relationship): return "\(entity).\(relationship) is synced, so it cannot use the deny delete rule"
        case let .syncedRename(entity, member, originalName):
            return "\(member.map { "\(entity).\($0)" } ?? "entity \(entity)") is synced, so it cannot be renamed from '\(originalName)': the cloud keeps "
                + "its name forever; keep the stored name and rename only the Swift property (.attribute(\"\(originalName)\", \\.\(member ?? "property")))"
        case let .syncedManyToMany(entity, relationship, inverse):
            return "\(entity).\(relationship) is its own inverse (\(inverse)), a many-to-many relationship synced stores do not replicate; use two relationships that are each other's inverse, or an entity with two to-one relationships for the links"
        case let .entityNameCollision(entity, other):
            return "entity '\(entity)' differs from entity '\(other)' only in letter case; SQLite table names ignore case, so both would share one table"
        case let .memberNameCollision(entity, member, other):
            return "\(entity).\(member) differs from \(entity).\(other) only in letter case; SQLite column names ignore case, so both would share one column"
        case let .reservedEntityName(entity, prefix):
            return "entity '\(entity)' starts with '\(prefix)', which SQLite reserves for its own tables"
        case let .sqlNameCollision(entity, member, name):
            return "the SQL name '\(name)' that Replica derives for \(entity).\(member) is also the name of another table or index of the store (names ignore letter case)"
        case let .tooManyColumns(entity, count, limit):
            return "entity '\(entity)' has \(count) stored fields (attributes and to-one relationships); SQLite's column limit allows at most \(limit)"
        }
    }
}

/// A schema (or a configuration's use of it) is invalid. Lists every violation found, not just the first.
public struct SchemaValidationError: Error, Sendable, Hashable, CustomStringConvertible {
    public let violations: [SchemaViolation]
    public var description: String {
        "invalid schema: " + violations.map(\.description).joined(separator: "; ")
    }
}

/// Checks a schema's structure. Internal; use ``Schema/validate()``.
struct SchemaValidator {
    let schema: Schema
    /// The table and index names the store creates for itself (lowercased; ``Store/reservedSQLNames``): no name
    /// derived from the schema may equal one of them. Given as data so that Schema/ need not know the store's DDL.
    let reservedSQLNames: Set<String>

    static func isValidName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, name.utf8.count <= 64, !name.lowercased().hasPrefix("replica_") else { return false }
        let isLetter = { (c: Unicode.Scalar) in (c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || c == "_" }
        return isLetter(first) && name.unicodeScalars.allSatisfy { isLetter($0) || ($0 >= "0" && $0 <= "9") }
    }

    func violations() -> [SchemaViolation] {
        var found: [SchemaViolation] = []
        var entityNames = Set<String>()
        // SQLite compares identifiers ignoring ASCII letter case (valid names are ASCII): the first spelling of each.
        var entityTables: [String: String] = [:]
        for entity in schema.entities {
            if !Self.isValidName(entity.name) { found.append(.invalidName(entity.name)) }
            if entity.name.lowercased().hasPrefix("sqlite_") { found.append(.reservedEntityName(entity: entity.name, prefix: "sqlite_")) }
            if !entityNames.insert(entity.name).inserted {
                found.append(.duplicateEntity(entity.name))
            } else if let other = entityTables[entity.name.lowercased()] {
                found.append(.entityNameCollision(entity: entity.name, other: other))
            } else {
                entityTables[entity.name.lowercased()] = entity.name
            }
            var members: Set<String> = ["id"]
            var columns: [String: String] = ["id": "id"]
            for name in entity.attributes.map(\.name) + entity.relationships.map(\.name) {
                if !Self.isValidName(name) { found.append(.invalidName(name)) }
                if !members.insert(name).inserted {
                    found.append(.duplicateMember(entity: entity.name, member: name))
                } else if let other = columns[name.lowercased()] {
                    found.append(.memberNameCollision(entity: entity.name, member: name, other: other))
                } else {
                    columns[name.lowercased()] = name
                }
            }
            if entity.fieldNames.count > Self.maximumStoredFields {
                found.append(.tooManyColumns(entity: entity.name, count: entity.fieldNames.count, limit: Self.maximumStoredFields))
            }
            for attribute in entity.attributes {
                if let value = attribute.defaultValue, !Self.value(value, fits: attribute) {
                    found.append(.defaultValueTypeMismatch(entity: entity.name, attribute: attribute.name))
                }
            }
            for constraint in entity.uniquenessConstraints {
                if constraint.isEmpty { found.append(.unknownUniquenessAttribute(entity: entity.name, attribute: "")) }
                for name in constraint where entity.attribute(named: name) == nil && entity.relationship(named: name).map({ $0.isToMany }) != false {
                    found.append(.unknownUniquenessAttribute(entity: entity.name, attribute: name))
                }
            }
            for relationship in entity.relationships {
                guard let destination = schema.entity(named: relationship.destination) else {
                    found.append(.unknownDestination(entity: entity.name, relationship: relationship.name, destination: relationship.destination))
                    continue
                }
                if let inverse = relationship.inverse {
                    let back = destination.relationship(named: inverse)
                    if back == nil || back?.destination != entity.name || (back?.inverse != nil && back?.inverse != relationship.name) {
                        found.append(.inverseMismatch(entity: entity.name, relationship: relationship.name, inverse: inverse))
                    }
                }
            }
        }
        found += sqlNameCollisions(among: entityTables)
        return found
    }

    /// SQLite's default limit on the columns of a table, of an index and of a result set (`SQLITE_MAX_COLUMN`).
    /// Source: <https://www.sqlite.org/limits.html>.
    static let sqliteColumnLimit = 2_000

    /// The most stored fields an entity may have: its table adds the `id` column, and the temporary table a query
    /// over unsaved changes fills adds a liveness column (see `QueryEngine.overlay`).
    static let maximumStoredFields = sqliteColumnLimit - 2

    /// The derived index and link-table names (all start with `replica_`) that equal, ignoring case, another derived
    /// name or one of ``reservedSQLNames``. Only entities in `tables` (the first of each case-insensitive name) are
    /// looked at, and of them only members whose names are distinct: their collisions are reported already.
    private func sqlNameCollisions(among tables: [String: String]) -> [SchemaViolation] {
        var found: [SchemaViolation] = []
        var taken = reservedSQLNames
        func claim(_ name: String, entity: String, member: String) {
            if !taken.insert(name.lowercased()).inserted { found.append(.sqlNameCollision(entity: entity, member: member, name: name)) }
        }
        let entities = schema.entities.filter { tables[$0.name.lowercased()] == $0.name }
            .reduce(into: [Schema.Entity]()) { list, entity in if !list.contains(where: { $0.name == entity.name }) { list.append(entity) } }
        for entity in entities {
            var seen = Set<String>(["id"])
            for relationship in entity.toOneRelationships where seen.insert(relationship.name.lowercased()).inserted {
                claim(Schema.relationshipIndexName(entity: entity.name, relationship: relationship.name), entity: entity.name, member: relationship.name)
            }
            for (i, constraint) in entity.uniquenessConstraints.enumerated() where !constraint.isEmpty {
                claim(Schema.uniquenessIndexName(entity: entity.name, constraint: i), entity: entity.name, member: constraint.joined(separator: ", "))
            }
        }
        let destinations = Set(entities.map(\.name))
        for table in LinkTable.all(in: entities) where destinations.contains(table.memberEntity) {
            claim(table.name, entity: table.ownerEntity, member: table.ownerRelationship)
            claim(table.indexName, entity: table.ownerEntity, member: table.ownerRelationship)
        }
        return found
    }

    /// Whether a stored value has the storage class an attribute of this type uses (NULL fits optionals only).
    static func value(_ value: SQLiteValue, fits attribute: Schema.Attribute) -> Bool {
        switch (attribute.type, value) {
        case (_, .null): return attribute.isOptional
        case (.string, .text), (.url, .text), (.composite, .text): return true
        case (.integer, .integer), (.bool, .integer): return true
        case (.double, .real), (.date, .real), (.double, .integer), (.date, .integer): return true
        case (.data, .blob): return true
        case let (.uuid, .blob(data)): return data.count == 16
        default: return false
        }
    }

    /// Rules a synced configuration adds (DESIGN.md, "Additive-only schema for synced stores").
    static func syncedViolations(of entities: [Schema.Entity]) -> [SchemaViolation] {
        var found: [SchemaViolation] = []
        for entity in entities {
            if let original = entity.originalName, original != entity.name {
                found.append(.syncedRename(entity: entity.name, member: nil, originalName: original))
            }
            for attribute in entity.attributes where !attribute.isOptional && attribute.defaultValue == nil {
                found.append(.syncedAttributeNeedsDefault(entity: entity.name, attribute: attribute.name))
            }
            for attribute in entity.attributes {
                if let original = attribute.originalName, original != attribute.name {
                    found.append(.syncedRename(entity: entity.name, member: attribute.name, originalName: original))
                }
            }
            for relationship in entity.relationships {
                if !relationship.isToMany && !relationship.isOptional {
                    found.append(.syncedRelationshipNotOptional(entity: entity.name, relationship: relationship.name))
                }
                if relationship.deleteRule == .deny {
                    found.append(.syncedDenyRule(entity: entity.name, relationship: relationship.name))
                }
            }
        }
        // Many-to-many pairs replicate as link sets (R17), except a relationship that is its own inverse: its link
        // table holds each link once, from either end, so the two ends of one link would be two replicated links.
        for table in LinkTable.all(in: entities) where table.isOwnInverse {
            found.append(.syncedManyToMany(entity: table.ownerEntity, relationship: table.ownerRelationship,
                                           inverse: "\(table.memberEntity).\(table.memberRelationship)"))
        }
        return found
    }
}
