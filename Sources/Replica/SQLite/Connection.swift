import CSQLite
import Foundation
import Synchronization

/// The SQL text of a statement run on a hot path, as a static constant: connections cache its prepared statement by
/// the key's identity. Declare keys as `static let`, or keep them in a structure that outlives their use (e.g. an
/// entity's storage); a connection keeps every key it caches a statement for, so a key's identity is never reused
/// while a statement is cached under it.
///
/// Keys with the same text share one prepared statement per connection (e.g. the same lookup built by two stores, or
/// by a store and a model type), found through the text's hash, computed once per key.
final class StatementKey: Sendable {
    let sql: String
    /// `sql.hashValue`, computed once (a connection finds a statement another key with the same text prepared without
    /// hashing the text again).
    let textHash: Int
    init(_ sql: String) {
        self.sql = sql
        self.textHash = sql.hashValue
    }
}

/// A ``StatementKey`` compared by its SQL text, hashed by its precomputed hash.
private struct StatementText: Hashable {
    let key: StatementKey
    func hash(into hasher: inout Hasher) { hasher.combine(key.textHash) }
    static func == (lhs: StatementText, rhs: StatementText) -> Bool { lhs.key === rhs.key || lhs.key.sql == rhs.key.sql }
}

/// The number of allocated statements of one connection (see ``Connection/liveStatements``).
final class LiveStatementCount: Sendable {
    private let count = Atomic<Int>(0)
    var value: Int { count.load(ordering: .acquiring) }
    func increment() { count.add(1, ordering: .relaxed) }
    func decrement() { count.subtract(1, ordering: .releasing) }
}

/// The reader of externally stored values that a SQL function registered on a connection reads through (Store's
/// `AssetReader`, the reader of `replica_asset`). The connection only keeps it, as ``Connection/assetReader``: the
/// function's reader then lives as long as the connection, and a query that fails in it asks it what failed. Internal.
protocol ExternalValueReader: AnyObject {}

/// One SQLite database connection. Internal.
///
/// A connection is a non-`Sendable` class: Swift 6's isolation checking confines it to the executor that created it
/// (one per ``ModelContext``), which is what SQLite's "multi-thread" threading mode requires.
///
/// Opening applies Replica's standard settings: `journal_mode=WAL` (file stores), `synchronous=NORMAL`,
/// `foreign_keys=ON` and a busy timeout.
/// Sources: <https://www.sqlite.org/wal.html>, <https://www.sqlite.org/pragma.html#pragma_synchronous>,
/// <https://www.sqlite.org/c3ref/busy_timeout.html>
final class Connection {
    /// Where a connection's database lives.
    enum Location: Hashable {
        /// A file on disk.
        case file(URL)
        /// A named in-memory database shared by every connection of this process that uses the same name
        /// (SQLite's `memdb` VFS). It lives while at least one connection to it is open.
        case memory(name: String)
    }

    let handle: OpaquePointer
    let location: Location
    let isReadOnly: Bool
    private var cache: [String: Statement] = [:]
    /// Statements of this connection that are still allocated, cached or not (a statement may be released on any
    /// thread, so the count is atomic).
    let liveStatements = LiveStatementCount()
    /// Statements of hot paths, cached by key identity (see ``StatementKey``). Unchecked exclusivity: the connection
    /// is confined to one executor, and no access to the table calls out of it.
    @exclusivity(unchecked) private var keyedCache = StatementsByIdentity()
    /// The statements of ``keyedCache``, each once, by text: a key whose identity misses finds the statement of an
    /// earlier key with the same text here rather than preparing it again.
    private var keyedByText: [StatementText: Statement] = [:]
    /// The keys of ``keyedCache``, kept alive with it (an identity stays unique only while its object lives).
    private var cachedKeys: [StatementKey] = []
    /// Statements whose text is built from a few numbers (e.g. the UPDATE of one entity's changed columns), by owner
    /// identity, kind and numbers (see ``cachedStatement(owner:kind:variant:sql:)``). Each is also in ``cache``.
    private var variantCache: [VariantKey: Statement] = [:]
    /// The owners of ``variantCache``'s keys, kept alive with it (an identity stays unique only while its object lives).
    private var variantOwners: [AnyObject] = []
    /// Replica's SQL functions (`SQLFunctions`) are registered on this connection. Kept with the connection, not with
    /// its owner: registering them again on a reused connection would replace them, which expires every prepared
    /// statement of the connection (each would be prepared again at its next use).
    var hasSQLFunctions = false
    /// The reader of `replica_asset` (Store's `AssetReader`), once registered for the store this connection serves.
    var assetReader: (any ExternalValueReader)?
    /// Nesting depth of `transaction` calls; inner calls use savepoints.
    private var transactionDepth = 0

    /// The busy timeout applied to every connection, in milliseconds.
    static let defaultBusyTimeoutMilliseconds: Int32 = 5_000

    /// The number of connections of this process open now to the database at `location` (tests check that observers
    /// and loaders give theirs back).
    static func openCount(at location: Location) -> Int { openConnections.withLock { $0[location] ?? 0 } }
    private static let openConnections = Mutex<[Location: Int]>([:])

    /// Opens (and, unless `readOnly`, creates) the database at `location`.
    /// - Throws: ``SQLiteError`` when the file cannot be opened or the settings cannot be applied.
    init(location: Location, readOnly: Bool = false, busyTimeoutMilliseconds: Int32 = defaultBusyTimeoutMilliseconds) throws {
        var flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI
        flags |= readOnly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        let path: String
        switch location {
        case let .file(url): path = url.path
        case let .memory(name):
            // The name is a URI path: escape everything but unreserved characters, so that a `?`, `#` or `%` in it
            // cannot end the path early and open a file instead of the in-memory database.
            path = "file:/\(Self.uriPath(name))?vfs=memdb"
        }
        var db: OpaquePointer?
        let code = sqlite3_open_v2(path, &db, flags, nil)
        guard code == SQLITE_OK, let db else {
            let error = SQLiteError(code: code, connection: db)
            sqlite3_close_v2(db)
            throw error
        }
        self.handle = db
        self.location = location
        self.isReadOnly = readOnly
        Self.openConnections.withLock { $0[location, default: 0] += 1 }
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, busyTimeoutMilliseconds)
        if case .file = location, !readOnly {
            try execute("PRAGMA journal_mode=WAL")
        }
        try execute("PRAGMA synchronous=NORMAL")
        try execute("PRAGMA foreign_keys=ON")
    }

    /// `name` with every character but the unreserved ones (RFC 3986) percent-encoded. Names Replica generates need
    /// no escaping (letters, digits, `-`), so the common case only checks the bytes.
    static func uriPath(_ name: String) -> String {
        if name.utf8.allSatisfy({ isUnreservedURIByte($0) }) { return name }
        return name.addingPercentEncoding(withAllowedCharacters: unreservedURICharacters) ?? name
    }

    private static func isUnreservedURIByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"): true
        default: false
        }
    }

    private static let unreservedURICharacters = CharacterSet(charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

    /// Prepares the connection for another owner (see `Store.reuse(_:)`): resets every statement that has not run to
    /// completion and rolls back a transaction left open, as closing the connection would. Cached statements stay.
    /// Returns `false` when the connection cannot be brought back to that state (it should then be closed).
    func resetForReuse() -> Bool {
        // A statement outside the caches is still held by someone (e.g. a `ModelRow` kept past its fetch): it would be
        // finalized on its holder's thread while the next owner uses this connection on another. Not reusable.
        guard liveStatements.value == cachedStatementCount else { return false }
        var statement = sqlite3_next_stmt(handle, nil)
        while let current = statement {
            if sqlite3_stmt_busy(current) != 0 { sqlite3_reset(current) }
            statement = sqlite3_next_stmt(handle, current)
        }
        if isInTransaction { try? execute("ROLLBACK") }
        transactionDepth = 0
        return !isInTransaction
    }

    deinit {
        variantCache.removeAll()
        cache.removeAll()
        keyedCache.removeAll()
        keyedByText.removeAll()
        sqlite3_close_v2(handle)
        let location = location
        Self.openConnections.withLock { open in
            open[location, default: 1] -= 1
            if open[location] == 0 { open[location] = nil }
        }
    }

    /// Copies this connection's main database into `destination`'s main database, replacing its content, with
    /// SQLite's online backup API in one step (https://www.sqlite.org/backup.html).
    /// - Returns: `false` (nothing copied) when SQLite cannot start the backup (`sqlite3_backup_init` fails, e.g.
    ///   while `destination` has a read transaction open).
    /// - Throws: ``SQLiteError`` when a started copy fails.
    func copy(into destination: Connection) throws -> Bool {
        guard let backup = sqlite3_backup_init(destination.handle, "main", handle, "main") else { return false }
        let stepped = sqlite3_backup_step(backup, -1)
        let finished = sqlite3_backup_finish(backup)
        if stepped != SQLITE_DONE || finished != SQLITE_OK {
            throw SQLiteError(code: stepped != SQLITE_DONE ? stepped : finished, connection: destination.handle, sql: "backup of the store schema")
        }
        return true
    }

    // MARK: Statements

    /// Runs one or more SQL statements that take no parameters and return no rows of interest.
    func execute(_ sql: String) throws {
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        if code != SQLITE_OK { throw SQLiteError(code: code, connection: handle, sql: sql) }
    }

    /// Returns the cached prepared statement for `sql`, preparing it on first use. The statement is reset.
    /// Complexity: O(1) amortized (one dictionary lookup).
    func cachedStatement(_ sql: String) throws -> Statement {
        if let statement = cache[sql] { return statement }
        let statement = try Statement(connection: self, sql: sql)
        cache[sql] = statement
        return statement
    }

    /// The cached prepared statement for `key`, preparing it on first use: like ``cachedStatement(_:)`` without
    /// hashing the SQL text on every call (long statements on per-record paths). Keys with the same text share one
    /// statement (a text asked for both by key and as a string is prepared once for each).
    func cachedStatement(_ key: StatementKey) throws -> Statement {
        if let statement = keyedCache[key] { return statement }
        let text = StatementText(key: key)
        let statement: Statement
        if let shared = keyedByText[text] {
            statement = shared
        } else {
            statement = try Statement(connection: self, sql: key.sql)
            keyedByText[text] = statement
        }
        keyedCache.insert(statement, for: key)
        cachedKeys.append(key)
        return statement
    }

    /// The cached statement whose SQL text `sql()` builds from `variant`, for `owner` (an object that the text
    /// depends on, e.g. an entity's SQL) and `kind` (which statement of that owner): like ``cachedStatement(_:)``
    /// with that text — the same statement — but without building or hashing the text once cached. Hashes `kind`
    /// and a few integers instead. `owner` is kept alive with the cache.
    func cachedStatement(owner: AnyObject, kind: Int, variant: [Int], sql: () -> String) throws -> Statement {
        let key = VariantKey(owner: ObjectIdentifier(owner), kind: kind, variant: variant)
        if let statement = variantCache[key] { return statement }
        let statement = try cachedStatement(sql())
        variantCache[key] = statement
        if !variantOwners.contains(where: { $0 === owner }) { variantOwners.append(owner) }
        return statement
    }

    private struct VariantKey: Hashable {
        let owner: ObjectIdentifier
        let kind: Int
        let variant: [Int]
    }

    /// Runs the statement of `key` (which returns no rows) with `values` bound.
    func run(_ key: StatementKey, _ values: [SQLiteValue] = []) throws {
        try cachedStatement(key).run(values)
    }

    /// Number of statements in the cache (for tests).
    var cachedStatementCount: Int { cache.count + keyedByText.count }

    /// Runs `sql` with `values` bound and returns every row, each as an array of column values.
    /// - Parameter cache: keep the prepared statement for reuse (pass `false` for SQL text that varies per call).
    func rows(_ sql: String, _ values: [SQLiteValue] = [], cache: Bool = true) throws -> [[SQLiteValue]] {
        try rows(of: cache ? try cachedStatement(sql) : try Statement(connection: self, sql: sql), values)
    }

    /// ``rows(_:_:cache:)`` for the cached statement of `key` (no SQL text hashed per call).
    func rows(_ key: StatementKey, _ values: [SQLiteValue] = []) throws -> [[SQLiteValue]] {
        try rows(of: try cachedStatement(key), values)
    }

    private func rows(of statement: Statement, _ values: [SQLiteValue]) throws -> [[SQLiteValue]] {
        defer { statement.reset() }
        try statement.bind(values)
        var result: [[SQLiteValue]] = []
        let count = statement.columnCount
        while try statement.step() {
            result.append((0..<count).map { statement.value($0) })
        }
        return result
    }

    /// Runs `sql` with `values` bound and returns the first column of the first row, or `nil` when there is none.
    func scalar(_ sql: String, _ values: [SQLiteValue] = []) throws -> SQLiteValue? {
        try scalar(of: try cachedStatement(sql), values)
    }

    /// ``scalar(_:_:)`` for the statement of `key` (no SQL text hashed per call).
    func scalar(_ key: StatementKey, _ values: [SQLiteValue] = []) throws -> SQLiteValue? {
        try scalar(of: try cachedStatement(key), values)
    }

    private func scalar(of statement: Statement, _ values: [SQLiteValue]) throws -> SQLiteValue? {
        defer { statement.reset() }
        try statement.bind(values)
        return try statement.step() ? statement.value(0) : nil
    }

    /// Runs a statement that returns no rows, with `values` bound.
    func run(_ sql: String, _ values: [SQLiteValue] = []) throws {
        try cachedStatement(sql).run(values)
    }

    /// The rowid of the row the most recent successful INSERT on this connection added.
    var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// Rows changed by the most recent INSERT, UPDATE or DELETE.
    var changes: Int { Int(sqlite3_changes(handle)) }

    /// `true` while a transaction is open on this connection.
    var isInTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    // MARK: Transactions

    /// How a transaction takes its lock.
    /// Source: <https://www.sqlite.org/lang_transaction.html>
    enum TransactionKind: String {
        /// Takes a read lock at the first read and a write lock at the first write (a read transaction).
        case deferred = "DEFERRED"
        /// Takes the write lock at once, waiting up to the busy timeout (a write transaction).
        case immediate = "IMMEDIATE"
    }

    /// Runs `body` in a transaction: commits when it returns, rolls back when it throws.
    /// Nested calls become savepoints of the outer transaction.
    func transaction<T>(_ kind: TransactionKind = .immediate, _ body: () throws -> T) throws -> T {
        if transactionDepth > 0 {
            let name = "replica_sp\(transactionDepth)"
            try execute("SAVEPOINT \(name)")
            transactionDepth += 1
            defer { transactionDepth -= 1 }
            do {
                let result = try body()
                try execute("RELEASE \(name)")
                return result
            } catch {
                try? execute("ROLLBACK TO \(name); RELEASE \(name)")
                throw error
            }
        }
        try begin(kind)
        do {
            let result = try body()
            try commit()
            return result
        } catch {
            rollback()
            throw error
        }
    }

    /// Opens a transaction that the caller ends with ``commit()`` or ``rollback()`` (used to hold several stores'
    /// transactions open at once during a two-phase save).
    func begin(_ kind: TransactionKind) throws {
        precondition(transactionDepth == 0, "Replica: a transaction is already open on this connection")
        try step(kind == .immediate ? Self.beginImmediateSQL : Self.beginDeferredSQL)
        transactionDepth = 1
    }

    func commit() throws {
        try step(Self.commitSQL)
        transactionDepth = 0
    }

    // Transaction control is prepared once per connection (sqlite3_exec parses the text every time).
    private static let beginImmediateSQL = StatementKey("BEGIN IMMEDIATE")
    private static let beginDeferredSQL = StatementKey("BEGIN DEFERRED")
    private static let commitSQL = StatementKey("COMMIT")

    /// Runs a cached statement that returns no rows, then resets it.
    private func step(_ key: StatementKey) throws {
        let statement = try cachedStatement(key)
        defer { statement.reset(clearingBindings: false) }
        while try statement.step() {}
    }

    func rollback() {
        if isInTransaction { try? execute("ROLLBACK") }
        transactionDepth = 0
    }
}

/// Prepared statements by the identity of their ``StatementKey``: open addressing over a power-of-two table, probed
/// from the key's address mixed by one multiplication (no `Hasher` per lookup, which cost more than the rest of a
/// cached statement's lookup). Entries are only added; the owner keeps every key alive while its entry exists, so an
/// address is never reused for another key meanwhile. Internal.
struct StatementsByIdentity {
    private struct Slot {
        /// The key's address; 0 marks an empty slot.
        var address: UInt = 0
        var statement: Statement?
    }

    private var slots = [Slot](repeating: Slot(), count: 64)
    private(set) var count = 0

    @inline(__always)
    private static func address(of key: StatementKey) -> UInt { UInt(bitPattern: ObjectIdentifier(key)) }

    @inline(__always)
    private func firstSlot(_ address: UInt) -> Int {
        // Fibonacci hashing: the high bits of the product mix every bit of the address.
        Int(truncatingIfNeeded: (address &* 0x9E37_79B9_7F4A_7C15) >> 32) & (slots.count - 1)
    }

    /// The statement cached for `key`, or `nil`.
    subscript(key: StatementKey) -> Statement? {
        let address = Self.address(of: key)
        var index = firstSlot(address)
        while true {
            let slot = slots[index]
            if slot.address == address { return slot.statement }
            if slot.address == 0 { return nil }
            index = (index + 1) & (slots.count - 1)
        }
    }

    /// Adds `statement` for `key`, which has none yet.
    mutating func insert(_ statement: Statement, for key: StatementKey) {
        if (count + 1) * 2 > slots.count {
            let old = slots
            slots = [Slot](repeating: Slot(), count: old.count * 2)
            for slot in old where slot.address != 0 { place(slot) }
        }
        place(Slot(address: Self.address(of: key), statement: statement))
        count += 1
    }

    private mutating func place(_ slot: Slot) {
        var index = firstSlot(slot.address)
        while slots[index].address != 0 { index = (index + 1) & (slots.count - 1) }
        slots[index] = slot
    }

    mutating func removeAll() {
        slots = [Slot](repeating: Slot(), count: 64)
        count = 0
    }
}
