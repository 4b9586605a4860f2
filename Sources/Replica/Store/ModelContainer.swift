import Foundation

/// Owns the schema and the stores of an app: one SQLite store per ``ModelConfiguration`` (SwiftData's
/// `ModelContainer`). Every entity lives in exactly one store; contexts route reads and writes there.
///
/// A container is `Sendable` and immutable; create one ``ModelContext`` per task or actor that reads and writes: the
/// main actor has ``mainContext``, a background ``ModelActor`` a context of its own.
public final class ModelContainer: Sendable {
    /// The full schema.
    public let schema: Schema
    /// The configurations, in the order given.
    public let configurations: [ModelConfiguration]
    /// The environment (clock, randomness, identity) every context of this container uses.
    public let environment: ReplicaEnvironment
    let stores: [Store]
    let storeIndexByEntity: [String: Int]
    /// Where every committed change of the stores goes through (the change stream, live queries; see `ChangeHub`).
    let changeHub: ChangeHub
    /// Where ``mainContext`` lives once made (see MainContext.swift).
    let mainContextSlot = MainContextSlot()

    /// Opens a container with the given stores.
    ///
    /// - Parameters:
    ///   - schema: every entity the app uses.
    ///   - configurations: the stores; with none, one default configuration holds every entity.
    ///   - environment: the sources of time, randomness and identity (``ReplicaEnvironment/live`` in production).
    /// - Throws: ``ReplicaError``: `.invalidModelDeclaration` (a schema built from model types whose entity
    ///   descriptions disagree with the types, every mismatch at once), `.invalidSchema` (every violation at once,
    ///   including the synced-store rules),
    ///   `.duplicateConfiguration`, `.configurationFileNameContainsInvalidCharacters`,
    ///   `.configurationSchemaNotFoundInContainerSchema`, `.entityNotRoutable`, `.crossStoreRelationship`,
    ///   `.loadIssueModelContainer`, `.storeInUse` (a rename through an original name while another process or
    ///   container has the store open, or an open while another one migrates it).
    ///   A ``VersionedSchema``'s schema (``Schema/init(versionedSchema:)``) opened this way on a store recorded at an
    ///   earlier version is a `.loadIssueModelContainer` that changes nothing: the migration plan must run its
    ///   stages first (``init(for:migrationPlan:configurations:environment:)``).
    public convenience init(for schema: Schema, configurations: [ModelConfiguration] = [], environment: ReplicaEnvironment = .live) throws {
        try self.init(for: schema, configurations: configurations, environment: environment, byMigrationPlan: false)
    }

    /// ``init(for:configurations:environment:)-(Schema,_,_)``; `byMigrationPlan` when a migration plan opens its
    /// stores after running its stages (a store whose tables decided where the plan started may record an earlier
    /// version until then).
    init(for schema: Schema, configurations: [ModelConfiguration], environment: ReplicaEnvironment, byMigrationPlan: Bool) throws {
        let configurations = configurations.isEmpty ? [ModelConfiguration()] : configurations
        if !schema.declarationMismatches.isEmpty { throw ReplicaError.invalidModelDeclaration(schema.declarationMismatches) }
        let structural = SchemaValidator(schema: schema, reservedSQLNames: Store.reservedSQLNames).violations()
        if !structural.isEmpty {
            let synced = Self.syncedViolations(of: schema, configurations)
            throw ReplicaError.invalidSchema(SchemaValidationError(violations: structural + synced))
        }

        // Names and files must be distinct.
        var names = Set<String>()
        var files = Set<String>()
        for configuration in configurations {
            guard ModelConfiguration.isValidFileName(configuration.name) else {
                throw ReplicaError.configurationFileNameContainsInvalidCharacters(name: configuration.name)
            }
            guard names.insert(configuration.name).inserted else { throw ReplicaError.duplicateConfiguration(name: configuration.name) }
            if let url = configuration.url(in: environment), !files.insert(url.standardizedFileURL.path).inserted {
                throw ReplicaError.duplicateConfiguration(name: configuration.name)
            }
            if !configuration.tracksHistory && (configuration.isSynced || configuration.groupContainer != .none) {
                throw ReplicaError.loadIssueModelContainer(
                    configuration: configuration.name, reason: "synced and app-group stores must track history")
            }
        }

        // Route each entity to exactly one configuration.
        var entitiesByConfiguration: [[String]] = Array(repeating: [], count: configurations.count)
        var owners: [String: [Int]] = [:]
        for (i, configuration) in configurations.enumerated() {
            guard let subset = configuration.schema else { continue }
            let unknown = subset.entityNames.filter { schema.entity(named: $0) == nil }
            if !unknown.isEmpty {
                throw ReplicaError.configurationSchemaNotFoundInContainerSchema(configuration: configuration.name, entities: unknown)
            }
            entitiesByConfiguration[i] = subset.entityNames
            for name in subset.entityNames { owners[name, default: []].append(i) }
        }
        let catchAll = configurations.firstIndex { $0.schema == nil }
        for entity in schema.entities {
            let claimed = owners[entity.name] ?? []
            if claimed.count > 1 {
                throw ReplicaError.entityNotRoutable(entity: entity.name, configurations: claimed.map { configurations[$0].name })
            }
            if claimed.isEmpty {
                guard let catchAll else { throw ReplicaError.entityNotRoutable(entity: entity.name, configurations: []) }
                entitiesByConfiguration[catchAll].append(entity.name)
                owners[entity.name] = [catchAll]
            }
        }
        var storeIndexByEntity: [String: Int] = [:]
        for (name, indices) in owners { storeIndexByEntity[name] = indices[0] }

        // References stay within one store; synced stores follow the additive-only rules.
        for entity in schema.entities {
            for relationship in entity.relationships where storeIndexByEntity[relationship.destination] != storeIndexByEntity[entity.name] {
                throw ReplicaError.crossStoreRelationship(entity: entity.name, relationship: relationship.name)
            }
        }
        let violations = Self.syncedViolations(of: schema, configurations)
        if !violations.isEmpty { throw ReplicaError.invalidSchema(SchemaValidationError(violations: violations)) }

        self.schema = schema
        self.configurations = configurations
        self.environment = environment
        self.storeIndexByEntity = storeIndexByEntity
        let stores = try configurations.enumerated().map { i, configuration in
            try Store(configuration: configuration, entities: entitiesByConfiguration[i].compactMap(schema.entity(named:)),
                      schemaVersion: schema.version, recordsVersion: schema.isVersioned,
                      refusesEarlierVersion: schema.isVersioned && !byMigrationPlan,
                      migrationSource: configuration.migrationSource, environment: environment)
        }
        self.stores = stores
        self.changeHub = ChangeHub(stores: stores, environment: environment)
    }

    /// The additive-only violations of every synced configuration's entities: those its schema names or, for the
    /// configuration without a schema, those no other configuration names. Works on an invalid schema too, so that
    /// `.invalidSchema` can list every violation at once.
    private static func syncedViolations(of schema: Schema, _ configurations: [ModelConfiguration]) -> [SchemaViolation] {
        let claimed = Set(configurations.flatMap { $0.schema?.entityNames ?? [] })
        let catchAll = configurations.firstIndex { $0.schema == nil }
        var violations: [SchemaViolation] = []
        for (i, configuration) in configurations.enumerated() where configuration.isSynced {
            let names = configuration.schema?.entityNames
                ?? (i == catchAll ? schema.entityNames.filter { !claimed.contains($0) } : [])
            violations += SchemaValidator.syncedViolations(of: names.compactMap(schema.entity(named:)))
        }
        return violations
    }

    /// Opens a container for the given model types.
    /// - Throws: as ``init(for:configurations:environment:)-(Schema,_,_)``.
    public convenience init(for models: any PersistentModel.Type..., configurations: ModelConfiguration..., environment: ReplicaEnvironment = .live) throws {
        try self.init(for: Schema(models), configurations: configurations, environment: environment)
    }

    /// The configuration whose store holds `entityName`, if any.
    public func configuration(for entityName: String) -> ModelConfiguration? {
        storeIndexByEntity[entityName].map { configurations[$0] }
    }

    /// The replica identity of the store of configuration `name`: one per store file, shared by every process.
    public func storeIdentity(of configurationName: String) -> UUID? {
        stores.first { $0.configuration.name == configurationName }?.identity
    }

    /// What `sqlite3_open_v2` (with `SQLITE_OPEN_URI`) opens to reach the database of configuration `name` from a
    /// connection of the caller's own: the file's path, or the `memdb` URI of an in-memory store (shared within this
    /// process while the container lives). `nil` for unknown names. For the simulator's checks of raw tables.
    /// Gives up every store's file lock (``StoreFileLock``) as the kernel does when a process crashes, while the
    /// container and its connections stay: the simulator keeps a crashed process's connections open (closing the last
    /// one would checkpoint the WAL, which a crash does not), and a later migration must not find the locks held.
    /// The container must not be used afterwards.
    @_spi(Simulation) public func releaseStoreLocksAsAfterCrash() {
        for store in stores { store.releaseFileLockAsAfterCrash() }
    }

    @_spi(Simulation) public func sqliteOpenPath(of configurationName: String) -> String? {
        guard let store = stores.first(where: { $0.configuration.name == configurationName }) else { return nil }
        switch store.location {
        case let .file(url): return url.path
        case let .memory(name): return "file:/\(Connection.uriPath(name))?vfs=memdb"
        }
    }

    /// The store file of configuration `name` (`nil` for in-memory stores and unknown names).
    public func url(of configurationName: String) -> URL? {
        guard let store = stores.first(where: { $0.configuration.name == configurationName }),
              case let .file(url) = store.location else { return nil }
        return url
    }
}
