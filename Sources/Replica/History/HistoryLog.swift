import Foundation

/// Reads and writes one store's history tables. Internal.
///
/// Layout (compact so that tracking history costs little on bulk writes):
/// - `replica_history_transaction(token INTEGER PRIMARY KEY AUTOINCREMENT, timestamp, author, bundle_identifier,
///   process_name, process_id)`: one row per save. AUTOINCREMENT makes tokens strictly increasing and never reused,
///   even after pruning (<https://www.sqlite.org/autoinc.html>).
/// - `replica_history_change(token, seq, entity, kind, fields, ids, tombstone)`: consecutive changes of one entity and
///   kind (and, for updates, the same changed fields) share one row; `ids` packs their 16-byte record IDs.
///   A delete whose entity preserves values gets a row of its own with the tombstone as JSON.
/// - `replica_metadata['history_pruned_through']`: the highest token removed by pruning; older tokens are expired.
enum HistoryLog {
    static let createSQL = """
        CREATE TABLE IF NOT EXISTS replica_history_transaction (
            token INTEGER PRIMARY KEY AUTOINCREMENT,
            timestamp INTEGER NOT NULL,
            author TEXT,
            bundle_identifier TEXT NOT NULL,
            process_name TEXT NOT NULL,
            process_id INTEGER NOT NULL);
        CREATE INDEX IF NOT EXISTS replica_history_transaction_timestamp ON replica_history_transaction (timestamp);
        CREATE TABLE IF NOT EXISTS replica_history_change (
            token INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            entity TEXT NOT NULL,
            kind INTEGER NOT NULL,
            fields TEXT,
            ids BLOB NOT NULL,
            tombstone TEXT,
            PRIMARY KEY (token, seq)) WITHOUT ROWID;
        """

    enum Kind: Int64 { case insert = 0, update = 1, delete = 2 }

    private static let insertTransactionSQL = StatementKey("""
        INSERT INTO replica_history_transaction (timestamp, author, bundle_identifier, process_name, process_id)
        VALUES (?, ?, ?, ?, ?)
        """)
    private static let insertChangeSQL = StatementKey(
        "INSERT INTO replica_history_change (token, seq, entity, kind, fields, ids, tombstone) VALUES (?, ?, ?, ?, ?, ?, ?)")

    /// Appends one transaction for `changes` inside the caller's open write transaction; returns its token value,
    /// or `nil` when there was nothing to record.
    ///
    /// Cost per recorded change: a comparison with the previous change's (entity, kind, fields) and 16 bytes copied
    /// into one buffer allocated per save; SQLite work is one row per run of like changes, not per change.
    static func record(_ changes: StoreChanges, author: String?, environment: ReplicaEnvironment, db: Connection) throws -> Int64? {
        guard !changes.isEmpty else { return nil }
        let identity = environment.processIdentity
        let transaction = try db.cachedStatement(insertTransactionSQL)
        // Reset clears the bindings: the texts are bound without a copy, valid only while the closures run.
        defer { transaction.reset() }
        try transaction.bind(environment.clock.nowMilliseconds(), at: 0)
        try transaction.bind(Int64(identity.processID), at: 4)
        try transaction.withStaticText(author, at: 1) {
            try transaction.withStaticText(identity.bundleIdentifier, at: 2) {
                try transaction.withStaticText(identity.processName, at: 3) {
                    while try transaction.step() {}
                }
            }
        }
        // The token is the row's rowid (an INTEGER PRIMARY KEY). Read from the connection rather than with `RETURNING`,
        // which buffers its rows in a temporary table on every run and cost more than the insert itself.
        let token = db.lastInsertRowID

        var rows = ChangeRows(token: token, statement: try db.cachedStatement(insertChangeSQL),
                              capacity: changes.inserted.count + changes.updated.count + changes.deleted.count)
        defer { rows.deallocate() }
        // Consecutive changes with the same (entity, kind, fields) share one row. The parts in the order they were
        // applied (``StoreChanges/partsInOrder``): a record deleted and inserted again by one save is recorded as
        // deleted, then inserted.
        if let split = changes.updatesBeforeDeletes {
            try rows.addUpdates(changes, 0..<split)
            try rows.addDeletes(changes)
            try rows.addInserts(changes)
            try rows.addUpdates(changes, split..<changes.updated.count)
        } else {
            try rows.addInserts(changes)
            try rows.addUpdates(changes, 0..<changes.updated.count)
            try rows.addDeletes(changes)
        }
        try rows.flush()
        return token
    }

    /// The change rows of one transaction being written: the current run of like changes and its packed IDs.
    /// A local value (no closures, no boxed captures), so the per-change path needs no exclusivity checks or
    /// reference counting beyond reading the snapshot.
    private struct ChangeRows {
        let token: Int64
        let statement: Statement
        var seq: Int64 = 0
        var entity = ""
        var kind = Kind.insert
        var fields: String? = nil
        /// The IDs of the current run, 16 bytes each; room for every change of the save.
        let ids: UnsafeMutableRawPointer
        let capacity: Int
        var count = 0

        init(token: Int64, statement: Statement, capacity: Int) {
            self.token = token
            self.statement = statement
            self.capacity = max(capacity, 1)
            ids = UnsafeMutableRawPointer.allocate(byteCount: self.capacity * 16, alignment: 16)
        }

        func deallocate() { ids.deallocate() }

        /// The field list of the last update added, and its text.
        var lastFields: [String]? = nil
        var joinedFields: String? = nil

        mutating func addInserts(_ changes: StoreChanges) throws {
            for index in changes.inserted.indices {
                try add(changes.inserted[index].entityName, .insert, nil, changes.inserted[index].id)
            }
        }

        mutating func addUpdates(_ changes: StoreChanges, _ range: Range<Int>) throws {
            for index in range {
                let fields = changes.updated[index].1
                if lastFields != fields {
                    lastFields = fields
                    joinedFields = fields.joined(separator: ",")
                }
                try add(changes.updated[index].0.entityName, .update, joinedFields, changes.updated[index].0.id)
            }
        }

        mutating func addDeletes(_ changes: StoreChanges) throws {
            for record in changes.deleted {
                if record.preservedValues.isEmpty {
                    try add(record.id.entityName, .delete, nil, record.id.id)
                } else {
                    try flush()
                    try withUnsafeBytes(of: record.id.id.uuid) { bytes in
                        try write(entity: record.id.entityName, kind: .delete, fields: nil, ids: bytes,
                                  tombstone: HistoryLog.encodeTombstone(record.preservedValues))
                    }
                }
            }
        }

        @inline(__always)
        mutating func add(_ entity: String, _ kind: Kind, _ fields: String?, _ id: UUID) throws {
            if count == 0 || kind != self.kind || entity != self.entity || fields != self.fields {
                try flush()
                self.entity = entity
                self.kind = kind
                self.fields = fields
            }
            precondition(count < capacity)
            (ids + count * 16).storeBytes(of: id.uuid, as: uuid_t.self)
            count += 1
        }

        /// Writes the current run, if any.
        mutating func flush() throws {
            guard count > 0 else { return }
            try write(entity: entity, kind: kind, fields: fields, ids: UnsafeRawBufferPointer(start: ids, count: count * 16), tombstone: nil)
            count = 0
        }

        /// Writes one change row; `ids` and the texts are bound without a copy (the statement is reset, clearing
        /// them, before return).
        mutating func write(entity: String, kind: Kind, fields: String?, ids: UnsafeRawBufferPointer, tombstone: String?) throws {
            let statement = self.statement
            defer { statement.reset() }
            try statement.bind(token, at: 0)
            try statement.bind(seq, at: 1)
            try statement.bind(kind.rawValue, at: 3)
            // (A nil buffer binds NULL, as `sqlite3_bind_blob` does for a nil pointer.)
            if ids.baseAddress == nil { try statement.bind(.null, at: 5) } else { try statement.check(statement.bindBlob(ids, at: 5, copying: false), parameter: 5) }
            try statement.withStaticText(entity, at: 2) {
                try statement.withStaticText(fields, at: 4) {
                    try statement.withStaticText(tombstone, at: 6) {
                        while try statement.step() {}
                    }
                }
            }
            seq += 1
        }
    }

    /// The highest pruned token value (0 when nothing was pruned).
    static func prunedThrough(_ db: Connection) throws -> Int64 {
        if case let .integer(value)? = try db.scalar(prunedThroughSQL) {
            return value
        }
        return 0
    }

    private static let prunedThroughSQL = StatementKey("SELECT value FROM replica_metadata WHERE key = 'history_pruned_through'")

    /// The newest token value in the store (0 when there is no history).
    static func latestToken(_ db: Connection) throws -> Int64 {
        // sqlite_sequence keeps the last AUTOINCREMENT value even when every row was pruned.
        if case let .integer(value)? = try db.scalar(latestTokenSQL) {
            return value
        }
        return 0
    }

    private static let latestTokenSQL = StatementKey("SELECT seq FROM sqlite_sequence WHERE name = 'replica_history_transaction'")

    /// The changes of the transactions with tokens in a range (bound: first, last), in order: a range search of
    /// the change table's primary key (token, seq).
    static let changesInRangeSQL =
        "SELECT token, entity, kind, fields, ids, tombstone FROM replica_history_change WHERE token BETWEEN ? AND ? ORDER BY token, seq"

    /// The SQL and values that select the transaction headers `descriptor` asks for. After a token, it is a range
    /// search of the INTEGER PRIMARY KEY (rowid) — O(N) in the transactions returned, whatever precedes the token
    /// (a test checks the plan).
    static func headerQuery(_ descriptor: HistoryDescriptor) -> (sql: String, values: [SQLiteValue]) {
        var conditions: [String] = []
        var values: [SQLiteValue] = []
        // After a token, `+timestamp` keeps SQLite from choosing the timestamp index (to filter, or to avoid a
        // sort) over the token range: the range comes first (O(N) rows), whatever precedes the token.
        let timestamp = descriptor.afterToken == nil ? "timestamp" : "+timestamp"
        if let token = descriptor.afterToken {
            conditions.append("token > ?")
            values.append(.integer(token.value))
        }
        if let authors = descriptor.authors {
            conditions.append("author IN (\(placeholders(authors.count)))")
            values += authors.map(SQLiteValue.text)
        }
        if let excluded = descriptor.excludedAuthors, !excluded.isEmpty {
            conditions.append("(author IS NULL OR author NOT IN (\(placeholders(excluded.count))))")
            values += excluded.map(SQLiteValue.text)
        }
        if let from = descriptor.fromDate {
            conditions.append("\(timestamp) >= ?")
            values.append(.integer(milliseconds(from)))
        }
        if let to = descriptor.toDate {
            conditions.append("\(timestamp) < ?")
            values.append(.integer(milliseconds(to)))
        }
        if let entities = descriptor.entityNames {
            conditions.append("EXISTS (SELECT 1 FROM replica_history_change c WHERE c.token = t.token AND c.entity IN (\(placeholders(entities.count))))")
            values += entities.map(SQLiteValue.text)
        }
        let direction = descriptor.reverse ? "DESC" : "ASC"
        let order = descriptor.sortBy == .token ? "token \(direction)" : "\(timestamp) \(direction), token \(direction)"
        var sql = "SELECT token, timestamp, author, bundle_identifier, process_name, process_id FROM replica_history_transaction t"
        if !conditions.isEmpty { sql += " WHERE " + conditions.joined(separator: " AND ") }
        sql += " ORDER BY \(order)"
        if let limit = descriptor.fetchLimit {
            sql += " LIMIT ?"
            values.append(.integer(Int64(max(0, limit))))
        }
        return (sql, values)
    }

    /// Reads the transactions `descriptor` selects from one store.
    static func fetch(_ descriptor: HistoryDescriptor, storeName: String, identity: UUID, db: Connection) throws -> [HistoryTransaction] {
        let (sql, values) = headerQuery(descriptor)
        let headers = try db.rows(sql, values, cache: descriptor.authors == nil && descriptor.excludedAuthors == nil && descriptor.entityNames == nil)
        guard let minToken = headers.lazy.compactMap({ if case let .integer(t) = $0[0] { return t } else { return nil } }).min(),
              let maxToken = headers.lazy.compactMap({ if case let .integer(t) = $0[0] { return t } else { return nil } }).max()
        else { return [] }

        // One range scan for the changes of every selected transaction: O(changes in range).
        var changesByToken: [Int64: [HistoryChange]] = [:]
        changesByToken.reserveCapacity(headers.count)
        let wanted = descriptor.entityNames.map(Set.init)
        let statement = try db.cachedStatement(changesInRangeSQL)
        defer { statement.reset() }
        try statement.bind([.integer(minToken), .integer(maxToken)])
        // The field list of the previous update row, split (runs of updates often change the same fields).
        var lastFields: (text: String, names: [String])? = nil
        while try statement.step() {
            let entity = statement.string(1)
            if let wanted, !wanted.contains(entity) { continue }
            let token = statement.int64(0)
            let kind = Kind(rawValue: statement.int64(2)) ?? .update
            let fields: [String]
            if statement.isNull(3) {
                fields = []
            } else {
                let text = statement.string(3)
                // Byte equality (`==` on strings is canonical equivalence, which could pair different texts).
                if let last = lastFields, last.text.utf8.elementsEqual(text.utf8) {
                    fields = last.names
                } else {
                    fields = splitFieldList(text)
                    lastFields = (text, fields)
                }
            }
            let tombstone = statement.isNull(5) ? HistoryTombstone() : decodeTombstone(statement.string(5))
            // The packed IDs are read in place (valid until the next step), and the changes are appended to the
            // token's list in place.
            let ids = statement.blob(4)
            let count = ids.count / 16
            var list = changesByToken.removeValue(forKey: token) ?? []
            list.reserveCapacity(list.count + count)
            for offset in stride(from: 0, to: count * 16, by: 16) {
                let id = PersistentIdentifier(entityName: entity, id: UUID(uuid: ids.loadUnaligned(fromByteOffset: offset, as: uuid_t.self)))
                switch kind {
                case .insert: list.append(.insert(id))
                case .update: list.append(.update(id, updatedAttributes: fields))
                case .delete: list.append(.delete(id, tombstone: tombstone))
                }
            }
            changesByToken[token] = list
        }
        return headers.compactMap { row in
            guard case let .integer(token) = row[0], case let .integer(ms) = row[1] else { return nil }
            let author: String? = if case let .text(a) = row[2] { a } else { nil }
            let text = { (value: SQLiteValue) -> String in if case let .text(s) = value { return s } else { return "" } }
            let pid: Int32 = if case let .integer(p) = row[5] { Int32(truncatingIfNeeded: p) } else { 0 }
            return HistoryTransaction(
                token: HistoryToken(storeIdentity: identity, value: token), storeName: storeName, author: author,
                timestamp: Date(timeIntervalSince1970: Double(ms) / 1000), bundleIdentifier: text(row[3]),
                processName: text(row[4]), processID: pid, changes: changesByToken[token] ?? [])
        }
    }

    /// Every transaction after token value `after`, with its changes, in token order: one prepared statement (the
    /// transactions' token range joined with their change rows, so one snapshot without a transaction of its own),
    /// built once. What the change hub reads after each commit.
    /// - Returns: the transactions, and whether the first one follows `after` directly (`false`: history was pruned
    ///   after `after`).
    /// - Complexity: O(transactions + change rows after `after`): a range search of the token key.
    static func transactions(after: Int64, storeName: String, identity: UUID, db: Connection) throws -> (transactions: [HistoryTransaction], contiguous: Bool) {
        let statement = try db.cachedStatement(transactionsAfterSQL)
        defer { statement.reset() }
        try statement.bind(after, at: 0)
        var transactions: [HistoryTransaction] = []
        var current: (token: Int64, timestamp: Int64, author: String?, bundle: String, process: String, pid: Int32)?
        var changes: [HistoryChange] = []
        var lastFields: (text: String, names: [String])? = nil
        func flush() {
            guard let header = current else { return }
            transactions.append(HistoryTransaction(
                token: HistoryToken(storeIdentity: identity, value: header.token), storeName: storeName, author: header.author,
                timestamp: Date(timeIntervalSince1970: Double(header.timestamp) / 1000), bundleIdentifier: header.bundle,
                processName: header.process, processID: header.pid, changes: changes))
            changes = []
        }
        while try statement.step() {
            let token = statement.int64(0)
            if current?.token != token {
                flush()
                current = (token, statement.int64(1), statement.isNull(2) ? nil : statement.string(2), statement.string(3),
                           statement.string(4), Int32(truncatingIfNeeded: statement.int64(5)))
            }
            guard !statement.isNull(6) else { continue }  // a transaction without change rows
            let entity = statement.string(6)
            let kind = Kind(rawValue: statement.int64(7)) ?? .update
            var fields: [String] = []
            if !statement.isNull(8) {
                let text = statement.string(8)
                if let last = lastFields, last.text.utf8.elementsEqual(text.utf8) {
                    fields = last.names
                } else {
                    fields = splitFieldList(text)
                    lastFields = (text, fields)
                }
            }
            let tombstone = statement.isNull(10) ? HistoryTombstone() : decodeTombstone(statement.string(10))
            let ids = statement.blob(9)
            for offset in stride(from: 0, to: ids.count / 16 * 16, by: 16) {
                let id = PersistentIdentifier(entityName: entity, id: UUID(uuid: ids.loadUnaligned(fromByteOffset: offset, as: uuid_t.self)))
                switch kind {
                case .insert: changes.append(.insert(id))
                case .update: changes.append(.update(id, updatedAttributes: fields))
                case .delete: changes.append(.delete(id, tombstone: tombstone))
                }
            }
        }
        flush()
        return (transactions, transactions.first.map { $0.token.value == after + 1 } ?? true)
    }

    private static let transactionsAfterSQL = StatementKey("""
        SELECT t.token, t.timestamp, t.author, t.bundle_identifier, t.process_name, t.process_id,
               c.entity, c.kind, c.fields, c.ids, c.tombstone
        FROM replica_history_transaction t LEFT JOIN replica_history_change c ON c.token = t.token
        WHERE t.token > ? ORDER BY t.token, c.seq
        """)

    /// The names of a change row's comma-separated field list (empty names left out). ASCII text is split by bytes;
    /// other text by characters (a comma followed by a combining mark is not a separator there).
    static func splitFieldList(_ text: String) -> [String] {
        let utf8 = text.utf8
        guard utf8.allSatisfy({ $0 < 0x80 }) else { return text.split(separator: ",").map(String.init) }
        return utf8.split(separator: UInt8(ascii: ",")).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Deletes history up to and including `token` (or every transaction older than `date`), and moves the
    /// expiry watermark. Returns the number of transactions removed.
    /// `date` as Unix milliseconds (rounded up), saturating: a date beyond what `Int64` milliseconds hold (or a NaN
    /// one) counts as the nearest end (NaN as the earliest), never traps.
    static func milliseconds(_ date: Date) -> Int64 {
        let ms = (date.timeIntervalSince1970 * 1000).rounded(.up)
        if ms.isNaN { return .min }
        return ms >= 9.223372036854775e18 ? .max : ms <= -9.223372036854775e18 ? .min : Int64(ms)
    }

    static func prune(throughToken token: Int64?, before date: Date?, db: Connection) throws -> Int {
        try db.transaction(.immediate) {
            var through = token ?? 0
            if let date {
                let ms = milliseconds(date)
                if case let .integer(max)? = try db.scalar("SELECT max(token) FROM replica_history_transaction WHERE timestamp < ?", [.integer(ms)]) {
                    through = Swift.max(through, max)
                }
            }
            // Never past the newest transaction: tokens after it have not been issued yet (a token from the store's
            // "future" — e.g. kept across a restore of an older backup — would otherwise expire the ones to come).
            through = Swift.min(through, try latestToken(db))
            guard through > 0 else { return 0 }
            try db.run("DELETE FROM replica_history_change WHERE token <= ?", [.integer(through)])
            try db.run("DELETE FROM replica_history_transaction WHERE token <= ?", [.integer(through)])
            let removed = db.changes
            try db.run("""
                INSERT INTO replica_metadata (key, value) VALUES ('history_pruned_through', ?)
                ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)
                """, [.integer(through)])
            return removed
        }
    }

    private static func placeholders(_ count: Int) -> String {
        Array(repeating: "?", count: max(count, 1)).joined(separator: ", ")
    }

    static func encodeTombstone(_ values: [(String, SQLiteValue)]) -> String {
        let dictionary = Dictionary(values, uniquingKeysWith: { a, _ in a })
        let data = (try? ReplicaJSON.encoder().encode(HistoryTombstone(values: dictionary))) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    static func decodeTombstone(_ json: String) -> HistoryTombstone {
        (try? ReplicaJSON.decoder().decode(HistoryTombstone.self, from: Data(json.utf8))) ?? HistoryTombstone()
    }
}
