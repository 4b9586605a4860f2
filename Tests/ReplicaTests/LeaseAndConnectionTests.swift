import CSQLite
import CSodium
import Foundation
import Testing
@_spi(Simulation) @testable import Replica

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

@Suite("Sync engine leases and connections", .serialized)
struct LeaseAndConnectionTests {
    /// `acquireLease().current()` reads the `sync_lease` text with one statement and parses the lease with a second
    /// one, then caches (first text -> second parse). Another process writing between the two statements leaves the
    /// cache mapping A's lease text to "no lease"; when A's lease text comes back byte for byte (same holder, same
    /// expiry: same millisecond, or a manual clock), B trusts the cache, even inside its write transaction, and takes
    /// the lease while A holds it.
    @Test("a lease written between the cache's two reads does not poison the cache (two processes, one file)")
    func leaseCacheRace() throws {
        let directory = temporaryTestDirectory("lease")
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
        let directory = temporaryTestDirectory("lease3")
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
        let directory = temporaryTestDirectory("lease2")
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
        let name = "sql-function-\(UUID().uuidString)"
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration(name, isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: .seeded(seed: 3, directory: temporaryTestDirectory("fn")))
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
