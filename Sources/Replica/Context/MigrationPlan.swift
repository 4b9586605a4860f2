import Foundation

/// One version of an app's schema: its models and its version identifier (SwiftData's `VersionedSchema`).
///
/// Declare one per released schema, usually as an enum namespacing that version's model types, and list them in a
/// ``SchemaMigrationPlan``. The version identifiers of a plan's schemas must increase.
///
/// The protocol refines `SendableMetatype`, so a schema's type can be named in a ``MigrationStage`` (which is
/// `Sendable`) and passed between actors.
public protocol VersionedSchema: SendableMetatype {
    /// The schema's version; recorded in each store migrated to it.
    static var versionIdentifier: Schema.Version { get }
    /// The model types of this version, in declaration order.
    static var models: [any PersistentModel.Type] { get }
}

extension VersionedSchema {
    /// The schema of ``models`` at ``versionIdentifier`` (``Schema/init(versionedSchema:)``).
    public static var schema: Schema { Schema(versionedSchema: self) }
}

extension Schema {
    /// The schema of a versioned schema's models at its version (SwiftData's `Schema(versionedSchema:)`).
    ///
    /// A container that creates a store from it — with or without a migration plan, say in a widget or an app
    /// extension — records its version in the store, so a plan opening the store later runs no stage that the store's
    /// tables are past already.
    public init(versionedSchema: any VersionedSchema.Type) {
        self.init(versionedSchema.models, version: versionedSchema.versionIdentifier)
        isVersioned = true
    }
}

/// How a store moves from each schema version to the next (SwiftData's `SchemaMigrationPlan`).
///
/// `schemas` lists every version from the oldest a store may still be at to the current one, in increasing
/// version order; `stages` has one stage from each schema to the next. Open the container with
/// ``ModelContainer/init(for:migrationPlan:configurations:environment:)``.
public protocol SchemaMigrationPlan {
    /// Every versioned schema, oldest first.
    static var schemas: [any VersionedSchema.Type] { get }
    /// One stage per consecutive pair of ``schemas``, in the same order.
    static var stages: [MigrationStage] { get }
}

/// One step of a migration plan: from one versioned schema to the next (SwiftData's `MigrationStage`).
///
/// Every stage opens the store at the new schema, which adds the tables and columns of new entities and attributes
/// (with their declared defaults) and renames those declared with an original name; removed attributes keep their
/// columns, which the new schema ignores. A custom stage also runs code around that step: `willMigrate` with a
/// context on the old schema (read or fix data before the schema changes), `didMigrate` with a context on the new
/// schema (fill new attributes from old ones). Each closure saves its context itself; unsaved changes are discarded.
/// A stage is all or nothing: it runs on a copy of the store file that replaces the store only when the whole stage
/// succeeded and the new version is recorded in it (see ``ModelContainer/init(for:migrationPlan:configurations:environment:)``).
public enum MigrationStage: Sendable {
    /// Only schema changes that need no code: added entities and attributes, renames through original names.
    case lightweight(fromVersion: any VersionedSchema.Type, toVersion: any VersionedSchema.Type)
    /// Schema changes with code before (`willMigrate`, on the old schema) and after (`didMigrate`, on the new one).
    case custom(fromVersion: any VersionedSchema.Type, toVersion: any VersionedSchema.Type,
                willMigrate: (@Sendable (ModelContext) throws -> Void)?, didMigrate: (@Sendable (ModelContext) throws -> Void)?)

    /// The schema the stage starts from.
    public var fromVersion: any VersionedSchema.Type {
        switch self {
        case let .lightweight(from, _), let .custom(from, _, _, _): from
        }
    }

    /// The schema the stage ends at.
    public var toVersion: any VersionedSchema.Type {
        switch self {
        case let .lightweight(_, to), let .custom(_, to, _, _): to
        }
    }
}

/// A migration plan that cannot be run: its schemas' versions do not increase, or its stages do not lead from each
/// schema to the next. Programmer misuse, reported as ``ReplicaError/loadIssueModelContainer(configuration:reason:)``
/// before any store is touched.
struct MigrationPlanProblem: Error {
    let reason: String
}

/// A plan checked once: its schemas in order, and the code of the stage leading to each but the first.
struct CheckedMigrationPlan {
    /// The code a stage runs around its schema change (none for a lightweight stage).
    struct Stage {
        var willMigrate: (@Sendable (ModelContext) throws -> Void)?
        var didMigrate: (@Sendable (ModelContext) throws -> Void)?
    }

    let schemas: [Schema]
    /// `stages[i]` leads from `schemas[i]` to `schemas[i + 1]`.
    let stages: [Stage]

    init(_ plan: any SchemaMigrationPlan.Type) throws {
        let planned = plan.stages
        try self.init(schemas: plan.schemas.map { $0.schema }, stages: planned.map { stage in
            switch stage {
            case .lightweight: Stage()
            case let .custom(_, _, willMigrate, didMigrate): Stage(willMigrate: willMigrate, didMigrate: didMigrate)
            }
        }, versions: planned.map { ($0.fromVersion.versionIdentifier, $0.toVersion.versionIdentifier) })
    }

    /// A plan of schema descriptions; `versions` are the stages' from and to versions, as declared.
    init(schemas: [Schema], stages: [Stage], versions: [(Schema.Version, Schema.Version)]? = nil) throws {
        guard !schemas.isEmpty else { throw MigrationPlanProblem(reason: "the migration plan lists no schemas") }
        if let version = schemas.map(\.version).first(where: { !$0.isRecordable }) {
            throw MigrationPlanProblem(reason: "the migration plan's " + version.unrecordableReason)
        }
        for (older, newer) in zip(schemas, schemas.dropFirst()) where !(older.version < newer.version) {
            throw MigrationPlanProblem(reason: "the migration plan's schema versions must increase: \(older.version) is followed by \(newer.version)")
        }
        guard stages.count == schemas.count - 1 else {
            throw MigrationPlanProblem(reason: "the migration plan has \(stages.count) stages for \(schemas.count) schemas; it needs one from each schema to the next")
        }
        for (index, (from, to)) in (versions ?? []).enumerated() {
            guard from == schemas[index].version, to == schemas[index + 1].version else {
                throw MigrationPlanProblem(reason: "migration stage \(index + 1) leads from \(from) to \(to); expected \(schemas[index].version) to \(schemas[index + 1].version)")
            }
        }
        self.schemas = schemas
        self.stages = stages
    }

    /// The current schema: the plan's last.
    var current: Schema { schemas[schemas.count - 1] }

    /// For each schema of the plan (by index), the names there of the entities named `names` in the current schema:
    /// followed back through the versions, an entity renamed in a version (its original name) had its original name
    /// before it, and one added in a version has no name before it. O(schemas × entities).
    func entityNames(following names: Set<String>) -> [Set<String>] {
        var result = Array(repeating: Set<String>(), count: schemas.count)
        result[schemas.count - 1] = names
        for index in stride(from: schemas.count - 2, through: 0, by: -1) {
            let earlier = schemas[index]
            result[index] = Set(schemas[index + 1].entities.filter { result[index + 1].contains($0.name) }.compactMap { entity in
                if earlier.entity(named: entity.name) != nil { return entity.name }
                if let original = entity.originalName, earlier.entity(named: original) != nil { return original }
                return nil
            })
        }
        return result
    }
}
