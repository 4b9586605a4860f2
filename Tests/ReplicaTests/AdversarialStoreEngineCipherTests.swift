import CSQLite
import CSodium
import Foundation
import Testing
@_spi(Simulation) @testable import Replica

// Adversarial tests of the changes in 0cfcf04..break4 (many-to-many refusal, outbox index, lease cache, SQL functions
// per connection, FieldCipher rewrite, SQLiteTuning).

// MARK: - Helpers

private func tempDir(_ tag: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("replica-break4-\(tag)-\(UUID().uuidString)")
}

private func linkTables(_ db: Connection) throws -> [String] {
    try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'replica_link_%' ORDER BY name").compactMap {
        if case let .text(name) = $0[0] { name } else { nil }
    }
}

private func attr(_ name: String) -> Schema.Attribute { Schema.Attribute(name: name, type: .string, isOptional: true) }

/// Called from the SQLite trace callback of the lease race test (one test installs it, on its own connection).
nonisolated(unsafe) private var leaseRaceHook: (() -> Void)?

private let leaseTrace: @convention(c) (UInt32, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Int32 = { _, _, _, sql in
    guard let sql, let hook = leaseRaceHook else { return 0 }
    let text = String(cString: sql.assumingMemoryBound(to: CChar.self))
    // The statement that parses the lease after its text was read (the text of the parse before and after the fix).
    if text.contains("json_extract(value, '$.holder'), json_extract(value, '$.expires')") || text.contains("json_extract(?1, '$.holder')") {
        leaseRaceHook = nil
        hook()
    }
    return 0
}

@Suite("Adversarial: many-to-many refusal", .serialized)
struct AdversarialManyToManyTests {
    /// `Zed.tags` (to-many) names `Alpha.notes` as its inverse; `Alpha.notes` (to-many) names none. The structural
    /// validator accepts an inverse declared on one side only, `LinkTable.of(Zed.tags)` sees a to-many inverse and
    /// creates `replica_link_Alpha_notes`, but `syncedViolations` only reports a pair from the side that sorts first
    /// ((Alpha, notes)), which has no inverse, so nothing is reported.
    @Test("a many-to-many pair whose inverse is declared only on the side sorting last is refused in a synced store")
    func oneSidedInverseManyToMany() throws {
        let schema = Schema(entities: [
            Schema.Entity(name: "Zed", attributes: [attr("name")], relationships: [
                Schema.Relationship(name: "tags", destination: "Alpha", inverse: "notes", isToMany: true),
            ]),
            Schema.Entity(name: "Alpha", attributes: [attr("label")], relationships: [
                Schema.Relationship(name: "notes", destination: "Zed", inverse: nil, isToMany: true),
            ]),
        ])
        let directory = tempDir("m2m")
        defer { try? FileManager.default.removeItem(at: directory) }
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: directory)
        var tables: [String] = []
        let error = #expect(throws: ReplicaError.self) {
            let container = try ModelContainer(for: schema, configurations: [
                ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test")),
            ], environment: environment)
            tables = try linkTables(try ModelContext(container).connection(for: 0))
        }
        #expect(tables.isEmpty, "synced store got link tables \(tables)")
        #expect(error?.schemaViolations.contains { if case .syncedManyToMany = $0 { true } else { false } } == true)
    }

    @Test("the mirror image (inverse declared only on the side sorting first) is refused")
    func oneSidedInverseSortingFirst() {
        let schema = Schema(entities: [
            Schema.Entity(name: "Alpha", attributes: [attr("label")], relationships: [
                Schema.Relationship(name: "notes", destination: "Zed", inverse: "tags", isToMany: true),
            ]),
            Schema.Entity(name: "Zed", attributes: [attr("name")], relationships: [
                Schema.Relationship(name: "tags", destination: "Alpha", inverse: nil, isToMany: true),
            ]),
        ])
        let directory = tempDir("m2m2")
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, configurations: [ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test"))],
                                   environment: .seeded(seed: 1, directory: directory))
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("synced.store").path))
    }

    @Test("self-referencing many-to-many and the catch-all configuration are refused; nothing is created on disk")
    func selfReferenceAndCatchAll() throws {
        let schema = Schema(entities: [
            Schema.Entity(name: "Person", attributes: [attr("name")], relationships: [
                Schema.Relationship(name: "friends", destination: "Person", inverse: "friends", isToMany: true),
            ]),
            Schema.Entity(name: "Other", attributes: [attr("x")]),
        ])
        let directory = tempDir("self")
        defer { try? FileManager.default.removeItem(at: directory) }
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, configurations: [
                ModelConfiguration("local", schema: Schema(entities: [schema.entity(named: "Other")!])),
                ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test")),
            ], environment: .seeded(seed: 1, directory: directory))
        }
        #expect(error?.schemaViolations == [.syncedManyToMany(entity: "Person", relationship: "friends", inverse: "Person.friends")])
        let leftovers = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        #expect(leftovers.isEmpty, "\(leftovers)")
    }
}

@Suite("Adversarial: outbox index", .serialized)
struct AdversarialOutboxTests {
    private func oldLayout(_ db: Connection) throws {
        try db.execute("DROP INDEX IF EXISTS replica_sync_record_outbox")
        try db.execute("CREATE INDEX IF NOT EXISTS replica_sync_record_pending ON replica_sync_record (pending) WHERE pending = 1")
    }

    private func expectedOutbox(_ db: Connection) throws -> [UUID] {
        try db.rows("""
            SELECT id FROM replica_sync_record NOT INDEXED WHERE pending = 1 AND state NOT IN ('rejected', 'undecryptable') ORDER BY id
            """).compactMap { try? UUID(sqliteValue: $0[0]) }
    }

    @Test("old layout: read-only open, two containers opening at once, an older version reopening; the outbox stays whole and ordered")
    func oldLayoutLifecycle() throws {
        let directory = tempDir("outbox")
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            let device = try Device("a", seed: 2, directory: directory)
            for i in 0..<300 { device.context.insert(SyncNote(title: "n\(i)", rating: i)) }
            try device.context.save()
            let db = try device.context.connection(for: 0)
            try db.execute("UPDATE replica_sync_record SET state = 'rejected' WHERE rowid % 7 = 0")
            try oldLayout(db)
        }
        // Read-only open of the old layout: no migration possible; the outbox still reads right.
        do {
            var environment = ReplicaEnvironment.seeded(seed: 5, directory: directory)
            environment.canaries = []
            let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
                ModelConfiguration("notes", allowsSave: false, cloudKitDatabase: .private("iCloud.test")),
            ], environment: environment)
            let context = ModelContext(container)
            #expect(try context.fetch(FetchDescriptor<SyncNote>()).count == 300)
            let db = try context.connection(for: 0)
            let expected = try expectedOutbox(db)
            #expect(expected.count > 200)
            for limit in [1, 7, 100, 1000] {
                let got = try SyncLedger.outbox(limit: limit, store: container.stores[0], db: db).map(\.record.recordID)
                #expect(got == Array(expected.prefix(limit)))
            }
        }
        // Two "processes" open the old-layout file at once.
        final class Box: @unchecked Sendable { var devices: [Device?] = [nil, nil]; var errors: [Error?] = [nil, nil] }
        let box = Box()
        let lock = NSLock()
        DispatchQueue.concurrentPerform(iterations: 2) { i in
            do {
                let d = try Device(i == 0 ? "b" : "c", seed: UInt64(10 + i), directory: directory)
                lock.withLock { box.devices[i] = d }
            } catch {
                lock.withLock { box.errors[i] = error }
            }
        }
        let devices = box.devices, errors = box.errors
        #expect(errors.allSatisfy { $0 == nil }, "\(errors)")
        let b = try #require(devices[0]), c = try #require(devices[1])
        let db = try b.context.connection(for: 0)
        let names = Set(try db.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'replica_sync_record'").compactMap {
            if case let .text(n) = $0[0] { n } else { nil }
        })
        #expect(names.contains("replica_sync_record_outbox") && !names.contains("replica_sync_record_pending"), "\(names)")
        let expected = try expectedOutbox(db)
        #expect(try SyncLedger.outbox(limit: 1000, store: b.container.stores[0], db: db).map(\.record.recordID) == expected)
        let cdb = try c.context.connection(for: 0)
        #expect(try SyncLedger.outbox(limit: 1000, store: c.container.stores[0], db: cdb).map(\.record.recordID) == expected)
        // An older version reopens it (its createSQL adds the pending-only index back) while this one is open.
        try cdb.execute("CREATE INDEX IF NOT EXISTS replica_sync_record_pending ON replica_sync_record (pending) WHERE pending = 1")
        try cdb.execute("ANALYZE")
        #expect(try SyncLedger.outbox(limit: 1000, store: b.container.stores[0], db: db).map(\.record.recordID) == expected)
        #expect(try SyncLedger.outbox(limit: 50, store: c.container.stores[0], db: cdb).map(\.record.recordID) == Array(expected.prefix(50)))
    }
}

@Suite("Adversarial: sync engine", .serialized)
struct AdversarialLeaseAndConnectionTests {
    /// `acquireLease().current()` reads the `sync_lease` text with one statement and parses the lease with a second
    /// one, then caches (first text -> second parse). Another process writing between the two statements leaves the
    /// cache mapping A's lease text to "no lease"; when A's lease text comes back byte for byte (same holder, same
    /// expiry: same millisecond, or a manual clock), B trusts the cache, even inside its write transaction, and takes
    /// the lease while A holds it.
    @Test("a lease written between the cache's two reads does not poison the cache (two processes, one file)")
    func leaseCacheRace() throws {
        let directory = tempDir("lease")
        defer { try? FileManager.default.removeItem(at: directory) }
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1, directory: directory)
        let b = try Device("b", seed: 2, directory: directory)
        #expect(a.clock.nowMilliseconds() == b.clock.nowMilliseconds())
        // A takes the lease.
        let ra = try #require(try a.engine.nextRequest())
        try a.engine.handle(ra.id, cloud.performNow(ra.operation))
        let leaseSQL = "SELECT json_extract(value, '$.holder') FROM replica_metadata WHERE key = 'sync_lease'"
        let aHolder = try #require(try a.engine.db.scalar(leaseSQL))
        // B reads A's lease text; before B parses it, A gives the lease up (another process).
        sqlite3_trace_v2(b.engine.db.handle, UInt32(SQLITE_TRACE_STMT), leaseTrace, nil)
        defer { sqlite3_trace_v2(b.engine.db.handle, 0, nil, nil); leaseRaceHook = nil }
        leaseRaceHook = { a.engine.releaseLease() }
        // (B may find the lease it read still held and wait, or take it once free: either is right here.)
        if let rb = try b.engine.nextRequest() { try b.engine.handle(rb.id, cloud.performNow(rb.operation)) }
        b.engine.releaseLease()
        // A takes the lease again in the same millisecond: the same text as before.
        let ra2 = try #require(try a.engine.nextRequest())
        try a.engine.handle(ra2.id, cloud.performNow(ra2.operation))
        // A holds a live lease: B must wait.
        #expect(try b.engine.db.scalar(leaseSQL) == aHolder)
        let stolen = try b.engine.nextRequest()
        #expect(stolen == nil, "B took the lease A holds")
        #expect(try b.engine.db.scalar(leaseSQL) == aHolder, "A's live lease was overwritten")
    }

    @Test("control: the same steps, A's release made before B's request instead of between B's two reads: B waits")
    func leaseSameStepsWithoutInterleaving() throws {
        let directory = tempDir("lease3")
        defer { try? FileManager.default.removeItem(at: directory) }
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1, directory: directory)
        let b = try Device("b", seed: 2, directory: directory)
        let leaseSQL = "SELECT json_extract(value, '$.holder') FROM replica_metadata WHERE key = 'sync_lease'"
        let ra = try #require(try a.engine.nextRequest())
        try a.engine.handle(ra.id, cloud.performNow(ra.operation))
        let aHolder = try #require(try a.engine.db.scalar(leaseSQL))
        a.engine.releaseLease()
        // (B may find the lease it read still held and wait, or take it once free: either is right here.)
        if let rb = try b.engine.nextRequest() { try b.engine.handle(rb.id, cloud.performNow(rb.operation)) }
        b.engine.releaseLease()
        let ra2 = try #require(try a.engine.nextRequest())
        try a.engine.handle(ra2.id, cloud.performNow(ra2.operation))
        #expect(try b.engine.db.scalar(leaseSQL) == aHolder)
        #expect(try b.engine.nextRequest() == nil)
        #expect(try b.engine.db.scalar(leaseSQL) == aHolder)
    }

    @Test("control: without the interleaving, B waits for A's lease, also across clock jumps")
    func leaseNoRaceAndClockJumps() throws {
        let directory = tempDir("lease2")
        defer { try? FileManager.default.removeItem(at: directory) }
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1, directory: directory)
        let b = try Device("b", seed: 2, directory: directory)
        let ra = try #require(try a.engine.nextRequest())
        try a.engine.handle(ra.id, cloud.performNow(ra.operation))
        #expect(try b.engine.nextRequest() == nil)
        // B's clock jumps far ahead then back: the cached parse must not turn into a stale decision.
        b.clock.advance(by: 10 * 60_000)
        let rb = try #require(try b.engine.nextRequest())  // A's lease expired for B
        try b.engine.handle(rb.id, cloud.performNow(rb.operation))
        b.clock.advance(by: -10 * 60_000)
        a.clock.advance(by: 1)
        // B holds a lease expiring far ahead of A's clock: A clamps it and waits, never takes it while live.
        #expect(try a.engine.nextRequest() == nil)
        #expect(a.engine.wakeTime != nil)
    }

    @Test("SQL functions survive connection reuse across contexts, engines and crashed engines of an in-memory store")
    func sqlFunctionsOnReusedConnections() throws {
        let name = "break4-fn-\(UUID().uuidString)"
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration(name, isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: .seeded(seed: 3, directory: tempDir("fn")))
        do {
            let context = ModelContext(container)
            for i in 0..<20 { context.insert(SyncNote(title: i % 2 == 0 ? "Café \(i)" : "tea \(i)")) }
            try context.save()
        }
        for round in 0..<12 {
            // Alternate owners so connections move between contexts and engines.
            let engine = try SyncEngine(container: container, storeName: name)
            if round % 3 == 0 { engine.simulateCrash() }
            let context = ModelContext(container)
            let found = try context.fetch(FetchDescriptor<SyncNote>(predicate: #Predicate { $0.title.localizedStandardContains("cafe") }))
            #expect(found.count == 10, "round \(round)")
            let ids = found.map(\.id)
            let again = try ModelContext(container).fetch(FetchDescriptor<SyncNote>(predicate: #Predicate { ids.contains($0.id) }))
            #expect(again.count == 10)
            _ = engine
        }
    }
}

@Suite("Adversarial: field cipher", .serialized)
struct AdversarialCipherTests {
    static let types: [String: Set<String>] = [
        "Diary": ["secret", "photo"], "Diar": ["secret"], "D": ["x"], "Key": ["k"],
        "Wide": Set((0..<40).map { "f\($0)" }), String(repeating: "T", count: 300): ["secret"],
    ]

    static func cipher(seed: UInt64, zone: String = "zone-ü", keys: [UInt32] = [1]) throws -> FieldCipher {
        let cipher = try FieldCipher(zone: zone, encryptedFields: types, random: SeededRandomSource(seed: seed))
        for version in keys {
            try [UInt8](repeating: UInt8(truncatingIfNeeded: version &* 31 &+ 7), count: 32).withUnsafeBytes { try cipher.setKey(version: version, $0) }
        }
        return cipher
    }

    static func stamp(_ n: Int) -> FieldStamp {
        FieldStamp(incarnation: Int64(1 + n % 3), clock: HLC(physical: 1_767_225_600_000 + Int64(n), logical: Int32(n % 5),
                                                            replica: UUID(uuidString: "01900000-0000-7000-8000-0000000000ff")!))
    }

    static func value(_ n: Int, _ g: SeededRandomSource) -> SQLiteValue {
        switch g.next() % 9 {
        case 0: return .null
        case 1: return .integer(Int64(bitPattern: g.next()))
        case 2: return .real(Double(bitPattern: g.next()))
        case 3: return .text("")
        case 4: return .blob(Data())
        case 5: return .text(String(repeating: "é✓", count: Int(g.next() % 3000)))
        case 6: return .blob(Data((0..<Int(g.next() % 700)).map { UInt8(truncatingIfNeeded: $0 &* n) }))
        case 7: return n % 50 == 0 ? .blob(Data(repeating: 0xAB, count: 3_000_000)) : .text("v\(n)")
        default: return .text("K\u{212A}\(n)")
        }
    }

    static func records(_ count: Int, seed: UInt64) -> [CloudRecord] {
        let g = SeededRandomSource(seed: seed)
        let typeNames = types.keys.sorted() + ["Other", "\u{212A}ey"]
        return (0..<count).map { n in
            let type = typeNames[Int(g.next() % UInt64(typeNames.count))]
            var fields: [String: CloudField] = ["title": CloudField(value: .text("plain \(n)"), stamp: stamp(n))]
            for name in types[type] ?? [] where g.next() % 4 != 0 { fields[name] = CloudField(value: value(n, g), stamp: stamp(n + 1)) }
            // Fields of a newer schema, flagged encrypted (the type does not declare them).
            if g.next() % 3 == 0 { fields["extra\(n % 4)"] = CloudField(value: value(n, g), stamp: stamp(n + 2), isEncrypted: true) }
            var bytes = [UInt8](repeating: 0, count: 16)
            for i in 0..<16 { bytes[i] = UInt8(truncatingIfNeeded: g.next()) }
            let id = bytes.withUnsafeBytes { UUID(uuid: $0.load(as: uuid_t.self)) }
            return CloudRecord(recordID: n % 17 == 0 ? UUID(uuidString: "01900000-0000-7000-8000-0000000000a1")! : id,
                               recordType: type, causalLength: 1, created: stamp(n), fields: fields)
        }
    }

    /// Marks the fields a cipher treats as encrypted as such (what opening returns).
    static func flagged(_ record: CloudRecord) -> CloudRecord {
        var r = record
        for name in types[r.recordType] ?? [] where r.fields[name] != nil { r.fields[name]!.isEncrypted = true }
        return r
    }

    @Test("interleaved types, zones, sizes and batches round-trip, and each sealed record opens alone in a fresh cipher")
    func interleavedRoundTrip() throws {
        let originals = Self.records(260, seed: 42)
        let sealer = try Self.cipher(seed: 1)
        var sealed: [CloudRecord] = []
        // Batches of varying sizes through one cipher (its cached associated-data prefix carries over).
        var start = 0, size = 1
        while start < originals.count {
            var batch = Array(originals[start..<min(originals.count, start + size)])
            try sealer.seal(&batch)
            sealed += batch
            start += size
            size = size % 13 + 3
        }
        // Single records too, after a batch of another type.
        sealed[5] = try sealer.sealed(originals[5])
        for (original, s) in zip(originals, sealed) {
            let fresh = try Self.cipher(seed: 99)
            let opened = try fresh.opened(s)
            #expect(opened == Self.flagged(original), "\(original.recordType) \(original.recordID)")
        }
        // Opened as one batch in reverse order by the sealing cipher.
        let results = sealer.open(sealed.reversed())
        for (result, original) in zip(results, originals.reversed()) {
            #expect((try? result.get().record) == Self.flagged(original))
        }
        let batch = sealer.openBatch(sealed)
        #expect(batch.failures.isEmpty && batch.opened == originals.map(Self.flagged))
    }

    @Test("a sealed value moved to a record of another type with the same ID, or another zone, fails; rotation keeps old values open")
    func movesAndRotation() throws {
        let cipher = try Self.cipher(seed: 3)
        let id = UUID(uuidString: "01900000-0000-7000-8000-0000000000b1")!
        let s = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: id))
        let diary = CloudRecord(recordID: id, recordType: "Diary", causalLength: 1, created: s,
                                fields: ["secret": CloudField(value: .text("x"), stamp: s)])
        let key = CloudRecord(recordID: id, recordType: "Key", causalLength: 1, created: s,
                              fields: ["k": CloudField(value: .text("x"), stamp: s)])
        let sealedDiary = try cipher.sealed(diary)
        let sealedKey = try cipher.sealed(key)
        var asDiar = sealedDiary
        asDiar.recordType = "Diar"
        var asKelvin = sealedKey
        asKelvin.recordType = "\u{212A}ey"
        // Warm the cache with the genuine type first, then the moved copy.
        let results = cipher.open([sealedDiary, asDiar, sealedKey, asKelvin, sealedDiary])
        #expect((try? results[0].get()) != nil)
        #expect((try? results[1].get()) == nil, "moved from Diary to Diar and still opened")
        #expect((try? results[2].get()) != nil)
        #expect((try? results[3].get()) == nil, "moved from Key to KELVIN SIGN+ey and still opened")
        #expect((try? results[4].get()) != nil)
        let otherZone = try Self.cipher(seed: 3, zone: "zone-u\u{0308}")
        #expect(throws: FieldEncryptionError.self) { _ = try otherZone.opened(sealedDiary) }
        // Rotation: seal with v1, add v2, seal again; a cipher with both opens both; oldest key reported.
        try [UInt8](repeating: 9, count: 32).withUnsafeBytes { try cipher.setKey(version: 2, $0) }
        var both = [diary, diary]
        try cipher.seal(&both)
        let opened = cipher.open([sealedDiary, both[0]])
        #expect((try? opened[0].get().oldestKeyVersion) == 1)
        #expect((try? opened[1].get().oldestKeyVersion) == 2)
        // Truncations and bit flips of every sealed byte fail cleanly.
        guard case let .blob(bytes) = both[0].fields["secret"]!.value else { Issue.record("not sealed"); return }
        for cut in [0, 1, 5, 29, 45, bytes.count - 1] {
            var t = both[0]
            t.fields["secret"]!.value = .blob(bytes.prefix(cut))
            #expect(throws: FieldEncryptionError.self) { _ = try cipher.opened(t) }
        }
        for i in 0..<bytes.count {
            var flipped = bytes
            flipped[flipped.startIndex + i] ^= 0x40
            var t = both[0]
            t.fields["secret"]!.value = .blob(flipped)
            #expect(throws: FieldEncryptionError.self) { _ = try cipher.opened(t) }
        }
    }
}

@Suite("Adversarial: replication states", .serialized)
struct AdversarialInspectionTests {
    @Test("replicationStates (one scan) equals the per-record load it replaced, odd rows included")
    func oneScanEqualsPerRecordLoads() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 7), b = try Device("b", seed: 8)
        var notes: [SyncNote] = []
        for i in 0..<30 { notes.append(a.context.insert(SyncNote(title: "n\(i)", body: i % 3 == 0 ? nil : "b", rating: i))) }
        try a.context.save()
        try a.sync(cloud)
        for note in notes.prefix(10) { a.context.delete(note) }
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        let db = b.engine.db
        // A row whose ID is no 16-byte blob (skipped by both), and a pending one.
        try db.execute("CREATE TEMP TABLE break4_row AS SELECT * FROM replica_sync_record LIMIT 1")
        try db.execute("UPDATE break4_row SET id = 'not-a-uuid'")
        try db.execute("INSERT INTO replica_sync_record SELECT * FROM break4_row")
        try db.execute("DROP TABLE break4_row")
        let old: [ReplicationState] = try db.rows("SELECT id FROM replica_sync_record ORDER BY id").compactMap { row in
            guard let id = try? UUID(sqliteValue: row[0]) else { return nil }
            return try SyncLedger.loadAsStored(id, db).map { ReplicationState($0, storeName: "notes") }
        }
        #expect(try b.engine.replicationStates() == old)
        #expect(old.count == 30)
    }
}

// SQLiteTuning (no test in-process: sqlite3_config only works before SQLite initializes). Its doc says the memory
// statistics are "counters that only sqlite3_memory_used(), sqlite3_memory_highwater() and sqlite3_status() read",
// but SQLITE_CONFIG_MEMSTATUS off also stops sqlite3_soft_heap_limit64 / sqlite3_hard_heap_limit64 from being
// enforced, process-wide. Reproduction against the same system libsqlite3 (gcc heap.c -lsqlite3):
//   if (off) sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
//   sqlite3_hard_heap_limit64(2 << 20); sqlite3_open(":memory:", &db);
//   sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (zeroblob(20000000)); SELECT length(x||x) FROM t;", ...)
//   -> memstatus on: rc=7 "out of memory"; memstatus off: rc=0 (the 2 MiB limit is ignored).

extension AdversarialCipherTests {
    @Test("already-sealed fields of undeclared types pass through a re-seal unchanged, whatever type came before them")
    func resealKeepsSealedUndeclaredFields() throws {
        let originals = Self.records(120, seed: 77)
        let cipher = try Self.cipher(seed: 5)
        var once = originals
        try cipher.seal(&once)
        // Re-seal in a shuffled, interleaved order (the records as a device without changes would send them again).
        var order = Array(once.indices)
        let g = SeededRandomSource(seed: 3)
        for i in order.indices.reversed() { order.swapAt(i, Int(g.next() % UInt64(i + 1))) }
        var twice = order.map { once[$0] }
        try cipher.seal(&twice)
        for (position, index) in order.enumerated() {
            let before = once[index], after = twice[position]
            let declared = Self.types[before.recordType] ?? []
            for (name, field) in before.fields where field.isEncrypted && !declared.contains(name) {
                #expect(after.fields[name] == field, "\(before.recordType).\(name) re-sealed")
            }
            // (Declared fields are sealed again by design: `seal` takes plaintext records.) Undeclared ones open to the original.
            let opened = try Self.cipher(seed: 1).opened(after)
            for (name, field) in originals[index].fields where field.isEncrypted && !declared.contains(name) {
                #expect(opened.fields[name] == field)
            }
        }
    }
}
