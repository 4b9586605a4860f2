import Foundation
import Synchronization

/// The fields of a synced store file as every app version that opened it declared them: the union of their entities'
/// attributes and to-one relationships, kept in `replica_metadata['store_fields']` (JSON). Internal.
///
/// Processes of different app versions share one app-group store file. A column that a newer process added is
/// invisible to an older one's models, yet the older process may be the one that syncs: it must merge a remote value
/// of that field into the column (not keep it beside the row, where the newer process never reads it), keep the
/// field's stamp, and upload the column's value — sealed when the newer version declares it encrypted. The union tells
/// it which columns hold whose fields, with their types (to check remote values) and options. Each process writes its
/// own entities into it when it opens the store, in the transaction that adds their columns, so the union never names
/// a column the file lacks.
struct StoreFieldUnion: Codable, Equatable {
    var entities: [Schema.Entity]

    static let metadataKey = "store_fields"

    /// `self` with the attributes and to-one relationships of `entities` added where missing (an entity, or a field of
    /// one, the union does not have yet). A field already present keeps its description.
    func adding(_ entities: [Schema.Entity]) -> StoreFieldUnion {
        var union = self
        for entity in entities {
            let trimmed = Schema.Entity(name: entity.name, attributes: entity.attributes, relationships: entity.toOneRelationships)
            guard let index = union.entities.firstIndex(where: { $0.name == entity.name }) else {
                union.entities.append(trimmed)
                continue
            }
            for attribute in trimmed.attributes where union.entities[index].attribute(named: attribute.name) == nil {
                union.entities[index].attributes.append(attribute)
            }
            for relationship in trimmed.relationships where union.entities[index].relationship(named: relationship.name) == nil {
                union.entities[index].relationships.append(relationship)
            }
        }
        return union
    }

    /// Adds `entities` to the union stored in the store (inside the caller's write transaction), writing it only when
    /// it changes.
    static func record(_ entities: [Schema.Entity], _ db: Connection) throws {
        let stored = try db.scalar("SELECT value FROM replica_metadata WHERE key = ?", [.text(metadataKey)])
        // No union yet, or one that does not decode (damaged metadata): begin again from this version's entities.
        // Nothing is lost with it — every app version records its entities again when it opens the file, and until
        // then an older process keeps the fields it does not know as unknown fields (R9) — and the bytes that did not
        // decode are replaced, not read as an empty union.
        let current: StoreFieldUnion
        if case let .text(json)? = stored, let decoded = decoded(json) {
            current = decoded
        } else {
            current = StoreFieldUnion(entities: [])
        }
        let union = current.adding(entities)
        guard union != current || stored == nil else { return }
        try db.run("INSERT INTO replica_metadata (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   [.text(metadataKey), .text(ReplicaJSON.string(union))])
    }

    /// The union `json` holds, or `nil` when it does not decode. Decoded once per distinct text in the process
    /// (every open of a synced store file reads the union, and JSONDecoder costs more than the rest of the read).
    static func decoded(_ json: String) -> StoreFieldUnion? {
        if let known = decodedByText.withLock({ $0[json] }) { return known }
        guard let union = ReplicaJSON.decode(StoreFieldUnion.self, json) else { return nil }
        decodedByText.withLock { cache in
            if cache.count >= 64 { cache.removeAll() }
            cache[json] = union
        }
        return union
    }

    private static let decodedByText = Mutex<[String: StoreFieldUnion]>([:])
}

/// A field of a store's table that this process's schema does not declare but another app version sharing the
/// file does (see ``StoreFieldUnion``).
struct StoreColumnField: Equatable {
    let name: String
    /// The attribute, or `nil` for a to-one relationship (a BLOB column of 16-byte record IDs).
    let attribute: Schema.Attribute?

    var isEncrypted: Bool { attribute?.options.contains(.allowsCloudEncryption) ?? false }

    /// Whether `value` is one this field can hold (as the version declaring it checks remote values, P4).
    func fits(_ value: SQLiteValue) -> Bool {
        guard let attribute else {
            if case let .blob(data) = value { return data.count == 16 }
            return value.isNull
        }
        if case let .real(v) = value, v.isNaN { return false }
        return SchemaValidator.value(value, fits: attribute)
    }
}

/// What a store last read of its ``StoreFieldUnion``: the stored text and, per entity of the store (by index), the
/// fields other app versions declare.
final class StoreColumnFieldsCache: Sendable {
    private let state = Mutex<(text: String, fields: [[StoreColumnField]])?>(nil)

    /// Per entity of `store` (by index), the fields the union holds that `store`'s schema does not declare, read from
    /// the store's metadata through `db` (decoded again only when the stored union changed).
    /// Complexity: one metadata read; decoding the union only when it changed since the last call.
    func fields(of store: Store, _ db: Connection) throws -> [[StoreColumnField]] {
        guard case let .text(text)? = try db.scalar(Self.unionSQL) else {
            return Array(repeating: [], count: store.entities.count)
        }
        if let known = state.withLock({ $0 }), known.text == text { return known.fields }
        guard let union = StoreFieldUnion.decoded(text) else {
            // Damaged after this process opened the store: never read as "no other version's fields" (a merge would
            // then keep their values aside, and a save could drop them); the next open records the union again.
            throw ReplicaError.corruptBookkeeping(BookkeepingCorruption(store: store.configuration.name, recordID: nil,
                                                                        column: "replica_metadata.\(StoreFieldUnion.metadataKey)"))
        }
        let fields = store.entities.map { entity -> [StoreColumnField] in
            guard let declared = union.entities.first(where: { $0.name == entity.name }) else { return [] }
            let own = Set(entity.fieldNames)
            return declared.attributes.filter { !own.contains($0.name) }.map { StoreColumnField(name: $0.name, attribute: $0) }
                + declared.toOneRelationships.filter { !own.contains($0.name) }.map { StoreColumnField(name: $0.name, attribute: nil) }
        }
        state.withLock { $0 = (text, fields) }
        return fields
    }

    private static let unionSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'store_fields'")
}

extension SyncLedger {
    /// For the version that just added columns to a synced store file: every ledger `unknown` entry of a field this
    /// schema knows — a value an older process merged before the column existed — goes into its column where it is
    /// newer than the column's stamp (plaintext values this schema can store only; sealed ones wait for the full
    /// resync the upgrade starts), and leaves `unknown`. Nothing is uploaded: the cloud has these values. Runs inside
    /// the store's preparing transaction. Complexity: one read of the ledger rows with unknown fields.
    static func foldUnknownFieldsIntoColumns(entities: [Schema.Entity], statements: [EntityStatements], _ db: Connection) throws {
        let rows = try db.rows("SELECT id, entity FROM replica_sync_record WHERE unknown IS NOT NULL AND causal_length % 2 = 1 ORDER BY id",
                               cache: false)
        for row in rows {
            guard let id = try? UUID(sqliteValue: row[0]), case let .text(entityName) = row[1],
                  let entityIndex = entities.firstIndex(where: { $0.name == entityName }), var state = try loadAsStored(id, db), state.corruptColumns.isEmpty else { continue }
            // (A row whose bookkeeping cannot be read stays as it is: the engine rebuilds and repairs it, R14.)
            let sql = statements[entityIndex]
            var changed = false
            for (name, field) in state.unknown {
                guard let index = sql.fieldIndex[name], field.stamp.incarnation == state.causalLength else { continue }
                if let known = state.stamps[name], known >= field.stamp {
                    state.unknown[name] = nil
                    changed = true
                    continue
                }
                guard !field.isEncrypted, StoreColumnField(name: name, attribute: sql.attributes[index]).fits(field.value) else { continue }
                try db.run("UPDATE \(sql.table) SET \(quoted(name)) = ? WHERE \"id\" = ?", [field.value, id.sqliteValue])
                state.stamps[name] = field.stamp
                state.unknown[name] = nil
                changed = true
            }
            guard changed else { continue }
            try db.run("UPDATE replica_sync_record SET stamps = ?, unknown = ? WHERE id = ?",
                       [.blob(encodeStamps(state.stamps)), state.unknown.isEmpty ? .null : .text(ReplicaJSON.string(state.unknown)), id.sqliteValue])
        }
    }
}
