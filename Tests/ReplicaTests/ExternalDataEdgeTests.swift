import Foundation
import Testing
@_spi(Simulation) @testable import Replica

// Edge cases of `ExternalData` (the lazy handle to an external-storage value): a new user's walk through the API,
// then attempts to make it lose data, trap, or return wrong bytes.

/// A photo library's photo, as a new user would write it from the documentation of `ExternalData`.
struct LibraryPhoto: PersistentModel, Codable {
    var id = UUID.unassigned
    var title = ""
    var image: ExternalData?

    static let entity = ModelEntity<LibraryPhoto>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
    ])
}

/// The `AssetPhoto` entity of the asset-sync tests, its image read through a handle.
struct LazyAssetPhoto: PersistentModel, Codable, Equatable {
    static var entityName: String { "AssetPhoto" }
    var id = UUID.unassigned
    var title: String = ""
    var image: ExternalData?
    static let entity = ModelEntity<LazyAssetPhoto>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
    ])
}

/// The `KeptScan` entity of the external-storage tests (image preserved in the tombstone), read through a handle.
struct LazyKeptScan: PersistentModel, Codable, Equatable {
    static var entityName: String { "KeptScan" }
    var id = UUID.unassigned
    var title: String = ""
    var image: ExternalData?
    static let entity = ModelEntity<LazyKeptScan>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: [.externalStorage, .preserveValueOnDeletion]),
    ])
}

/// The `VaultEntry` entity of the encrypted-asset tests (a sealed asset), its scan read through a handle.
struct LazyVaultEntry: PersistentModel, Codable, Equatable {
    static var entityName: String { "VaultEntry" }
    var id = UUID.unassigned
    var title: String = ""
    var scan: ExternalData?
    static let entity = ModelEntity<LazyVaultEntry>([
        .attribute("title", \.title, default: ""),
        .attribute("scan", \.scan, options: [.externalStorage, .allowsCloudEncryption]),
    ])
}

/// Version 1 of an album: a photo with an image.
enum AlbumV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Photo.self] }
    struct Photo: PersistentModel, Codable {
        static var entityName: String { "AlbumPhoto" }
        var id = UUID.unassigned
        var title = ""
        var image: ExternalData?
        static let entity = ModelEntity<Photo>([
            .attribute("title", \.title, default: ""),
            .attribute("image", \.image, options: .externalStorage),
        ])
    }
}

/// Version 2: the image moves to `original`, and `edited` starts as a copy of it (a custom stage does both).
enum AlbumV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Photo.self] }
    struct Photo: PersistentModel, Codable {
        static var entityName: String { "AlbumPhoto" }
        var id = UUID.unassigned
        var title = ""
        var image: ExternalData?
        var original: ExternalData?
        var edited: ExternalData?
        static let entity = ModelEntity<Photo>([
            .attribute("title", \.title, default: ""),
            .attribute("image", \.image, options: .externalStorage),
            .attribute("original", \.original, options: .externalStorage),
            .attribute("edited", \.edited, options: .externalStorage),
        ])
    }
}

enum AlbumPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [AlbumV1.self, AlbumV2.self] }
    static var stages: [MigrationStage] {
        [.custom(fromVersion: AlbumV1.self, toVersion: AlbumV2.self, willMigrate: nil, didMigrate: { context in
            for var photo in try context.fetch(AlbumV2.Photo.self) {
                photo.original = photo.image
                photo.edited = photo.image
                photo.image = nil
                context.update(photo)
            }
            try context.save()
        })]
    }
}

/// A deduplicated attachment: no two records may hold the same bytes.
struct UniqueAttachment: PersistentModel, Codable {
    var id = UUID.unassigned
    var name = ""
    var content: ExternalData?
    static let entity = ModelEntity<UniqueAttachment>([
        .attribute("name", \.name, default: ""),
        .attribute("content", \.content, options: [.externalStorage, .unique]),
    ])
}

/// One synced device of store "photos" whose schema declares `AssetPhoto` through `model`.
private final class EdgeDevice {
    let container: ModelContainer
    let engine: SyncEngine
    let clock: ManualClock
    let directory: URL

    init(seed: UInt64, model: any PersistentModel.Type, inMemory: Bool = false) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-edge-\(UUID().uuidString)")
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
        clock = environment.clock as! ManualClock
        container = try ModelContainer(for: Schema([model]), configurations: [
            ModelConfiguration("photos", isStoredInMemoryOnly: inMemory, cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        engine = try SyncEngine(container: container, storeName: "photos")
    }

    deinit { try? FileManager.default.removeItem(at: directory) }

    @discardableResult
    func sync(_ cloud: InMemoryCloudDatabase, maxSteps: Int = 2_000) throws -> SyncStatus {
        engine.setNeedsFetch()
        for _ in 0..<maxSteps {
            if let request = try engine.nextRequest() {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else {
                break
            }
        }
        return try engine.status()
    }
}

@Suite("External data edge cases")
struct ExternalDataEdgeTests {
    let directory = TestDirectory()

    func container(_ name: String = "photos", url: URL? = nil, inMemory: Bool = false, allowsSave: Bool = true,
                   models: [any PersistentModel.Type] = [LibraryPhoto.self]) throws -> ModelContainer {
        let schema = Schema(models)
        let configuration = url.map { ModelConfiguration(name, schema: schema, url: $0, allowsSave: allowsSave) }
            ?? ModelConfiguration(name, schema: schema, isStoredInMemoryOnly: inMemory, allowsSave: allowsSave)
        return try ModelContainer(for: schema, configurations: [configuration], environment: directory.environment())
    }

    func file(_ name: String, _ data: Data) throws -> URL {
        let url = directory.url.appendingPathComponent(name)
        try data.write(to: url)
        return url
    }

    func assetFiles(_ name: String = "photos") -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory.storeURL(name).path + "-assets")) ?? []).sorted()
    }

    // MARK: A new user's photo library

    @Test("usage: import a photo from a file, list without loading, show one, rename, copy into another record, delete")
    func photoLibrary() throws {
        let container = try container()
        let context = ModelContext(container)
        let jpeg = externalBytes(3 << 20 | 77, seed: 1)
        let camera = try file("IMG_0001.jpg", jpeg)

        // Import: the file is hashed now, copied at the save.
        let photo = context.insert(LibraryPhoto(title: "Beach", image: try ExternalData(contentsOf: camera)))
        context.insert(LibraryPhoto(title: "Empty"))
        try context.save()
        // The camera file may go once saved.
        try FileManager.default.removeItem(at: camera)

        // The list: titles and sizes, no bytes read.
        let list = try ModelContext(container).fetch(FetchDescriptor<LibraryPhoto>(sortBy: [SortDescriptor(\.title)]))
        #expect(list.map(\.title) == ["Beach", "Empty"])
        #expect(list.map { $0.image?.count } == [jpeg.count, nil])
        #expect(list[0].image?.isLoaded == false)

        // Show one: the bytes, whole and a header range.
        #expect(try list[0].image?.data() == jpeg)
        #expect(try list[0].image?.read(0..<4) == jpeg.prefix(4))

        // Rename: the image is not written again.
        var beach = list[0]
        beach.title = "Beach, 2026"
        context.update(beach)
        try context.save()
        #expect(assetFiles() == [beach.image!.sha256])

        // Copy the image into another record: one file for both.
        var empty = list[1]
        empty.image = beach.image
        context.update(empty)
        try context.save()
        #expect(assetFiles() == [beach.image!.sha256])
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: empty.id)?.image?.data() == jpeg)

        // Delete the original: the copy still reads; delete both: the file goes.
        context.delete(try #require(try context.model(LibraryPhoto.self, id: photo.id)))
        try context.save()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: empty.id)?.image?.data() == jpeg)
        context.delete(try #require(try context.model(LibraryPhoto.self, id: empty.id)))
        try context.save()
        #expect(assetFiles() == [])
        #expect(try context.fetchCount(FetchDescriptor<LibraryPhoto>()) == 0)
    }

    // MARK: Sizes

    @Test("empty, 1 MiB and 1 MiB + 1 values round-trip through import, save, fetch, every read, and a copy into another store",
          arguments: [0, 1 << 20, (1 << 20) + 1])
    func sizes(_ size: Int) throws {
        let value = externalBytes(size, seed: UInt64(size) + 3)
        let source = try file("source-\(size).bin", value)
        let container = try container()
        let context = ModelContext(container)
        let imported = try ExternalData(contentsOf: source)
        #expect(imported.count == size)
        let fromFile = context.insert(LibraryPhoto(title: "file", image: imported)).id
        let fromBytes = context.insert(LibraryPhoto(title: "bytes", image: ExternalData(value))).id
        try context.save()
        for id in [fromFile, fromBytes] {
            let handle = try #require(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image)
            #expect(handle.count == size)
            #expect(try handle.data() == value)
            var chunks: [Int] = []
            try handle.forEachChunk { chunks.append($0.count) }
            #expect(chunks == (size == 0 ? [] : size <= 1 << 20 ? [size] : [1 << 20, size - (1 << 20)]))
            #expect(try handle.read(0..<size + 10) == value)
            let out = directory.url.appendingPathComponent("out-\(size).bin")
            try handle.write(to: out)
            #expect(try Data(contentsOf: out) == value)

            let other = try self.container("other-\(size)")
            let otherContext = ModelContext(other)
            let copy = otherContext.insert(LibraryPhoto(title: "copy", image: handle)).id
            try otherContext.save()
            #expect(try ModelContext(other).model(LibraryPhoto.self, id: copy)?.image?.data() == value)
        }
    }

    @Test("forEachChunk(size: .max) reads the value in one chunk (a loaded value and a file), without trapping or allocating the chunk size")
    func hugeChunkSize() throws {
        let value = externalBytes(100_000, seed: 31)
        let container = try container()
        let context = ModelContext(container)
        let id = context.insert(LibraryPhoto(title: "c", image: ExternalData(value))).id
        try context.save()
        let handle = try #require(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image)
        for item in [ExternalData(value), handle, try ExternalData(contentsOf: try file("chunk.bin", value))] {
            var chunks: [Data] = []
            try item.forEachChunk(size: .max) { chunks.append($0) }
            #expect(chunks == [value])
            chunks = []
            try item.forEachChunk(size: 1 << 40) { chunks.append($0) }
            #expect(chunks == [value])
        }
    }

    // MARK: Names and paths

    @Test("store names with ':' and non-ASCII characters, and directories with spaces and colons, read handles and save them",
          arguments: ["a:b", "photos ✓ 写真", "\u{301}accent-first", "\u{200D}zwj", "٠:", "x:99:evil"])
    func awkwardNames(_ name: String) throws {
        let folder = directory.url.appendingPathComponent("dir with space:colon/and:\u{301}more", isDirectory: true)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let url = folder.appendingPathComponent("store:\(name.count).store")
        let image = externalBytes(70_000, seed: 11)
        for (container, label) in [(try container(name), "default location"), (try container(name, url: url), "explicit url")] {
            let context = ModelContext(container)
            let id = context.insert(LibraryPhoto(title: "t", image: ExternalData(image))).id
            try context.save()
            let fetched = try ModelContext(container).model(LibraryPhoto.self, id: id)
            let handle = try #require(fetched?.image, "\(label)")
            #expect(!handle.isLoaded)
            #expect(try handle.data() == image, "\(label)")
            var renamed = try #require(fetched)
            renamed.title = "renamed"
            context.update(renamed)
            try context.save()
            let copy = context.insert(LibraryPhoto(title: "copy", image: handle)).id
            try context.save()
            #expect(try ModelContext(container).model(LibraryPhoto.self, id: copy)?.image?.data() == image, "\(label)")
        }
    }

    @Test("a store at an explicit URL whose configuration name holds a NUL character still reads its handles")
    func nulInName() throws {
        let image = externalBytes(5_000, seed: 34)
        let container: ModelContainer
        do {
            container = try self.container("nul\u{0}name", url: directory.url.appendingPathComponent("nul.store"))
        } catch {
            // Refusing the name is fine, for that reason.
            #expect("\(error)".contains("NUL"))
            return
        }
        let context = ModelContext(container)
        let id = context.insert(LibraryPhoto(title: "n", image: ExternalData(image))).id
        try context.save()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image?.data() == image)
    }

    // MARK: Read-only stores, closed containers

    @Test("a store opened read-only fetches handles that read; a handle outlives its container")
    func readOnlyAndClosed() throws {
        let image = externalBytes(123_456, seed: 12)
        let id: UUID
        do {
            let context = ModelContext(try container())
            id = context.insert(LibraryPhoto(title: "r", image: ExternalData(image))).id
            try context.save()
        }
        var handle: ExternalData?
        do {
            let readOnly = try container(allowsSave: false)
            handle = try ModelContext(readOnly).model(LibraryPhoto.self, id: id)?.image
            #expect(try handle?.data() == image)
        }
        // The container is gone: the handle still names the file.
        #expect(try handle?.data() == image)
        let context = ModelContext(try container())
        let copy = context.insert(LibraryPhoto(title: "copy", image: handle)).id
        try context.save()
        #expect(try context.model(LibraryPhoto.self, id: copy)?.image?.data() == image)
    }

    // MARK: Imports

    @Test("an imported file deleted, truncated or grown before the save fails the save; nothing is stored, and the store stays usable")
    func importedFileChanged() throws {
        let image = externalBytes(300_000, seed: 13)
        let container = try container()
        let context = ModelContext(container)
        let damages: [(URL) throws -> Void] = [
            { url in try FileManager.default.removeItem(at: url) },
            { url in try image.prefix(1000).write(to: url) },
            { url in try (image + Data([1])).write(to: url) },
        ]
        for (index, damage) in damages.enumerated() {
            let source = try file("import-\(index).bin", image)
            context.insert(LibraryPhoto(title: "i\(index)", image: try ExternalData(contentsOf: source)))
            try damage(source)
            let problem = externalStorageProblem { try context.save() }?.problem
            #expect(problem != nil, "damage \(index)")
            context.rollback()
            #expect(try context.fetchCount(FetchDescriptor<LibraryPhoto>()) == 0)
            #expect(assetFiles().allSatisfy { !$0.hasSuffix(".tmp") })
        }
        context.insert(LibraryPhoto(title: "ok", image: ExternalData(image)))
        try context.save()
        #expect(try context.fetch(FetchDescriptor<LibraryPhoto>()).first?.image?.data() == image)
    }

    @Test("a value imported through a relative file URL is saved, not written to the row as an unreadable description")
    func relativeImport() throws {
        let image = externalBytes(20_000, seed: 24)
        let absolute = try file("relative.bin", image)
        // The same file named relative to the working directory (a URL made from a string, not a file path).
        let depth = FileManager.default.currentDirectoryPath.split(separator: "/").count
        let relative = String(repeating: "../", count: depth) + absolute.path.dropFirst()
        let url = try #require(URL(string: relative))
        let value = try ExternalData(contentsOf: url)
        #expect(value.count == image.count)
        let container = try container()
        let context = ModelContext(container)
        let id = context.insert(LibraryPhoto(title: "relative", image: value)).id
        do {
            try context.save()
        } catch {
            // Refusing the value is acceptable; storing something unreadable is not.
            context.rollback()
            return
        }
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image?.data() == image)
        #expect(try ModelContext(try self.container(models: [LibraryPhoto.self])).fetchCount(FetchDescriptor<LibraryPhoto>()) == 1)
    }

    @Test("importing a FIFO (or any file that is not regular) throws notRegularFile at once instead of blocking")
    func importFIFO() throws {
        let fifo = directory.url.appendingPathComponent("pipe")
        #expect(mkfifo(fifo.path, 0o600) == 0)
        final class Outcome: @unchecked Sendable {
            let lock = NSLock()
            var problem: ExternalStorageError.Problem??
        }
        let outcome = Outcome()
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let problem = externalStorageProblem { _ = try ExternalData(contentsOf: fifo) }?.problem
            outcome.lock.withLock { outcome.problem = .some(problem) }
            done.signal()
        }
        let returned = done.wait(timeout: .now() + 3) == .success
        #expect(returned, "ExternalData(contentsOf:) blocked on a FIFO")
        if !returned {
            // Unblock the reader: a writer opens the FIFO (and closes it at once).
            let writer = open(fifo.path, O_WRONLY | O_NONBLOCK)
            if writer >= 0 { close(writer) }
            _ = done.wait(timeout: .now() + 10)
        }
        #expect(outcome.lock.withLock { outcome.problem } == .some(.notRegularFile))
    }

    @Test("errors and descriptions name neither the bytes nor the directory of an imported file")
    func errorsDoNotLeakPaths() throws {
        let secretFolder = directory.url.appendingPathComponent("secret-folder-name", isDirectory: true)
        try FileManager.default.createDirectory(at: secretFolder, withIntermediateDirectories: true)
        let source = secretFolder.appendingPathComponent("doc.bin")
        try Data("top secret bytes".utf8).write(to: source)
        let value = try ExternalData(contentsOf: source)
        #expect(!value.description.contains("secret"))
        #expect(!String(describing: value).contains("secret-folder"))
        #expect(!String(reflecting: value).contains("secret-folder"), "debugDescription / reflection shows the path")
        try FileManager.default.removeItem(at: source)
        let errors: [any Error] = [
            try #require({ () -> (any Error)? in do { _ = try value.data(); return nil } catch { return error } }()),
            try #require({ () -> (any Error)? in do { _ = try value.read(0..<3); return nil } catch { return error } }()),
            try #require({ () -> (any Error)? in
                let context = ModelContext(try container())
                context.insert(LibraryPhoto(title: "s", image: value))
                do { try context.save(); return nil } catch { return error }
            }()),
        ]
        for error in errors {
            #expect(!String(describing: error).contains("secret-folder"))
            #expect(!String(describing: error).contains("top secret"))
        }
    }

    // MARK: Undo and redo

    @Test("undo and redo of an insert from an imported file, after the file was removed, bring the bytes back")
    func undoRedoImported() throws {
        let image = externalBytes(200_000, seed: 14)
        let container = try container()
        let context = ModelContext(container)
        context.undoManager = ModelUndoManager()
        let source = try file("undo.bin", image)
        let id = context.insert(LibraryPhoto(title: "u", image: try ExternalData(contentsOf: source))).id
        try context.save()
        try FileManager.default.removeItem(at: source)
        let undo = try #require(context.undoManager)
        _ = try undo.undo()
        #expect(try context.fetchCount(FetchDescriptor<LibraryPhoto>()) == 0)
        #expect(assetFiles() == [])
        _ = try undo.redo()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image?.data() == image)
        _ = try undo.undo()
        _ = try undo.redo()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image?.data() == image)
    }

    @Test("undo and redo of a handle copied into another record and the source deleted")
    func undoRedoCopiedHandle() throws {
        let image = externalBytes(150_000, seed: 15)
        let other = externalBytes(10_000, seed: 16)
        let container = try container()
        let context = ModelContext(container)
        context.undoManager = ModelUndoManager()
        let a = context.insert(LibraryPhoto(title: "a", image: ExternalData(image))).id
        let b = context.insert(LibraryPhoto(title: "b", image: ExternalData(other))).id
        try context.save()
        let undo = try #require(context.undoManager)
        var fetchedB = try #require(try context.model(LibraryPhoto.self, id: b))
        fetchedB.image = try context.model(LibraryPhoto.self, id: a)?.image
        context.update(fetchedB)
        context.delete(try #require(try context.model(LibraryPhoto.self, id: a)))
        try context.save()
        #expect(assetFiles() == [ExternalData(image).sha256])
        _ = try undo.undo()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: a)?.image?.data() == image)
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: b)?.image?.data() == other)
        _ = try undo.redo()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: a) == nil)
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: b)?.image?.data() == image)
        _ = try undo.undo()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: b)?.image?.data() == other)
    }

    @Test("renaming a photo with an undo manager does not read its image file (only changed fields are kept for undo)")
    func undoRenameReadsNoImage() throws {
        let image = externalBytes(4 << 20, seed: 25)
        let container = try container()
        let context = ModelContext(container)
        context.undoManager = ModelUndoManager()
        let id = context.insert(LibraryPhoto(title: "before", image: ExternalData(image))).id
        try context.save()
        let path = directory.storeURL("photos").path + "-assets/" + ExternalData(image).sha256
        // An access time before the modification time: relatime updates it at the next read.
        var info = stat()
        #expect(stat(path, &info) == 0)
        let old = info.st_mtim.tv_sec - 1_000
        var times = [timespec(tv_sec: old, tv_nsec: 0), info.st_mtim]
        #expect(utimensat(AT_FDCWD, path, &times, 0) == 0)
        var photo = try #require(try context.model(LibraryPhoto.self, id: id))
        photo.title = "after"
        context.update(photo)
        try context.save()
        #expect(stat(path, &info) == 0)
        #expect(info.st_atim.tv_sec == old, "the save read the unchanged image (O(size) per rename)")
        // Undo still sets the title back, and the image is untouched.
        _ = try #require(context.undoManager).undo()
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: id)?.title == "before")
        #expect(try ModelContext(container).model(LibraryPhoto.self, id: id)?.image?.data() == image)
    }

    @Test("two concurrent write(to:) of one destination both succeed, and the file holds one of the values whole")
    func concurrentExports() throws {
        let first = ExternalData(externalBytes(3 << 20, seed: 28)), second = ExternalData(externalBytes(3 << 20, seed: 29))
        let destination = directory.url.appendingPathComponent("export.jpg")
        final class Failures: @unchecked Sendable {
            let lock = NSLock()
            var errors: [String] = []
        }
        let failures = Failures()
        for _ in 0..<6 {
            let group = DispatchGroup()
            for value in [first, second] {
                group.enter()
                Thread.detachNewThread {
                    do { try value.write(to: destination) } catch { failures.lock.withLock { failures.errors.append("\(error)") } }
                    group.leave()
                }
            }
            group.wait()
            let written = try Data(contentsOf: destination)
            let values = [try first.data(), try second.data()]
            #expect(values.contains(written))
        }
        #expect(failures.lock.withLock { failures.errors } == [])
    }

    @Test("a unique external attribute: inserting bytes another record holds updates that record (an upsert), through Data and through a handle")
    func uniqueContent() throws {
        let bytes = externalBytes(30_000, seed: 30)
        let container = try container(models: [UniqueAttachment.self])
        let context = ModelContext(container)
        context.insert(UniqueAttachment(name: "first", content: ExternalData(bytes)))
        try context.save()
        context.insert(UniqueAttachment(name: "second", content: ExternalData(bytes)))
        try? context.save()
        context.rollback()
        context.insert(UniqueAttachment(name: "third", content: try ExternalData(contentsOf: try file("unique.bin", bytes))))
        try? context.save()
        context.rollback()
        let all = try ModelContext(container).fetch(FetchDescriptor<UniqueAttachment>())
        // The uniqueness check and the upsert compared the snapshot's value (bytes, or a handle's file description)
        // with the row's reference (`replica-asset:sha256:…`), which never matched: neither an upsert nor a violation
        // happened, for a `Data` property alike. Keys of external fields now compare as references.
        #expect(all.count == 1, "two records hold the same unique bytes")
        #expect(all.first?.name == "third")
        #expect(try all.first?.content?.data() == bytes)
    }

    @Test("a handle moved from a record of one store to a record of another store in one save (the source deleted): the bytes arrive")
    func moveBetweenStoresInOneSave() throws {
        let image = externalBytes(600_000, seed: 32)
        let environment = directory.environment()
        let container = try ModelContainer(for: Schema([LibraryPhoto.self, LazyAssetPhoto.self]), configurations: [
            ModelConfiguration("library", schema: Schema([LibraryPhoto.self])),
            ModelConfiguration("archive", schema: Schema([LazyAssetPhoto.self])),
        ], environment: environment)
        let context = ModelContext(container)
        let id = context.insert(LibraryPhoto(title: "move me", image: ExternalData(image))).id
        try context.save()
        let photo = try #require(try context.model(LibraryPhoto.self, id: id))
        let archived = context.insert(LazyAssetPhoto(title: photo.title, image: photo.image)).id
        context.delete(photo)
        try context.save()
        #expect(try ModelContext(container).model(LazyAssetPhoto.self, id: archived)?.image?.data() == image)
        #expect(assetFiles("library") == [])
        #expect(assetFiles("archive") == [ExternalData(image).sha256])
    }

    @Test("a store whose file name ends in .migrating keeps its own asset files (another store at the name without the suffix collects them)")
    func migratingSuffix() throws {
        let image = externalBytes(10_000, seed: 33)
        let folder = directory.url.appendingPathComponent("suffix", isDirectory: true)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let odd = try container("odd", url: folder.appendingPathComponent("library.migrating"))
        let context = ModelContext(odd)
        let id = context.insert(LibraryPhoto(title: "x", image: ExternalData(image))).id
        try context.save()
        // Another store at "library" opens (and collects) beside it.
        _ = try container("plain", url: folder.appendingPathComponent("library"))
        let read = try? ModelContext(odd).model(LibraryPhoto.self, id: id)?.image?.data()
        // AssetStore took any store URL ending in .migrating for a migration's copy: it shared (and never collected)
        // the asset directory of the URL without the suffix, whose store then collected this one's files.
        #expect(read == image)
    }

    // MARK: Migration

    @Test("a custom migration stage moves and copies handles between attributes; the bytes survive and one file stays")
    func migrationWithHandles() throws {
        let image = externalBytes(1_500_000, seed: 26)
        let url = directory.url.appendingPathComponent("album.store")
        let id: UUID
        do {
            let v1 = try ModelContainer(for: AlbumV1.schema, configurations: [ModelConfiguration("album", url: url)],
                                        environment: directory.environment())
            let context = ModelContext(v1)
            id = context.insert(AlbumV1.Photo(title: "p", image: try ExternalData(contentsOf: try file("album.bin", image)))).id
            try context.save()
        }
        let v2 = try ModelContainer(for: AlbumV2.schema, migrationPlan: AlbumPlan.self,
                                    configurations: [ModelConfiguration("album", url: url)], environment: directory.environment())
        let photo = try #require(try ModelContext(v2).model(AlbumV2.Photo.self, id: id))
        #expect(photo.image == nil)
        #expect(try photo.original?.data() == image)
        #expect(try photo.edited?.data() == image)
        let files = try FileManager.default.contentsOfDirectory(atPath: url.path + "-assets")
        #expect(files == [ExternalData(image).sha256])
        // Reopened (a collection runs): still there.
        let again = try ModelContainer(for: AlbumV2.schema, migrationPlan: AlbumPlan.self,
                                       configurations: [ModelConfiguration("album", url: url)], environment: directory.environment())
        #expect(try ModelContext(again).model(AlbumV2.Photo.self, id: id)?.edited?.data() == image)
    }

    // MARK: Sealed assets

    @Test("a sealed asset saved through handles (imported, then copied into another record) arrives on other devices, read as Data and as ExternalData")
    func sealedHandles() throws {
        let cloud = InMemoryCloudDatabase()
        let key = [UInt8](repeating: 7, count: 32)
        let a = try CryptoDevice("a", seed: 1, encryption: try FieldEncryption.rawKey(key), models: [LazyVaultEntry.self])
        let b = try CryptoDevice("b", seed: 2, encryption: try FieldEncryption.rawKey(key), models: [VaultEntry.self])
        let c = try CryptoDevice("c", seed: 3, encryption: try FieldEncryption.rawKey(key), models: [LazyVaultEntry.self])
        let scan = externalBytes(CloudAssetReference.chunkSize + 17, seed: 27)
        let first = a.context.insert(LazyVaultEntry(title: "1", scan: try ExternalData(contentsOf: try file("scan.bin", scan)))).id
        let second = a.context.insert(LazyVaultEntry(title: "2")).id
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        var two = try #require(try a.context.model(LazyVaultEntry.self, id: second))
        two.scan = try a.context.model(LazyVaultEntry.self, id: first)?.scan
        a.context.update(two)
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try b.sync(cloud).isUpToDate)
        let onB = try ModelContext(b.container).fetch(FetchDescriptor<VaultEntry>())
        #expect(onB.count == 2)
        #expect(onB.allSatisfy { $0.scan == scan })
        #expect(try c.sync(cloud).isUpToDate)
        let onC = try ModelContext(c.container).fetch(FetchDescriptor<LazyVaultEntry>())
        #expect(onC.count == 2)
        for entry in onC { #expect(try entry.scan?.data() == scan) }
    }

    // MARK: Overlay, predicates, propertiesToFetch, history, live queries

    @Test("pending handles pass the overlay with predicates, sorting and propertiesToFetch; history and tombstones read them")
    func overlayAndHistory() throws {
        let image = externalBytes(90_000, seed: 17)
        let container = try container(models: [LibraryPhoto.self, LazyKeptScan.self])
        let context = ModelContext(container)
        let source = try file("pending.bin", image)
        context.insert(LibraryPhoto(title: "b", image: try ExternalData(contentsOf: source)))
        context.insert(LibraryPhoto(title: "a"))
        let withImage = try context.fetch(FetchDescriptor<LibraryPhoto>(predicate: #Predicate { $0.image != nil }, sortBy: [SortDescriptor(\.title)]))
        #expect(withImage.map(\.title) == ["b"])
        #expect(try withImage.first?.image?.data() == image)
        #expect(try context.fetchCount(FetchDescriptor<LibraryPhoto>(predicate: #Predicate { $0.image == nil })) == 1)
        var titles = FetchDescriptor<LibraryPhoto>(sortBy: [SortDescriptor(\.title, order: .reverse)])
        titles.propertiesToFetch = [\.title]
        #expect(try context.fetch(titles).map { $0.image == nil } == [true, true])
        try context.save()
        #expect(try context.fetch(FetchDescriptor<LibraryPhoto>(predicate: #Predicate { $0.image != nil })).first?.image?.data() == image)

        // A tombstone's preserved value reads as a handle's bytes.
        let kept = context.insert(LazyKeptScan(title: "k", image: try ExternalData(contentsOf: source)))
        try context.save()
        let token = try context.currentHistoryToken(of: "photos")
        context.delete(kept)
        try context.save()
        let tombstones = try context.fetchHistory(HistoryDescriptor(after: token)).flatMap(\.changes).compactMap { change -> HistoryTombstone? in
            if case let .delete(_, tombstone) = change { return tombstone }
            return nil
        }
        #expect(tombstones.count == 1)
        #expect(try tombstones.first?.value("image", as: ExternalData.self).data() == image)
        #expect(try tombstones.first?.value("image", as: ExternalData?.self)?.data() == image)
    }

    @Test("a model fetched without its image (propertiesToFetch), renamed and saved, keeps the image; a Hashable set of handles works")
    func partialFetchKeepsImage() throws {
        let image = externalBytes(80_000, seed: 35)
        let container = try container()
        let context = ModelContext(container)
        let id = context.insert(LibraryPhoto(title: "partial", image: ExternalData(image))).id
        try context.save()
        var descriptor = FetchDescriptor<LibraryPhoto>()
        descriptor.propertiesToFetch = [\.title]
        let editing = ModelContext(container)
        var photo = try #require(try editing.fetch(descriptor).first)
        #expect(photo.image == nil)
        photo.title = "renamed"
        editing.update(photo)
        try editing.save()
        let reread = try #require(try ModelContext(container).model(LibraryPhoto.self, id: id))
        #expect(reread.title == "renamed")
        #expect(try reread.image?.data() == image)
        // Handles of one size hash alike but compare by content.
        let set: Set<ExternalData> = [ExternalData(image), try #require(reread.image), ExternalData(externalBytes(80_000, seed: 36))]
        #expect(set.count == 2)
    }

    @Test("a live query of models with handles delivers a changed image, and its handles read the bytes")
    func liveQuery() throws {
        let first = externalBytes(40_000, seed: 18), second = externalBytes(40_000, seed: 19)
        let container = try container()
        let context = ModelContext(container)
        let id = context.insert(LibraryPhoto(title: "l", image: ExternalData(first))).id
        try context.save()
        let live = try SynchronousLiveQuery(container.observe(FetchDescriptor<LibraryPhoto>()), context: ModelContext(container))
        #expect(try live.value.first?.image?.data() == first)
        var photo = try #require(try context.model(LibraryPhoto.self, id: id))
        photo.image = ExternalData(second)
        context.update(photo)
        try context.save()
        #expect(try live.refresh())
        #expect(try live.value.first?.image?.data() == second)
        // Same bytes again from a file: nothing changes.
        photo.image = try ExternalData(contentsOf: try file("same.bin", second))
        context.update(photo)
        try context.save()
        #expect(try live.refresh() == false)
    }

    // MARK: Several contexts and containers

    @Test("contexts on several threads saving handles of one file and of each other's records lose nothing")
    func concurrentContexts() async throws {
        let image = externalBytes(500_000, seed: 20)
        let container = try container()
        let source = try file("shared.bin", image)
        let seedContext = ModelContext(container)
        let original = seedContext.insert(LibraryPhoto(title: "original", image: ExternalData(image))).id
        try seedContext.save()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<4 {
                group.addTask {
                    let context = ModelContext(container)
                    for round in 0..<5 {
                        let handle = worker % 2 == 0 ? try ExternalData(contentsOf: source)
                            : try #require(try context.model(LibraryPhoto.self, id: original)?.image)
                        context.insert(LibraryPhoto(title: "w\(worker)-\(round)", image: handle))
                        try context.save()
                    }
                }
            }
            try await group.waitForAll()
        }
        let all = try ModelContext(container).fetch(FetchDescriptor<LibraryPhoto>())
        #expect(all.count == 21)
        for photo in all { #expect(try photo.image?.data() == image) }
        #expect(assetFiles() == [ExternalData(image).sha256])
    }

    @Test("one store file opened by two containers (an app and its extension): a handle from one saves into the other; a delete in one leaves the other's copy")
    func twoContainers() throws {
        let image = externalBytes(250_000, seed: 21)
        let url = directory.url.appendingPathComponent("group/shared.store")
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        let app = try container("shared", url: url), extensionContainer = try container("shared", url: url)
        let appContext = ModelContext(app), extensionContext = ModelContext(extensionContainer)
        let id = appContext.insert(LibraryPhoto(title: "app", image: ExternalData(image))).id
        try appContext.save()
        let handle = try #require(try extensionContext.model(LibraryPhoto.self, id: id)?.image)
        let copy = extensionContext.insert(LibraryPhoto(title: "ext", image: handle)).id
        try extensionContext.save()
        appContext.delete(try #require(try appContext.model(LibraryPhoto.self, id: id)))
        try appContext.save()
        #expect(try appContext.model(LibraryPhoto.self, id: copy)?.image?.data() == image)
        #expect(try extensionContext.model(LibraryPhoto.self, id: copy)?.image?.data() == image)
    }

    // MARK: Sync

    @Test("a value saved through a handle (imported, and copied between records) uploads once and arrives whole on another device, read as Data and as ExternalData",
          arguments: [false, true])
    func syncedHandles(inMemory: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try EdgeDevice(seed: 1, model: LazyAssetPhoto.self, inMemory: inMemory)
        let dataDevice = try EdgeDevice(seed: 2, model: AssetPhoto.self)
        let handleDevice = try EdgeDevice(seed: 3, model: LazyAssetPhoto.self, inMemory: inMemory)
        let image = externalBytes(CloudAssetReference.chunkSize * 2 + 5, seed: 22)
        let source = try file("sync.bin", image)
        let context = ModelContext(a.container)
        let id = context.insert(LazyAssetPhoto(title: "one", image: try ExternalData(contentsOf: source))).id
        let second = context.insert(LazyAssetPhoto(title: "two")).id
        try context.save()
        #expect(try a.sync(cloud).isUpToDate)
        // Copied into the second record through a handle fetched from the store.
        var two = try #require(try context.model(LazyAssetPhoto.self, id: second))
        two.image = try context.model(LazyAssetPhoto.self, id: id)?.image
        context.update(two)
        try context.save()
        #expect(try a.sync(cloud).isUpToDate)
        #expect(cloud.assets(in: "photos").count == 1)
        let records = try cloud.records(in: "photos")
        #expect(records.count == 2)
        for record in records {
            #expect(record.fields["image"]?.value == .text(CloudAssetReference(of: image).fieldValue))
        }

        #expect(try dataDevice.sync(cloud).isUpToDate)
        let asData = try ModelContext(dataDevice.container).fetch(FetchDescriptor<AssetPhoto>())
        #expect(asData.count == 2)
        #expect(asData.allSatisfy { $0.image == image })

        #expect(try handleDevice.sync(cloud).isUpToDate)
        let asHandles = try ModelContext(handleDevice.container).fetch(FetchDescriptor<LazyAssetPhoto>())
        #expect(asHandles.count == 2)
        for photo in asHandles { #expect(try photo.image?.data() == image) }

        // The receiving device renames through its handle: no asset moves again.
        var renamed = try #require(asHandles.first)
        renamed.title = "renamed"
        let receiving = ModelContext(handleDevice.container)
        receiving.update(renamed)
        try receiving.save()
        #expect(try handleDevice.sync(cloud).isUpToDate)
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try ModelContext(a.container).model(LazyAssetPhoto.self, id: renamed.id)?.title == "renamed")
        #expect(try ModelContext(a.container).model(LazyAssetPhoto.self, id: renamed.id)?.image?.data() == image)
    }

    @Test("an empty value synced to another device reads there as an empty handle, and copies into another record", arguments: [false, true])
    func syncedEmptyValue(fromHandle: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try EdgeDevice(seed: 5, model: fromHandle ? LazyAssetPhoto.self : AssetPhoto.self)
        let b = try EdgeDevice(seed: 6, model: LazyAssetPhoto.self)
        let context = ModelContext(a.container)
        let id = fromHandle ? context.insert(LazyAssetPhoto(title: "empty", image: try ExternalData(contentsOf: try file("empty.bin", Data())))).id
            : context.insert(AssetPhoto(title: "empty", image: Data())).id
        try context.save()
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try b.sync(cloud).isUpToDate)
        let receiving = ModelContext(b.container)
        let handle = try #require(try receiving.model(LazyAssetPhoto.self, id: id)?.image)
        #expect(handle.count == 0)
        #expect(try handle.data() == Data())
        var chunks = 0
        try handle.forEachChunk { _ in chunks += 1 }
        #expect(chunks == 0)
        let copy = receiving.insert(LazyAssetPhoto(title: "copy", image: handle)).id
        try receiving.save()
        #expect(try ModelContext(b.container).model(LazyAssetPhoto.self, id: copy)?.image?.data() == Data())
    }

    @Test("a synced record whose field holds a file description (not an asset reference) never becomes a handle to a local file")
    func remoteFileDescription() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try EdgeDevice(seed: 4, model: LazyAssetPhoto.self)
        // A file of this device the remote record names by path, size and hash.
        let secret = externalBytes(5_000, seed: 23)
        let secretURL = try file("private-notes.bin", secret)
        let form = FileHandleForm(hash: ExternalData(secret).sha256, size: secret.count, storeName: "x", path: secretURL.path)
        let id = UUID(uuidString: "018f0000-0000-7000-8000-000000000001")!
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 1_000, logical: 0, replica: UUID(uuidString: "018f0000-0000-7000-8000-0000000000aa")!))
        try cloud.createZone("photos")
        _ = try cloud.modifyRecords([CloudRecord(recordID: id, recordType: "AssetPhoto", causalLength: 1, created: stamp, fields: [
            "title": CloudField(value: .text("planted"), stamp: stamp), "image": CloudField(value: .text(form.text), stamp: stamp),
        ])], in: "photos")
        _ = try device.sync(cloud)
        let context = ModelContext(device.container)
        let handle: ExternalData?
        do {
            handle = try context.model(LazyAssetPhoto.self, id: id)?.image
        } catch {
            handle = nil  // refusing to read it is fine
        }
        #expect((try? handle?.read(0..<secret.count)) != secret, "a remote record made the app read a local file")
        #expect((try? handle?.data()) != secret, "a remote record made the app read a local file")
    }
}
