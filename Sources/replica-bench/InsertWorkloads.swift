import CSQLite
import Foundation
import Replica

// B1, B2, B4, B5: writes.
//
// Both sides start from the same in-memory data set (records with their IDs already assigned, built before timing)
// and an open connection to a store file whose schema Replica created; each run gets a new file. The timed part is
// the work an app asks for: "store these records".

/// A store file with the schema Replica creates for `models`, and a container on it (for Replica's side) or just
/// the file (for the raw side, which opens it with `RawDB`).
func makeStore(_ directory: URL, _ models: [any PersistentModel.Type], tracksHistory: Bool = true,
               synced: Bool = false) throws -> ModelContainer {
    var configuration = ModelConfiguration("bench", url: directory.appendingPathComponent("bench.store"),
                                           cloudKitDatabase: synced ? .private("iCloud.bench") : .none)
    configuration.tracksHistory = tracksHistory
    return try ModelContainer(for: Schema(models), configurations: [configuration], environment: benchEnvironment(directory))
}

func storePath(_ directory: URL) -> String { directory.appendingPathComponent("bench.store").path }

/// Opens the context's connection to the store before timing (the raw side opens its connection before timing too).
func warm(_ context: ModelContext) throws {
    _ = try context.model(BenchRecord.self, id: .unassigned)
}

// MARK: Replica

/// Inserts `records` through a context and saves once.
func replicaInsertTrial<Model: PersistentModel>(_ records: [Model], tracksHistory: Bool, name: String) throws -> Trial {
    let directory = trialDirectory(name)
    let container = try makeStore(directory, [Model.self], tracksHistory: tracksHistory)
    let context = ModelContext(container)
    _ = try context.model(Model.self, id: .unassigned)
    return Trial(run: {
        for record in records { context.insert(record) }
        try context.save()
    }, check: {
        let raw = RawDB(path: storePath(directory))
        try require(raw.count(Model.entityName) == records.count, "\(name): replica wrote \(raw.count(Model.entityName)) rows")
        let history = raw.count("replica_history_transaction")
        try require(history == (tracksHistory ? 1 : 0), "\(name): replica wrote \(history) history transactions")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

// MARK: Raw

/// Binds one record's 11 values (ID and ten attributes) without copying and runs `body` (which steps) while the
/// bytes are alive: what a careful C program does with its own buffers.
@inline(__always)
func bindRecord(_ s: OpaquePointer, _ r: BenchRecord, _ body: () -> Void) {
    withBytes(of: r.id) { id in
        withUTF8(r.name) { name in
            withUTF8(r.email) { email in
                withUTF8(r.tag) { tag in
                    sqlite3_bind_blob(s, 1, id.baseAddress, 16, SQLITE_STATIC)
                    bindText(s, 2, name)
                    bindText(s, 3, email)
                    sqlite3_bind_int64(s, 4, Int64(r.age))
                    sqlite3_bind_double(s, 5, r.score)
                    sqlite3_bind_int64(s, 6, r.active ? 1 : 0)
                    sqlite3_bind_double(s, 7, r.created.timeIntervalSince1970)
                    sqlite3_bind_int64(s, 9, Int64(r.count))
                    sqlite3_bind_double(s, 10, r.ratio)
                    bindText(s, 11, tag)
                    if let note = r.note {
                        withUTF8(note) { note in
                            bindText(s, 8, note)
                            body()
                        }
                    } else {
                        sqlite3_bind_null(s, 8)
                        body()
                    }
                }
            }
        }
    }
}

/// The raw side of B1/B2/B4: BEGIN IMMEDIATE, the same INSERT per record, (B4: the same history rows), COMMIT.
func rawInsertTrial(_ records: [BenchRecord], history: Bool, name: String) throws -> Trial {
    let directory = trialDirectory(name)
    _ = try makeStore(directory, [BenchRecord.self], tracksHistory: history)
    let raw = RawDB(path: storePath(directory))
    _ = benchIdentity  // initialized before timing (Replica's side reads its environment's identity before timing too)
    return Trial(run: {
        let begin = raw.prepare("BEGIN IMMEDIATE")
        let commit = raw.prepare("COMMIT")
        let insert = raw.prepare(BenchSQL.insert(BenchSQL.table))
        raw.done(begin)
        var ids: [UInt8] = []
        if history { ids.reserveCapacity(records.count * 16) }
        for record in records {
            bindRecord(insert, record) {
                if sqlite3_step(insert) != SQLITE_DONE { raw.fail(-1, "insert") }
            }
            sqlite3_reset(insert)
            if history { withBytes(of: record.id) { ids.append(contentsOf: $0) } }
        }
        if history { ids.withUnsafeBytes { rawWriteHistory(raw, entity: "BenchRecord", kind: 0, ids: $0, author: nil) } }
        raw.done(commit)
        for s in [begin, commit, insert] { sqlite3_finalize(s) }
    }, check: {
        try require(raw.count("BenchRecord") == records.count, "\(name): raw wrote \(raw.count("BenchRecord")) rows")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

/// Writes the history rows Replica writes for one save of same-kind changes of one entity: one transaction row
/// (timestamp, author, process identity) and one change row packing the 16-byte IDs (HistoryLog's layout).
func rawWriteHistory(_ raw: RawDB, entity: String, kind: Int64, ids: UnsafeRawBufferPointer, author: String?,
                     statements: (OpaquePointer, OpaquePointer)? = nil) {
    let transaction = statements?.0 ?? raw.prepare(BenchSQL.historyTransaction)
    let change = statements?.1 ?? raw.prepare(BenchSQL.historyChange)
    defer { if statements == nil { sqlite3_finalize(transaction); sqlite3_finalize(change) } }
    sqlite3_bind_int64(transaction, 1, nowMilliseconds())
    if let author { withUTF8(author) { bindText(transaction, 2, $0) } } else { sqlite3_bind_null(transaction, 2) }
    let identity = benchIdentity
    withUTF8(identity.bundleIdentifier) { bundle in
        withUTF8(identity.processName) { process in
            bindText(transaction, 3, bundle)
            bindText(transaction, 4, process)
            sqlite3_bind_int64(transaction, 5, Int64(identity.processID))
            guard sqlite3_step(transaction) == SQLITE_ROW else { raw.fail(-1, "history transaction") }
        }
    }
    let token = sqlite3_column_int64(transaction, 0)
    while sqlite3_step(transaction) == SQLITE_ROW {}
    sqlite3_reset(transaction)
    sqlite3_bind_int64(change, 1, token)
    sqlite3_bind_int64(change, 2, 0)
    withUTF8(entity) { entity in
        bindText(change, 3, entity)
        sqlite3_bind_int64(change, 4, kind)
        sqlite3_bind_null(change, 5)
        sqlite3_bind_blob(change, 6, ids.baseAddress, Int32(ids.count), SQLITE_STATIC)
        sqlite3_bind_null(change, 7)
        raw.done(change)
    }
}

// MARK: B5

/// Replica: one insert and one save per record (each save is one SQLite transaction with its history).
func replicaSingleSavesTrial(_ records: [BenchRecord]) throws -> Trial {
    let directory = trialDirectory("B5-replica")
    let container = try makeStore(directory, [BenchRecord.self])
    let context = ModelContext(container)
    try warm(context)
    return Trial(run: {
        for record in records {
            context.insert(record)
            try context.save()
        }
    }, check: {
        let raw = RawDB(path: storePath(directory))
        try require(raw.count("BenchRecord") == records.count, "B5: replica wrote \(raw.count("BenchRecord")) rows")
        try require(raw.count("replica_history_transaction") == records.count, "B5: replica history")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

/// Raw: per record BEGIN IMMEDIATE, the INSERT, the two history rows, COMMIT (prepared once, reused).
func rawSingleSavesTrial(_ records: [BenchRecord]) throws -> Trial {
    let directory = trialDirectory("B5-raw")
    _ = try makeStore(directory, [BenchRecord.self])
    let raw = RawDB(path: storePath(directory))
    return Trial(run: {
        let begin = raw.prepare("BEGIN IMMEDIATE")
        let commit = raw.prepare("COMMIT")
        let insert = raw.prepare(BenchSQL.insert(BenchSQL.table))
        let historyStatements = (raw.prepare(BenchSQL.historyTransaction), raw.prepare(BenchSQL.historyChange))
        for record in records {
            raw.done(begin)
            bindRecord(insert, record) {
                if sqlite3_step(insert) != SQLITE_DONE { raw.fail(-1, "insert") }
            }
            sqlite3_reset(insert)
            withBytes(of: record.id) { id in
                rawWriteHistory(raw, entity: "BenchRecord", kind: 0, ids: id, author: nil, statements: historyStatements)
            }
            raw.done(commit)
        }
        for s in [begin, commit, insert, historyStatements.0, historyStatements.1] { sqlite3_finalize(s) }
    }, check: {
        try require(raw.count("BenchRecord") == records.count, "B5: raw wrote \(raw.count("BenchRecord")) rows")
        try require(raw.count("replica_history_transaction") == records.count, "B5: raw history")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}
