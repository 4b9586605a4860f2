import Foundation

extension ModelContainer {
    /// Opens a container whose stores are first migrated through `migrationPlan` (SwiftData's
    /// `ModelContainer(for:migrationPlan:configurations:)`).
    ///
    /// Each store file at an earlier version of the plan runs every stage from its recorded version to the plan's last
    /// (see ``MigrationStage``) — also when a container without the plan added later schemas' columns meanwhile; a
    /// store without a recorded version starts at the schema its tables have, and is a load issue when they match
    /// none or several schemas with a custom stage between them; each stage is all or nothing, so a store interrupted mid-migration (an error thrown by
    /// a stage's code, a crash) opens next time at the version of its last completed stage and resumes from there.
    /// The container then opens at the plan's last schema and records that version in each store (new and in-memory
    /// stores too). Each store migrates on its own, in the order of `configurations`: stores of several configurations
    /// may end at different versions when one of them fails. A custom stage's code runs once per store, on a context
    /// holding only that store's entities.
    ///
    /// - Parameters:
    ///   - schema: the current schema; it must have the entities of the plan's last schema (its version is the
    ///     plan's). With `migrationPlan` `nil`, the container opens as ``init(for:configurations:environment:)-(Schema,_,_)``.
    ///   - migrationPlan: the versions and stages.
    ///   - configurations: the stores; with none, one default configuration holds every entity.
    ///   - environment: the sources of time, randomness and identity.
    /// - Throws: what ``init(for:configurations:environment:)-(Schema,_,_)`` throws; ``ReplicaError/loadIssueModelContainer(configuration:reason:)``
    ///   for a plan whose versions do not increase or whose stages do not chain, a store at a version newer than the
    ///   plan's last or one the plan does not list, a read-only store that needs migrating;
    ///   ``ReplicaError/storeInUse(configuration:reason:)`` for a store that needs migrating while another process or
    ///   container has it open (nothing is changed; open again once that one closed it); and whatever a stage's
    ///   `willMigrate` or `didMigrate` throws, unchanged (the store stays at the version before that stage).
    ///   Complexity: each stage copies the store file once.
    public convenience init(for schema: Schema, migrationPlan: (any SchemaMigrationPlan.Type)?, configurations: [ModelConfiguration] = [],
                            environment: ReplicaEnvironment = .live) throws {
        try self.init(for: schema, migrationPlan: migrationPlan, configurations: configurations, environment: environment, interruption: nil)
    }

    /// A hook called after each step of each stage of each store's migration, with the name of the configuration
    /// whose store is migrating, the stage's index into the plan's stages and the step; a test throws from it to
    /// interrupt the migration there, as a crash would (stores of later configurations are then not migrated).
    /// Internal, for tests.
    typealias MigrationInterruption = @Sendable (_ configuration: String, _ stage: Int, _ step: MigrationStep) throws -> Void

    /// ``init(for:migrationPlan:configurations:environment:)`` with a hook called after each step of each stage of
    /// each store (see ``MigrationInterruption``).
    convenience init(for schema: Schema, migrationPlan: (any SchemaMigrationPlan.Type)?, configurations: [ModelConfiguration],
                     environment: ReplicaEnvironment, interruption: MigrationInterruption?) throws {
        guard let migrationPlan else {
            try self.init(for: schema, configurations: configurations, environment: environment)
            return
        }
        let plan: CheckedMigrationPlan
        do {
            plan = try CheckedMigrationPlan(migrationPlan)
        } catch let problem as MigrationPlanProblem {
            throw ReplicaError.loadIssueModelContainer(configuration: configurations.first?.name ?? "default", reason: problem.reason)
        }
        guard plan.current.entities == schema.entities else {
            throw ReplicaError.loadIssueModelContainer(
                configuration: configurations.first?.name ?? "default",
                reason: "the container's schema is not the migration plan's last schema (\(plan.current.version))")
        }
        try self.init(plan: plan, configurations: configurations, environment: environment, interruption: interruption)
    }

    /// Migrates the stores of `configurations` through `plan`, one after the other in their order, then opens them at
    /// its last schema.
    convenience init(plan: CheckedMigrationPlan, configurations: [ModelConfiguration], environment: ReplicaEnvironment,
                     interruption: MigrationInterruption?) throws {
        let configurations = configurations.isEmpty ? [ModelConfiguration()] : configurations
        // Which entities of a schema of the plan each configuration holds: those its schema names (by their names in
        // that schema: an entity renamed in a later version has its original name before), and for the one without a
        // schema, the rest.
        let subsets = configurations.map { configuration in configuration.schema.map { plan.entityNames(following: Set($0.entityNames)) } }
        let claimed = plan.schemas.indices.map { index in subsets.reduce(into: Set<String>()) { $0.formUnion($1?[index] ?? []) } }
        let catchAll = configurations.firstIndex { $0.schema == nil }
        for (i, configuration) in configurations.enumerated() {
            let entityNames: (Schema) -> [String] = { stageSchema in
                guard let index = plan.schemas.firstIndex(where: { $0.version == stageSchema.version }) else { return [] }
                if let subset = subsets[i] { return stageSchema.entityNames.filter(subset[index].contains) }
                return i == catchAll ? stageSchema.entityNames.filter { !claimed[index].contains($0) } : []
            }
            let name = configuration.name
            let storeInterruption = interruption.map { hook in { @Sendable (stage: Int, step: MigrationStep) throws in try hook(name, stage, step) } }
            try StoreMigrator.migrate(configuration, plan: plan, entityNames: entityNames, environment: environment,
                                      interruption: storeInterruption)
        }
        try self.init(for: plan.current, configurations: configurations, environment: environment, byMigrationPlan: true)
        for store in stores where store.configuration.allowsSave {
            do {
                let db = try store.openConnection()
                defer { store.reuse(db) }
                if try StoreMigrator.recordedVersion(db) != plan.current.version { try StoreMigrator.record(plan.current.version, db) }
            } catch let error as SQLiteError {
                throw ReplicaError.loadIssueModelContainer(configuration: store.configuration.name, reason: error.description)
            }
        }
    }
}
