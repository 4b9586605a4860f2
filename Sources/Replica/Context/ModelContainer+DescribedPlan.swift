import Foundation

/// The code of one stage of a migration plan made of schema descriptions (see
/// `ModelContainer.init(describedPlan:stages:configurations:environment:)`): what `MigrationStage.custom` runs around
/// its schema change; both `nil` for a lightweight stage. For the simulator, whose schemas are data.
@_spi(Simulation) public struct DescribedMigrationStage: Sendable {
    /// Runs with a context on the stage's old schema.
    public var willMigrate: (@Sendable (ModelContext) throws -> Void)?
    /// Runs with a context on the stage's new schema.
    public var didMigrate: (@Sendable (ModelContext) throws -> Void)?

    public init(willMigrate: (@Sendable (ModelContext) throws -> Void)? = nil, didMigrate: (@Sendable (ModelContext) throws -> Void)? = nil) {
        self.willMigrate = willMigrate
        self.didMigrate = didMigrate
    }
}

extension Schema {
    /// The schema as a ``VersionedSchema``'s schema would be (a store a container creates from it records its
    /// version), for schemas built from descriptions. For the simulator.
    @_spi(Simulation) public var asVersioned: Schema {
        var schema = self
        schema.isVersioned = true
        return schema
    }
}

extension ModelContainer {
    /// ``init(for:migrationPlan:configurations:environment:)`` with a plan of schema descriptions (each treated as a
    /// versioned schema) and `stages[i]` leading from `schemas[i]` to `schemas[i + 1]`. For the simulator.
    /// - Throws: what ``init(for:migrationPlan:configurations:environment:)`` throws.
    @_spi(Simulation) public convenience init(describedPlan schemas: [Schema], stages: [DescribedMigrationStage],
                                              configurations: [ModelConfiguration], environment: ReplicaEnvironment) throws {
        let plan: CheckedMigrationPlan
        do {
            plan = try CheckedMigrationPlan(schemas: schemas.map(\.asVersioned), stages: stages.map {
                CheckedMigrationPlan.Stage(willMigrate: $0.willMigrate, didMigrate: $0.didMigrate)
            })
        } catch let problem as MigrationPlanProblem {
            throw ReplicaError.loadIssueModelContainer(configuration: configurations.first?.name ?? "default", reason: problem.reason)
        }
        try self.init(plan: plan, configurations: configurations, environment: environment, interruption: nil)
    }
}
