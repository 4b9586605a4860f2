import CSodium
import Foundation
import Testing
@testable import Replica

/// A scanned document: its image kept in a file beside the store, its thumbnail inline.
struct Scan: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var image: Data?
    var thumbnail: Data?
    static let entity = ModelEntity<Scan>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
        .attribute("thumbnail", \.thumbnail),
    ])
}

/// A scan whose image stays readable in its history tombstone after deletion.
struct KeptScan: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var image: Data?
    static let entity = ModelEntity<KeptScan>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: [.externalStorage, .preserveValueOnDeletion]),
    ])
}

@Suite("External storage")
struct ExternalStorageTests {
    let directory = TestDirectory()

    var storeURL: URL { directory.storeURL("scans") }
    var assetDirectory: URL { URL(fileURLWithPath: storeURL.path + "-assets") }

    func container(seed: UInt64 = 1, faults: ArmedFaults? = nil, synced: Bool = false) throws -> ModelContainer {
        var environment = directory.environment(seed: seed)
        environment.faultHook = faults?.hook
        let configuration = synced
            ? ModelConfiguration("scans", schema: Schema([Scan.self, KeptScan.self]), cloudKitDatabase: .private("iCloud.test"))
            : ModelConfiguration("scans", schema: Schema([Scan.self, KeptScan.self]))
        return try ModelContainer(for: Schema([Scan.self, KeptScan.self]), configurations: [configuration], environment: environment)
    }

    /// The names in the asset directory, sorted (empty when it does not exist).
    func assetFiles() -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: assetDirectory.path)) ?? []).sorted()
    }

    /// The storage class and text of a raw column value.
    func rawImage(_ id: UUID, table: String = "Scan") throws -> (type: String, value: SQLiteValue) {
        let db = try rawConnection(storeURL, readOnly: true)
        let row = try db.rows("SELECT typeof(image), image FROM \"\(table)\" WHERE id = ?", [id.sqliteValue])[0]
        guard case let .text(type) = row[0] else { return ("?", row[1]) }
        return (type, row[1])
    }

    @Test("a 5 MB value is written to a file beside the store, not into the SQLite file, and reads back")
    func roundTrip() throws {
        let image = externalBytes(5 << 20, seed: 1)
        let id: UUID
        do {
            let context = ModelContext(try container())
            id = context.insert(Scan(title: "big", image: image, thumbnail: Data([1, 2, 3]))).id
            try context.save()
        }
        let hash = libsodiumSHA256(image)
        #expect(assetFiles() == [hash])
        let file = try Data(contentsOf: assetDirectory.appendingPathComponent(hash))
        #expect(file == image)
        // The row holds the reference (hash, size); the database file stays small.
        let (type, value) = try rawImage(id)
        #expect(type == "text")
        #expect(value == .text("replica-asset:sha256:\(hash):\(5 << 20)"))
        let db = try rawConnection(storeURL)
        try db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        let size = try FileManager.default.attributesOfItem(atPath: storeURL.path)[.size] as! Int
        #expect(size < 256 << 10)
        // A new container reads the bytes back, by fetch and by ID.
        let context = ModelContext(try container())
        let fetched = try context.fetch(FetchDescriptor<Scan>())
        #expect(fetched.count == 1)
        #expect(fetched.first?.image == image)
        #expect(fetched.first?.thumbnail == Data([1, 2, 3]))
        #expect(try context.model(Scan.self, id: id)?.image == image)
    }

    @Test("equal values share one file; replacing or deleting a value removes its file once nothing references it")
    func sharingAndReplacing() throws {
        let context = ModelContext(try container())
        let a = externalBytes(70_000, seed: 2), b = externalBytes(90_000, seed: 3)
        var first = context.insert(Scan(title: "one", image: a))
        let second = context.insert(Scan(title: "two", image: a))
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(a)])
        first.image = b
        context.update(first)
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(a), libsodiumSHA256(b)].sorted())
        context.delete(second)
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(b)])
        // An unchanged value is not written again: the row keeps its reference, the file its inode.
        let before = try FileManager.default.attributesOfItem(atPath: assetDirectory.appendingPathComponent(libsodiumSHA256(b)).path)[.systemFileNumber] as? Int
        first.title = "renamed"
        context.update(first)
        try context.save()
        let after = try FileManager.default.attributesOfItem(atPath: assetDirectory.appendingPathComponent(libsodiumSHA256(b)).path)[.systemFileNumber] as? Int
        #expect(before == after)
        first.image = nil
        context.update(first)
        try context.save()
        #expect(assetFiles() == [])
        #expect(try rawImage(first.id).type == "null")
        #expect(try ModelContext(try container()).model(Scan.self, id: first.id)?.title == "renamed")
    }

    @Test("an in-memory store keeps the bytes in memory behind the same API")
    func inMemory() throws {
        let schema = Schema([Scan.self])
        let container = try ModelContainer(for: schema, configurations: [ModelConfiguration("mem", schema: schema, isStoredInMemoryOnly: true)],
                                           environment: directory.environment())
        let context = ModelContext(container)
        let image = externalBytes(300_000, seed: 4)
        let id = context.insert(Scan(title: "m", image: image)).id
        try context.save()
        #expect(try ModelContext(container).model(Scan.self, id: id)?.image == image)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.url.path).filter { $0.hasSuffix("-assets") }
        #expect(leftovers.isEmpty)
    }

    @Test("a synced store keeps external-storage values in files too (they sync as assets)")
    func syncedStoreFiles() throws {
        let context = ModelContext(try container(synced: true))
        let image = externalBytes(10_000, seed: 5)
        let id = context.insert(Scan(title: "s", image: image)).id
        try context.save()
        #expect(try rawImage(id) == ("text", .text(CloudAssetReference(of: image).fieldValue)))
        #expect(assetFiles() == [libsodiumSHA256(image)])
        #expect(try context.model(Scan.self, id: id)?.image == image)
    }

    @Test("a local store that kept files keeps them when it is opened synced; a value written inline earlier stays readable")
    func localThenSynced() throws {
        let image = externalBytes(20_000, seed: 6), inline = externalBytes(3_000, seed: 7)
        let id: UUID, old: UUID
        do {
            let context = ModelContext(try container())
            id = context.insert(Scan(title: "l", image: image)).id
            old = context.insert(Scan(title: "o")).id
            try context.save()
        }
        // A value a synced store wrote into its row before synced stores kept files.
        try rawConnection(storeURL).run("UPDATE \"Scan\" SET image = ? WHERE id = ?", [.blob(inline), old.sqliteValue])
        #expect(try rawImage(id).type == "text")
        let context = ModelContext(try container(synced: true))
        #expect(try rawImage(id).type == "text")
        #expect(try context.model(Scan.self, id: id)?.image == image)
        #expect(try context.model(Scan.self, id: old)?.image == inline)
        #expect(assetFiles() == [libsodiumSHA256(image)])
    }

    @Test("a missing or damaged file is a typed error naming store, entity, record and attribute")
    func missingAndCorruptFiles() throws {
        let image = externalBytes(50_000, seed: 7)
        let id: UUID
        do {
            let context = ModelContext(try container())
            id = context.insert(Scan(title: "x", image: image)).id
            try context.save()
        }
        let file = assetDirectory.appendingPathComponent(libsodiumSHA256(image))
        var damaged = image
        damaged[100] ^= 0xFF
        try damaged.write(to: file)
        let expected = { (problem: ExternalStorageError.Problem) in
            ReplicaError.externalStorage(ExternalStorageError(store: "scans", entity: "Scan", recordID: id, attribute: "image", problem: problem))
        }
        do {
            let context = ModelContext(try container())
            #expect(throws: expected(.hashMismatch)) { try context.fetch(FetchDescriptor<Scan>()) }
            #expect(throws: expected(.hashMismatch)) { try context.model(Scan.self, id: id) }
        }
        try Data(count: 10).write(to: file)
        #expect(throws: expected(.sizeMismatch(expected: 50_000, found: 10))) { try ModelContext(try container()).fetch(FetchDescriptor<Scan>()) }
        try FileManager.default.removeItem(at: file)
        #expect(throws: expected(.missingFile)) { try ModelContext(try container()).fetch(FetchDescriptor<Scan>()) }
        // Fields not fetched are not read: the other attributes stay readable.
        var descriptor = FetchDescriptor<Scan>()
        descriptor.propertiesToFetch = [\Scan.title]
        #expect(try ModelContext(try container()).fetch(descriptor).map(\.title) == ["x"])
    }

    @Test("a crash between writing the file and committing leaves a file the next open removes; committed files stay")
    func crashBeforeCommit() throws {
        let kept = externalBytes(40_000, seed: 8), lost = externalBytes(60_000, seed: 9)
        let faults = ArmedFaults()
        do {
            let context = ModelContext(try container(faults: faults))
            context.insert(Scan(title: "kept", image: kept))
            try context.save()
            faults.arm(.beforeCommit(store: "scans"))
            context.insert(Scan(title: "lost", image: lost))
            #expect(throws: ArmedFaults.Injected.self) { try context.save() }
            // The file was written before the commit that never came.
            #expect(assetFiles() == [libsodiumSHA256(kept), libsodiumSHA256(lost)].sorted())
        }
        // A write that crashed halfway leaves its temporary file too.
        try Data(count: 7).write(to: assetDirectory.appendingPathComponent(libsodiumSHA256(lost) + ".tmp"))
        let context = ModelContext(try container())
        #expect(assetFiles() == [libsodiumSHA256(kept)])
        #expect(try context.fetch(FetchDescriptor<Scan>()).map(\.image) == [kept])
    }

    @Test("a file referenced from a column an earlier schema's attribute left behind is kept")
    func leftoverColumnKeepsFile() throws {
        let old = externalBytes(12_000, seed: 14)
        let id: UUID
        do {
            let context = ModelContext(try container())
            id = context.insert(Scan(title: "o", image: externalBytes(100, seed: 15))).id
            try context.save()
        }
        // As an earlier schema with a data attribute `scan` (no longer declared) would have left the table.
        let db = try rawConnection(storeURL)
        try db.execute("ALTER TABLE \"Scan\" ADD COLUMN \"scan\" BLOB")
        try db.run("UPDATE \"Scan\" SET \"scan\" = ? WHERE id = ?", [.text(AssetStore.reference(for: old)), id.sqliteValue])
        try old.write(to: assetDirectory.appendingPathComponent(libsodiumSHA256(old)))
        _ = try container(seed: 2)
        #expect(assetFiles() == [libsodiumSHA256(old), libsodiumSHA256(externalBytes(100, seed: 15))].sorted())
    }

    @Test("a save that fails validation removes the files it wrote")
    func failedSave() throws {
        let context = ModelContext(try container())
        let saved = context.insert(Scan(title: "a", image: externalBytes(1000, seed: 10)))
        try context.save()
        var duplicate = Scan(title: "dup", image: externalBytes(2000, seed: 11))
        duplicate.id = saved.id
        context.insert(duplicate)
        #expect(throws: ReplicaError.self) { try context.save() }
        #expect(assetFiles() == [libsodiumSHA256(externalBytes(1000, seed: 10))])
    }

    @Test("a preserved value's file stays while a history tombstone references it, and goes with that history")
    func tombstoneReferences() throws {
        let image = externalBytes(30_000, seed: 12)
        let context = ModelContext(try container())
        let scan = context.insert(KeptScan(title: "k", image: image))
        try context.save()
        let afterInsert = try context.currentHistoryToken(of: "scans")
        context.delete(scan)
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(image)])
        // Reopening (a collection) keeps it too; the tombstone reads the bytes.
        let reopened = ModelContext(try container())
        #expect(assetFiles() == [libsodiumSHA256(image)])
        let deletes = try reopened.fetchHistory(HistoryDescriptor(after: afterInsert)).flatMap(\.changes).compactMap { change -> HistoryTombstone? in
            if case let .delete(_, tombstone) = change { return tombstone }
            return nil
        }
        #expect(deletes.count == 1)
        #expect(try deletes.first?.value("image", as: Data.self) == image)
        try reopened.deleteHistory(through: try reopened.currentHistoryToken(of: "scans"))
        #expect(assetFiles() == [])
    }

    @Test("undo after a save that removed a file writes it again")
    func undoRestoresFile() throws {
        let context = ModelContext(try container())
        context.undoManager = ModelUndoManager()
        let image = externalBytes(25_000, seed: 13)
        let scan = context.insert(Scan(title: "u", image: image))
        try context.save()
        context.delete(scan)
        try context.save()
        #expect(assetFiles() == [])
        try #require(context.undoManager).undo()
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(image)])
        #expect(try ModelContext(try container()).model(Scan.self, id: scan.id)?.image == image)
    }

    @Test("garbage: after random saves, deletes, failed saves and crashes, the directory holds exactly the referenced files")
    func garbage() throws {
        let random = SeededRandomSource(seed: 24)
        let faults = ArmedFaults()
        var live: [UUID: Data] = [:]
        var container: ModelContainer? = try self.container(faults: faults)
        var context = ModelContext(container!)
        var order: [UUID] = []
        for step in 0..<120 {
            let choice = random.next() % 10
            let value = externalBytes(Int(random.next() % 4096) + 1, seed: random.next() % 12)
            switch choice {
            case 0...3:
                let scan = context.insert(Scan(title: "s\(step)", image: value))
                try context.save()
                live[scan.id] = value
                order.append(scan.id)
            case 4...5 where !order.isEmpty:
                let id = order[Int(random.next() % UInt64(order.count))]
                var scan = try #require(try context.model(Scan.self, id: id))
                scan.image = value
                context.update(scan)
                try context.save()
                live[id] = value
            case 6...7 where !order.isEmpty:
                let id = order.remove(at: Int(random.next() % UInt64(order.count)))
                context.delete(try #require(try context.model(Scan.self, id: id)))
                try context.save()
                live[id] = nil
            case 8:
                // A crash before the commit: the context's changes are lost with the process.
                faults.arm(.beforeCommit(store: "scans"))
                context.insert(Scan(title: "crash", image: value))
                if let id = order.first, var scan = try context.model(Scan.self, id: id) {
                    scan.image = externalBytes(100, seed: random.next())
                    context.update(scan)
                }
                #expect(throws: ArmedFaults.Injected.self) { try context.save() }
                context = ModelContext(container!)
            default:
                // Restart: the next open collects.
                // (A new seed: the identifiers it hands out must not repeat the first run's.)
                container = nil
                container = try self.container(seed: UInt64(step) + 100, faults: faults)
                context = ModelContext(container!)
                #expect(Set(assetFiles()) == Set(live.values.map(libsodiumSHA256)))
            }
            // No referenced file is ever missing.
            #expect(Set(live.values.map(libsodiumSHA256)).isSubset(of: Set(assetFiles())), "step \(step)")
        }
        container = nil
        context = ModelContext(try self.container(seed: 999))
        #expect(Set(assetFiles()) == Set(live.values.map(libsodiumSHA256)))
        let fetched = try context.fetch(FetchDescriptor<Scan>())
        #expect(Dictionary(uniqueKeysWithValues: fetched.map { ($0.id, $0.image!) }) == live)
    }
}
