import CSQLite
import Foundation
import Synchronization

/// One store of a container: a configuration, the entities it holds and its SQLite database. Internal.
///
/// Table layout: one table per entity, named after it, with `id BLOB PRIMARY KEY` (the 16-byte record ID), one
/// column per attribute and one per to-one relationship (the referenced ID), and an index on each reference column.
/// `replica_metadata` holds the store's replica identity and the schema it was last opened with.
final class Store: Sendable {
    let configuration: ModelConfiguration
    let entities: [Schema.Entity]
    let entityIndex: [String: Int]
    let location: Connection.Location
    /// The store's replica identity: one per store file, shared by every process that opens it.
    let identity: UUID
    /// Keeps an in-memory database alive for the container's lifetime.
    private let anchor: Mutex<Connection?>
    /// SQL text per entity, built once.
    let statements: [EntityStatements]
    /// In-memory stores opened by this process so far: part of each in-memory database's name.
    private static let inMemoryStoreCount = Atomic<UInt64>(0)

    /// Opens (creating if needed) the store and brings its tables up to `entities`.
    /// - Throws: ``ReplicaError/loadIssueModelContainer(configuration:reason:)``.
    init(configuration: ModelConfiguration, entities: [Schema.Entity], environment: ReplicaEnvironment) throws {
        self.configuration = configuration
        self.entities = entities
        var index: [String: Int] = [:]
        for (i, entity) in entities.enumerated() { index[entity.name] = i }
        self.entityIndex = index
        self.statements = entities.map(EntityStatements.init)
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
        } else {
            // A unique name per container: in-memory stores of different containers never share data, even when
            // their environments produce the same identifiers (two environments seeded alike).
            let serial = Self.inMemoryStoreCount.add(1, ordering: .relaxed).newValue
            self.location = .memory(name: "replica-\(name)-\(serial)-\(environment.makeIdentifier().uuidString)")
        }

        do {
            let connection = try Connection(location: location, readOnly: !configuration.allowsSave)
            if configuration.allowsSave {
                // A new in-memory store starts as a copy of the schema (see `cloneFreshSchema`).
                let cloned = try configuration.isStoredInMemoryOnly
                    && Self.cloneFreshSchema(Self.freshSchemaSQL(entities, synced: configuration.isSynced), into: connection)
                identity = try Self.prepare(connection, entities: entities, synced: configuration.isSynced,
                                            schemaReady: cloned, environment: environment)
            } else {
                identity = try Self.readIdentity(connection, entities: entities)
            }
            anchor = Mutex(configuration.isStoredInMemoryOnly ? connection : nil)
        } catch let error as SQLiteError {
            throw loadIssue(error.description)
        }
    }

    /// Opens a new connection to this store, for one context.
    func openConnection() throws -> Connection {
        try Connection(location: location, readOnly: !configuration.allowsSave)
    }

    /// The schema of a new store: Replica's tables (metadata, history, and for a synced store the sync bookkeeping),
    /// then each entity's table and indexes.
    static func freshSchemaSQL(_ entities: [Schema.Entity], synced: Bool) -> String {
        var sql = metadataSQL + ";\n" + HistoryLog.createSQL + "\n"
        if synced { sql += SyncLedger.createSQL + "\n" }
        for entity in entities {
            let columns = [#""id" BLOB PRIMARY KEY NOT NULL"#] + columnDefinitions(entity)
            sql += "CREATE TABLE \(quoted(entity.name)) (\(columns.joined(separator: ", ")));\n"
            sql += indexSQL(entity).map { $0 + ";\n" }.joined()
        }
        return sql
    }

    private static let metadataSQL = "CREATE TABLE IF NOT EXISTS replica_metadata (key TEXT PRIMARY KEY NOT NULL, value ANY) STRICT"

    /// The indexes of an entity's table: one per to-one relationship and one per uniqueness constraint.
    private static func indexSQL(_ entity: Schema.Entity) -> [String] {
        let table = quoted(entity.name)
        return entity.toOneRelationships.map {
            "CREATE INDEX IF NOT EXISTS \(quoted("replica_\(entity.name)_\($0.name)")) ON \(table) (\(quoted($0.name)))"
        } + entity.uniquenessConstraints.enumerated().compactMap { i, constraint in
            constraint.isEmpty ? nil
                : "CREATE INDEX IF NOT EXISTS \(quoted("replica_\(entity.name)_unique\(i)")) ON \(table) (\(constraint.map(quoted).joined(separator: ", ")))"
        }
    }

    /// A database holding a fresh schema. Used only while `templates` is locked.
    private final class SchemaTemplate: @unchecked Sendable {
        let connection: Connection
        init(_ connection: Connection) { self.connection = connection }
    }

    /// Databases holding the fresh schema of each schema SQL text, one per process (memory only).
    private static let templates = Mutex<[String: SchemaTemplate]>([:])

    /// Copies the fresh schema `sql` into the new, empty database of `db` with SQLite's backup API, from a template
    /// database made once per schema and process. Creating the tables and indexes of a store with DDL costs more than
    /// all the other work of a short simulation or property-test case, which open hundreds of in-memory stores.
    /// Returns `false` (and copies nothing) when `db` is not empty or the copy is not possible.
    private static func cloneFreshSchema(_ sql: String, into db: Connection) throws -> Bool {
        guard case .integer(0)? = try db.scalar("SELECT count(*) FROM sqlite_master") else { return false }
        return try templates.withLock { templates in
            let template: SchemaTemplate
            if let existing = templates[sql] {
                template = existing
            } else {
                // Few distinct schemas per process in practice; past a bound, new ones are created with DDL.
                guard templates.count < 64 else { return false }
                let connection = try Connection(location: .memory(name: "replica-template-\(templates.count)"))
                try connection.transaction(.immediate) { try connection.execute(sql) }
                template = SchemaTemplate(connection)
                templates[sql] = template
            }
            guard let backup = sqlite3_backup_init(db.handle, "main", template.connection.handle, "main") else { return false }
            let stepped = sqlite3_backup_step(backup, -1)
            let finished = sqlite3_backup_finish(backup)
            if stepped != SQLITE_DONE || finished != SQLITE_OK {
                throw SQLiteError(code: stepped != SQLITE_DONE ? stepped : finished, connection: db.handle, sql: "backup of the store schema")
            }
            return true
        }
    }

    /// Creates missing tables, columns and indexes, and reads or creates the replica identity — in one write
    /// transaction, so two processes opening a new store file at once agree on one identity. With `schemaReady`, the
    /// database holds exactly the fresh schema already (a copy) and only the identity is created.
    private static func prepare(_ db: Connection, entities: [Schema.Entity], synced: Bool, schemaReady: Bool,
                                environment: ReplicaEnvironment) throws -> UUID {
        try db.transaction(.immediate) {
            if schemaReady {
                // Copied from the template: exactly the fresh schema.
            } else if case .integer(0)? = try db.scalar("SELECT count(*) FROM sqlite_master") {
                // A new store: its whole schema at once.
                try db.execute(freshSchemaSQL(entities, synced: synced))
            } else {
                try db.execute(metadataSQL)
                try db.execute(HistoryLog.createSQL)
                if synced { try db.execute(SyncLedger.createSQL) }
                for entity in entities {
                    let table = quoted(entity.name)
                    let existing = Set(try db.rows("SELECT name FROM pragma_table_info(?)", [.text(entity.name)]).compactMap {
                        if case let .text(name) = $0[0] { return name } else { return nil }
                    })
                    if existing.isEmpty {
                        let columns = [#""id" BLOB PRIMARY KEY NOT NULL"#] + columnDefinitions(entity)
                        try db.execute("CREATE TABLE \(table) (\(columns.joined(separator: ", ")))")
                    } else {
                        // Lightweight migration: add columns for new attributes and references. Columns of removed
                        // attributes stay (their data is kept) and are ignored.
                        for (name, definition) in zip(entity.fieldNames, columnDefinitions(entity)) where !existing.contains(name) {
                            try db.execute("ALTER TABLE \(table) ADD COLUMN \(definition)")
                            // Records written before the attribute existed take its declared default.
                            if let value = entity.attribute(named: name)?.defaultValue, !value.isNull {
                                _ = try db.rows("UPDATE \(table) SET \(quoted(name)) = ?", [value], cache: false)
                            }
                        }
                    }
                    for index in indexSQL(entity) { try db.execute(index) }
                }
            }
            if let existing = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'identity'"),
               let identity = try? UUID(sqliteValue: existing) {
                return identity
            }
            let identity = environment.makeIdentifier()
            try db.run("INSERT INTO replica_metadata (key, value) VALUES ('identity', ?)", [identity.sqliteValue])
            return identity
        }
    }

    private static func readIdentity(_ db: Connection, entities: [Schema.Entity]) throws -> UUID {
        guard let value = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'identity'"),
              let identity = try? UUID(sqliteValue: value) else {
            throw SQLiteError(extendedResultCode: 1, message: "the file is not a Replica store (no replica identity)")
        }
        for entity in entities {
            let columns = Set(try db.rows("SELECT name FROM pragma_table_info(?)", [.text(entity.name)]).compactMap {
                if case let .text(name) = $0[0] { return name } else { return nil }
            })
            let missing = entity.fieldNames.filter { !columns.contains($0) }
            if columns.isEmpty || !missing.isEmpty {
                throw SQLiteError(extendedResultCode: 1, message: "read-only store lacks \(entity.name)\(missing.isEmpty ? "" : " columns \(missing.joined(separator: ", "))")")
            }
        }
        return identity
    }

    private static func columnDefinitions(_ entity: Schema.Entity) -> [String] {
        entity.attributes.map { "\(quoted($0.name)) \($0.type.sqliteDeclaredType)" }
            + entity.toOneRelationships.map { "\(quoted($0.name)) BLOB" }
    }
}

/// Quotes an SQL identifier. Names are validated identifiers, so this never needs escaping, but it is done anyway.
func quoted(_ identifier: String) -> String {
    "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\""
}

/// The SQL text Replica uses for one entity's table, built once per store.
struct EntityStatements: Sendable {
    let table: String
    /// `"id", "a", "b", ...` in field order.
    let columnList: String
    let insert: String
    /// ``insert`` as a statement key (rows are inserted one by one on hot paths).
    let insertKey: StatementKey
    let selectAll: String
    let selectByID: String
    let delete: String
    let exists: String

    init(_ entity: Schema.Entity) {
        table = quoted(entity.name)
        let columns = [quoted("id")] + entity.fieldNames.map(quoted)
        columnList = columns.joined(separator: ", ")
        insert = "INSERT INTO \(table) (\(columnList)) VALUES (\(Array(repeating: "?", count: columns.count).joined(separator: ", ")))"
        insertKey = StatementKey(insert)
        selectAll = "SELECT \(columnList) FROM \(table)"
        selectByID = "SELECT \(columnList) FROM \(table) WHERE \"id\" = ?"
        delete = "DELETE FROM \(table) WHERE \"id\" = ?"
        exists = "SELECT 1 FROM \(table) WHERE \"id\" = ?"
    }
}
