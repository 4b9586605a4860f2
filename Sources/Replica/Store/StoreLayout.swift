import Foundation
import Synchronization

/// What Replica derives from the entities of a store, once per process: the SQL text of a new store's schema, of
/// each entity's statements, the fingerprint of the declared defaults, and a template database holding the fresh
/// schema. Immutable once made (the template is used under a lock); shared by every store with the same entities.
final class StoreLayout: @unchecked Sendable {
    let entities: [Schema.Entity]
    let synced: Bool
    /// ``Store/freshSchemaSQL(_:synced:)`` of the entities.
    let freshSchemaSQL: String
    /// One per entity, in order.
    let statements: [EntityStatements]
    /// The value of `replica_metadata['synced_defaults']` for these entities.
    let defaultsFingerprint: String
    /// The value of `replica_metadata['store_fields']` of a new store file with these entities (``StoreFieldUnion``).
    let fieldUnion: String
    /// The value of `replica_metadata['attribute_types']` of a new store with these entities (``StoreAttributeTypes``).
    let attributeTypes: String
    /// The outbox query, limited to these entities (a process of another app version may queue records of entities
    /// this one does not know in a shared store file: those are left to it).
    let outboxSQL: StatementKey
    /// An in-memory database holding the fresh schema, made on first use; guarded by its lock.
    private let template = Mutex<TemplateState>(.notMade)
    /// Connections of in-memory stores with these entities that went away (see `Store.deinit`), newest last.
    private let retired = Mutex<[RetiredConnection]>([])
    private static let temporaryTablesSQL = StatementKey("SELECT name FROM sqlite_temp_master WHERE type = 'table'")
    /// At most this many retired connections wait per layout (each keeps its database's pages).
    private static let retiredLimit = 4

    private init(_ entities: [Schema.Entity], synced: Bool) {
        self.entities = entities
        self.synced = synced
        freshSchemaSQL = Store.freshSchemaSQL(entities, synced: synced)
        statements = entities.map(EntityStatements.init)
        defaultsFingerprint = Store.defaultsFingerprint(entities)
        fieldUnion = ReplicaJSON.stamplessString(StoreFieldUnion(entities: []).adding(entities))
        attributeTypes = StoreAttributeTypes.encode(StoreAttributeTypes.types(of: entities))
        outboxSQL = SyncLedger.outboxSQL(entities: entities.map(\.name))
    }

    private struct Key: Hashable {
        let entities: [Schema.Entity]
        let synced: Bool
    }

    /// Layouts made so far, and the order they were made in; few distinct ones per process in practice. Past a
    /// bound the oldest is forgotten (its template and retired connections close once no store uses it), so a
    /// process that opens many schemas — a test suite, a tool — keeps recycling the stores it opens now.
    private static let layouts = Mutex<(byKey: [Key: StoreLayout], order: [Key])>(([:], []))
    private static let layoutLimit = 64
    /// Names the template databases made so far (each an in-memory database of its own).
    private static let templateCount = Atomic<Int>(0)

    /// The layout of `entities`, made once per process.
    static func shared(_ entities: [Schema.Entity], synced: Bool) -> StoreLayout {
        let key = Key(entities: entities, synced: synced)
        if let layout = layouts.withLock({ $0.byKey[key] }) { return layout }
        let layout = StoreLayout(entities, synced: synced)
        return layouts.withLock { layouts in
            if let existing = layouts.byKey[key] { return existing }
            if layouts.order.count >= layoutLimit {
                let oldest = layouts.order.removeFirst()
                layouts.byKey[oldest] = nil
            }
            layouts.byKey[key] = layout
            layouts.order.append(key)
            return layout
        }
    }

    private enum TemplateState {
        case notMade
        case made(TemplateDatabase)
    }

    /// Keeps `connection`, the last of an in-memory store that went away, for ``takeRetired()`` (closes it when
    /// enough wait already).
    func retire(_ connection: Connection, schemaVersion: Int64) {
        retired.withLock { retired in
            if retired.count < Self.retiredLimit { retired.append(RetiredConnection(connection: connection, schemaVersion: schemaVersion)) }
        }
    }

    /// A retired connection whose database is emptied back to the fresh schema, or `nil` when none can be: each
    /// table's rows deleted (`sqlite_sequence` too, so AUTOINCREMENT counters start again), in one write
    /// transaction. Only a database whose schema cookie is still the one it had when its store was made (a copy of
    /// the template) qualifies: nothing changed its schema since, so it holds exactly the fresh schema — and the
    /// connection's parsed schema and prepared statements stay valid. Temporary tables are emptied too. The emptied
    /// database answers every query as a new copy would (rowids and sequences restart; page placement differs,
    /// which no query sees).
    func takeRetired() -> Connection? {
        guard case let .made(source)? = template.withLock({ state -> TemplateState? in state }) else { return nil }
        while let candidate = retired.withLock({ $0.popLast() }) {
            let db = candidate.connection
            do {
                guard !db.isInTransaction, case .integer(candidate.schemaVersion)? = try db.scalar(Store.schemaVersionSQL) else { continue }
                try db.transaction(.immediate) {
                    for key in source.emptyingStatements { try db.run(key) }
                    // Temporary tables (the query engine's overlays of unsaved changes) hold nothing either.
                    for row in try db.rows(Self.temporaryTablesSQL) {
                        guard case let .text(table) = row[0] else { continue }
                        try db.run("DELETE FROM temp.\(quoted(table))")
                    }
                }
                return db
            } catch {
                continue
            }
        }
        return nil
    }

    /// Copies the fresh schema into the new, empty database of `db` with SQLite's backup API, from the template
    /// database (made on first use). Creating the tables and indexes of a store with DDL costs more than all the other
    /// work of a short simulation or property-test case, which open hundreds of in-memory stores.
    /// Returns `false` (and copies nothing) when `db` is not empty or the copy is not possible.
    func cloneFreshSchema(into db: Connection) throws -> Bool {
        guard case .integer(0)? = try db.scalar("SELECT count(*) FROM sqlite_master") else { return false }
        return try template.withLock { state in
            let source: TemplateDatabase
            switch state {
            case let .made(existing):
                source = existing
            case .notMade:
                let serial = Self.templateCount.add(1, ordering: .relaxed).newValue
                let connection = try Connection(location: .memory(name: "replica-template-\(serial)"))
                try connection.transaction(.immediate) { try connection.execute(freshSchemaSQL) }
                source = try TemplateDatabase(connection)
                state = .made(source)
            }
            return try source.connection.copy(into: db)
        }
    }
}

/// A database holding a fresh schema. Used only under its layout's lock.
private final class TemplateDatabase: @unchecked Sendable {
    let connection: Connection
    /// One `DELETE` per table of the fresh schema (`sqlite_sequence` included): what empties a copy of it.
    let emptyingStatements: [StatementKey]

    init(_ connection: Connection) throws {
        self.connection = connection
        emptyingStatements = try connection.rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", cache: false)
            .compactMap { row in
                guard case let .text(table) = row[0] else { return nil }
                return StatementKey("DELETE FROM main.\(quoted(table))")
            }
    }
}

/// A connection of an in-memory store that went away, waiting in its layout for the next new store.
private struct RetiredConnection: @unchecked Sendable {
    let connection: Connection
    /// Its database's schema cookie when its store was made (and when it went away).
    let schemaVersion: Int64
}
