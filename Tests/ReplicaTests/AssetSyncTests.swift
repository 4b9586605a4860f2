import Foundation
import Synchronization
import Testing
@_spi(Simulation) @testable import Replica

/// A photo whose image is kept as an asset (`.externalStorage`); `kept` survives deletion in the tombstone.
struct AssetPhoto: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var image: Data?
    static let entity = ModelEntity<AssetPhoto>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
    ])
}

/// One device with a synced store "photos" (a file unless `inMemory`), its engine and clock.
final class AssetDevice {
    let container: ModelContainer
    private(set) var engine: SyncEngine
    let context: ModelContext
    let clock: ManualClock
    let directory: URL
    let faults = ArmedFaults()
    /// Every operation this device's engine asked for, in order (names and asset chunk indices).
    private(set) var operations: [CloudOperation] = []

    init(seed: UInt64, inMemory: Bool = false, directory: URL? = nil) throws {
        self.directory = directory ?? FileManager.default.temporaryDirectory.appendingPathComponent("replica-assets-\(UUID().uuidString)")
        var environment = ReplicaEnvironment.seeded(seed: seed, directory: self.directory)
        environment.faultHook = faults.hook
        clock = environment.clock as! ManualClock
        container = try ModelContainer(for: Schema([AssetPhoto.self]), configurations: [
            ModelConfiguration("photos", isStoredInMemoryOnly: inMemory, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        engine = try SyncEngine(container: container, storeName: "photos")
        context = ModelContext(container)
    }

    var storeURL: URL { directory.appendingPathComponent("photos.store") }
    var assetDirectory: URL { URL(fileURLWithPath: storeURL.path + "-assets") }
    func assetFiles() -> [String] { ((try? FileManager.default.contentsOfDirectory(atPath: assetDirectory.path)) ?? []).sorted() }

    /// Performs one request of the engine against `cloud`; `false` when it has none (a backoff is skipped).
    @discardableResult
    func step(_ cloud: InMemoryCloudDatabase) throws -> Bool {
        if let request = try engine.nextRequest() {
            operations.append(request.operation)
            try engine.handle(request.id, cloud.performNow(request.operation))
            return true
        }
        if let wake = engine.wakeTime {
            clock.set(milliseconds: wake)
            return true
        }
        return false
    }

    @discardableResult
    func sync(_ cloud: InMemoryCloudDatabase, maxSteps: Int = 2_000) throws -> SyncStatus {
        engine.setNeedsFetch()
        for _ in 0..<maxSteps where try step(cloud) {}
        return try engine.status()
    }

    /// The process crashed and started again: a new engine (after the crashed one's upload lease expired).
    func restartEngine() throws {
        engine.simulateCrash()
        engine = try SyncEngine(container: container, storeName: "photos")
        clock.advance(by: 60_000)
        operations = []
    }

    func forgetOperations() { operations = [] }

    func photos() throws -> [AssetPhoto] { try ModelContext(container).fetch(AssetPhoto.self).sorted { $0.title < $1.title } }

    /// Chunk indices of `uploadAssetChunk` requests, in order.
    var uploadedChunks: [Int] { operations.compactMap { if case let .uploadAssetChunk(_, index, _, _) = $0 { index } else { nil } } }
    var downloadedChunks: [Int] { operations.compactMap { if case let .downloadAssetChunk(_, index, _) = $0 { index } else { nil } } }
}

@Suite("Assets in sync")
struct AssetSyncTests {
    static let size = CloudAssetReference.chunkSize * 5 / 2  // three chunks, the last one half full

    @Test("an external-storage value travels as an asset: the record holds its reference, the bytes go in chunks first, the other device downloads them before merging", arguments: [false, true])
    func roundTrip(inMemory: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1, inMemory: inMemory), b = try AssetDevice(seed: 2, inMemory: inMemory)
        let image = assetBytes(Self.size, seed: 4)
        let asset = CloudAssetReference(of: image)
        let id = a.context.insert(AssetPhoto(title: "beach", image: image)).id
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        // The record carries the reference, never the bytes; the zone holds the asset, complete.
        let stored = try #require(cloud.records(in: "photos").first)
        #expect(stored.fields["image"]?.value == .text(asset.fieldValue))
        #expect(cloud.assets(in: "photos") == [CloudAssetUploadState(asset: asset, receivedChunks: [0, 1, 2], isComplete: true)])
        #expect(a.uploadedChunks == [0, 1, 2])
        // Every chunk went before the record.
        let modify = try #require(a.operations.firstIndex { if case .modifyRecords = $0 { true } else { false } })
        #expect(a.operations.lastIndex { if case .uploadAssetChunk = $0 { true } else { false } }! < modify)

        let status = try b.sync(cloud)
        #expect(status.isUpToDate)
        #expect(status.waitingForAsset == 0)
        #expect(try b.photos() == [AssetPhoto(id: id, title: "beach", image: image)])
        #expect(b.downloadedChunks == [0, 1, 2])
        if inMemory {
            #expect(b.assetFiles().isEmpty)
        } else {
            // The bytes are in the store's asset file; the row holds the reference; nothing stays staged.
            #expect(b.assetFiles() == [asset.hash])
            let db = try rawConnection(b.storeURL, readOnly: true)
            #expect(try db.scalar("SELECT image FROM \"AssetPhoto\"") == .text(asset.fieldValue))
            #expect(try db.scalar("SELECT count(*) FROM replica_sync_asset_chunk") == .integer(0))
        }
        // B's edit of another field sends the reference back, uploads no byte again, and A downloads nothing.
        var photo = try #require(try b.photos().first)
        photo.title = "beach, 2024"
        b.context.update(photo)
        try b.context.save()
        #expect(try b.sync(cloud).isUpToDate)
        #expect(b.uploadedChunks.isEmpty)
        #expect(try a.sync(cloud).isUpToDate)
        #expect(a.downloadedChunks.isEmpty)
        #expect(try a.photos().map(\.title) == ["beach, 2024"])
    }

    @Test("after another device re-created a reset zone, a device sends its assets again before the records the full read sends back, so a new device gets the bytes (found by the sealed-files exploration: the records went up referencing assets the zone no longer held)")
    func assetsGoUpAgainAfterZoneReset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 81), b = try AssetDevice(seed: 82)
        let image = assetBytes(Self.size, seed: 9)
        let id = a.context.insert(AssetPhoto(title: "dunes", image: image)).id
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        // The zone is reset (deleted with its assets); a device with nothing re-creates it.
        cloud.resetZone("photos")
        #expect(try b.sync(cloud).isUpToDate)
        a.forgetOperations()
        #expect(try a.sync(cloud).isUpToDate)
        let modify = try #require(a.operations.firstIndex { if case .modifyRecords = $0 { true } else { false } })
        let upload = a.operations.lastIndex { if case .uploadAssetChunk = $0 { true } else { false } }
        #expect(upload.map { $0 < modify } == true, "the record went up before its asset: \(a.operations.map { "\($0)".prefix(30) })")
        let c = try AssetDevice(seed: 83)
        let status = try c.sync(cloud)
        #expect(status.waitingForAsset == 0 && status.lastError == nil, "\(status)")
        #expect(try c.photos() == [AssetPhoto(id: id, title: "dunes", image: image)])
    }

    @Test("a save in flight across a zone reset that another device re-creates is refused for its missing asset, and the asset goes up again before the record (found by files-zone-reset seed 226: the record landed in the new zone referencing an asset that went with the old one, and no device could ever download it)")
    func saveRacingZoneResetUploadsAssetAgain() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 91), b = try AssetDevice(seed: 92)
        #expect(try b.sync(cloud).isUpToDate)
        let image = assetBytes(Self.size, seed: 10)
        let id = a.context.insert(AssetPhoto(title: "reef", image: image)).id
        try a.context.save()
        // A uploads the asset; its save of the record is in flight when the zone is reset and B re-creates it.
        var held: SyncRequest?
        for _ in 0..<200 where held == nil {
            let request = try #require(try a.engine.nextRequest())
            if case .modifyRecords = request.operation { held = request; break }
            try a.engine.handle(request.id, cloud.performNow(request.operation))
        }
        let save = try #require(held)
        #expect(cloud.assets(in: "photos").contains { $0.isComplete })
        cloud.resetZone("photos")
        #expect(try b.sync(cloud).isUpToDate)
        // The save reaches the new zone, which does not hold the asset: refused for that record alone.
        let answer = cloud.performNow(save.operation)
        guard case let .success(.modified(results)) = answer else { Issue.record("\(answer)"); return }
        #expect(results == [.failed(recordID: id, error: .assetNotFound(hash: CloudAssetReference(of: image).hash))])
        try a.engine.handle(save.id, answer)
        a.forgetOperations()
        let status = try a.sync(cloud)
        #expect(status.isUpToDate && status.rejectedRecords == 0, "\(status)")
        #expect(a.uploadedChunks == [0, 1, 2])
        let c = try AssetDevice(seed: 93)
        let seen = try c.sync(cloud)
        #expect(seen.waitingForAsset == 0 && seen.lastError == nil, "\(seen)")
        #expect(try c.photos() == [AssetPhoto(id: id, title: "reef", image: image)])
    }

    @Test("a version waiting for an asset that went with a reset zone stops waiting when the record's tombstone arrives (files-zone-reset seed 86: its author sent the delete again, never the asset, and the device waited for ever)")
    func tombstoneEndsWaitForLostAsset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 94), b = try AssetDevice(seed: 95)
        let id = a.context.insert(AssetPhoto(title: "kelp", image: assetBytes(Self.size, seed: 11))).id
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        // B fetches the record and is about to download its asset.
        b.engine.setNeedsFetch()
        for _ in 0..<100 where try b.engine.status().waitingForAsset == 0 { try b.step(cloud) }
        #expect(try b.engine.status().waitingForAsset == 1)
        // A deletes it; the zone is reset and A re-creates it, sending the tombstone (the asset is gone for good).
        a.context.delete(PersistentIdentifier(entityName: AssetPhoto.entityName, id: id))
        try a.context.save()
        cloud.resetZone("photos")
        #expect(try a.sync(cloud).isUpToDate)
        let status = try b.sync(cloud)
        #expect(status.isUpToDate && status.waitingForAsset == 0, "\(status)")
        #expect(try b.photos().isEmpty)
    }

    @Test("a device waiting for an asset a reset took merges the re-created zone's complete version now: its upload never sends its own older title over the newer one (large-files seed 328)")
    func uploadWhileJoinWaitsKeepsNewerFields() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try AssetDevice(seed: 96), tablet = try AssetDevice(seed: 97), laptop = try AssetDevice(seed: 98)
        let id = phone.context.insert(AssetPhoto(title: "first", image: assetBytes(Self.size, seed: 12))).id
        try phone.context.save()
        #expect(try phone.sync(cloud).isUpToDate)
        #expect(try tablet.sync(cloud).isUpToDate)
        #expect(try laptop.sync(cloud).isUpToDate)
        // The laptop replaces the image; the phone fetches that version and waits for its asset.
        var edited = try #require(try laptop.photos().first)
        edited.image = assetBytes(Self.size, seed: 13)
        laptop.context.update(edited)
        try laptop.context.save()
        #expect(try laptop.sync(cloud).isUpToDate)
        phone.engine.setNeedsFetch()
        for _ in 0..<100 where try phone.engine.status().waitingForAsset == 0 { try phone.step(cloud) }
        #expect(try phone.engine.status().waitingForAsset == 1)
        // The tablet, which never fetched the laptop's image, renames the photo; the zone is reset and the tablet
        // re-creates it with its version (the newer title, the older image: complete, its asset uploaded again).
        var renamed = try #require(try tablet.photos().first)
        renamed.title = "renamed on the tablet"
        tablet.context.update(renamed)
        try tablet.context.save()
        cloud.resetZone("photos")
        #expect(try tablet.sync(cloud).isUpToDate)
        // The phone fetches the tablet's version: joined with the waiting one, the laptop's image still wins and its
        // asset is gone, so the join waits; the tablet's version alone is complete and merges now.
        let status = try phone.sync(cloud)
        #expect(status.waitingForAsset == 1, "\(status)")
        #expect(try cloud.records(in: "photos").first { $0.recordID == id }?.fields["title"]?.value == .text("renamed on the tablet"))
        #expect(try phone.photos().map(\.title) == ["renamed on the tablet"])
        // Once the laptop sends its image again, every device converges on the newest of each field.
        #expect(try laptop.sync(cloud).isUpToDate)
        #expect(try phone.sync(cloud).isUpToDate)
        #expect(try tablet.sync(cloud).isUpToDate)
        for device in [phone, tablet, laptop] {
            #expect(try device.photos() == [AssetPhoto(id: id, title: "renamed on the tablet", image: assetBytes(Self.size, seed: 13))])
        }
    }

    @Test("dedup: equal bytes in several records, and bytes the zone holds already, are uploaded once")
    func dedup() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1), b = try AssetDevice(seed: 2)
        let image = assetBytes(CloudAssetReference.chunkSize + 1, seed: 5)
        a.context.insert(AssetPhoto(title: "one", image: image))
        a.context.insert(AssetPhoto(title: "two", image: image))
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        #expect(a.uploadedChunks == [0, 1])
        // Another device saving the same bytes finds them in the zone.
        b.context.insert(AssetPhoto(title: "three", image: image))
        try b.context.save()
        #expect(try b.sync(cloud).isUpToDate)
        #expect(b.uploadedChunks.isEmpty)
        #expect(b.downloadedChunks.isEmpty)  // its own file serves the records of A
        #expect(try b.photos().map(\.title) == ["one", "three", "two"])
        #expect(cloud.assets(in: "photos").count == 1)
    }

    @Test("an interrupted upload leaves the record pending; after a restart it resumes with the chunks the zone lacks")
    func resumeAfterInterruption() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1)
        let image = assetBytes(CloudAssetReference.chunkSize * 4, seed: 6)
        a.context.insert(AssetPhoto(title: "big", image: image))
        try a.context.save()
        // Zone, schema, fetch, prepare, chunks 0 and 1; then the network fails on chunk 2.
        while a.uploadedChunks.count < 2 { try a.step(cloud) }
        cloud.injectFailure(.networkUnavailable, for: .asset)
        try a.step(cloud)
        var status = try a.engine.status()
        #expect(status.pendingRecords == 1)
        #expect(status.lastError == .networkUnavailable)
        #expect(try cloud.records(in: "photos").isEmpty)
        #expect(cloud.assets(in: "photos").first?.receivedChunks == [0, 1])
        // The process dies; the next engine learns from the zone what it holds and sends the rest only.
        try a.restartEngine()
        status = try a.sync(cloud)
        #expect(status.isUpToDate)
        #expect(a.uploadedChunks == [2, 3])
        #expect(try cloud.records(in: "photos").count == 1)
        let b = try AssetDevice(seed: 2)
        #expect(try b.sync(cloud).isUpToDate)
        #expect(try b.photos().first?.image == image)
    }

    @Test("a record whose asset the cloud lacks waits (status, ledger), is never applied without its value, and merges once it is there")
    func waitsForAsset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1), b = try AssetDevice(seed: 2)
        let image = assetBytes(3_000, seed: 7)
        let asset = CloudAssetReference(of: image)
        let id = a.context.insert(AssetPhoto(title: "lost", image: image)).id
        try a.context.save()
        try a.sync(cloud)
        cloud.removeAsset(asset.hash, in: "photos")  // lost by the cloud (or collected too early)
        let status = try b.sync(cloud)
        #expect(status.waitingForAsset == 1)
        #expect(!status.isUpToDate)
        #expect(try b.photos().isEmpty, "applied without its value")
        let entry = try #require(try b.engine.ledgerEntry(for: PersistentIdentifier(entityName: "AssetPhoto", id: id)))
        guard case let .waitingForAsset(waited, reason) = entry.state else { Issue.record("\(entry.state)"); return }
        #expect(waited == asset)
        #expect(reason?.contains("not found") == true, "\(reason ?? "no reason")")
        #expect(try b.engine.ledgerEntries(in: .waitingForAsset).count == 1)
        // A restart keeps it waiting (the import committed it with the token).
        try b.restartEngine()
        #expect(try b.sync(cloud).waitingForAsset == 1)
        // The asset arrives (uploaded again); the next sync merges the record with its value.
        _ = try cloud.prepareAssetUpload(asset, in: "photos")
        _ = try cloud.uploadAssetChunk(asset, index: 0, bytes: image, in: "photos")
        let after = try b.sync(cloud)
        #expect(after.isUpToDate, "\(after)")
        #expect(try b.photos() == [AssetPhoto(id: id, title: "lost", image: image)])
    }

    @Test("tampering: downloaded bytes that do not hash to the asset's name are dropped, never applied; the record waits")
    func tamperedAsset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1), b = try AssetDevice(seed: 2)
        let image = assetBytes(CloudAssetReference.chunkSize + 10, seed: 8)
        let asset = CloudAssetReference(of: image)
        a.context.insert(AssetPhoto(title: "t", image: image))
        try a.context.save()
        try a.sync(cloud)
        #expect(cloud.tamperWithAsset(asset.hash, chunk: 1, in: "photos") { $0[3] ^= 0x40 })
        let status = try b.sync(cloud)
        #expect(status.waitingForAsset == 1)
        #expect(try b.photos().isEmpty)
        #expect(b.assetFiles().isEmpty, "a file of bytes that do not hash to the name was kept")
        guard case let .waitingForAsset(_, reason)? = try b.engine.ledgerEntries(in: .waitingForAsset).first?.state else {
            Issue.record("not waiting"); return
        }
        #expect(reason?.contains("hash") == true)
        #expect(try rawConnection(b.storeURL, readOnly: true).scalar("SELECT count(*) FROM replica_sync_asset_chunk") == .integer(0))
        // Repaired in the cloud: the next cycle downloads it again and merges.
        cloud.tamperWithAsset(asset.hash, chunk: 1, in: "photos") { $0[3] ^= 0x40 }
        #expect(try b.sync(cloud).isUpToDate)
        #expect(try b.photos().first?.image == image)
    }

    @Test("a value larger than the cloud's limit per asset: the record is kept, marked rejected with the reason; nothing else stops")
    func tooLarge() throws {
        let cloud = InMemoryCloudDatabase(maximumAssetSize: 2_000)
        let a = try AssetDevice(seed: 1)
        let big = a.context.insert(AssetPhoto(title: "big", image: assetBytes(2_001, seed: 1))).id
        a.context.insert(AssetPhoto(title: "small", image: assetBytes(1_999, seed: 2)))
        try a.context.save()
        let status = try a.sync(cloud)
        #expect(status.rejectedRecords == 1)
        #expect(status.pendingRecords == 0)
        let entry = try #require(try a.engine.ledgerEntry(for: PersistentIdentifier(entityName: "AssetPhoto", id: big)))
        guard case let .rejected(reason) = entry.state else { Issue.record("\(entry.state)"); return }
        #expect(reason.contains("AssetPhoto.image") && reason.contains("too large"), "\(reason)")
        #expect(try cloud.records(in: "photos").map { $0.fields["title"]?.value } == [.text("small")])
        #expect(try a.photos().count == 2)
        // A smaller value makes it go.
        var photo = try #require(try a.photos().first { $0.title == "big" })
        photo.image = assetBytes(100, seed: 3)
        a.context.update(photo)
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try cloud.records(in: "photos").count == 2)
    }

    @Test("a damaged or missing local file refuses its record with the reason; no byte of it reaches the cloud", arguments: [false, true])
    func damagedLocalFile(missing: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1)
        let image = assetBytes(5_000, seed: 9)
        let id = a.context.insert(AssetPhoto(title: "d", image: image)).id
        try a.context.save()
        let file = a.assetDirectory.appendingPathComponent(CloudAssetReference(of: image).hash)
        if missing {
            try FileManager.default.removeItem(at: file)
        } else {
            var damaged = image
            damaged[0] ^= 1
            try damaged.write(to: file)
        }
        let status = try a.sync(cloud)
        #expect(status.rejectedRecords == 1)
        guard case let .rejected(reason)? = try a.engine.ledgerEntry(for: PersistentIdentifier(entityName: "AssetPhoto", id: id))?.state else {
            Issue.record("not rejected"); return
        }
        #expect(reason.contains("AssetPhoto.image of record \(id.uuidString.lowercased())"), "\(reason)")
        // (The zone was asked whether it holds the asset — it might, from another device — and received no chunk.)
        #expect(cloud.assets(in: "photos").allSatisfy { $0.receivedChunks.isEmpty })
        #expect(a.uploadedChunks.isEmpty)
        #expect(try cloud.records(in: "photos").isEmpty)
    }

    @Test("a crash between writing the asset file and committing its row: the file is collected at the next open, nothing is uploaded")
    func crashBeforeCommit() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-assets-\(UUID().uuidString)")
        let kept = assetBytes(4_000, seed: 1), lost = assetBytes(6_000, seed: 2)
        do {
            let a = try AssetDevice(seed: 1, directory: directory)
            a.context.insert(AssetPhoto(title: "kept", image: kept))
            try a.context.save()
            a.faults.arm(.beforeCommit(store: "photos"))
            a.context.insert(AssetPhoto(title: "lost", image: lost))
            #expect(throws: ArmedFaults.Injected.self) { try a.context.save() }
            #expect(a.assetFiles().count == 2)
            a.engine.simulateCrash()
            a.container.releaseStoreLocksAsAfterCrash()
        }
        let again = try AssetDevice(seed: 1, directory: directory)
        #expect(again.assetFiles() == [CloudAssetReference(of: kept).hash])
        #expect(try again.sync(cloud).isUpToDate)
        #expect(cloud.assets(in: "photos").map(\.asset) == [CloudAssetReference(of: kept)])
        #expect(try cloud.records(in: "photos").count == 1)
    }

    @Test("older writers: a value sent inline (bytes in the record) still merges; sent again, it travels as an asset")
    func inlineFromOlderWriter() throws {
        let cloud = InMemoryCloudDatabase()
        let b = try AssetDevice(seed: 2)
        let image = assetBytes(2_500, seed: 3)
        let id = UUID(uuidString: "018f0000-0000-7000-8000-000000000001")!
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 1_000, logical: 0, replica: UUID(uuidString: "018f0000-0000-7000-8000-0000000000aa")!))
        try cloud.createZone("photos")
        _ = try cloud.modifyRecords([CloudRecord(recordID: id, recordType: "AssetPhoto", causalLength: 1, created: stamp, fields: [
            "title": CloudField(value: .text("old"), stamp: stamp), "image": CloudField(value: .blob(image), stamp: stamp),
        ])], in: "photos")
        #expect(try b.sync(cloud).isUpToDate)
        #expect(try b.photos() == [AssetPhoto(id: id, title: "old", image: image)])
        var photo = try #require(try b.photos().first)
        photo.title = "new"
        b.context.update(photo)
        try b.context.save()
        #expect(try b.sync(cloud).isUpToDate)
        let stored = try #require(try cloud.records(in: "photos").first)
        #expect(stored.fields["image"]?.value == .text(CloudAssetReference(of: image).fieldValue))
        #expect(cloud.assets(in: "photos").map(\.isComplete) == [true])
    }

    @Test("concurrent values: the newer asset wins on every device; a losing value is never downloaded")
    func concurrentValues() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try AssetDevice(seed: 1), b = try AssetDevice(seed: 2)
        a.context.insert(AssetPhoto(title: "p", image: assetBytes(1_000, seed: 1)))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        a.forgetOperations()
        b.forgetOperations()
        var fromA = try #require(try a.photos().first), fromB = try #require(try b.photos().first)
        let older = assetBytes(CloudAssetReference.chunkSize + 5, seed: 2), newer = assetBytes(1_500, seed: 3)
        fromA.image = older
        a.context.update(fromA)
        try a.context.save()
        b.clock.advance(by: 10_000)
        fromB.image = newer
        b.context.update(fromB)
        try b.context.save()
        try b.sync(cloud)
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try a.photos().first?.image == newer)
        #expect(try b.photos().first?.image == newer)
        #expect(b.downloadedChunks.isEmpty, "the losing value was downloaded")
        #expect(a.downloadedChunks == [0])  // the winning value, one chunk
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try b.sync(cloud).isUpToDate)
    }
}
