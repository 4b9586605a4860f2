import Foundation

/// The SQL text Replica uses for one entity's table, built once per store. A class, so that handing it around per
/// record retains one reference rather than each of its fields.
final class EntityStatements: Sendable {
    /// The entity's name.
    let entityName: String
    let table: String
    /// `"id", "a", "b", ...` in field order.
    let columnList: String
    let insert: String
    /// ``insert`` as a statement key (rows are inserted one by one on hot paths).
    let insertKey: StatementKey
    let selectAll: String
    let selectByID: String
    let delete: String
    /// ``selectByID`` as a statement key: reads a row by ID (once per merged or updated record) and tells whether one
    /// exists (per inserted record of a synced store, per reference checked), one prepared statement for both.
    let selectByIDKey: StatementKey
    /// The largest ID of the table (read once per merge batch, see `SyncLedger.MergeBatch`).
    let largestIDKey: StatementKey
    /// The entity's stored fields in storage order (``Schema/Entity/fieldNames``, computed once).
    let fieldNames: [String]
    /// Field positions in the order of their names' UTF-8 bytes: the order of the ledger's compact `stamps` form.
    let fieldsInStampOrder: [Int]
    /// The compact `stamps` form's bytes after the stamp when one stamp covers every field (see
    /// ``SyncLedger/oneStampTail(names:order:)``).
    let oneStampTail: [UInt8]
    /// Position of each stored field, by name.
    let fieldIndex: [String: Int]
    /// The value of each field when no write of the current incarnation is known (the attribute's declared default,
    /// else NULL), in storage order.
    let defaults: [SQLiteValue]
    /// The attribute each field stores, in storage order (`nil` for to-one relationships).
    let attributes: [Schema.Attribute?]

    init(_ entity: Schema.Entity) {
        entityName = entity.name
        table = quoted(entity.name)
        let columns = [quoted("id")] + entity.fieldNames.map(quoted)
        columnList = columns.joined(separator: ", ")
        insert = "INSERT INTO \(table) (\(columnList)) VALUES (\(Array(repeating: "?", count: columns.count).joined(separator: ", ")))"
        insertKey = StatementKey(insert)
        selectAll = "SELECT \(columnList) FROM \(table)"
        selectByID = "SELECT \(columnList) FROM \(table) WHERE \"id\" = ?"
        delete = "DELETE FROM \(table) WHERE \"id\" = ?"
        selectByIDKey = StatementKey(selectByID)
        largestIDKey = StatementKey("SELECT max(\"id\") FROM \(table)")
        let names = entity.fieldNames
        fieldNames = names
        fieldsInStampOrder = names.indices.sorted { names[$0].utf8.lexicographicallyPrecedes(names[$1].utf8) }
        oneStampTail = SyncLedger.oneStampTail(names: names, order: fieldsInStampOrder)
        fieldIndex = Dictionary(names.enumerated().map { ($1, $0) }, uniquingKeysWith: { first, _ in first })
        attributes = names.indices.map { $0 < entity.attributes.count ? entity.attributes[$0] : nil }
        defaults = attributes.map { $0?.defaultValue ?? .null }
    }
}
