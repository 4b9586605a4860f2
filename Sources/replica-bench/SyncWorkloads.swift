import CSQLite
import Foundation
import Replica

// B9 — apply a remote batch: the sync engine merging `n` new records fetched from the cloud (field registers,
// ledger, history), against a raw upsert loop writing the same rows and the same history rows.

/// `n` cloud records as another device would upload them: every field stamped by that device.
func remoteBatch(_ n: Int) -> [CloudRecord] {
    let remote = UUID(uuidString: "01900000-0000-7000-8000-00000000beef")!
    let names = BenchRecord.schemaEntity.fieldNames
    return makeRecords(n, seed: 9).enumerated().map { i, record in
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 1_767_225_600_000 + Int64(i), logical: 0, replica: remote))
        let values = BenchRecord.entity.snapshot(of: record).values
        var fields: [String: CloudField] = [:]
        for (name, value) in zip(names, values) { fields[name] = CloudField(value: value, stamp: stamp) }
        return CloudRecord(recordID: record.id, recordType: BenchRecord.entityName, changeTag: "tag-\(i)", causalLength: 1,
                           created: stamp, fields: fields)
    }
}

nonisolated(unsafe) private var batches: [Int: [CloudRecord]] = [:]

func batch(_ n: Int) -> [CloudRecord] {
    if let b = batches[n] { return b }
    let b = remoteBatch(n)
    batches[n] = b
    return b
}

/// Replica: an engine that has created its zone, agreed on the schema and completed its first (empty) fetch is
/// handed the batch as the response to its next fetch. Timed: `handle` (merge, ledger, history, token; one
/// transaction).
func replicaMergeTrial(_ n: Int) throws -> Trial {
    let records = batch(n)
    let directory = trialDirectory("B9-replica")
    let container = try makeStore(directory, [BenchRecord.self], synced: true)
    let engine = try SyncEngine(container: container, storeName: "bench")
    let cloud = InMemoryCloudDatabase()
    for _ in 0..<20 {
        guard let request = try engine.nextRequest() else { break }
        try engine.handle(request.id, cloud.performNow(request.operation))
    }
    engine.setNeedsFetch()
    guard let request = try engine.nextRequest(), case .fetchZoneChanges = request.operation else {
        throw CheckFailed("B9: the engine did not ask for zone changes")
    }
    let response: Result<CloudOperationResult, CloudError> = .success(.changes(ZoneChangeBatch(
        records: records, token: ServerChangeToken(epoch: 1, sequence: Int64(n)), moreComing: false)))
    return Trial(run: {
        try engine.handle(request.id, response)
    }, check: {
        let raw = RawDB(path: storePath(directory))
        try require(raw.count("BenchRecord") == n, "B9: replica has \(raw.count("BenchRecord")) rows")
        try require(try engine.status().pendingRecords == 0, "B9: replica left records pending")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

/// Binds `fields[names[k]]` for k ≥ `index` to parameters k + 2 (text and blobs without copying) and runs `body`.
private func bindFields(_ s: OpaquePointer, _ record: CloudRecord, _ names: [String], from index: Int, _ body: () -> Void) {
    guard index < names.count else { return body() }
    let parameter = Int32(index + 2)
    switch record.fields[names[index]]?.value ?? .null {
    case .null: sqlite3_bind_null(s, parameter)
    case let .integer(v): sqlite3_bind_int64(s, parameter, v)
    case let .real(v): sqlite3_bind_double(s, parameter, v)
    case let .text(v): return withUTF8(v) { bindText(s, parameter, $0); bindFields(s, record, names, from: index + 1, body) }
    case let .blob(v):
        return v.withUnsafeBytes {
            sqlite3_bind_blob(s, parameter, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count), SQLITE_STATIC)
            bindFields(s, record, names, from: index + 1, body)
        }
    }
    bindFields(s, record, names, from: index + 1, body)
}

/// Raw: in one transaction, an upsert per record (`INSERT ... ON CONFLICT ("id") DO UPDATE`), then the history rows
/// Replica writes for an import (author `replica.sync`, one change row of inserts).
func rawMergeTrial(_ n: Int) throws -> Trial {
    let records = batch(n)
    let directory = trialDirectory("B9-raw")
    _ = try makeStore(directory, [BenchRecord.self], synced: true)
    let raw = RawDB(path: storePath(directory))
    let names = BenchRecord.schemaEntity.fieldNames
    let upsertSQL = BenchSQL.insert(BenchSQL.table) + " ON CONFLICT (\"id\") DO UPDATE SET "
        + names.map { "\"\($0)\" = excluded.\"\($0)\"" }.joined(separator: ", ")
    return Trial(run: {
        let begin = raw.prepare("BEGIN IMMEDIATE")
        let commit = raw.prepare("COMMIT")
        let upsert = raw.prepare(upsertSQL)
        raw.done(begin)
        var ids: [UInt8] = []
        ids.reserveCapacity(records.count * 16)
        for record in records {
            withBytes(of: record.recordID) { id in
                sqlite3_bind_blob(upsert, 1, id.baseAddress, 16, SQLITE_STATIC)
                bindFields(upsert, record, names, from: 0) {
                    if sqlite3_step(upsert) != SQLITE_DONE { raw.fail(-1, "upsert") }
                }
                ids.append(contentsOf: id)
            }
            sqlite3_reset(upsert)
        }
        ids.withUnsafeBytes { rawWriteHistory(raw, entity: "BenchRecord", kind: 0, ids: $0, author: "replica.sync") }
        raw.done(commit)
        for s in [begin, commit, upsert] { sqlite3_finalize(s) }
    }, check: {
        try require(raw.count("BenchRecord") == n, "B9: raw has \(raw.count("BenchRecord")) rows")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}
