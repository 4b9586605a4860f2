import Foundation
import Testing
@testable import Replica

/// Holds a device inside a custom actor: the engine never leaves the actor's isolation.
private actor ActorHeldSync {
    let device: Device
    init(seed: UInt64) throws { device = try Device("actor", seed: seed) }
    func saveAndSync(_ cloud: InMemoryCloudDatabase) async throws -> SyncStatus {
        device.context.insert(SyncNote(title: "from an actor"))
        try device.context.save()
        return try await SyncDriver.syncUntilIdle(device.engine, with: cloud, timeoutMilliseconds: 60_000)
    }
}

/// Holds a device on the main actor, as an app's view model would.
@MainActor
private final class MainActorHeldSync {
    let device: Device
    init(seed: UInt64) throws { device = try Device("main", seed: seed) }
    func saveAndSync(_ cloud: InMemoryCloudDatabase) async throws -> SyncStatus {
        device.context.insert(SyncNote(title: "from the main actor"))
        try device.context.save()
        return try await SyncDriver.syncUntilIdle(device.engine, with: cloud)
    }
}

@Suite("Bounded sync driver")
struct BoundedSyncTests {
    @Test("with the network down, syncUntilIdle returns within its bound with the change pending and the error shown")
    func networkDownReturnsWithinBound() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 3)
        try await SyncDriver.syncUntilIdle(device.engine, with: cloud)  // zone, schema, first fetch
        device.context.insert(SyncNote(title: "offline"))
        try device.context.save()
        for _ in 0..<1_000 { cloud.injectFailure(.networkUnavailable) }
        let start = device.clock.nowMilliseconds()
        let status = try await SyncDriver.syncUntilIdle(device.engine, with: cloud, timeoutMilliseconds: 30_000)
        #expect(device.clock.nowMilliseconds() - start <= 30_000)
        #expect(status.pendingRecords == 1)
        #expect(status.lastError == .networkUnavailable)
        #expect(cloud.records(in: "notes").isEmpty)
    }

    @Test("a transient failure that clears before the bound is retried and the call ends up to date")
    func transientFailureRetriedWithinBound() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 4)
        device.context.insert(SyncNote(title: "t"))
        try device.context.save()
        cloud.injectFailure(.zoneBusy(retryAfterMilliseconds: 2_000), for: .modify)
        let status = try await SyncDriver.syncUntilIdle(device.engine, with: cloud, timeoutMilliseconds: 60_000)
        #expect(status.isUpToDate)
        #expect(cloud.records(in: "notes").count == 1)
    }

    @Test("a zero bound performs nothing and reports the work left")
    func zeroBound() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 5)
        device.context.insert(SyncNote(title: "t"))
        try device.context.save()
        let status = try await SyncDriver.syncUntilIdle(device.engine, with: cloud, timeoutMilliseconds: 0)
        #expect(status.pendingRecords == 1)
        #expect(cloud.records(in: "notes").isEmpty)
    }

    @Test("an engine held by a custom actor, by a main-actor object or inside a task syncs without leaving its isolation")
    func callableFromIsolatedContexts() async throws {
        let cloud = InMemoryCloudDatabase()
        let held = try ActorHeldSync(seed: 6)
        #expect(try await held.saveAndSync(cloud).isUpToDate)
        let main = try await MainActorHeldSync(seed: 7)
        #expect(try await main.saveAndSync(cloud).isUpToDate)
        let fromTask = Task {
            let device = try Device("task", seed: 8)
            device.context.insert(SyncNote(title: "from a task"))
            try device.context.save()
            return try await SyncDriver.syncUntilIdle(device.engine, with: cloud).isUpToDate
        }
        #expect(try await fromTask.value)
        #expect(cloud.records(in: "notes").count == 3)
    }
}
