import Foundation

/// The declared type of every attribute a store's tables hold, as the schemas that created their columns declared it:
/// `replica_metadata['attribute_types']`, a JSON object from `Entity.attribute` to ``Schema/AttributeType`` raw value.
/// Internal.
///
/// SQLite column types tell only four storage classes apart (TEXT, INTEGER, REAL, BLOB; see
/// ``Schema/AttributeType/sqliteDeclaredType``), so a Bool attribute redeclared as Int, or a Date redeclared as a
/// Double, reads the old values as something else without any column changing. The store remembers each attribute's
/// declared type instead, written in the transaction that creates or extends its tables, and every open compares the
/// declaration with it. An attribute a schema no longer declares keeps its entry (its column and data stay): declaring
/// it again with another type is a retype too. A store written before the types were recorded gets them on its first
/// open from the schema opening it (nothing better is known: a retype within one storage class made before that open
/// goes unnoticed; one across storage classes is still caught by the column's type).
enum StoreAttributeTypes {
    static let metadataKey = "attribute_types"

    /// `Entity.attribute` → type, for `entities`.
    static func types(of entities: [Schema.Entity]) -> [String: String] {
        var types: [String: String] = [:]
        for entity in entities {
            for attribute in entity.attributes { types[key(entity.name, attribute.name)] = attribute.type.rawValue }
        }
        return types
    }

    static func key(_ entity: String, _ attribute: String) -> String { entity + "." + attribute }

    /// The stored form of `types` (sorted keys, so equal maps have equal text).
    static func encode(_ types: [String: String]) -> String { ReplicaJSON.stamplessString(types) }

    /// The recorded types, or `nil` when the store has none (written before they were recorded) or they do not decode
    /// (damaged metadata: then, as for an old store, the current declaration is recorded, after the column check).
    static func read(_ db: Connection) throws -> [String: String]? {
        guard case let .text(json)? = try db.scalar(readSQL) else { return nil }
        return ReplicaJSON.decode([String: String].self, json)
    }

    /// Records the types of `entities` (inside the caller's write transaction) over `recorded` (the stored map with
    /// this open's renames applied), writing only when the result differs from what is `stored`.
    static func record(_ entities: [Schema.Entity], over recorded: [String: String]?, stored: [String: String]?, _ db: Connection) throws {
        let merged = (recorded ?? [:]).merging(types(of: entities)) { _, declared in declared }
        guard merged != stored else { return }
        try db.run("INSERT INTO replica_metadata (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   [.text(metadataKey), .text(encode(merged))])
    }

    private static let readSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'attribute_types'")

    /// The load issue of an attribute whose stored values have another type than the one declared now.
    /// - Parameters:
    ///   - stored: the recorded type's name, or a description of the column (`"a TEXT column"`) when none is recorded.
    ///   - synced: whether the store is synced (the retype is then refused for good: its cloud schema is additive-only).
    static func retypeReason(entity: String, attribute: String, stored: String, declared: String, synced: Bool) -> String {
        let head = "\(entity).\(attribute) is stored as \(stored) but declared \(declared)"
        if synced {
            return head + "; a synced store's schema is additive-only (the cloud and older app versions keep the "
                + "attribute's type): declare a new attribute of the new type and copy the values into it"
        }
        return head + "; changing an attribute's type needs a migration: keep both versions as VersionedSchema and open "
            + "the container with ModelContainer(for:migrationPlan:configurations:), whose custom MigrationStage copies "
            + "the values into an attribute of the new type"
    }
}
