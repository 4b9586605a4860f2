import CSQLite
import Foundation
import Replica

// B9 — apply a remote batch: the sync engine merging `n` new records fetched from the cloud (field registers,
// ledger, history), against a raw C loop doing the same SQL in the same transaction (the issue's baseline): per record
// the row upserted and its ledger row written with the statement text and bytes Replica writes (stamps encoded by
// hand, as a C program would), then the same history rows. The same raw loop without the ledger statement is reported
// too (`--only B9` prints both; "B9r" in the table), for the cost of the bookkeeping itself.

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
        replicaLedgerRow = raw.ledgerRow(records[0].recordID)
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

/// The ledger row Replica wrote for the first record of B9's batch (compared with the raw side's).
nonisolated(unsafe) private var replicaLedgerRow: [String]?

extension RawDB {
    /// The columns of `id`'s ledger row as text (blobs in hex), for checks.
    func ledgerRow(_ id: UUID) -> [String]? {
        let s = prepare("""
            SELECT entity, causal_length, created, hex(stamps), unknown, tombstone, redirect, change_tag, local_version,
                   pending, state FROM replica_sync_record WHERE id = ?
            """)
        defer { sqlite3_finalize(s) }
        let found = withBytes(of: id) { id in
            sqlite3_bind_blob(s, 1, id.baseAddress, 16, SQLITE_STATIC)
            return sqlite3_step(s) == SQLITE_ROW
        }
        guard found else { return nil }
        return (0..<sqlite3_column_count(s)).map { sqlite3_column_type(s, $0) == SQLITE_NULL ? "NULL" : columnString(s, $0) }
    }
}

/// The text of `SyncLedger.store`'s statement.
private let ledgerUpsertSQL = """
    INSERT INTO replica_sync_record (id, entity, causal_length, created, stamps, unknown, tombstone, redirect,
                                     change_tag, local_version, pending, state)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET entity = excluded.entity, causal_length = excluded.causal_length,
        created = excluded.created, stamps = excluded.stamps, unknown = excluded.unknown,
        tombstone = excluded.tombstone, redirect = excluded.redirect, change_tag = excluded.change_tag,
        local_version = excluded.local_version, pending = excluded.pending,
        state = CASE WHEN excluded.pending = 1 AND replica_sync_record.state NOT IN ('rejected', 'undecryptable')
                     THEN 'pending' WHEN excluded.pending = 0 THEN 'synced' ELSE replica_sync_record.state END
    """

/// Writes `value` big-endian at `p`.
@inline(__always)
private func putBigEndian<T: FixedWidthInteger>(_ value: T, _ p: UnsafeMutableRawPointer) {
    p.storeBytes(of: value.bigEndian, as: T.self)
}

/// Writes `value` as `width` lowercase hex digits at `p`.
@inline(__always)
private func putHex(_ value: UInt64, _ width: Int, _ p: UnsafeMutablePointer<UInt8>) {
    var v = value
    for k in stride(from: width - 1, through: 0, by: -1) {
        let nibble = UInt8(truncatingIfNeeded: v & 0xF)
        p[k] = nibble < 10 ? nibble &+ 48 : nibble &+ 87
        v >>= 4
    }
}

/// Raw ledger writing for B9: the compact `stamps` bytes of a record whose fields share one stamp (format 1, one
/// distinct stamp, then the entity's field names in UTF-8 order each with stamp index 0) and the 64-hex-digit
/// `created` text, encoded into reused buffers.
struct RawLedgerEncoder {
    var stamps: [UInt8]
    var created = [UInt8](repeating: 0, count: 64)
    let tailOffset = 2 + 36

    init(fieldNames: [String]) {
        let names = fieldNames.map { Array($0.utf8) }.sorted { $0.lexicographicallyPrecedes($1) }
        var tail: [UInt8] = [UInt8(names.count)]
        for name in names { tail.append(UInt8(name.count)); tail += name; tail.append(0) }
        stamps = [1, 1] + [UInt8](repeating: 0, count: 36) + tail
    }

    mutating func encode(_ stamp: FieldStamp) {
        let (high, low) = withUnsafeBytes(of: stamp.clock.replica.uuid) {
            (UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
             UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
        }
        stamps.withUnsafeMutableBytes { raw in
            let p = raw.baseAddress! + 2
            putBigEndian(UInt64(bitPattern: stamp.incarnation), p)
            putBigEndian(UInt64(bitPattern: stamp.clock.physical), p + 8)
            putBigEndian(UInt32(bitPattern: stamp.clock.logical), p + 16)
            putBigEndian(high, p + 20)
            putBigEndian(low, p + 28)
        }
        created.withUnsafeMutableBufferPointer { hex in
            let p = hex.baseAddress!
            putHex(UInt64(stamp.incarnation), 16, p)
            putHex(UInt64(stamp.clock.physical), 12, p + 16)
            putHex(UInt64(stamp.clock.logical), 4, p + 28)
            putHex(high, 16, p + 32)
            putHex(low, 16, p + 48)
        }
    }
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

/// Raw: in one transaction, per record an upsert of the row (`INSERT ... ON CONFLICT ("id") DO UPDATE`) and, with
/// `ledger`, of its ledger row (the statement and bytes `SyncLedger.store` writes), then the history rows Replica
/// writes for an import (author `replica.sync`, one change row of inserts).
func rawMergeTrial(_ n: Int, ledger: Bool = true) throws -> Trial {
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
        let ledgerUpsert = raw.prepare(ledgerUpsertSQL)
        var encoder = RawLedgerEncoder(fieldNames: names)
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
                guard ledger else { return }
                encoder.encode(record.created)
                let s = ledgerUpsert
                sqlite3_bind_blob(s, 1, id.baseAddress, 16, SQLITE_STATIC)
                sqlite3_bind_int64(s, 3, record.causalLength)
                encoder.created.withUnsafeBufferPointer { created in
                    encoder.stamps.withUnsafeBufferPointer { stamps in
                        withUTF8(record.changeTag ?? "") { tag in
                          withUTF8(record.recordType) { type in
                            bindText(s, 2, type)
                            bindText(s, 4, created)
                            sqlite3_bind_blob(s, 5, stamps.baseAddress, Int32(stamps.count), SQLITE_STATIC)
                            sqlite3_bind_null(s, 6)
                            sqlite3_bind_null(s, 7)
                            sqlite3_bind_null(s, 8)
                            bindText(s, 9, tag)
                            sqlite3_bind_int64(s, 10, 0)
                            sqlite3_bind_int64(s, 11, 0)
                            sqlite3_bind_text(s, 12, "synced", 6, SQLITE_STATIC)
                            if sqlite3_step(s) != SQLITE_DONE { raw.fail(-1, "ledger upsert") }
                          }
                        }
                    }
                }
                sqlite3_reset(s)
            }
            sqlite3_reset(upsert)
        }
        ids.withUnsafeBytes { rawWriteHistory(raw, entity: "BenchRecord", kind: 0, ids: $0, author: "replica.sync") }
        raw.done(commit)
        for s in [begin, commit, upsert, ledgerUpsert] { sqlite3_finalize(s) }
    }, check: {
        try require(raw.count("BenchRecord") == n, "B9: raw has \(raw.count("BenchRecord")) rows")
        guard ledger else { return }
        try require(raw.count("replica_sync_record") == n, "B9: raw has \(raw.count("replica_sync_record")) ledger rows")
        let row = raw.ledgerRow(records[0].recordID)
        if let expected = replicaLedgerRow {
            try require(row == expected, "B9: raw's ledger row \(row ?? []) differs from Replica's \(expected)")
        }
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}
