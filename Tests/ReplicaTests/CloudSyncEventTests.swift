import Foundation
import Testing
@testable import Replica

/// A container with one synced in-memory store "notes" of encrypted diaries, on a seeded environment.
private final class EncryptedRuntimeDevice: Sendable {
    let container: ModelContainer
    let clock: ManualClock

    init(seed: UInt64) throws {
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: temporaryTestDirectory("runtime-crypto"))
        clock = environment.clock as! ManualClock
        container = try ModelContainer(for: Schema([Diary.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
    }

    func diaries() throws -> [Diary] { try ModelContext(container).fetch(Diary.self) }
}

/// The events of ``CloudSync`` not covered by the runtime's own suite: conflicts resolved (as the conflict log records
/// them) and the encryption key events (needed, changed), with the key control they call for.
@Suite("Sync runtime events: descriptions for logs")
struct CloudSyncEventDescriptionTests {
    @Test("events and states print as one readable line, without the module's type names (trial: Replica.CloudSyncState.syncing)")
    func eventsReadInLogs() {
        let id = PersistentIdentifier(entityName: "Note", id: UUID(uuidString: "01900000-0000-7000-8000-000000000001")!)
        #expect("\(CloudSyncState.waitingForNetwork)" == "waitingForNetwork")
        #expect("\(CloudSyncEvent.stateChanged(.syncing))" == "stateChanged syncing")
        #expect("\(CloudSyncEvent.sentChanges([id]))" == "sentChanges [\(id)]")
        #expect("\(CloudSyncEvent.requestFailed(operation: "modifyRecords", error: .networkUnavailable))" == "requestFailed modifyRecords: \(CloudError.networkUnavailable)")
        #expect("\(CloudSyncEvent.changeTokenExpired(zone: "notes"))" == "changeTokenExpired 'notes'")
        #expect(!"\(CloudSyncEvent.fetchedChanges(CloudSyncChanges(inserted: [id])))".contains("Replica."))
    }
}

@Suite("Sync runtime events: conflicts and encryption keys")
struct CloudSyncEventTests {
    @Test("conflictsResolved carries exactly the new conflict log entries, oldest first, once")
    func conflictsResolvedMatchesTheLog() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 40)
        let ids = try device.save("first", "second")
        let sync = try device.container.startSync(store: "notes", cloud: cloud)
        let log = EventLog(sync)
        #expect(await eventually { await sync.lastSyncDate != nil })

        // Another device receives both notes and, later by its clock, retitles them.
        let other = try Device("other", seed: 41)
        try other.sync(cloud)
        other.clock.set(milliseconds: device.clock.nowMilliseconds() + 60_000)
        for var note in try other.notes() {
            note.title = "theirs \(note.title)"
            other.context.update(note)
        }
        try other.context.save()
        try other.sync(cloud)

        // Meanwhile this device retitles both without uploading (the manual clock never reaches the debounce).
        let context = ModelContext(device.container)
        for var note in try context.fetch(SyncNote.self) {
            note.title = "mine \(note.title)"
            context.update(note)
        }
        try context.save()
        #expect(await eventually { await sync.localDeadlineForTesting != nil })
        try await sync.syncNow()

        let entries = try await sync.conflictLog()
        #expect(entries.count == 2)
        #expect(Set(entries.map(\.id.id)) == Set(ids))
        #expect(entries.allSatisfy { $0.field == "title" && $0.kind == .overwritten })
        #expect(await log.waitFor { if case .conflictsResolved = $0 { true } else { false } })
        let reported = log.all.compactMap { if case let .conflictsResolved(entries) = $0 { entries } else { nil } }
        #expect(reported == [Array(entries.reversed())])
        #expect(try device.titles() == ["theirs first", "theirs second"])

        // A later pass with no new decision reports none (its end, idle, arrives after anything it reported).
        try await sync.syncNow()
        let events = log.all.count
        #expect(await eventually { log.all.count > events || log.all.last == .stateChanged(.idle) })
        #expect(log.count { if case .conflictsResolved = $0 { true } else { false } } == 1)
        await sync.stop()
    }

    @Test("a wrong key: encryptionKeyNeeded naming the zone, blocked, nothing merged; the right key resumes and reports the change")
    func keyNeededThenGiven() async throws {
        let cloud = InMemoryCloudDatabase()
        let writer = try CryptoDevice("writer", seed: 42, encryption: try Keys.passphrase("right"))
        writer.context.insert(Diary(title: "sealed", secret: "the secret"))
        try writer.context.save()
        try writer.sync(cloud)

        let device = try EncryptedRuntimeDevice(seed: 43)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, encryption: try Keys.passphrase("hunter-2-guess"))
        let log = EventLog(sync)
        #expect(await log.waitFor { $0 == .encryptionKeyNeeded(.wrongKey(zone: "notes")) })
        #expect(await log.waitFor { $0 == .stateChanged(.blocked) })
        #expect(try device.diaries().isEmpty)
        #expect(!log.all.contains { "\($0)".contains("hunter") || "\($0)".contains("secret") })
        #expect(log.count { if case .encryptionKeyChanged = $0 { true } else { false } } == 0)

        // The app asks the user again and hands the runtime the right key: it syncs at once.
        try await sync.setEncryptionKeyProvider(PassphraseKeyProvider(passphrase: "right", limits: .minimum))
        #expect(await log.waitFor { $0 == .encryptionKeyChanged(zone: "notes") })
        #expect(await eventually { (try? device.diaries().map(\.secret)) == ["the secret"] })
        #expect(await eventually { await sync.state == .idle })
        #expect(log.count { if case .encryptionKeyNeeded = $0 { true } else { false } } == 1)
        await sync.stop()
    }

    @Test("encryptionKeyChanged when the zone's key is adopted and when another device rotates it; a rotation from the runtime")
    func keyChanged() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try EncryptedRuntimeDevice(seed: 44)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, encryption: try Keys.passphrase("shared"))
        let log = EventLog(sync)
        // The first device on the zone makes its key set: a change from "no key".
        #expect(await log.waitFor { $0 == .encryptionKeyChanged(zone: "notes") })
        #expect(await eventually { await sync.state == .idle })
        let adopted = log.count { $0 == .encryptionKeyChanged(zone: "notes") }
        #expect(adopted == 1)

        // Another device rotates the key; the runtime loads the new version at its next pass.
        let other = try CryptoDevice("other", seed: 45, encryption: try Keys.passphrase("shared"))
        try other.sync(cloud)
        try other.engine.rotateEncryptionKey()
        try other.sync(cloud)
        try await sync.syncNow()
        #expect(await eventually { log.count { $0 == .encryptionKeyChanged(zone: "notes") } == 2 })

        // The runtime rotates the key itself: one more change, and the other device opens what it seals.
        try await sync.rotateEncryptionKey()
        let context = ModelContext(device.container)
        context.insert(Diary(title: "after rotation", secret: "rotated secret"))
        try context.save()
        try await sync.syncNow()
        #expect(await eventually { log.count { $0 == .encryptionKeyChanged(zone: "notes") } == 3 })
        try other.sync(cloud)
        #expect(try other.diaries().map(\.secret) == ["rotated secret"])
        await sync.stop()
    }
}
