import CSQLite
import Foundation
import Replica

// B3 and B8: reads of a store built once per size (untimed) and shared by both sides and every repetition.
// B3 goes through the public query path: `fetch(FetchDescriptor<BenchRecord>())` (every record, in ID order),
// and the raw side runs the SQL text that query plan shows (`ModelContext.queryPlan(for:)`).

// MARK: B3 — fetch into models

nonisolated(unsafe) private var fetchStores: [Int: URL] = [:]

/// A store file holding `n` bench records (built once per size, through Replica).
func fetchStore(_ n: Int) throws -> URL {
    if let directory = fetchStores[n] { return directory }
    let directory = trialDirectory("B3-data")
    var configuration = ModelConfiguration("bench", url: directory.appendingPathComponent("bench.store"))
    configuration.tracksHistory = false
    let container = try ModelContainer(for: Schema([BenchRecord.self]), configurations: [configuration],
                                       environment: benchEnvironment(directory))
    let context = ModelContext(container)
    for record in makeRecords(n, seed: 3) { context.insert(record) }
    try context.save()
    fetchStores[n] = directory
    return directory
}

func replicaFetchTrial(_ n: Int) throws -> Trial {
    let directory = try fetchStore(n)
    var configuration = ModelConfiguration("bench", url: directory.appendingPathComponent("bench.store"))
    configuration.tracksHistory = false
    let container = try ModelContainer(for: Schema([BenchRecord.self]), configurations: [configuration],
                                       environment: benchEnvironment(directory))
    var context: ModelContext? = ModelContext(container)
    try warm(context!)
    var result: [BenchRecord] = []
    return Trial(run: {
        result = try context!.fetch(FetchDescriptor<BenchRecord>())
    }, check: {
        try require(result.count == n, "B3: replica fetched \(result.count)")
        let sum = BenchRecord.checksum(result)
        if let known = fetchChecksums[n] { try require(known == sum, "B3: replica's records differ from raw's") } else { fetchChecksums[n] = sum }
        result = []
        context = nil
    })
}

nonisolated(unsafe) private var fetchChecksums: [Int: Int] = [:]

/// B3d: B3 through the `Decodable` convenience path — the same store and query, decoded by the synthesized
/// `init(from:)` of `BenchCodableRecord` (same entity, same table) instead of a hand-written `init(row:)`.
func replicaDecodableFetchTrial(_ n: Int) throws -> Trial {
    let directory = try fetchStore(n)
    var configuration = ModelConfiguration("bench", url: directory.appendingPathComponent("bench.store"))
    configuration.tracksHistory = false
    let container = try ModelContainer(for: Schema([BenchCodableRecord.self]), configurations: [configuration],
                                       environment: benchEnvironment(directory))
    var context: ModelContext? = ModelContext(container)
    _ = try context!.model(BenchCodableRecord.self, id: .unassigned)
    var result: [BenchCodableRecord] = []
    return Trial(run: {
        result = try context!.fetch(FetchDescriptor<BenchCodableRecord>())
    }, check: {
        try require(result.count == n, "B3d: replica fetched \(result.count)")
        let sum = BenchRecord.checksum(result.map(BenchRecord.init))
        if let known = fetchChecksums[n] { try require(known == sum, "B3d: replica's records differ from raw's") } else { fetchChecksums[n] = sum }
        result = []
        context = nil
    })
}

@inline(__always)
func columnString(_ s: OpaquePointer, _ i: Int32) -> String {
    guard let p = sqlite3_column_text(s, i) else { return "" }
    return String(decoding: UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(s, i))), as: UTF8.self)
}

@inline(__always)
func columnUUID(_ s: OpaquePointer, _ i: Int32) -> UUID {
    var uuid = UUID.unassigned.uuid
    if sqlite3_column_bytes(s, i) == 16, let p = sqlite3_column_blob(s, i) {
        withUnsafeMutableBytes(of: &uuid) { $0.copyMemory(from: UnsafeRawBufferPointer(start: p, count: 16)) }
    }
    return UUID(uuid: uuid)
}

/// The SQL `fetch(FetchDescriptor<BenchRecord>())` runs, from its query plan; it selects the ID and the ten
/// attributes in field order and takes no parameters (checked).
func fetchSQL(_ directory: URL) throws -> String {
    var configuration = ModelConfiguration("bench", url: directory.appendingPathComponent("bench.store"))
    configuration.tracksHistory = false
    let container = try ModelContainer(for: Schema([BenchRecord.self]), configurations: [configuration],
                                       environment: benchEnvironment(directory))
    let plan = try ModelContext(container).queryPlan(for: FetchDescriptor<BenchRecord>())
    try require(!plan.filtersInMemory && !plan.sortsInMemory && !plan.sql.contains("?"),
                "B3: the plan is not one parameterless SQL query: \(plan)")
    return plan.sql
}

/// Raw: the same SELECT, one `BenchRecord` per row straight from `sqlite3_column_*`.
func rawFetchTrial(_ n: Int) throws -> Trial {
    let directory = try fetchStore(n)
    let raw = RawDB(path: storePath(directory))
    let sql = try fetchSQL(directory)
    var result: [BenchRecord] = []
    return Trial(run: {
        let s = raw.prepare(sql)
        while sqlite3_step(s) == SQLITE_ROW {
            result.append(BenchRecord(
                id: columnUUID(s, 0), name: columnString(s, 1), email: columnString(s, 2),
                age: Int(sqlite3_column_int64(s, 3)), score: sqlite3_column_double(s, 4),
                active: sqlite3_column_int64(s, 5) != 0,
                created: Date(timeIntervalSince1970: sqlite3_column_double(s, 6)),
                note: sqlite3_column_type(s, 7) == SQLITE_NULL ? nil : columnString(s, 7),
                count: Int(sqlite3_column_int64(s, 8)), ratio: sqlite3_column_double(s, 9), tag: columnString(s, 10)))
        }
        sqlite3_finalize(s)
    }, check: {
        try require(result.count == n, "B3: raw fetched \(result.count)")
        let sum = BenchRecord.checksum(result)
        if let known = fetchChecksums[n] { try require(known == sum, "B3: raw checksum changed") } else { fetchChecksums[n] = sum }
        result = []
    })
}

// MARK: B8 — read history after a token

/// A store with one first transaction (the token to read after) and then `n` changes in transactions of 50:
/// 25 inserts and 25 updates of one field of the previous transaction's records (two change rows each).
struct HistoryStore {
    var directory: URL
    var afterToken: HistoryToken
    var changes: Int
}

nonisolated(unsafe) private var historyStores: [Int: HistoryStore] = [:]

func historyStore(_ n: Int) throws -> HistoryStore {
    if let store = historyStores[n] { return store }
    let directory = trialDirectory("B8-data")
    let container = try makeStore(directory, [BenchRecord.self])
    let context = ModelContext(container)
    let records = makeRecords(n / 2 + 26, seed: 8)
    context.insert(records[0])
    try context.save()
    let token = try context.currentHistoryToken(of: "bench")
    var previous: [BenchRecord] = []
    var next = 1
    var written = 0
    while written < n {
        let fresh = Array(records[next..<next + 25])
        next += 25
        for record in fresh { context.insert(record) }
        for var record in previous {
            record.score += 1
            context.update(record)
        }
        try context.save()
        written += fresh.count + previous.count
        previous = fresh
    }
    let store = HistoryStore(directory: directory, afterToken: token, changes: written)
    historyStores[n] = store
    return store
}

func replicaHistoryTrial(_ n: Int) throws -> Trial {
    let store = try historyStore(n)
    let container = try makeStore(store.directory, [BenchRecord.self])
    let context = ModelContext(container)
    _ = try context.currentHistoryToken(of: "bench")
    var result: [HistoryTransaction] = []
    return Trial(run: {
        result = try context.fetchHistory(HistoryDescriptor(after: store.afterToken))
    }, check: {
        let count = result.reduce(0) { $0 + $1.changes.count }
        try require(count == store.changes, "B8: replica read \(count) changes, expected \(store.changes)")
        result = []
    })
}

/// What the raw side builds: the same information as `HistoryTransaction` / `HistoryChange`.
struct RawHistoryTransaction {
    var token: Int64
    var timestamp: Date
    var author: String?
    var bundleIdentifier: String
    var processName: String
    var processID: Int32
    var changes: [RawHistoryChange]
}

struct RawHistoryChange {
    var entity: String
    var kind: Int64
    var id: UUID
    var updatedAttributes: [String]
}

/// Raw: the statements `fetchHistory` runs — a read transaction, the expiry watermark, the transaction headers after
/// the token, one range scan of their changes — merged into transactions in one pass.
func rawHistoryTrial(_ n: Int) throws -> Trial {
    let store = try historyStore(n)
    let raw = RawDB(path: storePath(store.directory))
    var result: [RawHistoryTransaction] = []
    return Trial(run: {
        let begin = raw.prepare("BEGIN DEFERRED")
        let commit = raw.prepare("COMMIT")
        let pruned = raw.prepare("SELECT value FROM replica_metadata WHERE key = 'history_pruned_through'")
        let headers = raw.prepare(
            "SELECT token, timestamp, author, bundle_identifier, process_name, process_id FROM replica_history_transaction t WHERE token > ? ORDER BY token ASC")
        let changes = raw.prepare(
            "SELECT token, entity, kind, fields, ids, tombstone FROM replica_history_change WHERE token BETWEEN ? AND ? ORDER BY token, seq")
        raw.done(begin)
        let prunedThrough = sqlite3_step(pruned) == SQLITE_ROW ? sqlite3_column_int64(pruned, 0) : 0
        sqlite3_reset(pruned)
        guard store.afterToken.value >= prunedThrough else { raw.fail(-1, "expired") }
        sqlite3_bind_int64(headers, 1, store.afterToken.value)
        while sqlite3_step(headers) == SQLITE_ROW {
            result.append(RawHistoryTransaction(
                token: sqlite3_column_int64(headers, 0),
                timestamp: Date(timeIntervalSince1970: Double(sqlite3_column_int64(headers, 1)) / 1000),
                author: sqlite3_column_type(headers, 2) == SQLITE_NULL ? nil : columnString(headers, 2),
                bundleIdentifier: columnString(headers, 3), processName: columnString(headers, 4),
                processID: Int32(truncatingIfNeeded: sqlite3_column_int64(headers, 5)), changes: []))
        }
        sqlite3_reset(headers)
        if let first = result.first, let last = result.last {
            sqlite3_bind_int64(changes, 1, first.token)
            sqlite3_bind_int64(changes, 2, last.token)
            var index = 0
            while sqlite3_step(changes) == SQLITE_ROW {
                let token = sqlite3_column_int64(changes, 0)
                while index < result.count && result[index].token < token { index += 1 }
                guard index < result.count, result[index].token == token else { continue }
                let entity = columnString(changes, 1)
                let kind = sqlite3_column_int64(changes, 2)
                let fields = sqlite3_column_type(changes, 3) == SQLITE_NULL ? [] : columnString(changes, 3).split(separator: ",").map(String.init)
                let count = Int(sqlite3_column_bytes(changes, 4)) / 16
                guard let ids = sqlite3_column_blob(changes, 4) else { continue }
                result[index].changes.reserveCapacity(result[index].changes.count + count)
                for k in 0..<count {
                    var uuid = UUID.unassigned.uuid
                    withUnsafeMutableBytes(of: &uuid) { $0.copyMemory(from: UnsafeRawBufferPointer(start: ids + 16 * k, count: 16)) }
                    result[index].changes.append(RawHistoryChange(entity: entity, kind: kind, id: UUID(uuid: uuid), updatedAttributes: fields))
                }
            }
            sqlite3_reset(changes)
        }
        raw.done(commit)
        for s in [begin, commit, pruned, headers, changes] { sqlite3_finalize(s) }
    }, check: {
        let count = result.reduce(0) { $0 + $1.changes.count }
        try require(count == store.changes, "B8: raw read \(count) changes, expected \(store.changes)")
        result = []
    })
}

// MARK: B8T — the same tail at two total history lengths

/// A store whose history holds `total` transactions of `changesPerTransaction` inserts each (one change row per
/// transaction, in `HistoryLog`'s layout), written with SQL outside timing (saving 100k transactions one by one
/// would dominate the run, and under callgrind take minutes); the token to read after leaves `tail` transactions.
struct HistoryTailStore {
    var directory: URL
    var afterToken: HistoryToken
    var total: Int
    var tail: Int
    var changes: Int
}

nonisolated(unsafe) private var historyTailStores: [Int: HistoryTailStore] = [:]

let changesPerTailTransaction = 10

func historyTailStore(total: Int, tail: Int) throws -> HistoryTailStore {
    if let store = historyTailStores[total] { return store }
    let directory = trialDirectory("B8T-data-\(total)")
    let container = try makeStore(directory, [BenchRecord.self])
    let context = ModelContext(container)
    _ = try context.currentHistoryToken(of: "bench")
    let raw = RawDB(path: storePath(directory))
    raw.exec("BEGIN IMMEDIATE")
    raw.exec("""
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(total))
        INSERT INTO replica_history_transaction (timestamp, author, bundle_identifier, process_name, process_id)
        SELECT 1700000000000 + i, NULL, '\(benchIdentity.bundleIdentifier)', '\(benchIdentity.processName)', \(benchIdentity.processID) FROM n
        """)
    // Distinct, deterministic 16-byte IDs: the token and the position as 8 decimal digits each.
    raw.exec("""
        WITH RECURSIVE k(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j < \(changesPerTailTransaction - 1))
        INSERT INTO replica_history_change (token, seq, entity, kind, fields, ids, tombstone)
        SELECT token, 0, 'BenchRecord', 0, NULL,
               CAST((SELECT group_concat(printf('%08d%08d', token, j), '') FROM k) AS BLOB), NULL
        FROM replica_history_transaction
        """)
    raw.exec("COMMIT")
    let latest = try context.currentHistoryToken(of: "bench")
    guard latest.value == Int64(total) else { throw CheckFailed("B8T: store has \(latest.value) transactions") }
    let store = HistoryTailStore(directory: directory, afterToken: HistoryToken(storeIdentity: latest.storeIdentity, value: Int64(total - tail)),
                                 total: total, tail: tail, changes: tail * changesPerTailTransaction)
    historyTailStores[total] = store
    return store
}

/// Replica's `fetchHistory(after:)` of the newest `tail` transactions of a store with `total` transactions. B8T's
/// two sides are both this, at 100k and at 10k total transactions: their ratio is how the cost depends on the
/// history before the token (1.0 for O(N) in the transactions returned).
func historyTailTrial(total: Int, tail: Int) throws -> Trial {
    let store = try historyTailStore(total: total, tail: tail)
    let container = try makeStore(store.directory, [BenchRecord.self])
    let context = ModelContext(container)
    _ = try context.currentHistoryToken(of: "bench")
    // One small read before timing (as B8's warm-up run does): the first fetch in a process pays one-time type
    // metadata set-up, which should not land on whichever side runs first.
    _ = try context.fetchHistory(HistoryDescriptor(after: HistoryToken(storeIdentity: store.afterToken.storeIdentity,
                                                                        value: Int64(store.total - 1))))
    var result: [HistoryTransaction] = []
    return Trial(run: {
        result = try context.fetchHistory(HistoryDescriptor(after: store.afterToken))
    }, check: {
        let count = result.reduce(0) { $0 + $1.changes.count }
        try require(result.count == store.tail && count == store.changes,
                    "B8T: read \(result.count) transactions, \(count) changes; expected \(store.tail), \(store.changes)")
        result = []
    }, note: { "\(store.tail) of \(store.total) transactions" })
}
