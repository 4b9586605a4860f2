import Foundation
import Synchronization
import Testing
@testable import Replica

/// A container with one synced store "notes" in a file under `directory` (opening it again is a restart).
private func fileContainer(_ directory: URL, seed: UInt64) throws -> (ModelContainer, ManualClock) {
    let environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
    let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
        ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
    ], environment: environment)
    return (container, environment.clock as! ManualClock)
}

/// The last successful sync time is kept in the store: it survives a restart of the runtime or the process and is read
/// through the public state API (``CloudSync/lastSyncDate``, ``SyncEngine/lastSyncDate()``).
@Suite("Last sync date")
struct LastSyncDateTests {
    @Test("a runtime started after a restart begins with the last sync date recorded, and keeps it while offline")
    func survivesRestart() async throws {
        let directory = temporaryTestDirectory("last-sync")
        let cloud = OutageCloud()
        let synced: Date
        do {
            let (container, _) = try fileContainer(directory, seed: 50)
            let context = ModelContext(container)
            context.insert(SyncNote(title: "one"))
            try context.save()
            let sync = try container.startSync(store: "notes", cloud: cloud)
            #expect(await eventually { await sync.lastSyncDate != nil })
            synced = try #require(await sync.lastSyncDate)
            #expect(synced <= container.environment.now())
            await sync.stop()
        }
        // The process restarts (a new container on the same file, its clock later) with the network down.
        cloud.offline.withLock { $0 = true }
        let (container, clock) = try fileContainer(directory, seed: 50)
        clock.advance(by: 3_600_000)
        let engine = try SyncEngine(container: container, storeName: "notes")
        #expect(try engine.lastSyncDate() == synced)
        engine.releaseLease()
        let sync = try container.startSync(store: "notes", cloud: cloud)
        #expect(await sync.lastSyncDate == synced)
        #expect(await eventually { await sync.state == .waitingForNetwork })
        #expect(await sync.lastSyncDate == synced)
        // Back online: the next successful pass records a new time, kept in the store.
        cloud.offline.withLock { $0 = false }
        clock.advance(by: 600_000)  // past any backoff
        try await sync.syncNow()
        let later = try #require(await sync.lastSyncDate)
        #expect(later > synced.addingTimeInterval(3_600))  // after the restart's clock
        #expect(later <= container.environment.now())
        await sync.stop()
        let (reopened, _) = try fileContainer(directory, seed: 50)
        #expect(try SyncEngine(container: reopened, storeName: "notes").lastSyncDate() == later)
    }

    @Test("syncUntilIdle records a completed sync; a failing one leaves the date alone")
    func driverRecords() async throws {
        let cloud = OutageCloud()
        let device = try Device("a", seed: 51)
        #expect(try device.engine.lastSyncDate() == nil)
        device.context.insert(SyncNote(title: "one"))
        try device.context.save()
        try await SyncDriver.syncUntilIdle(device.engine, with: cloud)
        let first = try #require(try device.engine.lastSyncDate())
        #expect(first == device.container.environment.now())
        device.clock.advance(by: 10_000)
        cloud.offline.withLock { $0 = true }
        let status = try await SyncDriver.syncUntilIdle(device.engine, with: cloud, timeoutMilliseconds: 100)
        #expect(status.lastError == .networkUnavailable)
        #expect(try device.engine.lastSyncDate() == first)
    }

    @Test("an unreadable stored date is a typed error naming the metadata, not a missing date")
    func unreadableDate() throws {
        let device = try Device("a", seed: 52)
        let db = try device.container.stores[0].openConnection()
        try db.run("INSERT INTO replica_metadata (key, value) VALUES ('last_sync', 'yesterday')")
        #expect(throws: ReplicaError.corruptBookkeeping(BookkeepingCorruption(store: "notes", recordID: nil, column: "replica_metadata.last_sync"))) {
            try device.engine.lastSyncDate()
        }
    }
}
