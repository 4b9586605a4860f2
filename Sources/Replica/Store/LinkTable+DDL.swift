import Foundation

/// The DDL of link tables (``LinkTable``): the store creates them with the rest of its file.
extension LinkTable {
    /// Creates the link tables of `entities` that do not exist yet. Run inside the store's preparing transaction.
    static func prepare(_ db: Connection, entities: [Schema.Entity]) throws {
        for statement in createSQL(entities: entities) { try db.execute(statement) }
    }

    /// The statements creating the link tables of `entities` (and their indexes), each idempotent.
    static func createSQL(entities: [Schema.Entity]) -> [String] {
        all(in: entities).flatMap(createSQL(for:))
    }

    /// The statements creating `table` and its index, each idempotent.
    static func createSQL(for table: LinkTable) -> [String] {
        [
            """
            CREATE TABLE IF NOT EXISTS \(table.quotedName) ("owner" BLOB NOT NULL, "member" BLOB NOT NULL, \
            PRIMARY KEY ("owner", "member")) WITHOUT ROWID
            """,
            "CREATE INDEX IF NOT EXISTS \(quoted(table.indexName)) ON \(table.quotedName) (\"member\", \"owner\")",
        ]
    }
}
