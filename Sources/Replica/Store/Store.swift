import Foundation
import Synchronization

/// One store of a container: a configuration, the entities it holds and its SQLite database. Internal.
///
/// Table layout: one table per entity, named after it, with `id BLOB PRIMARY KEY` (the 16-byte record ID), one
/// column per attribute and one per to-one relationship (the referenced ID), and an index on each reference column.
/// Many-to-many relationships live in link tables (`replica_link_<Entity>_<relationship>`, see `LinkTable`).
/// Each attribute's column carries its declared default as SQL `DEFAULT` (see `ColumnDefaults`), so rows that a process
/// of an older app version inserts hold it. `replica_metadata` holds the store's replica identity, the declared defaults
/// of a synced store (`synced_defaults`) and, in a synced store file, the fields every app version that opened it
/// declares (`store_fields`, see `StoreFieldUnion`).
final class Store: Sendable {
    let configuration: ModelConfiguration
    let entities: [Schema.Entity]
    let entityIndex: [String: Int]
    let location: Connection.Location
    /// The store's replica identity: one per store file, shared by every process that opens it.
    let identity: UUID
    /// Whether saves keep the sync bookkeeping (stamps, causal lengths, outbox): in a synced store, and in a store
    /// file that has it although this configuration is local-only (sync turned off for a while). Kept up to date
    /// while sync is off, the bookkeeping lets sync, turned on again, upload the edits and deletes made meanwhile —
    /// otherwise they would be lost to the older versions in the cloud, or resurrected by them.
    let tracksSync: Bool
    /// The fields other app versions sharing this store file declare (see ``StoreFieldUnion``), as last read.
    let columnFields = StoreColumnFieldsCache()
    /// Connections no context or sync engine holds: the one that opened the store (until the first owner takes it),
    /// then, for an in-memory store, those their owners gave back (``reuse(_:)``). While no owner holds a connection
    /// of an in-memory store, one waits here, so the in-memory database lives as long as the container.
    private let idle: Mutex<[IdleConnection]>
    /// SQL text per entity, built once.
    let statements: [EntityStatements]
    /// The outbox query of this store's entities (``SyncLedger/outboxSQL(entities:)``).
    let outboxSQL: StatementKey
    /// Canary ``Canary/uniqueExternalComparedAsBytes``: saves compare external-storage values with rows as bytes.
    let comparesExternalValuesAsBytes: Bool
    /// What the store was made from (shared by every store with these entities): its template and the connections
    /// of in-memory stores that went away, for the next one.
    private let layout: StoreLayout
    /// For an in-memory store: its database's schema cookie (`PRAGMA schema_version`) when it was made. The same
    /// cookie when the store goes away means its schema is still the fresh one (see `deinit`).
    private let freshSchemaVersion: Int64?
    /// Set when an owner gave back a connection that could not be reset (a statement of it still held elsewhere):
    /// that connection may outlive the store, reading its database, which is then never recycled.
    private let connectionHeldElsewhere = Atomic<Bool>(false)
    /// For a store file: the shared lock this store holds while it exists, by which other processes and containers
    /// learn it is open (see ``StoreFileLock``).
    private let fileLock: StoreFileLock?

    /// Gives up the store's file lock as a crash of this process would (the kernel drops it), keeping the connections
    /// (see ``ModelContainer/releaseStoreLocksAsAfterCrash()``).
    func releaseFileLockAsAfterCrash() { fileLock?.unlock() }
    /// The files of ``Schema/Attribute/Options/externalStorage`` attributes (see ``AssetStore``): for every store file,
    /// synced or not (a synced store's values travel as assets, see `SyncEngine+Assets.swift`); `nil` for in-memory
    /// stores, which keep the bytes in their rows, in memory.
    let assets: AssetStore?
    /// Per entity (``entities`` order): the field indices of its external-storage data attributes when ``assets``
    /// is set, else empty.
    let externalFields: [[Int]]
    /// Per entity: the field indices of its external-storage data attributes when ``assets`` is `nil` (an in-memory
    /// store keeps their bytes in its rows), else empty: a save reads an ``ExternalData`` file handle there into bytes.
    let inlineExternalFields: [[Int]]
    /// The files queries read external-storage references from: ``assets`` (`nil` when no row can hold a reference).
    let readAssets: AssetStore?
    /// Per entity: the field indices queries read through ``readAssets`` (``externalFields``).
    let readExternalFields: [[Int]]
    /// The reason of ``ReplicaError/storeInUse(configuration:reason:)`` when another process or container is migrating
    /// the store (it holds the store's lock exclusively): nothing is wrong with either side; open it again once that
    /// migration finished.
    static let migratingElsewhere = "another process or container is migrating it right now; open it again when that migration has finished"

    /// In-memory stores opened by this process so far: part of each in-memory database's name.
    private static let inMemoryStoreCount = Atomic<UInt64>(0)

    /// Opens (creating if needed) the store and brings its tables up to `entities`.
    /// - Throws: ``ReplicaError/loadIssueModelContainer(configuration:reason:)``.
    /// - Parameters:
    ///   - schemaVersion: the version of the schema opening the store; a store that a migration plan migrated to a
    ///     later version, or that a later versioned schema created (``recordedSchemaVersion(_:)``), is refused.
    ///   - recordsVersion: whether a store created now records `schemaVersion` (the schema is a ``VersionedSchema``'s).
    ///   - refusesEarlierVersion: whether a store recorded at an earlier version than `schemaVersion` is refused (a
    ///     versioned schema opened without its migration plan: it would change the tables past the recorded version
    ///     without running the plan's stages, which would then never run).
    ///   - migrationSource: when the store opens as a migration stage's new schema, the stage's old schema (see
    ///     ``StoreRenames``).
    init(configuration: ModelConfiguration, entities: [Schema.Entity], schemaVersion: Schema.Version, recordsVersion: Bool = false,
         refusesEarlierVersion: Bool = false, migrationSource: Schema? = nil, environment: ReplicaEnvironment) throws {
        var recycled: Connection?
        self.configuration = configuration
        self.entities = entities
        var index: [String: Int] = [:]
        for (i, entity) in entities.enumerated() { index[entity.name] = i }
        self.entityIndex = index
        let layout = StoreLayout.shared(entities, synced: configuration.isSynced)
        self.layout = layout
        self.statements = layout.statements
        self.outboxSQL = environment.canaries.contains(.unknownEntityRefused) ? SyncLedger.outboxSQL(entities: nil) : layout.outboxSQL
        comparesExternalValuesAsBytes = environment.canaries.contains(.uniqueExternalComparedAsBytes)
        let name = configuration.name
        func loadIssue(_ reason: String) -> ReplicaError { .loadIssueModelContainer(configuration: name, reason: reason) }

        if let url = configuration.url(in: environment) {
            self.location = .file(url)
            let directory = url.deletingLastPathComponent()
            if configuration.allowsSave {
                do {
                    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                } catch {
                    throw loadIssue("cannot create directory \(directory.path)")
                }
            } else if !FileManager.default.fileExists(atPath: url.path) {
                throw loadIssue("read-only store file \(url.path) does not exist")
            }
            do {
                fileLock = try StoreFileLock.take(.shared, of: url, create: configuration.allowsSave)
            } catch .held {
                throw ReplicaError.storeInUse(configuration: name, reason: Self.migratingElsewhere)
            } catch let .unavailable(path, code) {
                throw loadIssue("cannot lock \(path) (errno \(code))")
            }
        } else {
            fileLock = nil
            // A unique name per container: in-memory stores of different containers never share data, even when
            // their environments produce the same identifiers (two environments seeded alike).
            let serial = Self.inMemoryStoreCount.add(1, ordering: .relaxed).newValue
            // Drawn whether or not a recycled database is used: what the environment hands out next must not depend
            // on what other containers of the process did before.
            let unique = environment.makeIdentifier().uuidString
            recycled = configuration.allowsSave ? layout.takeRetired() : nil
            self.location = recycled?.location ?? .memory(name: "replica-\(name)-\(serial)-\(unique)")
        }

        do {
            let connection = try recycled ?? Connection(location: location, readOnly: !configuration.allowsSave)
            // A store a migration plan took past this schema's version holds what an older build cannot know (renamed
            // columns, transformed values): opening it would add the old columns back and read defaults.
            let recordedVersion = recycled == nil ? try Self.recordedSchemaVersion(connection) : nil
            if let recorded = recordedVersion {
                if recorded > schemaVersion {
                    // An unversioned schema (`Schema([Note.self])`) is 1.0.0 whatever its models: often the current
                    // models opened without their VersionedSchema, not an older build.
                    let advice = recordsVersion ? "this is an older build of the app — update it"
                        : "if this schema is the app's current one, open the store with its versioned schema (Schema(versionedSchema:), MyV2.schema: an unversioned Schema([Model.self]) is version 1.0.0) or with the migration plan; otherwise this is an older build of the app — update it"
                    throw StoreLayoutError(reason: "the store is at schema version \(recorded), newer than this app's schema version \(schemaVersion) (a newer app version migrated or created it); \(advice)")
                }
                // A versioned schema without its plan (a widget's or a ModelActor's container of the updated app, run
                // before the app) would add its tables and columns and leave the recorded version: the plan would then
                // have to guess from the tables where to start, and skip the stages' code (R2).
                if refusesEarlierVersion && recorded < schemaVersion {
                    throw StoreLayoutError(reason: "the store is at schema version \(recorded), this schema is \(schemaVersion): open it with the migration plan (ModelContainer(for:migrationPlan:configurations:)), which runs the stages from \(recorded) first; nothing was changed")
                }
            }
            var isNew = false
            let fileURL: URL? = if case let .file(url) = location { url } else { nil }
            let assetStore = fileURL.map {
                AssetStore(storeURL: $0, storeName: name, verifiesReuse: true, migrationCopy: configuration.isMigrationCopy)
            }
            if configuration.allowsSave {
                // A new in-memory store starts as a copy of the schema (see `cloneFreshSchema`), or as the emptied
                // database of one that went away (see `StoreLayout.takeRetired()`).
                let cloned = try configuration.isStoredInMemoryOnly && (recycled != nil || layout.cloneFreshSchema(into: connection))
                // Renames through original names need the store to itself: the shared lock becomes exclusive for
                // them, and shared again once they are committed.
                let fileLock = self.fileLock
                var exclusive = false
                let takeExclusive: () throws -> Void = {
                    // A store a migration plan manages (it records a schema version) is renamed by the plan's stages
                    // only: a container without the plan (a widget's, a model actor's, with an unversioned schema of
                    // the updated models) that renamed its columns would move its tables past the recorded version,
                    // and the plan would then skip the stages' code (R2).
                    if let recordedVersion, migrationSource == nil, !environment.canaries.contains(.renameOutsidePlan) {
                        throw StoreLayoutError(reason: "the store is at schema version \(recordedVersion), recorded by a migration plan, and this schema renames its tables or columns through original names: renaming them is that plan's stages' work — open it with the migration plan (ModelContainer(for:migrationPlan:configurations:)) first; nothing was changed")
                    }
                    guard let fileLock, !exclusive else { return }
                    do {
                        try fileLock.change(to: .exclusive)
                    } catch {
                        throw StoreInUse(reason: "another process or container has it open; renaming through original names needs it to itself — close the store there (or update that app) and open it again")
                    }
                    exclusive = true
                }
                (identity, isNew, tracksSync) = try Self.prepare(connection, layout: layout, schemaReady: cloned,
                                                                 sharedFile: !configuration.isStoredInMemoryOnly,
                                                                 appGroup: configuration.groupContainer != .none,
                                                                 recordVersion: recordsVersion ? schemaVersion : nil,
                                                                 migrationSource: migrationSource,
                                                                 takeExclusive: takeExclusive, environment: environment)
                if exclusive, let fileLock {
                    do {
                        try fileLock.change(to: .shared)
                    } catch {
                        throw StoreInUse(reason: "the store's lock could not be shared again")
                    }
                }
            } else {
                identity = try Self.readIdentity(connection, entities: entities, synced: configuration.isSynced)
                tracksSync = false
            }
            assets = assetStore
            let declaredExternal = entities.map { entity in
                entity.attributes.indices.filter { entity.attributes[$0].options.contains(.externalStorage) && entity.attributes[$0].type == .data }
            }
            externalFields = assets == nil ? entities.map { _ in [] } : declaredExternal
            inlineExternalFields = assets == nil ? declaredExternal : entities.map { _ in [] }
            readAssets = assets
            readExternalFields = readAssets == nil ? entities.map { _ in [] } : declaredExternal
            // Files a save wrote before it crashed (or rolled back) are referenced by no committed row, nor are those
            // of a column a migration stage dropped: removed now, whether or not this schema declares external
            // attributes (the collector reads what the store's tables hold). Best effort: while another process
            // holds the write lock past the busy timeout, the next collection removes them instead.
            if let assets, configuration.allowsSave {
                _ = try? assets.collectGarbage(connection, entities: entities)
            }
            // The connection that created an in-memory store keeps it alive, and is the first one handed out. That of a
            // store file is handed out first too: it has read the schema and prepared statements already, which a
            // new connection would do again (a process start opens each store, then its context asks for one).
            idle = Mutex([IdleConnection(connection)])
            if configuration.isStoredInMemoryOnly, configuration.allowsSave, isNew, case let .integer(version)? = try connection.scalar(Self.schemaVersionSQL) {
                freshSchemaVersion = version
            } else {
                freshSchemaVersion = nil
            }
            // A store created just now holds no records, so none can lack sync bookkeeping.
            if configuration.allowsSave && configuration.isSynced && !isNew {
                try adoptUntrackedRecords(connection, environment: environment)
            }
        } catch let error as SQLiteError {
            throw loadIssue(error.description)
        } catch let error as StoreLayoutError {
            throw loadIssue(error.reason)
        } catch let error as StoreInUse {
            throw ReplicaError.storeInUse(configuration: name, reason: error.reason)
        }
    }

    /// The schema version recorded in the store (`replica_metadata['schema_version']`, by a migration plan or by the
    /// container that created the store from a versioned schema), `nil` when it has none.
    /// - Throws: `SQLiteError` when it cannot be read; ``StoreLayoutError`` when the recorded value is damaged: not
    ///   text (an integer, a blob, NULL), or text that is not a version (`major.minor.patch`, decimal digits only,
    ///   no spaces).
    static func recordedSchemaVersion(_ db: Connection) throws -> Schema.Version? {
        guard try db.scalar("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_metadata')") == .integer(1),
              let value = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'") else { return nil }
        func damaged(_ shown: String) -> StoreLayoutError {
            StoreLayoutError(reason: "its schema-version bookkeeping value (replica_metadata 'schema_version') is damaged: it holds \(shown), not a version such as 1.0.0; it cannot tell which migration stages ran — restore the store file from a backup, or set the value to the version its tables are at")
        }
        guard case let .text(text) = value else {
            switch value {
            case let .integer(number): throw damaged("the integer \(number)")
            case let .real(number): throw damaged("the number \(number)")
            case let .blob(bytes): throw damaged("a \(bytes.count)-byte blob")
            default: throw damaged("NULL")
            }
        }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        // Up to 18 digits a part: every version a container records (build numbers such as 2026120701 too).
        let numbers = parts.map { part in part.allSatisfy { ("0"..."9").contains($0) } && part.count <= 18 ? Int(part) : nil }
        guard numbers.count == 3, let major = numbers[0], let minor = numbers[1], let patch = numbers[2] else {
            // A long value is shown by its start only (a damaged value may be any size).
            let start = text.count > 40 ? "the text '\(text.prefix(40))…' (\(text.utf8.count) bytes)" : "the text '\(text)'"
            throw damaged(text.isEmpty ? "empty text" : start)
        }
        return Schema.Version(major, minor, patch)
    }

    /// Records of a synced store that have no sync bookkeeping — saved while the store was opened local-only, before
    /// sync was turned on — enter the outbox as local inserts (every field stamped now), so turning sync on for an
    /// existing store uploads what it holds. Done in one write transaction, only when there are any.
    private func adoptUntrackedRecords(_ db: Connection, environment: ReplicaEnvironment) throws {
        func untracked() throws -> StoreChanges {
            var changes = StoreChanges()
            for (index, entity) in entities.enumerated() {
                let sql = "SELECT \"id\" FROM \(statements[index].table) WHERE \"id\" NOT IN (SELECT id FROM replica_sync_record) ORDER BY \"id\""
                for row in try db.rows(sql, cache: false) {
                    guard let id = try? UUID(sqliteValue: row[0]) else { continue }
                    changes.inserted.append(Snapshot(entityName: entity.name, id: id, values: []))
                }
            }
            return changes
        }
        guard try !untracked().isEmpty else { return }
        try db.transaction(.immediate) {
            try SyncLedger.recordLocalChanges(try untracked(), store: self, db: db, environment: environment)
        }
    }

    /// A connection to this store, for one owner (a context or a sync engine): an idle one (the one that opened the
    /// store, or one an owner of an in-memory store gave back, see ``reuse(_:)``), else a new one. Opening a connection reads the whole schema and every statement it runs
    /// is prepared again, which costs more than the rest of a short-lived store's work (property-test and simulator
    /// cases open hundreds of in-memory stores).
    func openConnection() throws -> Connection {
        if let reused = idle.withLock({ $0.popLast() }) {
            return reused.connection
        }
        return try Connection(location: location, readOnly: !configuration.allowsSave)
    }

    /// Takes back a connection from an owner that is done with it (a context or sync engine going away), so that the
    /// next ``openConnection()`` uses it, with its schema read and its statements prepared. Only for in-memory stores
    /// (a file store's connection closes as before): the connection is reset first — unfinished statements reset,
    /// an open transaction rolled back (as closing it would) — so the next owner finds it as a new one would be.
    /// Keeps at most a few; past that the connection closes (the others keep the database alive).
    ///
    /// A connection that cannot be reset (a statement of it still held elsewhere) closes once that statement goes;
    /// if it were the store's last connection, the in-memory database would go with it. So while no connection
    /// waits here, a new one is opened in its place to keep the database alive.
    func reuse(_ connection: Connection) {
        guard configuration.isStoredInMemoryOnly, connection.location == location else { return }
        let reusable = connection.resetForReuse()
        if !reusable { connectionHeldElsewhere.store(true, ordering: .relaxed) }
        idle.withLock { idle in
            if reusable {
                if idle.count < Self.idleConnectionLimit { idle.append(IdleConnection(connection)) }
            } else if idle.isEmpty, let fresh = try? Connection(location: location, readOnly: !configuration.allowsSave) {
                // Opened while the refused connection is still open, so it joins the same database.
                idle.append(IdleConnection(fresh))
            }
        }
    }

    /// At most this many idle connections per in-memory store.
    private static let idleConnectionLimit = 4

    /// An in-memory database goes away with its last connection. Instead, one connection of it that can be reset
    /// (no statement held outside its caches, no transaction; the one given back last, as ``openConnection()``
    /// would hand out next) goes to the layout, and the next new in-memory store with these entities starts from
    /// it, emptied (``StoreLayout/takeRetired()``): its schema is read and the statements it ran are prepared
    /// already, which costs more than the whole life of a short test or simulation case's store. Contexts and sync
    /// engines keep the container, so none holds a connection of this store now; a database that a connection given
    /// back unreset may still read, or whose schema changed, is not recycled.
    deinit {
        guard let freshSchemaVersion, !connectionHeldElsewhere.load(ordering: .relaxed) else { return }
        let connections = idle.withLock { idle in
            defer { idle.removeAll() }
            return idle.map(\.connection)
        }
        guard let reusable = connections.last(where: { $0.location == location && $0.resetForReuse() }),
              case .integer(freshSchemaVersion)? = try? reusable.scalar(Self.schemaVersionSQL) else { return }
        layout.retire(reusable, schemaVersion: freshSchemaVersion)
    }

    static let schemaVersionSQL = StatementKey("PRAGMA schema_version")

    /// The schema of a new store: Replica's tables (metadata, history, and for a synced store the sync bookkeeping),
    /// then each entity's table and indexes, then the link tables of many-to-many relationships.
    static func freshSchemaSQL(_ entities: [Schema.Entity], synced: Bool) -> String {
        var sql = metadataSQL + ";\n" + HistoryLog.createSQL + "\n"
        if synced { sql += SyncLedger.freshCreateSQL + "\n" }
        for entity in entities {
            let columns = [#""id" BLOB PRIMARY KEY NOT NULL"#] + columnDefinitions(entity)
            sql += "CREATE TABLE \(quoted(entity.name)) (\(columns.joined(separator: ", ")));\n"
            sql += indexSQL(entity).map { $0 + ";\n" }.joined()
        }
        sql += LinkTable.createSQL(entities: entities).map { $0 + ";\n" }.joined()
        return sql
    }

    static let metadataSQL = "CREATE TABLE IF NOT EXISTS replica_metadata (key TEXT PRIMARY KEY NOT NULL, value ANY) STRICT"

    /// The indexes of an entity's table: one per to-one relationship and one per uniqueness constraint.
    static func indexSQL(_ entity: Schema.Entity) -> [String] {
        let table = quoted(entity.name)
        return entity.toOneRelationships.map {
            "CREATE INDEX IF NOT EXISTS \(quoted(Schema.relationshipIndexName(entity: entity.name, relationship: $0.name))) ON \(table) (\(quoted($0.name)))"
        } + entity.uniquenessConstraints.enumerated().compactMap { i, constraint in
            constraint.isEmpty ? nil
                : "CREATE INDEX IF NOT EXISTS \(quoted(Schema.uniquenessIndexName(entity: entity.name, constraint: i))) ON \(table) (\(constraint.map(quoted).joined(separator: ", ")))"
        }
    }

    /// Creates missing tables, columns and indexes, and reads or creates the replica identity — in one write
    /// transaction, so two processes opening a new store file at once agree on one identity. With `schemaReady`, the
    /// database holds exactly the fresh schema already (a copy) and only the identity is created.
    /// Returns the identity, whether the store was created now (it then holds no records), and whether saves keep
    /// its sync bookkeeping (see ``tracksSync``). A store file (`sharedFile`: other processes, perhaps of other app
    /// versions, may open it) with sync bookkeeping records this schema's fields in its ``StoreFieldUnion``. In an
    /// app-group store (`appGroup`), which processes of several app versions share at once, tables whose columns lack
    /// their SQL defaults are rebuilt (a copy of each such table, once).
    private static func prepare(_ db: Connection, layout: StoreLayout, schemaReady: Bool, sharedFile: Bool, appGroup: Bool,
                                recordVersion: Schema.Version?, migrationSource: Schema?, takeExclusive: () throws -> Void,
                                environment: ReplicaEnvironment) throws -> (identity: UUID, isNew: Bool, tracksSync: Bool) {
        let entities = layout.entities, synced = layout.synced
        return try db.transaction(.immediate) {
            if try schemaReady || db.scalar("SELECT count(*) FROM sqlite_master") == .integer(0) {
                // A new store: its whole schema at once (or copied from the template: exactly the fresh schema), then
                // its identity and, when synced, the fingerprint of its defaults, in one statement. It has no
                // records, so no default needs applying (see `applyCurrentDefaults`).
                if !schemaReady { try db.execute(layout.freshSchemaSQL) }
                let identity = environment.makeIdentifier()
                let types = SQLiteValue.text(layout.attributeTypes)
                if synced && sharedFile {
                    _ = try db.rows("INSERT INTO replica_metadata (key, value) VALUES ('identity', ?), ('attribute_types', ?), ('synced_defaults', ?), ('store_fields', ?)",
                                    [identity.sqliteValue, types, .text(layout.defaultsFingerprint), .text(layout.fieldUnion)], cache: false)
                } else if synced {
                    _ = try db.rows("INSERT INTO replica_metadata (key, value) VALUES ('identity', ?), ('attribute_types', ?), ('synced_defaults', ?)",
                                    [identity.sqliteValue, types, .text(layout.defaultsFingerprint)], cache: false)
                } else {
                    _ = try db.rows("INSERT INTO replica_metadata (key, value) VALUES ('identity', ?), ('attribute_types', ?)",
                                    [identity.sqliteValue, types], cache: false)
                }
                // Created from a versioned schema: the store is at its version (with or without a migration plan), so
                // a plan opening it later runs no stage it is past (see StoreMigrator).
                if let recordVersion {
                    guard recordVersion.isRecordable else { throw StoreLayoutError(reason: recordVersion.unrecordableReason) }
                    _ = try db.rows("INSERT INTO replica_metadata (key, value) VALUES ('schema_version', ?)",
                                    [.text(recordVersion.description)], cache: false)
                }
                return (identity, true, synced)
            }
            // A local-only configuration of a file that has sync bookkeeping keeps it (see `tracksSync`).
            let tracked = try synced || db.scalar(Self.hasLedgerSQL) == .integer(1)
            do {
                // Tables and indexes the store has already: their `CREATE ... IF NOT EXISTS` would do nothing, and
                // parsing them costs more than the rest of opening a store that is up to date.
                let present = try IdempotentSchemaSQL.presentObjects(db)
                try IdempotentSchemaSQL.execute(metadataSQL, db, present: present)
                try IdempotentSchemaSQL.execute(HistoryLog.createSQL, db, present: present)
                if tracked {
                    try IdempotentSchemaSQL.execute(SyncLedger.createSQL, db, present: present)
                    try SyncLedger.migrate(db)
                }
                // Whether this schema added tables or columns to the store (an app upgrade), and whether a table was
                // rebuilt to give its columns their defaults.
                var grew = false, rebuilt = false
                // The declared type of every attribute that has a column (see StoreAttributeTypes).
                let storedTypes = try StoreAttributeTypes.read(db)
                var recordedTypes = storedTypes
                for entity in entities {
                    let table = quoted(entity.name)
                    // Renames through original names (local stores; synced entities cannot declare them).
                    try StoreRenames.renameTable(of: entity, in: entities, db, recordedTypes: &recordedTypes, tracksSync: tracked,
                                                 stageSource: migrationSource, takeExclusive: takeExclusive)
                    // Each existing column with the text of its SQL default (`nil`: none).
                    var existing: [String: String?] = [:]
                    for row in try db.rows("SELECT name, dflt_value FROM pragma_table_info(?)", [.text(entity.name)]) {
                        guard case let .text(name) = row[0] else { continue }
                        existing[name] = if case let .text(value) = row[1] { .some(value) } else { .some(nil) }
                    }
                    if existing.isEmpty {
                        let columns = [#""id" BLOB PRIMARY KEY NOT NULL"#] + columnDefinitions(entity)
                        try db.execute("CREATE TABLE \(table) (\(columns.joined(separator: ", ")))")
                        grew = true
                    } else {
                        if !environment.canaries.contains(.renameAddsColumn) {
                            try StoreRenames.renameColumns(of: entity, db, existing: &existing, recordedTypes: &recordedTypes, tracksSync: tracked,
                                                          stageSource: migrationSource, takeExclusive: takeExclusive)
                        }
                        try checkLayout(of: entity, db, recordedTypes: recordedTypes, synced: synced)
                        // Lightweight migration: add columns for new attributes and references, each with its declared
                        // default as SQL DEFAULT, so rows written before — and rows a process of an older app version
                        // sharing the file inserts later — hold it. Columns of removed attributes stay (their data is
                        // kept) and are ignored.
                        for name in entity.fieldNames where existing[name] == nil {
                            let withDefault = try ColumnDefaults.addColumn(name, to: entity, db)
                            existing[name] = .some(withDefault ? "" : nil)
                            grew = true
                        }
                        // Columns created before defaults were stored in the schema get theirs by a rebuild, once — in
                        // app-group stores, where processes of an older version insert rows while this one runs. (A
                        // store only one process opens gets the SQL defaults of columns it adds; rebuilding all of
                        // its tables would cost a copy of each at the first launch after an update, for no writer.)
                        if appGroup, try ColumnDefaults.rebuildIfNeeded(existing, entity: entity, db: db) { rebuilt = true }
                    }
                    for index in indexSQL(entity) { try IdempotentSchemaSQL.execute(index, db, present: present) }
                }
                // A rebuild gave rows an older process inserted without the column their default; in a synced store
                // the fields of such rows that no write stamped take the current default too (R8), checked again.
                if synced && rebuilt {
                    try db.run("DELETE FROM replica_metadata WHERE key = 'synced_defaults'")
                }
                try StoreAttributeTypes.record(entities, over: recordedTypes, stored: storedTypes, db)
                // Many-to-many relationships: one link table per relationship pair (see LinkTable). In a store with
                // sync bookkeeping (synced now, or while sync is off), a new one is filled by a full resync (below, or
                // when sync is on again) from the link sets an older schema kept (R17).
                // A renamed entity's link tables move to the new name first (local stores, see StoreRenames).
                try StoreRenames.renameLinkTables(of: entities, db, takeExclusive: takeExclusive)
                var newLinkTable = false
                let linkTables = LinkTable.all(in: entities)
                if tracked, !linkTables.isEmpty {
                    for table in linkTables where try db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(table.name)]) == nil {
                        newLinkTable = true
                    }
                }
                try LinkTable.prepare(db, entities: entities)
                // Records the older schema could only keep whole (an unknown type) or in part (fields it did not
                // know, kept beside the row) are read again in full: the next fetch starts a full resync, whose
                // merges put those values into the new tables and columns.
                if synced && grew || newLinkTable {
                    try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
                }
                if tracked && sharedFile {
                    try StoreFieldUnion.record(entities, db)
                    // Values an older process kept beside the row, as fields it did not know, go into the columns added
                    // now, so this version reads them at once (offline too; the full resync above re-reads the rest).
                    if grew { try SyncLedger.foldUnknownFieldsIntoColumns(entities: entities, statements: layout.statements, db) }
                }
            }
            if synced { try applyCurrentDefaults(db, entities: entities) }
            if let existing = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'identity'") {
                guard let identity = try? UUID(sqliteValue: existing) else {
                    // The replica identity stamps this store's writes: a damaged one is never replaced silently.
                    throw StoreLayoutError(reason: "its replica identity (replica_metadata 'identity') is damaged: it holds \(Self.shown(existing)), not a 16-byte identifier; restore the store file from a backup, or delete that row to give the store a new identity (its writes are then stamped as a new replica's); nothing was changed")
                }
                return (identity, false, tracked)
            }
            let identity = environment.makeIdentifier()
            try db.run("INSERT INTO replica_metadata (key, value) VALUES ('identity', ?)", [identity.sqliteValue])
            return (identity, false, tracked)
        }
    }

    /// Whether the store file has the sync ledger.
    private static let hasLedgerSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'replica_sync_record')")

    /// The declared defaults of every attribute, as remembered in `replica_metadata['synced_defaults']`.
    static func defaultsFingerprint(_ entities: [Schema.Entity]) -> String {
        var defaults: [String: SQLiteValue] = [:]
        for entity in entities {
            for attribute in entity.attributes { defaults["\(entity.name).\(attribute.name)"] = attribute.defaultValue ?? .null }
        }
        return ReplicaJSON.stamplessString(defaults)
    }

    /// R8: a synced field with no write in its record's current incarnation shows its declared default. Rows keep the
    /// default of the schema that merged them, so when a synced store is opened with other defaults than the last
    /// time, every such field takes the current one; otherwise devices on the same schema version would disagree
    /// forever about records an older writer created. Runs only when the declared defaults changed (they are
    /// remembered in `replica_metadata['synced_defaults']`). Nothing is stamped or uploaded: no one wrote these fields.
    private static func applyCurrentDefaults(_ db: Connection, entities: [Schema.Entity]) throws {
        let fingerprint = defaultsFingerprint(entities)
        if case let .text(previous)? = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'synced_defaults'"),
           previous == fingerprint {
            return
        }
        // Only records the ledger knows can need a new default: a new store (every in-memory one) skips the
        // per-entity reads and the UPDATEs, whose preparation costs more than the rest of opening it.
        let knowsRecords = try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_record)") == .integer(1)
        for entity in entities where knowsRecords {
            // Live records of this entity and the fields their current incarnation has stamps for (the `stamps`
            // column is read in either of its forms, so this works on stores written before the compact form).
            var stamped: [(id: UUID, fields: Set<String>)] = []
            let select = try Statement(connection: db, sql: "SELECT id, stamps FROM replica_sync_record WHERE entity = ? AND causal_length % 2 = 1")
            try select.bind(.text(entity.name), at: 0)
            while try select.step() {
                // A row whose stamps cannot be read says nothing about which fields were written: its values stay
                // (never replaced by defaults); the sync engine finds it corrupt and repairs it (R14).
                guard let id = select.uuid(0), let stamps = SyncLedger.readStamps(select, 1) else { continue }
                stamped.append((id, Set(stamps.keys)))
            }
            for attribute in entity.attributes {
                let value = attribute.defaultValue ?? .null
                let update = try Statement(connection: db, sql: """
                    UPDATE \(quoted(entity.name)) SET \(quoted(attribute.name)) = ? WHERE \(quoted(attribute.name)) IS NOT ? AND "id" = ?
                    """)
                for record in stamped where !record.fields.contains(attribute.name) {
                    try update.run([value, value, record.id.sqliteValue])
                }
            }
        }
        try db.run("INSERT INTO replica_metadata (key, value) VALUES ('synced_defaults', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   [.text(fingerprint)])
    }

    /// A damaged bookkeeping value for a message: its kind and size, text by its start only.
    static func shown(_ value: SQLiteValue) -> String {
        switch value {
        case let .integer(number): "the integer \(number)"
        case let .real(number): "the number \(number)"
        case let .blob(bytes): "a \(bytes.count)-byte blob"
        case let .text(text): text.count > 40 ? "the text '\(text.prefix(40))…' (\(text.utf8.count) bytes)" : "the text '\(text)'"
        case .null: "NULL"
        }
    }

    private static func readIdentity(_ db: Connection, entities: [Schema.Entity], synced: Bool) throws -> UUID {
        guard let value = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'identity'"),
              let identity = try? UUID(sqliteValue: value) else {
            throw SQLiteError(extendedResultCode: 1, message: "the file is not a Replica store (no replica identity)")
        }
        let recordedTypes = try StoreAttributeTypes.read(db)
        for entity in entities {
            let columns = Set(try db.rows("SELECT name FROM pragma_table_info(?)", [.text(entity.name)]).compactMap {
                if case let .text(name) = $0[0] { return name } else { return nil }
            })
            let missing = entity.fieldNames.filter { !columns.contains($0) }
            if columns.isEmpty || !missing.isEmpty {
                throw SQLiteError(extendedResultCode: 1, message: "read-only store lacks \(entity.name)\(missing.isEmpty ? "" : " columns \(missing.joined(separator: ", "))")")
            }
            try checkLayout(of: entity, db, recordedTypes: recordedTypes, synced: synced)
        }
        return identity
    }

    /// Checks that an existing table can hold `entity` faithfully: `id` is the BLOB primary key, each existing
    /// column of a reference is a BLOB column, and each existing column of an attribute holds values of the type
    /// declared now — its SQL type is the one Replica declares for that type, and the type recorded for the attribute
    /// (`recordedTypes`, see ``StoreAttributeTypes``) is the declared one. A column of another type would convert
    /// values by its affinity (a string "007" saved into an INTEGER column reads back as the integer 7), a Bool read
    /// as an Int or a Date read as a Double would silently change meaning, and rows with other IDs would be invisible.
    /// - Throws: ``StoreLayoutError`` naming the attribute, the stored type and the declared one.
    private static func checkLayout(of entity: Schema.Entity, _ db: Connection, recordedTypes: [String: String]?, synced: Bool) throws {
        var declared: [String: (type: String, pk: Bool)] = [:]
        for row in try db.rows("SELECT name, type, pk FROM pragma_table_info(?)", [.text(entity.name)]) {
            guard case let .text(name) = row[0] else { continue }
            let type = if case let .text(t) = row[1] { t.uppercased() } else { "" }
            let pk = if case let .integer(p) = row[2] { p != 0 } else { false }
            declared[name] = (type, pk)
        }
        if let id = declared["id"], id.type != "BLOB" || !id.pk {
            throw StoreLayoutError(reason: "table \(entity.name) has an 'id' column of type '\(id.type)'\(id.pk ? "" : ", not the primary key"); Replica needs a BLOB primary key of 16-byte record IDs")
        } else if declared["id"] == nil {
            throw StoreLayoutError(reason: "table \(entity.name) has no 'id' column")
        }
        for attribute in entity.attributes {
            guard let column = declared[attribute.name] else { continue }
            let recorded = recordedTypes?[StoreAttributeTypes.key(entity.name, attribute.name)]
            let stored: String
            if let recorded, recorded != attribute.type.rawValue {
                stored = recorded
            } else if column.type != attribute.type.sqliteDeclaredType {
                stored = recorded ?? "a column of type '\(column.type)'"
            } else {
                continue
            }
            throw StoreLayoutError(reason: StoreAttributeTypes.retypeReason(
                entity: entity.name, attribute: attribute.name, stored: stored,
                declared: "\(attribute.type.rawValue) (\(attribute.type.sqliteDeclaredType))", synced: synced))
        }
        for relationship in entity.toOneRelationships {
            guard let column = declared[relationship.name], column.type != "BLOB" else { continue }
            throw StoreLayoutError(reason: "\(entity.name).\(relationship.name) is stored in a column of type '\(column.type)' but declared a reference (BLOB); changing an attribute into a relationship needs a migration")
        }
    }

    /// The column definitions of an entity's fields, each attribute's with its declared default (see ColumnDefaults).
    static func columnDefinitions(_ entity: Schema.Entity) -> [String] {
        ColumnDefaults.columnDefinitions(entity)
    }
}

/// A connection waiting in a store's pool. SQLite connections are opened in its multi-thread mode: one may move
/// between threads as long as one thread uses it at a time, which handing it over through the pool's lock ensures
/// (its owner gave it back and no longer uses it).
private struct IdleConnection: @unchecked Sendable {
    let connection: Connection
    init(_ connection: Connection) { self.connection = connection }
}

/// A store file's tables do not have the layout the schema needs. Internal: reported as
/// ``ReplicaError/loadIssueModelContainer(configuration:reason:)``.
/// Opening the store needs it to itself, and another process or container has it open. Internal: becomes
/// ``ReplicaError/storeInUse(configuration:reason:)``.
struct StoreInUse: Error {
    let reason: String
}

struct StoreLayoutError: Error {
    let reason: String
}

/// Schema SQL made only of `CREATE TABLE|INDEX IF NOT EXISTS` statements, run only when one of the objects it
/// creates is missing (running it otherwise changes nothing). Internal.
enum IdempotentSchemaSQL {
    /// The names of the tables and indexes `db`'s main database holds.
    static func presentObjects(_ db: Connection) throws -> Set<String> {
        var names = Set<String>()
        for row in try db.rows(presentSQL) {
            if case let .text(name) = row[0] { names.insert(name) }
        }
        return names
    }

    private static let presentSQL = StatementKey("SELECT name FROM main.sqlite_master WHERE type IN ('table', 'index')")

    /// Runs `sql` unless every statement in it is a `CREATE TABLE|INDEX IF NOT EXISTS` of an object in `present`.
    static func execute(_ sql: String, _ db: Connection, present: Set<String>) throws {
        if let names = createdNames(sql), names.allSatisfy(present.contains) { return }
        try db.execute(sql)
    }

    /// The objects `sql` creates when each of its statements is a `CREATE [UNIQUE] TABLE|INDEX IF NOT EXISTS name`
    /// (name bare or in double quotes without quotes inside), else `nil`. Remembered per text.
    static func createdNames(_ sql: String) -> [String]? {
        if let known = parsed.withLock({ $0[sql] }) { return known }
        var names: [String]? = []
        for statement in sql.split(separator: ";") {
            let words = statement.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "(" }).prefix(7).map { $0.uppercased() }
            if words.isEmpty { continue }
            var index = 0
            guard words.count >= 6, words[0] == "CREATE" else { names = nil; break }
            index = words[1] == "UNIQUE" ? 2 : 1
            guard words.count > index + 4, words[index] == "TABLE" || words[index] == "INDEX",
                  words[index + 1] == "IF", words[index + 2] == "NOT", words[index + 3] == "EXISTS" else { names = nil; break }
            // The name as written (case kept): the word after EXISTS in the original text.
            let original = statement.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "(" })[index + 4]
            var name = String(original)
            if name.hasPrefix("\"") {
                guard name.count >= 2, name.hasSuffix("\""), !name.dropFirst().dropLast().contains("\"") else { names = nil; break }
                name = String(name.dropFirst().dropLast())
            } else if !name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) {
                names = nil
                break
            }
            names?.append(name)
        }
        parsed.withLock { cache in
            if cache.count >= 256 { cache.removeAll() }
            cache[sql] = names
        }
        return names
    }

    private static let parsed = Mutex<[String: [String]?]>([:])
}

extension Store {
    /// The entity named `name`, if this store holds it.
    func entity(named name: String) -> Schema.Entity? { entityIndex[name].map { entities[$0] } }
    /// The SQL of entity `name`, if this store holds it.
    func statements(for name: String) -> EntityStatements? { entityIndex[name].map { statements[$0] } }
}
