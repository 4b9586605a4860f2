import Foundation

/// Renames of tables and columns declared with original names (``Schema/Entity/originalName``,
/// ``Schema/Attribute/originalName``), done when a store opens, inside its preparing write transaction. Internal.
///
/// A rename applies when the store has the original name and not the new one, so it runs once, and a store already
/// renamed (or created at the new schema) is left alone. SQLite renames keep the data and update the table's indexes
/// (`ALTER TABLE … RENAME COLUMN` needs SQLite 3.25). A store file with sync bookkeeping is never renamed: its cloud
/// records and field stamps carry the original names (synced entities cannot declare original names at all, see
/// ``SchemaViolation/syncedRename(entity:member:originalName:)``). History transactions recorded before a rename keep
/// the names they were recorded with. A rename needs the store to itself (`takeExclusive`, see ``StoreFileLock``): a
/// process of the older app version that has it open would find its tables and columns gone.
enum StoreRenames {
    /// Renames the table `entity.originalName` to `entity.name` when only the former exists, dropping its indexes named
    /// after the original entity (the caller creates those of the new name), and moves the recorded attribute types.
    static func renameTable(of entity: Schema.Entity, _ db: Connection, recordedTypes: inout [String: String]?, tracksSync: Bool,
                            takeExclusive: () throws -> Void) throws {
        guard let original = entity.originalName, original != entity.name,
              try tableExists(original, db), try !tableExists(entity.name, db) else { return }
        guard !tracksSync else {
            throw StoreLayoutError(reason: "entity \(entity.name) renames \(original), but the store has sync bookkeeping, whose records keep the name \(original)")
        }
        try takeExclusive()
        let indexes = try db.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name LIKE ? ESCAPE '\\'",
                                  [.text(original), .text("replica\\_" + original.replacingOccurrences(of: "_", with: "\\_") + "\\_%")], cache: false)
        for row in indexes {
            guard case let .text(index) = row[0] else { continue }
            try db.execute("DROP INDEX \(quoted(index))")
        }
        try db.execute("ALTER TABLE \(quoted(original)) RENAME TO \(quoted(entity.name))")
        if var types = recordedTypes {
            for key in types.keys.sorted() where key.hasPrefix(original + ".") {
                types[entity.name + key.dropFirst(original.count)] = types.removeValue(forKey: key)
            }
            recordedTypes = types
        }
    }

    /// Renames the column of each attribute declared with an original name when the table has a column of that name
    /// and none of the attribute's name; updates `existing` (column name → SQL default text) and the recorded types.
    static func renameColumns(of entity: Schema.Entity, _ db: Connection, existing: inout [String: String?],
                              recordedTypes: inout [String: String]?, tracksSync: Bool, takeExclusive: () throws -> Void) throws {
        for attribute in entity.attributes {
            guard let original = attribute.originalName, original != attribute.name,
                  existing[attribute.name] == nil, let column = existing[original] else { continue }
            // A column of the original name that this schema still declares as another attribute is that attribute's.
            guard entity.attribute(named: original) == nil, entity.relationship(named: original) == nil else { continue }
            guard !tracksSync else {
                throw StoreLayoutError(reason: "\(entity.name).\(attribute.name) renames \(original), but the store has sync bookkeeping, whose field stamps keep the name \(original)")
            }
            try takeExclusive()
            try db.execute("ALTER TABLE \(quoted(entity.name)) RENAME COLUMN \(quoted(original)) TO \(quoted(attribute.name))")
            existing[original] = nil
            existing[attribute.name] = column
            let from = StoreAttributeTypes.key(entity.name, original), to = StoreAttributeTypes.key(entity.name, attribute.name)
            if let type = recordedTypes?.removeValue(forKey: from) { recordedTypes?[to] = type }
        }
    }

    /// Moves the links of many-to-many pairs whose entity was renamed (``Schema/Entity/originalName``) from the link
    /// table named after the original entity (`replica_link_<Original>_<relationship>`) to the table of the new name,
    /// when only the former exists. The owner side is the smaller (entity, relationship) pair, so a rename can swap
    /// the sides: then the links are copied with `owner` and `member` exchanged and the old table dropped; otherwise
    /// the table is renamed. Run before ``LinkTable/prepare(_:entities:)`` creates the missing tables (and the new
    /// table's index). Synced entities cannot be renamed (their cloud record type never changes), so a store with sync
    /// bookkeeping never gets here with a rename (``renameTable(of:_:recordedTypes:tracksSync:)`` refuses first).
    static func renameLinkTables(of entities: [Schema.Entity], _ db: Connection, takeExclusive: () throws -> Void) throws {
        var originals: [String: String] = [:]
        for entity in entities { if let original = entity.originalName, original != entity.name { originals[entity.name] = original } }
        guard !originals.isEmpty else { return }
        for table in LinkTable.all(in: entities) {
            let ownerBefore = (originals[table.ownerEntity] ?? table.ownerEntity, table.ownerRelationship)
            let memberBefore = (originals[table.memberEntity] ?? table.memberEntity, table.memberRelationship)
            let selfInverse = table.ownerEntity == table.memberEntity && table.ownerRelationship == table.memberRelationship
            let swapped = !selfInverse && memberBefore < ownerBefore
            let before = swapped ? memberBefore : ownerBefore
            let oldName = "replica_link_\(before.0)_\(before.1)"
            guard oldName != table.name, try tableExists(oldName, db), try !tableExists(table.name, db) else { continue }
            try takeExclusive()
            try db.execute("DROP INDEX IF EXISTS \(quoted(oldName + "_member"))")
            if swapped {
                for statement in LinkTable.createSQL(for: table) { try db.execute(statement) }
                try db.execute("INSERT OR IGNORE INTO \(table.quotedName) (\"owner\", \"member\") SELECT \"member\", \"owner\" FROM \(quoted(oldName))")
                try db.execute("DROP TABLE \(quoted(oldName))")
            } else {
                try db.execute("ALTER TABLE \(quoted(oldName)) RENAME TO \(table.quotedName)")
            }
        }
    }

    private static func tableExists(_ name: String, _ db: Connection) throws -> Bool {
        try db.scalar("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)", [.text(name)]) == .integer(1)
    }
}
