import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A point of a migration stage at which a test interrupts it (as a crash would): after the store file was copied,
/// after `willMigrate`, after the schema change, after `didMigrate`, after the new version was recorded in the copy,
/// and after the copy replaced the store. Internal.
enum MigrationStep: String, Sendable, Hashable, CaseIterable {
    case copied, willMigrate, schemaChanged, didMigrate, versionRecorded, replaced
}

/// Runs a ``SchemaMigrationPlan`` on the store file of one configuration before the container opens it. Internal.
///
/// The store records its schema version in `replica_metadata['schema_version']`. Each stage from the recorded version
/// to the plan's last runs on a copy of the store file (`VACUUM INTO <file>.migrating`, a consistent snapshot):
/// `willMigrate` with a context on the old schema, the schema change (opening the copy at the new schema: new tables
/// and columns, renames through original names), `didMigrate` with a context on the new schema, then the new version
/// is recorded in the copy, whose journal is checkpointed, and the copy replaces the store file with `rename(2)`, which
/// is atomic. So a stage is one transaction: interrupted anywhere (an error thrown by a stage's code, a crash), the
/// store is still the one before the stage, at its version, and the next open resumes from there (a leftover copy is
/// deleted first); completed, the store is at the stage's version. Saves made by a stage's contexts are ordinary saves
/// of the store's configuration: history transactions, and in a synced store new changes with new stamps that
/// replicate like any other (another device on an older schema version keeps fields it does not know, R9).
///
/// A listed recorded version is where the plan starts while the store has every table and column of its schema
/// (columns of later schemas beside them were added by an open without the plan). A store without a recorded version
/// (created by a container without a plan from a schema that is no versioned schema's, or before versions were
/// recorded), or lacking tables or columns of its recorded schema, is at the schema its tables say (see
/// ``StoreLayoutMatch``); tables several schemas with a custom stage between them share, or that match no schema,
/// are a load issue. Only a store no other process or container has open is migrated: the
/// migration holds the store's lock exclusively (``StoreFileLock``) from before the first stage to after the last,
/// and throws ``ReplicaError/storeInUse(configuration:reason:)`` without changing anything when it cannot have it
/// (with the reason ``Store/migratingElsewhere`` when the other holder is migrating it).
enum StoreMigrator {
    static let versionKey = "schema_version"

    /// The longest file name the file systems Replica runs on accept (`NAME_MAX`), in bytes.
    static let fileNameLimit = 255

    /// Migrates the store of `configuration` to `plan`'s last schema, if it exists and is at an earlier version.
    /// - Parameters:
    ///   - entityNames: for a schema of the plan, the names of its entities this configuration holds.
    ///   - interruption: called after each step of each stage (index into the plan's stages); a test throws from it.
    /// - Throws: ``ReplicaError/loadIssueModelContainer(configuration:reason:)`` for a store at an unknown or newer
    ///   version, or one that cannot be copied or replaced; ``ReplicaError/storeInUse(configuration:reason:)`` when
    ///   another process or container has the store open; whatever a stage's code throws, unchanged.
    static func migrate(_ configuration: ModelConfiguration, plan: CheckedMigrationPlan, entityNames: (Schema) -> [String],
                        environment: ReplicaEnvironment, interruption: (@Sendable (Int, MigrationStep) throws -> Void)?) throws {
        guard let url = configuration.url(in: environment) else { return }
        func loadIssue(_ reason: String) -> ReplicaError { .loadIssueModelContainer(configuration: configuration.name, reason: reason) }
        let copy = URL(fileURLWithPath: url.path + ".migrating")
        guard FileManager.default.fileExists(atPath: url.path) else { return }
        let recorded: Schema.Version?
        let start: Int
        do {
            let db = try Connection(location: .file(url), readOnly: true)
            recorded = try recordedVersion(db)
            let current = plan.current.version
            let claimed: Int
            if let recorded {
                if recorded == current { return }
                if recorded > current {
                    throw loadIssue("the store is at schema version \(recorded), newer than this app's latest schema version \(current)")
                }
                guard let index = plan.schemas.firstIndex(where: { $0.version == recorded }) else {
                    throw loadIssue("the store is at schema version \(recorded), which the migration plan does not list (it lists \(plan.schemas.map(\.version.description).joined(separator: ", ")))")
                }
                claimed = index
            } else {
                claimed = 0
            }
            start = try StoreLayoutMatch.start(db, plan: plan, entityNames: entityNames, claimed: claimed, recorded: recorded,
                                               canaries: environment.canaries)
        } catch let error as SQLiteError {
            throw loadIssue(error.description)
        } catch let error as StoreLayoutError {
            throw loadIssue(error.reason)
        }
        let current = plan.current.version
        guard start < plan.stages.count else { return }
        guard configuration.allowsSave else {
            throw loadIssue("the read-only store is at schema version \(plan.schemas[start].version); migrating it to \(current) needs a writable store")
        }
        // The stages work on `<file>.migrating`, which SQLite gives a `-journal` beside it: both names must fit the
        // file-name limit, or the copy could not be made after the stages had begun.
        let longest = copy.lastPathComponent.utf8.count + "-journal".utf8.count
        guard longest <= Self.fileNameLimit else {
            let room = Self.fileNameLimit - (longest - url.lastPathComponent.utf8.count) - ".store".utf8.count
            throw loadIssue("the store file's name (\(url.lastPathComponent.utf8.count) bytes) leaves no room for the migration's working copy beside it ('.migrating' and its '-journal' must fit the \(Self.fileNameLimit)-byte file-name limit): migrating it from schema version \(plan.schemas[start].version) to \(current) needs a configuration name of at most \(room) bytes (rename the store file to match); nothing was changed")
        }
        // The stages replace the store file: no other process or container may have it open meanwhile (it would go on
        // writing into the replaced file), and none may open it before they are done (see StoreFileLock).
        let lock: StoreFileLock?
        do {
            lock = try StoreFileLock.take(.exclusive, of: url)
        } catch .held {
            // A holder that is migrating the store (or renaming through original names) has the lock exclusively: then
            // not even a shared lock can be had, and this process only has to wait for it (R9).
            let migrating: Bool
            do {
                _ = try StoreFileLock.take(.shared, of: url)
                migrating = false
            } catch .held {
                migrating = true
            } catch {
                migrating = false
            }
            if migrating { throw ReplicaError.storeInUse(configuration: configuration.name, reason: Store.migratingElsewhere) }
            throw ReplicaError.storeInUse(
                configuration: configuration.name,
                reason: "another process or container has it open; migrating it from schema version \(plan.schemas[start].version) to \(current) needs it to itself — close the store there (or update that app) and open it again")
        } catch let .unavailable(path, code) {
            throw loadIssue("cannot lock \(path) (errno \(code))")
        }
        defer { withExtendedLifetime(lock) {} }
        // Only now, holding the lock, is a copy beside the store a leftover of a crashed migration (before, it may be
        // the live copy of another process's migration); and that migration may have finished meanwhile.
        try removeDatabaseFiles(at: copy)
        let now: Schema.Version?
        do {
            now = try recordedVersion(Connection(location: .file(url), readOnly: true))
        } catch let error as SQLiteError {
            throw loadIssue(error.description)
        } catch let error as StoreLayoutError {
            throw loadIssue(error.reason)
        }
        guard now == recorded else {
            throw ReplicaError.storeInUse(configuration: configuration.name,
                                          reason: "another process or container migrated it meanwhile; open it again")
        }
        for index in start..<plan.stages.count {
            try runStage(index, of: plan, store: url, copy: copy, configuration: configuration, entityNames: entityNames,
                         environment: environment, interruption: interruption)
        }
    }

    /// The version recorded in a store, `nil` when it has none.
    static func recordedVersion(_ db: Connection) throws -> Schema.Version? {
        try Store.recordedSchemaVersion(db)
    }

    /// Records `version` as the store's schema version (inside or outside a transaction of the caller).
    static func record(_ version: Schema.Version, _ db: Connection) throws {
        try db.run("INSERT INTO replica_metadata (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   [.text(versionKey), .text(version.description)])
    }

    private static func runStage(_ index: Int, of plan: CheckedMigrationPlan, store url: URL, copy: URL, configuration: ModelConfiguration,
                                 entityNames: (Schema) -> [String], environment: ReplicaEnvironment,
                                 interruption: (@Sendable (Int, MigrationStep) throws -> Void)?) throws {
        func loadIssue(_ reason: String) -> ReplicaError { .loadIssueModelContainer(configuration: configuration.name, reason: reason) }
        let stage = plan.stages[index]
        let old = plan.schemas[index], new = plan.schemas[index + 1]
        let step: (MigrationStep) throws -> Void = { try interruption?(index, $0) }
        do {
            do {
                let db = try Connection(location: .file(url))
                try db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                try db.run("VACUUM INTO ?", [.text(copy.path)])
            }
            try step(.copied)
            var staged = configuration
            staged.explicitURL = copy
            staged.isMigrationCopy = true
            staged.schema = nil
            func container(_ schema: Schema) throws -> ModelContainer {
                let names = Set(entityNames(schema))
                return try ModelContainer(for: Schema(entities: schema.entities.filter { names.contains($0.name) }, version: schema.version),
                                          configurations: [staged], environment: environment)
            }
            if let willMigrate = stage.willMigrate {
                let before = try lastHistoryToken(copy)
                try willMigrate(ModelContext(try container(old)))
                if !environment.canaries.contains(.syncedStageInPlace) {
                    try refuseInPlaceChanges(since: before, in: copy, schema: old, from: old, to: new, configuration: configuration)
                }
            }
            try step(.willMigrate)
            // The new schema's open renames through original names; it knows the stage's old schema, so a swap of
            // two names is made here, once (see StoreRenames).
            staged.migrationSource = old
            let migrated = try container(new)
            try step(.schemaChanged)
            if let didMigrate = stage.didMigrate {
                let before = try lastHistoryToken(copy)
                try didMigrate(ModelContext(migrated))
                if !environment.canaries.contains(.syncedStageInPlace) {
                    try refuseInPlaceChanges(since: before, in: copy, schema: new, from: old, to: new, configuration: configuration)
                }
            }
            try step(.didMigrate)
            do {
                let db = try Connection(location: .file(copy))
                if !configuration.isSynced {
                    try dropRemovedAttributes(from: old, to: new, entities: Set(entityNames(new)), db)
                }
                try record(new.version, db)
                try db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            }
            try step(.versionRecorded)
        } catch let error as SQLiteError {
            try? removeDatabaseFiles(at: copy)
            throw loadIssue("migration stage \(old.version) → \(new.version): \(error.description)")
        } catch let error as StoreLayoutError {
            try? removeDatabaseFiles(at: copy)
            throw loadIssue("migration stage \(old.version) → \(new.version): \(error.reason)")
        } catch {
            try? removeDatabaseFiles(at: copy)
            throw error
        }
        // Every connection to the copy and to the store is closed: their journals are checkpointed and gone. The
        // rename replaces the store in one step.
        guard rename(copy.path, url.path) == 0 else {
            let code = errno
            try? removeDatabaseFiles(at: copy)
            throw loadIssue("migration stage \(old.version) → \(new.version): cannot replace the store file (errno \(code))")
        }
        try removeDatabaseFiles(at: copy)
        try step(.replaced)
    }

    /// Drops the columns of the attributes `old` declares and `new` does not (neither by name nor as an
    /// ``Schema/Attribute/originalName``) from the tables of `entities` — a lightweight stage's "drop" for a local
    /// store (SwiftData deletes a removed attribute's data). With `secure_delete` on, so the freed space holds no
    /// trace of the values (a removed attribute is often a sensitive one), and their recorded types go too, so a later
    /// schema may declare the name again with any type and starts empty. A store that keeps sync bookkeeping (synced
    /// once) keeps its columns: its cloud schema is additive-only. Entity tables a schema no longer declares are kept.
    private static func dropRemovedAttributes(from old: Schema, to new: Schema, entities: Set<String>, _ db: Connection) throws {
        if try !db.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_sync_record'").isEmpty { return }
        var drops: [(entity: String, column: String)] = []
        // The names the history log may know each entity by (its name when the record was deleted).
        var historyNames: [String: Set<String>] = [:]
        for entity in new.entities where entities.contains(entity.name) {
            guard let before = old.entities.first(where: { $0.name == entity.name })
                ?? entity.originalName.flatMap({ name in old.entities.first { $0.name == name } }) else { continue }
            let kept = Set(entity.attributes.flatMap { [$0.name] + ($0.originalName.map { [$0] } ?? []) })
            let relationships = Set(entity.relationships.map(\.name))
            for attribute in before.attributes where !kept.contains(attribute.name) && !relationships.contains(attribute.name) {
                drops.append((entity.name, attribute.name))
                historyNames[entity.name] = [entity.name, before.name]
            }
        }
        guard !drops.isEmpty else { return }
        try db.execute("PRAGMA secure_delete = ON")
        try db.execute("BEGIN IMMEDIATE")
        do {
            var types = try StoreAttributeTypes.read(db)
            for (entity, column) in drops {
                let columns = try db.rows("SELECT name FROM pragma_table_info(?)", [.text(entity)]).compactMap { row -> String? in
                    if case let .text(name)? = row.first { return name } else { return nil }
                }
                guard columns.contains(column) else { continue }
                try StoreRenames.dropColumn(column, of: entity, db)
                types?[StoreAttributeTypes.key(entity, column)] = nil
            }
            // A deleted record's tombstone in the history log keeps the values its entity preserves on deletion: those
            // of the dropped attributes go too, or the file would still hold them.
            try scrubTombstones(of: drops, names: historyNames, db)
            if let types {
                try db.run("UPDATE replica_metadata SET value = ? WHERE key = ?", [.text(StoreAttributeTypes.encode(types)), .text(StoreAttributeTypes.metadataKey)])
            }
            try db.execute("COMMIT")
        } catch {
            try? db.execute("ROLLBACK")
            throw error
        }
    }

    /// The newest history token of the store file at `url` (0 without history).
    private static func lastHistoryToken(_ url: URL) throws -> Int64 {
        let db = try Connection(location: .file(url), readOnly: true)
        guard try !db.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_history_transaction'").isEmpty,
              case let .integer(token)? = try db.scalar("SELECT max(token) FROM replica_history_transaction") else { return 0 }
        return token
    }

    /// In a synced store, refuses what a custom stage's code saved after history token `token` when it changed, in
    /// place, an attribute the stage's old schema `from` already has: every device runs the stage on the values it
    /// holds — values other devices already migrated and synced among them, and values devices still at the old
    /// version write — so an in-place transformation (dollars to cents) would apply more than once. Setting attributes
    /// the stage adds (derived values), inserting and deleting records are what a synced store's stage may do.
    /// `schema` is the schema the code's context had (`from` in `willMigrate`, `to` in `didMigrate`).
    /// - Throws: ``StoreLayoutError`` naming the entity and attribute (the stage runs on a copy: nothing changed).
    private static func refuseInPlaceChanges(since token: Int64, in url: URL, schema: Schema, from old: Schema, to new: Schema,
                                             configuration: ModelConfiguration) throws {
        let db = try Connection(location: .file(url), readOnly: true)
        guard try !db.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_sync_record'").isEmpty,
              try !db.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_history_change'").isEmpty else { return }
        let rows = try db.rows("SELECT DISTINCT entity, fields FROM replica_history_change WHERE token > ? AND kind = ? ORDER BY entity, fields",
                               [.integer(token), .integer(HistoryLog.Kind.update.rawValue)], cache: false)
        for row in rows {
            guard case let .text(entityName) = row[0], case let .text(fields) = row[1],
                  let entity = schema.entity(named: entityName) else { continue }
            // The entity and its attributes under their names in the old schema (through original names).
            let oldEntity = old.entity(named: entity.name) ?? entity.originalName.flatMap { old.entity(named: $0) }
            guard let oldEntity else { continue }
            for field in fields.split(separator: ",").map(String.init).sorted() {
                let attribute = entity.attributes.first { $0.name == field }
                let oldName = schema.version == old.version ? field : (attribute?.originalName ?? field)
                guard oldEntity.attributes.contains(where: { $0.name == oldName }) else { continue }
                throw StoreLayoutError(reason: "the stage's code changed \(entity.name).\(field) of records in the synced store '\(configuration.name)', an attribute \(old.version) has too: every device runs the stage on the values it holds, including values other devices migrated and synced already and values devices at \(old.version) still write, so the change would apply more than once; write the new values to an attribute \(new.version) adds instead (synced stores are additive-only); nothing was changed")
            }
        }
    }

    /// Removes the values of the dropped attributes from the tombstones of deleted records in the history log
    /// (`replica_history_change.tombstone`), inside the caller's transaction.
    private static func scrubTombstones(of drops: [(entity: String, column: String)], names: [String: Set<String>], _ db: Connection) throws {
        guard try !db.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_history_change'").isEmpty else { return }
        let columns = Dictionary(grouping: drops, by: \.entity).mapValues { Set($0.map(\.column)) }
        for entity in columns.keys.sorted() {
            guard let dropped = columns[entity] else { continue }
            for name in (names[entity] ?? [entity]).sorted() {
                let rows = try db.rows("SELECT token, seq, tombstone FROM replica_history_change WHERE entity = ? AND tombstone IS NOT NULL ORDER BY token, seq",
                                       [.text(name)], cache: false)
                for row in rows {
                    guard case let .text(json) = row[2] else { continue }
                    let tombstone = HistoryLog.decodeTombstone(json)
                    guard tombstone.values.keys.contains(where: dropped.contains) else { continue }
                    let kept = tombstone.values.filter { !dropped.contains($0.key) }.sorted { $0.key < $1.key }
                    try db.run("UPDATE replica_history_change SET tombstone = ? WHERE token = ? AND seq = ?",
                               [.text(HistoryLog.encodeTombstone(kept)), row[0], row[1]])
                }
            }
        }
    }

    /// Deletes a database file and the files SQLite keeps beside it, where they exist.
    private static func removeDatabaseFiles(at url: URL) throws {
        for suffix in ["", "-wal", "-shm", "-journal", "-lock"] {
            let path = url.path + suffix
            guard FileManager.default.fileExists(atPath: path) else { continue }
            try FileManager.default.removeItem(atPath: path)
        }
    }
}
