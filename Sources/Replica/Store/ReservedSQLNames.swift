import Foundation

extension Store {
    /// The table and index names Replica creates for itself in every store (metadata, history, sync bookkeeping),
    /// read from the statements that create them, plus those earlier versions created: no name derived from a
    /// schema may equal one of them.
    static let reservedSQLNames: Set<String> = {
        var names: Set<String> = ["replica_sync_record_pending"]
        for script in [Store.metadataSQL, HistoryLog.createSQL, SyncLedger.createSQL] {
            for line in script.split(separator: "\n") {
                let words = line.split(whereSeparator: { $0 == " " || $0 == "(" || $0 == ";" })
                guard let create = words.firstIndex(of: "CREATE"), words.count > create + 5,
                      words[create + 1] == "TABLE" || words[create + 1] == "INDEX",
                      words[create + 2] == "IF", words[create + 3] == "NOT", words[create + 4] == "EXISTS" else { continue }
                names.insert(words[create + 5].lowercased())
            }
        }
        return names
    }()
}

extension Schema {
    /// Checks the whole schema and reports every violation at once.
    /// - Throws: ``SchemaValidationError`` listing each problem (duplicate names, relationships to unknown entities,
    ///   inverses that do not point back, non-optional attributes without defaults where that is required, and so on).
    public func validate() throws {
        let violations = SchemaValidator(schema: self, reservedSQLNames: Store.reservedSQLNames).violations()
        if !violations.isEmpty { throw SchemaValidationError(violations: violations) }
    }
}
