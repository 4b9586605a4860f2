import CSodium
import CSQLite
import Foundation
import Replica

// B6 — records with two ~64-byte encrypted fields, written on one device and received by another through sync
// encoding: what the engines actually do to make and take records.
//
// Replica (timed): device A inserts the records and saves (rows, history, sync ledger); A's engine builds the upload
// from its outbox and seals both fields of every record (XChaCha20-Poly1305, `FieldCipher`) — seal on the way out;
// device B's engine receives those sealed records as a fetched batch, opens both fields of every record and merges
// them (rows, ledger, history, token) — open on the way in.
// Raw (timed): the same rows inserted with the same history rows on A; per field one
// `crypto_aead_xchacha20poly1305_ietf_encrypt` with the same associated data, plaintext encoding and header Replica
// uses; on B per field one `crypto_aead_xchacha20poly1305_ietf_decrypt` and the row inserted, with B's history rows.
// The cloud round trip itself is not timed on either side (B receives exactly what A's engine emitted).

/// A record with two text fields marked for cloud encryption (~64 bytes each) and two plain ones.
struct BenchSecret: PersistentModel, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var secretA: String = ""
    var secretB: String = ""
    var count: Int = 0

    static let entity = ModelEntity<BenchSecret>([
        .attribute("title", \.title, default: ""),
        .attribute("secretA", \.secretA, default: "", options: .allowsCloudEncryption),
        .attribute("secretB", \.secretB, default: "", options: .allowsCloudEncryption),
        .attribute("count", \.count, default: 0),
    ])

    init(id: UUID, title: String, secretA: String, secretB: String, count: Int) {
        self.id = id
        self.title = title
        self.secretA = secretA
        self.secretB = secretB
        self.count = count
    }

    init(row: ModelRow) throws {
        id = row.id
        title = try row.decode(at: 0)
        secretA = try row.decode(at: 1)
        secretB = try row.decode(at: 2)
        count = try row.decode(at: 3)
    }

    /// A 64-byte secret: a prefix that varies per record, padded.
    static func secret(_ label: String, _ i: Int) -> String {
        let head = "\(label) \(i) "
        return head + String(repeating: "x", count: max(0, 64 - head.utf8.count))
    }
}

/// The data set of B6 (IDs assigned, built before timing).
func makeSecrets(_ n: Int) -> [BenchSecret] {
    let environment = ReplicaEnvironment.seeded(seed: 6, directory: FileManager.default.temporaryDirectory)
    return (0..<n).map { i in
        BenchSecret(id: environment.makeIdentifier(), title: "title \(i)", secretA: BenchSecret.secret("card", i),
                    secretB: BenchSecret.secret("pin", i), count: i)
    }
}

/// The field key both sides use.
let benchFieldKey = [UInt8](repeating: 0x5A, count: 32)

/// A synced device for B6: a container on a store file, its engine (upload batches as large as the data set) and
/// a context, with zone, schema and encryption set up against `cloud` before timing.
final class SecretDevice {
    let directory: URL
    let container: ModelContainer
    let engine: SyncEngine
    let context: ModelContext

    init(_ name: String, cloud: InMemoryCloudDatabase, batch: Int) throws {
        directory = trialDirectory(name)
        container = try makeStore(directory, [BenchSecret.self], synced: true)
        var options = SyncEngine.Options()
        options.uploadBatchSize = batch
        options.fetchLimit = batch
        engine = try SyncEngine(container: container, storeName: "bench", options: options,
                                encryption: try .rawKey(benchFieldKey))
        context = ModelContext(container)
        _ = try context.model(BenchSecret.self, id: .unassigned)
        for _ in 0..<50 {
            guard let request = try engine.nextRequest() else { break }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        guard try engine.nextRequest() == nil else { throw CheckFailed("B6: \(name)'s engine is not idle after set-up") }
    }
}

func replicaEncryptedTrial(_ n: Int) throws -> Trial {
    let records = makeSecrets(n)
    let cloud = InMemoryCloudDatabase()
    let a = try SecretDevice("B6-replica-a", cloud: cloud, batch: n)
    let b = try SecretDevice("B6-replica-b", cloud: cloud, batch: n)
    // B asks for zone changes (after whatever the encryption gate needs first, answered by the cloud).
    b.engine.setNeedsFetch()
    var next = try b.engine.nextRequest()
    for _ in 0..<10 {
        guard let request = next, !request.operation.isZoneFetch else { break }
        try b.engine.handle(request.id, cloud.performNow(request.operation))
        next = try b.engine.nextRequest()
    }
    guard let fetch = next, fetch.operation.isZoneFetch else {
        throw CheckFailed("B6: device B did not ask for zone changes (\(next.map { "\($0.operation)" } ?? "no request"))")
    }
    var uploaded = 0
    var sealedBytes = 0
    var phases: [Double] = []
    return Trial(run: {
        phases = []
        let t0 = cpuNow()
        for record in records { a.context.insert(record) }
        try a.context.save()
        let t1 = cpuNow()
        guard let upload = try a.engine.nextRequest(), case let .modifyRecords(sealed, _) = upload.operation else {
            throw CheckFailed("B6: device A did not upload")
        }
        let t2 = cpuNow()
        try b.engine.handle(fetch.id, .success(.changes(ZoneChangeBatch(
            records: sealed, token: ServerChangeToken(epoch: 1, sequence: Int64(sealed.count)), moreComing: false))))
        let t3 = cpuNow()
        phases = [t1 - t0, t2 - t1, t3 - t2]
        uploaded = sealed.count
        if case let .blob(bytes)? = sealed.first?.fields["secretA"]?.value { sealedBytes = bytes.count }
    }, check: {
        try require(uploaded == n, "B6: device A uploaded \(uploaded) records")
        try require(sealedBytes == 64 + FieldCipher.overhead, "B6: a sealed field has \(sealedBytes) bytes")
        let fetched = try ModelContext(b.container).fetch(FetchDescriptor<BenchSecret>())
        try require(fetched == records, "B6: device B's records differ from A's")
        try require(try b.engine.undecryptableRecords().isEmpty, "B6: device B could not open some records")
    }, cleanup: {
        try? FileManager.default.removeItem(at: a.directory)
        try? FileManager.default.removeItem(at: b.directory)
    }, note: {
        phases.count == 3 ? "save \(format(phases[0], 2))s, seal \(format(phases[1], 2))s, open+merge \(format(phases[2], 2))s" : nil
    })
}

extension CloudOperation {
    /// Whether this is a fetch of zone changes.
    var isZoneFetch: Bool { if case .fetchZoneChanges = self { true } else { false } }
}

/// Thread CPU seconds (for phase breakdowns inside a timed region).
func cpuNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Raw: the rows and history on A, `crypto_aead_xchacha20poly1305_ietf_encrypt` per field (nonces from
/// `randombytes_buf`, one call for the batch), then on B `crypto_aead_xchacha20poly1305_ietf_decrypt` per field and
/// the row inserted, with B's history rows. Sealed values use Replica's layout (format byte, key version, nonce,
/// ciphertext and tag) and associated data (record ID, zone, record type, field name, field stamp, format and key
/// version), so both sides encrypt and authenticate the same number of bytes.
///
/// With `ledger` (B6; B6r without), the raw side also writes the sync bookkeeping rows Replica writes, with the same
/// statement text: on A a ledger row per record (every field stamped, pending), on B a ledger row per record (synced)
/// beside the row, which is upserted as a merge does, and the server change token. So both sides write the same rows
/// — entity rows, ledger rows, history rows — and seal and open the same fields.
func rawEncryptedTrial(_ n: Int, ledger: Bool = false) throws -> Trial {
    guard sodium_init() >= 0 else { throw CheckFailed("B6: sodium_init failed") }
    let records = makeSecrets(n)
    let directoryA = trialDirectory("B6-raw-a"), directoryB = trialDirectory("B6-raw-b")
    _ = try makeStore(directoryA, [BenchSecret.self], synced: true)
    _ = try makeStore(directoryB, [BenchSecret.self], synced: true)
    let a = RawDB(path: storePath(directoryA)), b = RawDB(path: storePath(directoryB))
    let insertSQL = #"INSERT INTO "BenchSecret" ("id", "title", "secretA", "secretB", "count") VALUES (?, ?, ?, ?, ?)"#
    // A merge writes a fetched record's row as an upsert (B9's statement for this entity).
    let mergeSQL = ledger ? insertSQL + #" ON CONFLICT ("id") DO UPDATE SET "title" = excluded."title", "secretA" = excluded."secretA", "#
        + #""secretB" = excluded."secretB", "count" = excluded."count""# : insertSQL
    let fieldNames = BenchSecret.entity.schemaEntity.fieldNames
    let fields = ["secretA", "secretB"]
    let zone = "bench", recordType = "BenchSecret"
    let replica = UUID(uuidString: "01900000-0000-7000-8000-00000000a11c")!
    let header = 1 + 4 + 24, tag = 16
    var opened: [(String, String)] = []
    return Trial(run: {
        // A: the rows and their history, one transaction.
        let begin = a.prepare("BEGIN IMMEDIATE"), commit = a.prepare("COMMIT"), insert = a.prepare(insertSQL)
        let ledgerA = ledger ? a.prepare(rawLedgerInsertSQL) : nil
        var encoder = RawLedgerEncoder(fieldNames: fieldNames)
        let stampA = FieldStamp(incarnation: 1, clock: HLC(physical: nowMilliseconds(), logical: 0, replica: replica))
        a.done(begin)
        var ids: [UInt8] = []
        ids.reserveCapacity(n * 16)
        for r in records {
            if let ledgerA {
                encoder.encode(stampA)
                withBytes(of: r.id) { id in
                    rawWriteLedgerRow(a, ledgerA, id: id, entity: recordType, encoder: encoder, localVersion: 1, pending: true)
                }
            }
            withBytes(of: r.id) { id in
                withUTF8(r.title) { title in
                    withUTF8(r.secretA) { s1 in
                        withUTF8(r.secretB) { s2 in
                            sqlite3_bind_blob(insert, 1, id.baseAddress, 16, SQLITE_STATIC)
                            bindText(insert, 2, title)
                            bindText(insert, 3, s1)
                            bindText(insert, 4, s2)
                            sqlite3_bind_int64(insert, 5, Int64(r.count))
                            if sqlite3_step(insert) != SQLITE_DONE { a.fail(-1, "insert") }
                        }
                    }
                }
                ids.append(contentsOf: id)
            }
            sqlite3_reset(insert)
        }
        ids.withUnsafeBytes { rawWriteHistory(a, entity: recordType, kind: 0, ids: $0, author: nil) }
        a.done(commit)
        for s in [begin, commit, insert] { sqlite3_finalize(s) }
        sqlite3_finalize(ledgerA)

        // Seal: every field of every record into one buffer.
        let sealedLength = header + 1 + 64 + tag
        var sealed = [UInt8](repeating: 0, count: n * 2 * sealedLength)
        var nonces = [UInt8](repeating: 0, count: n * 2 * 24)
        nonces.withUnsafeMutableBytes { randombytes_buf($0.baseAddress!, $0.count) }
        var ad = [UInt8](repeating: 0, count: 256)
        var plain = [UInt8](repeating: 0, count: 1 + 256)
        func putAD(_ id: UUID, _ field: String, _ stamp: Int64, into p: UnsafeMutablePointer<UInt8>) -> Int {
            var o = 0
            func put(_ v: UInt64, _ width: Int) { for k in 0..<width { p[o + k] = UInt8(truncatingIfNeeded: v >> (8 * (width - 1 - k))) }; o += width }
            func put(_ s: String) { put(UInt64(s.utf8.count), 4); for byte in s.utf8 { p[o] = byte; o += 1 } }
            withUnsafeBytes(of: id.uuid) { for k in 0..<16 { p[o + k] = $0[k] } }
            o += 16
            put(zone); put(recordType); put(field)
            put(1, 8); put(UInt64(stamp), 8); put(0, 4)
            withUnsafeBytes(of: replica.uuid) { for k in 0..<16 { p[o + k] = $0[k] } }
            o += 16
            put(1, 1); put(1, 4)
            return o
        }
        benchFieldKey.withUnsafeBufferPointer { key in
            sealed.withUnsafeMutableBufferPointer { out in
                nonces.withUnsafeBufferPointer { nonce in
                    ad.withUnsafeMutableBufferPointer { ad in
                        plain.withUnsafeMutableBufferPointer { plain in
                            for (i, r) in records.enumerated() {
                                for (f, field) in fields.enumerated() {
                                    let slot = i * 2 + f
                                    let o = out.baseAddress! + slot * sealedLength
                                    let adCount = putAD(r.id, field, 1_767_225_600_000 + Int64(i), into: ad.baseAddress!)
                                    plain[0] = 3
                                    let count = withUTF8(f == 0 ? r.secretA : r.secretB) { text in
                                        (plain.baseAddress! + 1).update(from: text.baseAddress!, count: text.count)
                                        return 1 + text.count
                                    }
                                    o[0] = 1
                                    o[1] = 0; o[2] = 0; o[3] = 0; o[4] = 1
                                    (o + 5).update(from: nonce.baseAddress! + slot * 24, count: 24)
                                    var written: UInt64 = 0
                                    crypto_aead_xchacha20poly1305_ietf_encrypt(
                                        o + header, &written, plain.baseAddress, UInt64(count), ad.baseAddress, UInt64(adCount),
                                        nil, o + 5, key.baseAddress!)
                                }
                            }
                        }
                    }
                }
            }
        }

        // B: open every field and insert the rows, with B's history, one transaction.
        let beginB = b.prepare("BEGIN IMMEDIATE"), commitB = b.prepare("COMMIT"), insertB = b.prepare(mergeSQL)
        let ledgerB = ledger ? b.prepare(rawLedgerInsertSQL) : nil
        b.done(beginB)
        var out = [UInt8](repeating: 0, count: 2 * (1 + 256))
        benchFieldKey.withUnsafeBufferPointer { key in
            sealed.withUnsafeBufferPointer { input in
                ad.withUnsafeMutableBufferPointer { ad in
                    out.withUnsafeMutableBufferPointer { out in
                        for (i, r) in records.enumerated() {
                            var lengths = (0, 0)
                            for f in 0..<2 {
                                let slot = i * 2 + f
                                let s = input.baseAddress! + slot * sealedLength
                                guard s[0] == 1 else { b.fail(-1, "format") }
                                let adCount = putAD(r.id, fields[f], 1_767_225_600_000 + Int64(i), into: ad.baseAddress!)
                                var written: UInt64 = 0
                                let rc = crypto_aead_xchacha20poly1305_ietf_decrypt(
                                    out.baseAddress! + f * 257, &written, nil, s + header, UInt64(sealedLength - header),
                                    ad.baseAddress, UInt64(adCount), s + 5, key.baseAddress!)
                                guard rc == 0, out[f * 257] == 3 else { b.fail(-1, "decrypt") }
                                if f == 0 { lengths.0 = Int(written) - 1 } else { lengths.1 = Int(written) - 1 }
                            }
                            withBytes(of: r.id) { id in
                                withUTF8(r.title) { title in
                                    sqlite3_bind_blob(insertB, 1, id.baseAddress, 16, SQLITE_STATIC)
                                    bindText(insertB, 2, title)
                                    bindText(insertB, 3, UnsafeBufferPointer(start: out.baseAddress! + 1, count: lengths.0))
                                    bindText(insertB, 4, UnsafeBufferPointer(start: out.baseAddress! + 258, count: lengths.1))
                                    sqlite3_bind_int64(insertB, 5, Int64(r.count))
                                    if sqlite3_step(insertB) != SQLITE_DONE { b.fail(-1, "insert") }
                                }
                                if let ledgerB {
                                    encoder.encode(stampA)
                                    rawWriteLedgerRow(b, ledgerB, id: id, entity: recordType, encoder: encoder, localVersion: 0, pending: false)
                                }
                            }
                            sqlite3_reset(insertB)
                        }
                    }
                }
            }
        }
        ids.withUnsafeBytes { rawWriteHistory(b, entity: recordType, kind: 0, ids: $0, author: "replica.sync") }
        if ledger {
            // The new server change token, as the merge's transaction writes it.
            let token = b.prepare(rawTokenSQL)
            let text = "{\"epoch\":1,\"sequence\":\(n)}"
            withUTF8(text) { bindText(token, 1, $0); b.done(token) }
            sqlite3_finalize(token)
        }
        b.done(commitB)
        for s in [beginB, commitB, insertB] { sqlite3_finalize(s) }
        sqlite3_finalize(ledgerB)
    }, check: {
        try require(a.count(recordType) == n && b.count(recordType) == n, "B6: raw wrote \(a.count(recordType)) / \(b.count(recordType)) rows")
        if ledger {
            try require(a.count("replica_sync_record") == n && b.count("replica_sync_record") == n,
                        "B6: raw wrote \(a.count("replica_sync_record")) / \(b.count("replica_sync_record")) ledger rows")
        }
        let s = b.prepare(#"SELECT "secretA", "secretB" FROM "BenchSecret" WHERE "id" = ?"#)
        defer { sqlite3_finalize(s) }
        let found = withBytes(of: records[0].id) { id in
            sqlite3_bind_blob(s, 1, id.baseAddress, 16, SQLITE_STATIC)
            return sqlite3_step(s) == SQLITE_ROW
        }
        guard found else { throw CheckFailed("B6: raw B lacks the first record") }
        opened = [(columnString(s, 0), columnString(s, 1))]
        try require(opened[0] == (records[0].secretA, records[0].secretB), "B6: raw B's secrets differ from A's")
    }, cleanup: {
        try? FileManager.default.removeItem(at: directoryA)
        try? FileManager.default.removeItem(at: directoryB)
    })
}

/// The text of `SyncLedger`'s insert of a new ledger row (`insertSQL`).
let rawLedgerInsertSQL = """
    INSERT INTO replica_sync_record (id, entity, causal_length, created, stamps, unknown, tombstone, redirect,
                                     change_tag, local_version, pending, state)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO NOTHING
    """

/// The server change token's metadata row, written with a merged batch.
let rawTokenSQL = "INSERT INTO replica_metadata (key, value) VALUES ('server_change_token', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"

/// Writes one new ledger row (a record of causal length 1 whose fields share the encoder's stamp) with `s`, text and
/// blobs bound without copying, as B9's raw loop does.
@inline(__always)
func rawWriteLedgerRow(_ raw: RawDB, _ s: OpaquePointer, id: UnsafeRawBufferPointer, entity: String, encoder: RawLedgerEncoder,
                       localVersion: Int64, pending: Bool) {
    sqlite3_bind_blob(s, 1, id.baseAddress, 16, SQLITE_STATIC)
    sqlite3_bind_int64(s, 3, 1)
    sqlite3_bind_null(s, 6)
    sqlite3_bind_null(s, 7)
    sqlite3_bind_null(s, 8)
    sqlite3_bind_null(s, 9)
    sqlite3_bind_int64(s, 10, localVersion)
    sqlite3_bind_int64(s, 11, pending ? 1 : 0)
    if pending { sqlite3_bind_text(s, 12, "pending", 7, SQLITE_STATIC) } else { sqlite3_bind_text(s, 12, "synced", 6, SQLITE_STATIC) }
    withUTF8(entity) { entity in
        encoder.created.withUnsafeBufferPointer { created in
            encoder.stamps.withUnsafeBufferPointer { stamps in
                bindText(s, 2, entity)
                bindText(s, 4, created)
                sqlite3_bind_blob(s, 5, stamps.baseAddress, Int32(stamps.count), SQLITE_STATIC)
                if sqlite3_step(s) != SQLITE_DONE { raw.fail(-1, "ledger insert") }
            }
        }
    }
    sqlite3_reset(s)
}
