import Foundation
import Synchronization
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// Zone deletion reasons (CloudKit's deleted, purged, encrypted data reset): what every cloud reports, and the policy
/// that decides — before anything changes locally — whether a store keeps its data and uploads it again or erases it
/// (R18 in `Specs/replication-protocol.md`).
@Suite("Zone deletion reasons and policy")
struct ZoneDeletionTests {
    typealias Kind = CloudDatabaseTests.Kind

    /// Every (cloud kind, reason) pair.
    static let kindsAndReasons: [(Kind, ZoneDeletionReason)] = CloudDatabaseTests.kinds.flatMap { kind in
        ZoneDeletionReason.allCases.map { (kind, $0) }
    }

    @Test("every cloud reports why a zone was deleted until it is created again", arguments: kindsAndReasons)
    func cloudReportsReason(kind: Kind, reason: ZoneDeletionReason) async throws {
        let db = try CloudDatabaseTests.make(kind)
        try await db.createZone("z")
        _ = try await db.modifyRecords([CloudDatabaseTests.record(1)], in: "z")
        try await db.deleteZone("z", reason: reason)
        let error = CloudError.zoneDeleted(reason: reason)
        await #expect(throws: error) { try await db.modifyRecords([CloudDatabaseTests.record(2)], in: "z") }
        await #expect(throws: error) { try await db.fetchZoneChanges("z", since: nil, limit: 5) }
        await #expect(throws: error) { try await db.zoneMetadata("z") }
        await #expect(throws: error) { try await db.setZoneMetadata("z", key: "k", value: Data([1]), ifCurrent: nil) }
        await #expect(throws: error) { try await db.deleteZone("z") }
        // Another zone, never created, is only missing.
        await #expect(throws: CloudError.zoneNotFound) { try await db.zoneMetadata("other") }
        // Created again, the zone works and the reason is gone; deleted plainly, it is "deleted".
        try await db.createZone("z")
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 5).records.isEmpty)
        try await db.deleteZone("z")
        await #expect(throws: CloudError.zoneDeleted(reason: .deleted)) { try await db.zoneMetadata("z") }
    }

    @Test("a reset without a reason is only a missing zone; the fault injectors take one", arguments: ZoneDeletionReason.allCases)
    func resetsWithAndWithoutReason(reason: ZoneDeletionReason) throws {
        let memory = InMemoryCloudDatabase()
        let file = try SQLiteCloudDatabase(url: temporaryTestDirectory("zone-reasons").appendingPathComponent("cloud.sqlite"))
        try memory.createZone("z")
        try file.createZone("z")
        memory.resetZone("z")
        try file.resetZone("z")
        #expect(throws: CloudError.zoneNotFound) { try memory.zoneMetadata("z") }
        #expect(throws: CloudError.zoneNotFound) { try file.zoneMetadata("z") }
        memory.resetZone("z", reason: reason)
        try file.resetZone("z", reason: reason)
        #expect(throws: CloudError.zoneDeleted(reason: reason)) { try memory.zoneMetadata("z") }
        #expect(throws: CloudError.zoneDeleted(reason: reason)) { try file.zoneMetadata("z") }
    }

    @Test("a cloud file made before deletion reasons gains them when opened, keeping its zones")
    func sqliteCloudFileUpgrade() throws {
        let url = temporaryTestDirectory("zone-reasons-upgrade").appendingPathComponent("cloud.sqlite")
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        do {
            let old = try Connection(location: .file(url))
            try old.execute("""
                CREATE TABLE cloud_zone (name TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL,
                    sequence INTEGER NOT NULL DEFAULT 0, oldest_valid INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE cloud_epoch (name TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL);
                CREATE TABLE cloud_record (zone TEXT NOT NULL, id BLOB NOT NULL, sequence INTEGER NOT NULL,
                    change_tag TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (zone, id));
                CREATE TABLE cloud_zone_metadata (zone TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (zone, key));
                INSERT INTO cloud_zone (name, epoch) VALUES ('kept', 7), ('gone', 8);
                INSERT INTO cloud_epoch (name, epoch) VALUES ('kept', 7), ('gone', 8);
                """)
        }
        let cloud = try SQLiteCloudDatabase(url: url)
        #expect(try cloud.fetchZoneChanges("kept", since: nil, limit: 5).token.epoch == 7)
        try cloud.deleteZone("gone", reason: .purged)
        #expect(throws: CloudError.zoneDeleted(reason: .purged)) { try cloud.zoneMetadata("gone") }
        // Opening it again (the column exists now) changes nothing.
        let again = try SQLiteCloudDatabase(url: url)
        #expect(throws: CloudError.zoneDeleted(reason: .purged)) { try again.zoneMetadata("gone") }
    }

    /// A device with two synced notes, uploaded; then the zone is deleted for `reason`.
    private static func deviceWithDeletedZone(_ reason: ZoneDeletionReason, policy: ZoneDeletionPolicy, seed: UInt64,
                                              directory: URL? = nil) throws -> (Device, InMemoryCloudDatabase, [UUID]) {
        var options = SyncEngine.Options()
        options.zoneDeletionPolicy = policy
        let device = try Device("a", seed: seed, directory: directory, options: options)
        let notes = [device.context.insert(SyncNote(title: "one")), device.context.insert(SyncNote(title: "two"))]
        try device.context.save()
        let cloud = InMemoryCloudDatabase()
        #expect(try device.sync(cloud).isUpToDate)
        #expect(cloud.records(in: "notes").count == 2)
        cloud.resetZone("notes", reason: reason)
        return (device, cloud, notes.map(\.id))
    }

    @Test("by default the store keeps its data and uploads it again, whatever the reason", arguments: ZoneDeletionReason.allCases)
    func defaultKeepsAndReuploads(reason: ZoneDeletionReason) throws {
        let (device, cloud, ids) = try Self.deviceWithDeletedZone(reason, policy: .keepAndReupload, seed: 1)
        let status = try device.sync(cloud)
        #expect(status.isUpToDate)
        #expect(try device.notes().map(\.id).sorted { $0.bytesPrecede($1) } == ids.sorted { $0.bytesPrecede($1) })
        #expect(cloud.records(in: "notes").count == 2)
    }

    @Test("the erase policy erases for deleted and purged, and keeps the data for an encrypted-data reset",
          arguments: ZoneDeletionReason.allCases)
    func erasePolicy(reason: ZoneDeletionReason) throws {
        let (device, cloud, ids) = try Self.deviceWithDeletedZone(reason, policy: .eraseLocalData, seed: 2)
        let before = try device.context.fetchHistory().count
        let status = try device.sync(cloud)
        #expect(status.isUpToDate)
        if reason == .encryptedDataReset {
            #expect(try device.notes().count == 2)
            #expect(cloud.records(in: "notes").count == 2)
            return
        }
        #expect(try device.notes().isEmpty)
        #expect(cloud.records(in: "notes").isEmpty)
        #expect(try device.engine.ledgerEntries().isEmpty)
        #expect(try device.engine.serverChangeToken() != nil)  // the re-created zone was read
        // The erase is one history transaction by the sync author, deleting both records with their tombstones.
        let history = try device.context.fetchHistory()
        #expect(history.count == before + 1)
        let erase = try #require(history.last)
        #expect(erase.author == HistoryTransaction.syncAuthor)
        let deleted = erase.changes.compactMap { if case let .delete(id, tombstone) = $0 { (id.id, tombstone) } else { nil } }
        #expect(Set(deleted.map(\.0)) == Set(ids))
        #expect(Set(deleted.compactMap { $0.1.values["title"] }) == [.text("one"), .text("two")])
        // The store syncs on from empty: a new save uploads, and nothing of the erased records comes back.
        device.context.insert(SyncNote(title: "after"))
        try device.context.save()
        #expect(try device.sync(cloud).isUpToDate)
        #expect(cloud.records(in: "notes").map { $0.fields["title"]?.value } == [.text("after")])
    }

    @Test("an erase on one device leaves another device's copy, which comes back to it as new records")
    func eraseThenAnotherDeviceReuploads() throws {
        let (device, cloud, ids) = try Self.deviceWithDeletedZone(.purged, policy: .eraseLocalData, seed: 3)
        #expect(try device.sync(cloud).isUpToDate)
        #expect(try device.notes().isEmpty)
        // Another device that keeps its data (the default) uploads what it holds to the re-created zone …
        let keeper = try Device("c", seed: 5)
        for title in ["x", "y"] { keeper.context.insert(SyncNote(title: title)) }
        try keeper.context.save()
        #expect(try keeper.sync(cloud).isUpToDate)
        // … and the erased device receives it as new records.
        #expect(try device.sync(cloud).isUpToDate)
        #expect(try device.notes().map(\.title).sorted() == ["x", "y"])
        #expect(Set(try device.notes().map(\.id)).isDisjoint(with: ids))
    }

    @Test("a deciding policy runs before anything changes locally, and its answer is carried out", arguments: ZoneDeletionReason.allCases)
    func decidingPolicySeesUntouchedStore(reason: ZoneDeletionReason) throws {
        let directory = temporaryTestDirectory("zone-deciding")
        let seen = Mutex<[(ZoneDeletion, Int)]>([])
        let reader = Mutex<ModelContainer?>(nil)
        let policy = ZoneDeletionPolicy.deciding { deletion in
            // What the store holds when the policy is asked: read through a container of its own.
            let count = reader.withLock { container in (try? container.map { try ModelContext($0).fetchCount(FetchDescriptor<SyncNote>()) }) ?? -1 } ?? -1
            seen.withLock { $0.append((deletion, count)) }
            return deletion.reason == .purged ? .eraseLocalData : .keepAndReupload
        }
        let (device, cloud, _) = try Self.deviceWithDeletedZone(reason, policy: policy, seed: 6, directory: directory)
        reader.withLock { $0 = device.container }
        #expect(try device.sync(cloud).isUpToDate)
        let calls = seen.withLock { $0 }
        #expect(calls.map(\.0) == [ZoneDeletion(storeName: "notes", zone: "notes", reason: reason)])
        #expect(calls.map(\.1) == [2])
        #expect(try device.notes().count == (reason == .purged ? 0 : 2))
    }

    @Test("ask: nothing is erased or uploaded before the answer, the question survives a restart, then the answer is carried out")
    func askWaitsForTheAnswer() throws {
        let directory = temporaryTestDirectory("zone-ask")
        let (device, cloud, ids) = try Self.deviceWithDeletedZone(.deleted, policy: .ask, seed: 7, directory: directory)
        let status = try device.sync(cloud)
        let question = ZoneDeletion(storeName: "notes", zone: "notes", reason: .deleted)
        #expect(status.zoneDeletion == question)
        #expect(!status.isUpToDate)
        #expect(device.engine.pendingZoneDeletion == question)
        #expect(try device.engine.nextRequest() == nil)
        // Nothing local changed, and the zone was not created again.
        #expect(try device.notes().count == 2)
        #expect(throws: CloudError.zoneDeleted(reason: .deleted)) { try cloud.zoneMetadata("notes") }
        // A save meanwhile is recorded (the outbox is durable), not uploaded.
        device.context.insert(SyncNote(title: "meanwhile"))
        try device.context.save()
        #expect(try device.engine.nextRequest() == nil)

        // After a restart (a new container and engine on the same file, same policy) the question stands.
        device.engine.releaseLease()
        var options = SyncEngine.Options()
        options.zoneDeletionPolicy = .ask
        let restarted = try Device("a", seed: 7, directory: directory, options: options)
        #expect(try restarted.engine.nextRequest() == nil)
        #expect(try restarted.engine.status().zoneDeletion == question)
        #expect(try restarted.notes().count == 3)

        // The answer erases (as one sync-authored transaction) and syncing resumes with an empty zone.
        #expect(try restarted.engine.resolveZoneDeletion(.eraseLocalData))
        #expect(try restarted.notes().isEmpty)
        #expect(try !restarted.engine.resolveZoneDeletion(.keepAndReupload))  // nothing waits any more
        #expect(try restarted.sync(cloud).isUpToDate)
        #expect(cloud.records(in: "notes").isEmpty)
        let last = try #require(try restarted.context.fetchHistory().last)
        #expect(last.author == HistoryTransaction.syncAuthor)
        #expect(Set(last.changes.map(\.changedPersistentIdentifier.id)).isSuperset(of: ids))
    }

    @Test("ask, answered keep: the data is uploaded again")
    func askAnsweredKeep() throws {
        let (device, cloud, _) = try Self.deviceWithDeletedZone(.purged, policy: .ask, seed: 8)
        #expect(try device.sync(cloud).zoneDeletion != nil)
        #expect(try device.engine.resolveZoneDeletion(.keepAndReupload))
        #expect(try device.sync(cloud).isUpToDate)
        #expect(try device.notes().count == 2)
        #expect(cloud.records(in: "notes").count == 2)
    }

    @Test("a question left by an engine that asked is answered by the policy of the next engine that does not ask")
    func restartWithAnsweringPolicy() throws {
        let directory = temporaryTestDirectory("zone-ask-then-erase")
        let (device, cloud, _) = try Self.deviceWithDeletedZone(.purged, policy: .ask, seed: 9, directory: directory)
        #expect(try device.sync(cloud).zoneDeletion != nil)
        device.engine.releaseLease()
        var options = SyncEngine.Options()
        options.zoneDeletionPolicy = .eraseLocalData
        let restarted = try Device("a", seed: 9, directory: directory, options: options)
        #expect(try restarted.sync(cloud).isUpToDate)
        #expect(try restarted.notes().isEmpty)
    }

    @Test("a zone only missing (no reason) never reaches the policy: the data is kept")
    func missingZoneKeeps() throws {
        var options = SyncEngine.Options()
        options.zoneDeletionPolicy = .eraseLocalData(for: Set(ZoneDeletionReason.allCases))
        let device = try Device("a", seed: 10, options: options)
        device.context.insert(SyncNote(title: "kept"))
        try device.context.save()
        let cloud = InMemoryCloudDatabase()
        #expect(try device.sync(cloud).isUpToDate)
        cloud.resetZone("notes")
        #expect(try device.sync(cloud).isUpToDate)
        #expect(try device.notes().map(\.title) == ["kept"])
        #expect(cloud.records(in: "notes").count == 1)
    }

    @Test("policies compare as values: built-ins by kind and reasons, deciding ones by identity")
    func policyEquality() {
        #expect(ZoneDeletionPolicy.eraseLocalData == .eraseLocalData(for: [.deleted, .purged]))
        #expect(ZoneDeletionPolicy.eraseLocalData != .eraseLocalData(for: [.purged]))
        #expect(ZoneDeletionPolicy.keepAndReupload != .ask)
        let deciding = ZoneDeletionPolicy.deciding { _ in .keepAndReupload }
        #expect(deciding == deciding)
        #expect(deciding != .deciding { _ in .keepAndReupload })
        #expect(SyncEngine.Options().zoneDeletionPolicy == .keepAndReupload)
    }

    /// Whether `event` is a fetched-changes event deleting exactly `ids`.
    private static func deletes(_ event: CloudSyncEvent, _ ids: [UUID]) -> Bool {
        if case let .fetchedChanges(changes) = event { Set(changes.deleted.map(\.id)) == Set(ids) && changes.inserted.isEmpty } else { false }
    }

    @Test("the runtime reports the reason before the erase it leads to", arguments: [ZoneDeletionReason.deleted, .purged])
    func runtimeReportsReasonThenErase(reason: ZoneDeletionReason) async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 20)
        let ids = try device.save("one", "two")
        var options = CloudSync.Options()
        options.zoneDeletionPolicy = .eraseLocalData
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await eventually { await sync.lastSyncDate != nil })
        cloud.resetZone("notes", reason: reason)
        #expect(try await sync.syncNow().isUpToDate)
        #expect(await log.waitFor { Self.deletes($0, ids) })
        let events = log.all
        let deletion = try #require(events.firstIndex(of: .zoneDeleted(zone: "notes", reason: reason)))
        let erase = try #require(events.firstIndex { Self.deletes($0, ids) })
        #expect(deletion < erase)
        #expect(try device.titles().isEmpty)
        await sync.stop()
    }

    @Test("the runtime asked: blocked with the store untouched until resolveZoneDeletion, then erased and syncing")
    func runtimeAsks() async throws {
        let cloud = InMemoryCloudDatabase()
        let device = try RuntimeDevice(seed: 21)
        let ids = try device.save("one", "two")
        var options = CloudSync.Options()
        options.zoneDeletionPolicy = .ask
        #expect(options.engine.zoneDeletionPolicy == .ask)
        let sync = try device.container.startSync(store: "notes", cloud: cloud, options: options)
        let log = EventLog(sync)
        #expect(await eventually { await sync.lastSyncDate != nil })
        cloud.resetZone("notes", reason: .purged)
        let status = try await sync.syncNow()
        let question = ZoneDeletion(storeName: "notes", zone: "notes", reason: .purged)
        #expect(status.zoneDeletion == question)
        #expect(await sync.pendingZoneDeletion == question)
        #expect(await log.waitFor { $0 == .zoneDeleted(zone: "notes", reason: .purged) })
        #expect(await sync.state == .blocked)
        #expect(try device.titles() == ["one", "two"])
        #expect(try await sync.resolveZoneDeletion(.eraseLocalData))
        #expect(await log.waitFor { Self.deletes($0, ids) })
        #expect(try await sync.syncNow().isUpToDate)
        #expect(try device.titles().isEmpty)
        #expect(await sync.state == .idle)
        #expect(try await !sync.resolveZoneDeletion(.keepAndReupload))
        await sync.stop()
    }

    @Test("a key reset deletes the zone as an encrypted-data reset: other devices hear that reason, the resetting one keeps its data")
    func keyResetIsEncryptedDataReset() throws {
        let cloud = InMemoryCloudDatabase()
        var erasing = SyncEngine.Options()
        erasing.zoneDeletionPolicy = .eraseLocalData(for: Set(ZoneDeletionReason.allCases))
        var asking = SyncEngine.Options()
        asking.zoneDeletionPolicy = .ask
        let a = try CryptoDevice("A", seed: 30, encryption: try Keys.passphrase("old"), options: erasing)
        let b = try CryptoDevice("B", seed: 31, encryption: try Keys.passphrase("old"), options: asking)
        a.context.insert(Diary(title: "kept", secret: "kept secret"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        try a.engine.resetEncryption(keyProvider: PassphraseKeyProvider(passphrase: "new", limits: .minimum))
        // A performs its requests up to and including the zone's deletion.
        var deleted = false
        for _ in 0..<20 where !deleted {
            let request = try #require(try a.engine.nextRequest())
            if case .resetZone(_, .encryptedDataReset) = request.operation { deleted = true }
            try a.engine.handle(request.id, cloud.performNow(request.operation))
        }
        #expect(deleted)
        #expect(throws: CloudError.zoneDeleted(reason: .encryptedDataReset)) { try cloud.zoneMetadata("notes") }
        #expect(try b.sync(cloud).zoneDeletion?.reason == .encryptedDataReset)
        // A's own deletion is no news to it: it keeps its data (whatever its policy) and uploads it under the new key.
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try a.diaries().map(\.title) == ["kept"])
        #expect(cloud.records(in: "notes").count == 1)
    }

    @Test("replica-cloud init upgrades a schema from before deletion reasons: zones deleted before stay merely missing",
          .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
    func postgresUpgrade() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase(installing: false)
        try server.administration(database: database).install(upTo: 3)
        let old = try server.cloud(owner: "upgraded", database: database)
        try await old.createZone("before")
        try await old.createZone("after")
        // Deleted on step 3's server, which keeps no reason.
        try server.superuserSQL("DELETE FROM replica.zone WHERE owner = 'upgraded' AND name = 'before'", database: database)
        await #expect(throws: CloudError.zoneNotFound) { try await old.zoneMetadata("before") }
        _ = try server.administration(database: database).install()
        #expect(try server.administration(database: database).schemaVersion() == PostgresCloudSchema.currentVersion)
        let cloud = try server.cloud(owner: "upgraded", database: database)
        await #expect(throws: CloudError.zoneNotFound) { try await cloud.zoneMetadata("before") }
        try await cloud.deleteZone("after", reason: .encryptedDataReset)
        await #expect(throws: CloudError.zoneDeleted(reason: .encryptedDataReset)) { try await cloud.fetchZoneChanges("after", since: nil, limit: 5) }
    }
}
