import Foundation

/// The names of the indexes Replica derives from a schema (schema validation checks that they are unique).
extension Schema {
    /// The name of the index on the column of a to-one relationship (schema validation checks it is unique).
    static func relationshipIndexName(entity: String, relationship: String) -> String { "replica_\(entity)_\(relationship)" }

    /// The name of the index of the `constraint`th uniqueness constraint of an entity.
    static func uniquenessIndexName(entity: String, constraint: Int) -> String { "replica_\(entity)_unique\(constraint)" }
}
