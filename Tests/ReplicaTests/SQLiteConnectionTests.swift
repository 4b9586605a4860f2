// The internal SQLite layer: connection settings, busy timeout, statement cache, errors and transactions.
import Foundation
import Testing
@testable import Replica

@Suite("SQLite connection")
struct SQLiteConnectionTests {
    let directory = TestDirectory()

    var databaseURL: URL { directory.url.appendingPathComponent("raw.sqlite") }

    private func integer(_ db: Connection, _ sql: String) throws -> Int64? {
        if case let .integer(value)? = try db.scalar(sql) { return value }
        return nil
    }

    // MARK: Settings

    @Test func fileConnectionsUseWALNormalSyncForeignKeys() throws {
        let db = try Connection(location: .file(databaseURL))
        #expect(try db.scalar("PRAGMA journal_mode") == .text("wal"))
        #expect(try integer(db, "PRAGMA synchronous") == 1)
        #expect(try integer(db, "PRAGMA foreign_keys") == 1)

        // The settings are per connection (except WAL, which is stored in the file): a second one gets them too.
        let second = try Connection(location: .file(databaseURL))
        #expect(try integer(second, "PRAGMA synchronous") == 1)
        #expect(try integer(second, "PRAGMA foreign_keys") == 1)
    }

    @Test func inMemoryConnectionsUseNormalSyncAndForeignKeys() throws {
        let db = try Connection(location: .memory(name: "sqlite-tests-\(UUID().uuidString)"))
        #expect(try integer(db, "PRAGMA synchronous") == 1)
        #expect(try integer(db, "PRAGMA foreign_keys") == 1)
        #expect(db.isReadOnly == false)
    }

    @Test func foreignKeysAreEnforced() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY); CREATE TABLE child (parent INTEGER REFERENCES parent(id))")
        let error = #expect(throws: SQLiteError.self) { try db.run("INSERT INTO child (parent) VALUES (?)", [.integer(42)]) }
        #expect(error?.isConstraintViolation == true)
    }

    @Test func busyTimeoutIsApplied() throws {
        #expect(Connection.defaultBusyTimeoutMilliseconds == 5_000)
        #expect(try integer(Connection(location: .file(databaseURL)), "PRAGMA busy_timeout") == 5_000)
        #expect(try integer(Connection(location: .file(databaseURL), busyTimeoutMilliseconds: 250), "PRAGMA busy_timeout") == 250)
    }

    @Test func secondWriterWaitsForTheBusyTimeoutThenGetsBusy() throws {
        let holder = try Connection(location: .file(databaseURL))
        try holder.execute("CREATE TABLE t (x)")
        try holder.begin(.immediate)
        try holder.run("INSERT INTO t VALUES (1)")
        defer { holder.rollback() }

        let waiter = try Connection(location: .file(databaseURL), busyTimeoutMilliseconds: 200)
        let start = DispatchTime.now()
        let error = #expect(throws: SQLiteError.self) { try waiter.begin(.immediate) }
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1e9
        #expect(error?.isBusy == true)
        #expect(error?.resultCode == 5) // SQLITE_BUSY
        #expect(elapsed >= 0.15, "the second connection gave up after \(elapsed) s, before its busy timeout")
        #expect(elapsed < 4, "the second connection waited \(elapsed) s, far beyond its busy timeout")
        #expect(!waiter.isInTransaction)

        // Once the holder is done, the waiter gets the lock.
        holder.rollback()
        try waiter.begin(.immediate)
        waiter.rollback()
    }

    // MARK: Statement cache

    @Test func preparedStatementsAreCachedPerConnection() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x INTEGER)")
        let baseline = db.cachedStatementCount
        for i in 0..<10 { try db.run("INSERT INTO t (x) VALUES (?)", [.integer(Int64(i))]) }
        #expect(db.cachedStatementCount == baseline + 1)
        for _ in 0..<3 { _ = try db.rows("SELECT x FROM t ORDER BY x") }
        #expect(db.cachedStatementCount == baseline + 2)
        #expect(try db.cachedStatement("SELECT x FROM t ORDER BY x") === db.cachedStatement("SELECT x FROM t ORDER BY x"))
        // Uncached queries do not grow the cache.
        _ = try db.rows("SELECT count(*) FROM t", cache: false)
        #expect(db.cachedStatementCount == baseline + 2)
        // The cache belongs to the connection.
        let other = try Connection(location: .file(databaseURL))
        #expect(other.cachedStatementCount == 0)
        #expect(try db.rows("SELECT x FROM t ORDER BY x").count == 10)
    }

    @Test func cachedStatementsAreResetAndUnboundBetweenUses() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x INTEGER)")
        for i in 1...3 { try db.run("INSERT INTO t (x) VALUES (?)", [.integer(Int64(i))]) }
        // A query whose first use stops after one row must start over on its next use.
        #expect(try db.scalar("SELECT x FROM t ORDER BY x") == .integer(1))
        #expect(try db.scalar("SELECT x FROM t ORDER BY x") == .integer(1))
        #expect(try db.rows("SELECT x FROM t WHERE x >= ? ORDER BY x", [.integer(2)]) == [[.integer(2)], [.integer(3)]])
        #expect(try db.rows("SELECT x FROM t WHERE x >= ? ORDER BY x", [.integer(3)]) == [[.integer(3)]])
    }

    @Test func valuesOfEveryStorageClassRoundTrip() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (v ANY) STRICT")
        let values: [SQLiteValue] = [.null, .integer(.min), .integer(.max), .real(-0.5), .text(""), .text("héllo\u{0}x"),
                                     .blob(Data()), .blob(Data([0, 1, 2, 255]))]
        for value in values { try db.run("INSERT INTO t (v) VALUES (?)", [value]) }
        #expect(try db.rows("SELECT v FROM t ORDER BY rowid").map { $0[0] } == values)
        // An empty string and an empty blob are values, not NULL.
        #expect(try db.scalar("SELECT count(*) FROM t WHERE v IS NULL") == .integer(1))
    }

    // MARK: Values

    @Test func valueDescriptionsNeverShowTheValue() {
        #expect(SQLiteValue.text("secret").description == "TEXT(6 bytes)")
        #expect(SQLiteValue.blob(Data([1, 2, 3])).description == "BLOB(3 bytes)")
        #expect(SQLiteValue.integer(123_456).description == "INTEGER")
        #expect(SQLiteValue.real(3.25).description == "REAL")
        #expect(SQLiteValue.null.description == "NULL")
        #expect(!"\([SQLiteValue.text("secret")])".contains("secret"))
    }

    @Test func storageOrderFollowsSQLite() {
        let sorted: [SQLiteValue] = [.null, .integer(-5), .real(-1.5), .integer(0), .real(0.5), .integer(1), .text(""),
                                     .text("B"), .text("a"), .text("é"), .blob(Data()), .blob(Data([0])), .blob(Data([1]))]
        #expect(sorted.shuffled().sorted(by: SQLiteValue.storageOrder) == sorted)
        #expect(!SQLiteValue.storageOrder(.integer(1), .real(1)))
        #expect(!SQLiteValue.storageOrder(.real(1), .integer(1)))
    }

    // MARK: Errors

    @Test func errorsCarryExtendedCodeMessageAndSQL() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x TEXT UNIQUE)")
        let insert = "INSERT INTO t (x) VALUES (?)"
        try db.run(insert, [.text("a")])
        let error = #expect(throws: SQLiteError.self) { try db.run(insert, [.text("a")]) }
        #expect(error?.extendedResultCode == SQLiteError.constraintUnique)
        #expect(error?.resultCode == 19) // SQLITE_CONSTRAINT
        #expect(error?.isConstraintViolation == true)
        #expect(error?.message.contains("UNIQUE constraint failed: t.x") == true)
        #expect(error?.sql == insert)
        #expect(error?.description.contains(insert) == true)
        #expect(error?.description.contains("2067") == true)

        let syntax = #expect(throws: SQLiteError.self) { try db.execute("SELEKT 1") }
        #expect(syntax?.resultCode == 1)
        #expect(syntax?.sql == "SELEKT 1")

        let prepare = #expect(throws: SQLiteError.self) { _ = try db.rows("SELECT nope FROM t") }
        #expect(prepare?.message.contains("nope") == true)
        #expect(prepare?.sql == "SELECT nope FROM t")
    }

    @Test func errorsNeverContainBoundValues() throws {
        let secret = "hunter2-S3CR3T-value"
        let db = try Connection(location: .file(databaseURL))
        try db.execute("""
            CREATE TABLE u (x TEXT UNIQUE);
            CREATE TABLE c (x TEXT CHECK (length(x) < 5));
            CREATE TABLE s (n INTEGER) STRICT;
            CREATE TABLE nn (x TEXT NOT NULL, y TEXT NOT NULL);
            """)
        try db.run("INSERT INTO u (x) VALUES (?)", [.text(secret)])
        var errors: [SQLiteError] = []
        func capture(_ body: () throws -> Void) {
            do { try body() } catch let error as SQLiteError { errors.append(error) } catch { Issue.record("unexpected \(error)") }
        }
        capture { try db.run("INSERT INTO u (x) VALUES (?)", [.text(secret)]) }
        capture { try db.run("INSERT INTO c (x) VALUES (?)", [.text(secret)]) }
        capture { try db.run("INSERT INTO s (n) VALUES (?)", [.text(secret)]) }
        capture { try db.run("INSERT INTO nn (x, y) VALUES (?, ?)", [.text(secret), .null]) }
        capture { try db.run("INSERT INTO u (x) VALUES (?)", [.text(secret), .text(secret)]) } // too many values
        capture { _ = try db.rows("SELECT json(?)", [.text("{" + secret)]) }
        #expect(errors.count == 6)
        for error in errors {
            for text in [error.description, "\(error)", String(reflecting: error), error.message, error.sql ?? ""] {
                #expect(!text.contains(secret), "an SQLite error leaks a bound value: \(text)")
                #expect(!text.contains("hunter2"), "an SQLite error leaks part of a bound value: \(text)")
            }
        }
    }

    @Test func openingAMissingFileReadOnlyFails() {
        let error = #expect(throws: SQLiteError.self) {
            _ = try Connection(location: .file(databaseURL), readOnly: true)
        }
        #expect(error?.resultCode == 14) // SQLITE_CANTOPEN
        #expect(!FileManager.default.fileExists(atPath: databaseURL.path))
    }

    // MARK: Transactions

    struct Failure: Error {}

    @Test func transactionCommits() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x)")
        let result = try db.transaction {
            #expect(db.isInTransaction)
            try db.run("INSERT INTO t VALUES (1)")
            return 7
        }
        #expect(result == 7)
        #expect(!db.isInTransaction)
        let other = try Connection(location: .file(databaseURL))
        #expect(try other.scalar("SELECT count(*) FROM t") == .integer(1))
    }

    @Test func transactionRollsBackWhenTheBodyThrows() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x)")
        #expect(throws: Failure.self) {
            try db.transaction {
                try db.run("INSERT INTO t VALUES (1)")
                throw Failure()
            }
        }
        #expect(!db.isInTransaction)
        #expect(try db.scalar("SELECT count(*) FROM t") == .integer(0))
        // The connection is usable again.
        try db.transaction { try db.run("INSERT INTO t VALUES (2)") }
        #expect(try db.scalar("SELECT count(*) FROM t") == .integer(1))
    }

    @Test func nestedTransactionsAreSavepoints() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x)")
        try db.transaction {
            try db.run("INSERT INTO t VALUES (1)")
            // A failing inner transaction undoes only its own work.
            #expect(throws: Failure.self) {
                try db.transaction {
                    try db.run("INSERT INTO t VALUES (2)")
                    try db.transaction { try db.run("INSERT INTO t VALUES (3)") }
                    throw Failure()
                }
            }
            #expect(db.isInTransaction)
            // A succeeding inner transaction is kept, including its own nested savepoint.
            try db.transaction {
                try db.run("INSERT INTO t VALUES (4)")
                try db.transaction { try db.run("INSERT INTO t VALUES (5)") }
            }
        }
        #expect(!db.isInTransaction)
        #expect(try db.rows("SELECT x FROM t ORDER BY x") == [[.integer(1)], [.integer(4)], [.integer(5)]])

        // An error in an inner savepoint that escapes rolls the whole transaction back.
        #expect(throws: Failure.self) {
            try db.transaction {
                try db.run("INSERT INTO t VALUES (6)")
                try db.transaction { throw Failure() }
            }
        }
        #expect(try db.scalar("SELECT count(*) FROM t") == .integer(3))
        // Depth bookkeeping is back to zero: begin() works.
        try db.begin(.immediate)
        db.rollback()
    }

    @Test func readTransactionSeesAStableSnapshot() throws {
        let reader = try Connection(location: .file(databaseURL))
        try reader.execute("CREATE TABLE t (x)")
        try reader.run("INSERT INTO t VALUES (1)")
        let writer = try Connection(location: .file(databaseURL))
        try reader.transaction(.deferred) {
            #expect(try reader.scalar("SELECT count(*) FROM t") == .integer(1))
            // WAL: a writer can commit while the read transaction is open...
            try writer.transaction(.immediate) { try writer.run("INSERT INTO t VALUES (2)") }
            // ...and the reader keeps its snapshot until it ends.
            #expect(try reader.scalar("SELECT count(*) FROM t") == .integer(1))
        }
        #expect(try reader.scalar("SELECT count(*) FROM t") == .integer(2))
    }

    @Test func writeTransactionTakesTheWriteLockAtOnce() throws {
        let db = try Connection(location: .file(databaseURL))
        try db.execute("CREATE TABLE t (x)")
        let other = try Connection(location: .file(databaseURL), busyTimeoutMilliseconds: 0)
        try db.transaction(.immediate) {
            // Nothing written yet, but the lock is held: another writer is refused.
            let error = #expect(throws: SQLiteError.self) { try other.begin(.immediate) }
            #expect(error?.isBusy == true)
        }
        try db.transaction(.deferred) {
            // A deferred transaction takes no lock until it writes.
            try other.begin(.immediate)
            other.rollback()
        }
    }
}
