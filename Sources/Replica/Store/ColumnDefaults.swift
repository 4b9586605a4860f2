import Foundation

/// Declared defaults at the storage level: each attribute's column carries its default as SQL `DEFAULT`, so a row
/// inserted by a process that does not know the column — an older app version sharing the store file (a widget
/// that updates later than its app) — holds the default, not NULL. Internal.
///
/// SQLite rules this follows (<https://www.sqlite.org/lang_createtable.html#dfltval>,
/// <https://www.sqlite.org/lang_altertable.html#altertabaddcol>): `CREATE TABLE` accepts any constant expression in
/// parentheses; `ALTER TABLE … ADD COLUMN` accepts only a literal (a signed number, a string, a blob, NULL) — no
/// expression, not even `CAST` — and existing rows then read the default without being rewritten; SQLite cannot
/// change the default of an existing column, so in an app-group store a table whose columns lack their defaults is
/// rebuilt (``ColumnDefaults/rebuildIfNeeded(_:entity:db:)``).
enum ColumnDefaults {
    /// The column definitions of `entity`'s attributes and to-one relationships, in storage order, each with the
    /// attribute's declared default as an exact constant expression (for `CREATE TABLE`).
    static func columnDefinitions(_ entity: Schema.Entity) -> [String] {
        entity.attributes.map { attribute in
            let clause = attribute.defaultValue.flatMap { $0.isNull ? nil : expression($0) }.map { " DEFAULT \($0)" } ?? ""
            return "\(quoted(attribute.name)) \(attribute.type.sqliteDeclaredType)\(clause)"
        } + entity.toOneRelationships.map { "\(quoted($0.name)) BLOB" }
    }

    /// A constant expression whose value is exactly `value` (for `CREATE TABLE … DEFAULT`).
    ///
    /// SQLite's text-to-double conversion is not correctly rounded for every decimal (SQLite 3.40 misreads about
    /// 0.3 % of the shortest round-trip forms of random doubles), so a REAL that is not a small integer is written as
    /// its binary form, `m × 2^e`, multiplied or divided by powers of two — each step exact in IEEE arithmetic.
    /// Text containing NUL (which ends SQL text) is written as a blob cast to TEXT.
    static func expression(_ value: SQLiteValue) -> String {
        switch value {
        case let .real(v) where v.isFinite && !(v == v.rounded() && abs(v) < 0x1p53):
            // v = ±mantissa × 2^shift, with the mantissa's trailing zero bits moved into the shift.
            var mantissa = Int64(v.significandBitPattern | (v.isNormal ? 1 << 52 : 0))
            var shift = v.isNormal ? Int(v.exponentBitPattern) - 1075 : -1074
            while mantissa & 1 == 0 { mantissa >>= 1; shift += 1 }
            if v < 0 { mantissa = -mantissa }
            var text = "CAST(\(mantissa) AS REAL)"
            var remaining = abs(shift)
            while remaining > 0 {
                let step = min(remaining, 62)
                text += (shift > 0 ? " * " : " / ") + String(Int64(1) << step)
                remaining -= step
            }
            return "(\(text))"
        case let .text(s) where s.utf8.contains(0):
            return "(CAST(X'\(hex(Data(s.utf8)))' AS TEXT))"
        default:
            return literal(value) ?? "NULL"
        }
    }

    /// The literal form of `value` that `ALTER TABLE … ADD COLUMN … DEFAULT` accepts, or `nil` when there is none
    /// (text containing NUL). A REAL literal may not read back exactly: ``addColumn(_:to:_:)`` checks.
    static func literal(_ value: SQLiteValue) -> String? {
        switch value {
        case .null: return "NULL"
        case let .integer(v): return String(v)
        case let .real(v):
            if v.isNaN { return nil }
            if v.isInfinite { return v < 0 ? "-9e999" : "9e999" }
            if v == v.rounded() && abs(v) < 0x1p53 { return String(Int64(v)) + ".0" }
            return "\(v)"
        case let .text(s):
            if s.utf8.contains(0) { return nil }
            return "'" + s.replacingOccurrences(of: "'", with: "''") + "'"
        case let .blob(d): return "X'\(hex(d))'"
        }
    }

    private static func hex(_ data: Data) -> String {
        let digits = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(data.count * 2)
        for byte in data { bytes.append(digits[Int(byte >> 4)]); bytes.append(digits[Int(byte & 0xF)]) }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Whether `a` and `b` are the same stored value (REALs compared bit for bit, as a default must be).
    static func same(_ a: SQLiteValue, _ b: SQLiteValue) -> Bool {
        if case let .real(x) = a, case let .real(y) = b { return x.bitPattern == y.bitPattern }
        return a == b
    }

    /// Adds the column of field `name` to the existing table of `entity`, with its default when a literal for it
    /// reads back exactly. Returns `false` when the column had to be added without its default: the table then needs
    /// ``rebuildIfNeeded(_:entity:db:)``. Existing rows read the default (SQLite does not rewrite them); without one
    /// they are given it by an UPDATE.
    static func addColumn(_ name: String, to entity: Schema.Entity, _ db: Connection) throws -> Bool {
        let table = quoted(entity.name)
        guard let attribute = entity.attribute(named: name) else {
            try db.execute("ALTER TABLE \(table) ADD COLUMN \(quoted(name)) BLOB")
            return true
        }
        let definition = "\(quoted(name)) \(attribute.type.sqliteDeclaredType)"
        guard let value = attribute.defaultValue, !value.isNull else {
            try db.execute("ALTER TABLE \(table) ADD COLUMN \(definition)")
            return true
        }
        if let literal = literal(value), try readsBack(literal, as: value, db) {
            try db.execute("ALTER TABLE \(table) ADD COLUMN \(definition) DEFAULT \(literal)")
            return true
        }
        try db.execute("ALTER TABLE \(table) ADD COLUMN \(definition)")
        _ = try db.rows("UPDATE \(table) SET \(quoted(name)) = ?", [value], cache: false)
        return false
    }

    /// Whether SQLite reads the literal `text` as exactly `value`.
    private static func readsBack(_ text: String, as value: SQLiteValue, _ db: Connection) throws -> Bool {
        guard case .real = value else { return true }
        guard let read = try db.scalar("SELECT \(text)") else { return false }
        return same(read, value)
    }

    /// Whether the existing table of `entity` needs rebuilding for its defaults: a column of an attribute with a
    /// declared (non-NULL) default has no SQL default (a table created before defaults were stored, or a column that
    /// had to be added without one). `columns` are the table's columns with their `dflt_value` text (`nil`: none).
    /// A column whose default differs from the declared one is left as it is: another app version sharing the file
    /// may declare that one, and rebuilding back and forth on every open would cost a table copy each time.
    static func needsRebuild(_ entity: Schema.Entity, columns: [String: String?]) -> Bool {
        entity.attributes.contains { attribute in
            guard let value = attribute.defaultValue, !value.isNull, let existing = columns[attribute.name] else { return false }
            return existing == nil
        }
    }

    /// The name of the table a rebuild copies into: not an identifier Replica derives from a schema (those are
    /// letters, digits and underscores), so it can never be taken.
    private static let rebuildTable = "replica-rebuild"

    /// Rebuilds the table of `entity` when ``needsRebuild(_:columns:)`` says so (SQLite's procedure for changing a
    /// table's definition, <https://www.sqlite.org/lang_altertable.html#otheralter>): a new table with every existing
    /// column — those of attributes with their declared defaults, the others (a newer app version's) as they were —
    /// the rows copied with their rowids, the old table dropped, the new one renamed, and the old table's indexes
    /// created again. A NULL in the column of a non-optional attribute with a default becomes the default: Replica
    /// never writes NULL there, so such a NULL is a row inserted by a process that did not know the column — exactly
    /// the rows the default is for. Runs inside the caller's write transaction; costs one copy of the table.
    /// Returns whether it rebuilt. A table Replica did not create (constraints or options it never writes) is left
    /// as it is.
    static func rebuildIfNeeded(_ columnsWithDefaults: [String: String?], entity: Schema.Entity, db: Connection) throws -> Bool {
        guard needsRebuild(entity, columns: columnsWithDefaults) else { return false }
        guard case let .text(createSQL)? = try db.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(entity.name)]) else {
            return false
        }
        let upper = createSQL.uppercased()
        for keyword in ["CHECK", "UNIQUE", "REFERENCES", "COLLATE", "WITHOUT ROWID", "GENERATED", "AUTOINCREMENT", "CONSTRAINT", "FOREIGN"] where upper.contains(keyword) {
            return false
        }
        var definitions: [String] = []
        var names: [String] = []
        var selected: [String] = []
        for row in try db.rows("SELECT name, type, \"notnull\", dflt_value, pk, hidden FROM pragma_table_xinfo(?) ORDER BY cid", [.text(entity.name)], cache: false) {
            guard case let .text(name) = row[0], case let .text(type) = row[1] else { return false }
            if case let .integer(hidden) = row[5], hidden != 0 { return false }
            let notNull = row[2] == .integer(1)
            let isKey = row[4] != .integer(0)
            if isKey && name != "id" { return false }
            var definition = "\(quoted(name)) \(type)"
            var column = quoted(name)
            if isKey {
                definition += " PRIMARY KEY NOT NULL"
            } else {
                if notNull { definition += " NOT NULL" }
                if let attribute = entity.attribute(named: name), let value = attribute.defaultValue, !value.isNull {
                    definition += " DEFAULT \(expression(value))"
                    if !attribute.isOptional { column = "coalesce(\(column), \(expression(value)))" }
                } else if case let .text(existing) = row[3] {
                    definition += " DEFAULT \(existing)"
                }
            }
            definitions.append(definition)
            names.append(quoted(name))
            selected.append(column)
        }
        let indexes = try db.rows("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL ORDER BY name",
                                  [.text(entity.name)], cache: false).compactMap { row -> String? in
            if case let .text(sql) = row[0] { return sql } else { return nil }
        }
        // The rowid is kept (so rows keep their order and any rowid another reader holds), unless a column shadows it.
        let keepsRowID = !names.contains { ["\"rowid\"", "\"oid\"", "\"_rowid_\""].contains($0.lowercased()) }
        let table = quoted(entity.name), copy = quoted(rebuildTable)
        try db.execute("DROP TABLE IF EXISTS \(copy)")
        try db.execute("CREATE TABLE \(copy) (\(definitions.joined(separator: ", ")))")
        try db.execute("INSERT INTO \(copy) (\(keepsRowID ? "rowid, " : "")\(names.joined(separator: ", "))) "
                       + "SELECT \(keepsRowID ? "rowid, " : "")\(selected.joined(separator: ", ")) FROM \(table)")
        try db.execute("DROP TABLE \(table)")
        try db.execute("ALTER TABLE \(copy) RENAME TO \(table)")
        for index in indexes { try db.execute(index) }
        return true
    }
}
