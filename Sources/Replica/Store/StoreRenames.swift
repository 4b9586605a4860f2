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
    /// Drops `column` of table `table` with the indexes on it first (SQLite cannot drop an indexed column), inside
    /// the caller's write transaction: for a rename that replaces an empty target, and for a stage's removed
    /// attributes (``StoreMigrator``).
    static func dropColumn(_ column: String, of table: String, _ db: Connection) throws {
        let indexes = try db.rows("SELECT DISTINCT il.name FROM pragma_index_list(?) AS il JOIN pragma_index_info(il.name) AS ii WHERE ii.name = ? AND il.origin = 'c'",
                                  [.text(table), .text(column)], cache: false)
        for row in indexes {
            guard case let .text(index) = row[0] else { continue }
            try db.execute("DROP INDEX \(quoted(index))")
        }
        try db.execute("ALTER TABLE \(quoted(table)) DROP COLUMN \(quoted(column))")
    }

    /// Renames the table `entity.originalName` to `entity.name` when the store has the former, dropping its indexes
    /// named after the original entity (the caller creates those of the new name), and moves the recorded attribute
    /// types.
    ///
    /// When the store has a table of the new name too (the old schema had both entities), the rename replaces it if it
    /// holds no records (nor links), and is otherwise refused: renaming would hide the original table's records, and
    /// replacing would destroy the other's. Not so when the table of the original name belongs to an entity of this
    /// schema (`entities`), or when `stageSource` — the old schema of the migration stage opening the store —
    /// declares this rename already (the store was renamed before). Two entities swapping names are refused in a
    /// stage and left alone outside one (a store with both tables is taken as swapped already).
    static func renameTable(of entity: Schema.Entity, in entities: [Schema.Entity], _ db: Connection, recordedTypes: inout [String: String]?,
                            tracksSync: Bool, stageSource: Schema?, takeExclusive: () throws -> Void) throws {
        guard let original = entity.originalName, original != entity.name, try tableExists(original, db) else { return }
        if try tableExists(entity.name, db) {
            if let owner = entities.first(where: { $0.name == original }) {
                // The table of the original name is an entity's of this schema; a swap when that one is renamed from
                // this entity's name.
                guard owner.originalName == entity.name, let stageSource,
                      stageSource.entity(named: entity.name)?.originalName != original else { return }
                throw StoreLayoutError(reason: "entities \(entity.name) and \(original) swap names through their original names, which is not supported: rename one of them through a third name in a migration stage of its own")
            }
            if stageSource?.entity(named: entity.name)?.originalName == original { return }
            guard !tracksSync else {
                throw StoreLayoutError(reason: "entity \(entity.name) renames \(original), but the store has sync bookkeeping, whose records keep the name \(original)")
            }
            let links = try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\\'",
                                    [.text("replica\\_link\\_" + entity.name.replacingOccurrences(of: "_", with: "\\_") + "\\_%")], cache: false)
                .compactMap { row -> String? in if case let .text(name) = row[0] { return name } else { return nil } }
            var records = try count(entity.name, db)
            for link in links { records += try count(link, db) }
            guard records == 0 else {
                throw StoreLayoutError(reason: "entity \(entity.name) renames \(original) (its original name), but the store has a table \(entity.name) too, holding \(records) records or links; the rename would hide \(original)'s records or destroy \(entity.name)'s, so nothing was changed — move or delete \(entity.name)'s records in a migration stage's willMigrate first, or give the entity another name")
            }
            try takeExclusive()
            for link in links { try db.execute("DROP TABLE \(quoted(link))") }
            try db.execute("DROP TABLE \(quoted(entity.name))")
            if var types = recordedTypes {
                for key in types.keys.sorted() where key.hasPrefix(entity.name + ".") { types[key] = nil }
                recordedTypes = types
            }
        }
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
    /// (and no attribute of this schema keeps that column as its own); updates `existing` (column name → SQL default
    /// text) and the recorded types. An attribute of this schema keeps the column of its name unless it is renamed
    /// away from it in turn, followed along chains: after a chain of renames was made, every attribute keeps its
    /// column and later opens change nothing.
    ///
    /// All renames of a table are made at once, through temporary names, so renames that displace each other work:
    /// `b` from `a` with `c` from `b` (and longer chains), and a swap (`first` from `last`, `last` from `first`, or a
    /// cycle of more names). A swap leaves both names
    /// in the store, so it is made only by a migration stage whose old schema (`stageSource`) does not declare it yet;
    /// outside a stage, a store with both columns is taken as swapped already.
    ///
    /// When the column of the new name exists and no rename moves it away (the old schema had both attributes), the
    /// rename replaces it if it holds only NULL or its SQL default in every row; otherwise it is refused, naming both
    /// names, and nothing is changed: renaming would hide the column's values, and replacing would destroy them. A
    /// stage whose old schema declares the rename already leaves the column of the original name alone (it is a
    /// removed attribute's).
    static func renameColumns(of entity: Schema.Entity, _ db: Connection, existing: inout [String: String?],
                              recordedTypes: inout [String: String]?, tracksSync: Bool, stageSource: Schema?,
                              takeExclusive: () throws -> Void) throws {
        // The entity in the stage's old schema (`nil`: outside a stage, or new in it).
        let before = stageSource.flatMap { source in source.entity(named: entity.name) ?? entity.originalName.flatMap(source.entity(named:)) }
        // Attributes renamed from a column the store has, unless a relationship of this schema owns that column or
        // the stage's old schema made this rename already.
        var renamedFromColumn = Set(entity.attributes.compactMap { attribute -> String? in
            guard let original = attribute.originalName, original != attribute.name, existing[original] != nil,
                  entity.relationship(named: original) == nil,
                  before?.attribute(named: attribute.name)?.originalName != original else { return nil }
            return attribute.name
        })
        // A column of the original name that this schema still declares as another attribute is that attribute's,
        // unless that attribute is renamed away from it in turn. Followed along chains until nothing changes: in a
        // chain `given` from `first`, `first` from `last`, `last` from `middle` on a store without `middle`, `last`
        // keeps its column, so `first` keeps its own, and so does `given` (the chain was renamed before). Renames in
        // a cycle (a swap) stay, and are told apart below.
        while let settled = renamedFromColumn.first(where: { name in
            guard let original = entity.attribute(named: name)?.originalName else { return false }
            return entity.attribute(named: original) != nil && !renamedFromColumn.contains(original)
        }) {
            renamedFromColumn.remove(settled)
        }
        var moves: [(from: String, to: String)] = []
        for attribute in entity.attributes where renamedFromColumn.contains(attribute.name) {
            guard let original = attribute.originalName, !moves.contains(where: { $0.from == original }) else { continue }
            moves.append((original, attribute.name))
        }
        // Renames in a cycle (a swap): every target is the source of another.
        func cycle(from start: Int) -> [Int]? {
            var path = [start], current = start
            while let next = moves.firstIndex(where: { $0.from == moves[current].to }) {
                if next == start { return path }
                if path.contains(next) { return nil }
                path.append(next)
                current = next
            }
            return nil
        }
        var skipped = Set<Int>()
        for index in moves.indices where !skipped.contains(index) {
            guard let members = cycle(from: index) else { continue }
            // Outside a stage, the store cannot tell a swap to make from one made: taken as made.
            if stageSource == nil { skipped.formUnion(members) }
        }
        moves = moves.indices.filter { !skipped.contains($0) }.map { moves[$0] }
        guard !moves.isEmpty else { return }
        // A target column no rename moves away is replaced when it holds nothing but NULL or its default.
        var replaced: [String] = []
        for move in moves where existing[move.to] != nil && !moves.contains(where: { $0.from == move.to }) {
            let defaultText = existing[move.to] ?? nil
            let column = quoted(move.to)
            let condition = defaultText.map { "\(column) IS NOT NULL AND \(column) IS NOT (\($0))" } ?? "\(column) IS NOT NULL"
            guard case let .integer(holding)? = try db.scalar("SELECT count(*) FROM \(quoted(entity.name)) WHERE \(condition)") else { continue }
            if holding > 0 {
                throw StoreLayoutError(reason: "\(entity.name).\(move.to) renames \(move.from) (its original name), but the store has a column \(move.to) too, holding values in \(holding) of its rows; the rename would hide \(move.from)'s values or destroy \(move.to)'s, so nothing was changed — move or clear \(move.to)'s values in a migration stage's willMigrate first, or give the attribute another name")
            }
            replaced.append(move.to)
        }
        guard !tracksSync else {
            let move = moves[0]
            throw StoreLayoutError(reason: "\(entity.name).\(move.to) renames \(move.from), but the store has sync bookkeeping, whose field stamps keep the name \(move.from)")
        }
        try takeExclusive()
        let table = quoted(entity.name)
        for column in replaced {
            // (The caller creates the schema's indexes again.)
            try dropColumn(column, of: entity.name, db)
            existing[column] = nil
            recordedTypes?[StoreAttributeTypes.key(entity.name, column)] = nil
        }
        // Every source to a temporary name, then every temporary name to its target: no rename meets a column of
        // the name it goes to.
        let temporary = moves.indices.map { "replica_renaming_\($0)" }
        var defaults: [String?] = []
        var types: [String?] = []
        for (move, name) in zip(moves, temporary) {
            try db.execute("ALTER TABLE \(table) RENAME COLUMN \(quoted(move.from)) TO \(quoted(name))")
            defaults.append(existing.removeValue(forKey: move.from) ?? nil)
            types.append(recordedTypes?.removeValue(forKey: StoreAttributeTypes.key(entity.name, move.from)))
        }
        for (index, (move, name)) in zip(moves, temporary).enumerated() {
            try db.execute("ALTER TABLE \(table) RENAME COLUMN \(quoted(name)) TO \(quoted(move.to))")
            existing[move.to] = .some(defaults[index])
            if let type = types[index] { recordedTypes?[StoreAttributeTypes.key(entity.name, move.to)] = type }
        }
    }

    /// The number of rows of `table`.
    private static func count(_ table: String, _ db: Connection) throws -> Int64 {
        guard case let .integer(rows)? = try db.scalar("SELECT count(*) FROM \(quoted(table))") else { return 0 }
        return rows
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
