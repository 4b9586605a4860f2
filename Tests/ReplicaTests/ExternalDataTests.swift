import CSodium
import Foundation
import Testing
@testable import Replica

/// The `Scan` entity of the external-storage tests read through a lazy handle: same table, same attributes, the image
/// declared `ExternalData?` instead of `Data?`.
struct LazyScan: PersistentModel, Codable, Equatable {
    static var entityName: String { "Scan" }
    var id = UUID.unassigned
    var title: String = ""
    var image: ExternalData?
    var thumbnail: Data?
    static let entity = ModelEntity<LazyScan>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
        .attribute("thumbnail", \.thumbnail),
    ])
}

@Suite("External data handles")
struct ExternalDataTests {
    let directory = TestDirectory()

    func container(_ name: String = "scans", lazy: Bool = true, inMemory: Bool = false) throws -> ModelContainer {
        let schema = lazy ? Schema([LazyScan.self]) : Schema([Scan.self])
        // The default location of a store file is `directory.storeURL(name)`.
        let configuration = ModelConfiguration(name, schema: schema, isStoredInMemoryOnly: inMemory)
        return try ModelContainer(for: schema, configurations: [configuration], environment: directory.environment())
    }

    func assetFiles(_ name: String = "scans") -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory.storeURL(name).path + "-assets")) ?? []).sorted()
    }

    func assetPath(_ hash: String, store: String = "scans") -> String {
        directory.storeURL(store).path + "-assets/" + hash
    }

    @Test("a fetched model holds a handle, not the bytes; whole, ranged, chunked and file reads return the bytes a Data property saved")
    func fetchHoldsHandle() throws {
        let image = externalBytes(3 << 20 | 123, seed: 1)
        let id: UUID
        do {
            // Written through the `Data` declaration: the stored form is the same.
            let context = ModelContext(try container(lazy: false))
            id = context.insert(Scan(title: "big", image: image, thumbnail: Data([7]))).id
            try context.save()
        }
        let context = ModelContext(try container())
        let fetched = try #require(try context.fetch(FetchDescriptor<LazyScan>()).first)
        #expect(fetched.id == id)
        let handle = try #require(fetched.image)
        #expect(!handle.isLoaded)
        #expect(handle.count == image.count)
        #expect(handle.sha256 == libsodiumSHA256(image))
        #expect(handle == ExternalData(image))
        #expect(try handle.data() == image)
        #expect(try handle.read(1_048_570..<1_048_600) == image.subdata(in: 1_048_570..<1_048_600))
        #expect(try handle.read(image.count - 5..<image.count + 100) == image.suffix(5))
        var chunks: [Int] = []
        var joined = Data()
        try handle.forEachChunk(size: 1 << 20) { chunk in
            chunks.append(chunk.count)
            joined.append(chunk)
        }
        #expect(chunks == [1 << 20, 1 << 20, 1 << 20, 123])
        #expect(joined == image)
        let exported = directory.url.appendingPathComponent("exported.bin")
        try handle.write(to: exported)
        #expect(try Data(contentsOf: exported) == image)
        #expect(try context.model(LazyScan.self, id: id)?.image == handle)
        // Leaving the attribute out of the fetch reads it as nil.
        var descriptor = FetchDescriptor<LazyScan>()
        descriptor.propertiesToFetch = [\.title]
        #expect(try context.fetch(descriptor).first?.image == nil)
        // A `Data` property fetched from the same store still reads the bytes.
        #expect(try ModelContext(try container(lazy: false)).model(Scan.self, id: id)?.image == image)
    }

    @Test("saving a fetched handle unchanged writes nothing; into another record it shares the file")
    func unchangedHandleWritesNothing() throws {
        let image = externalBytes(200_000, seed: 2)
        let context = ModelContext(try container())
        let id = context.insert(LazyScan(title: "one", image: ExternalData(image))).id
        try context.save()
        let before = try FileManager.default.attributesOfItem(atPath: assetPath(libsodiumSHA256(image)))[.systemFileNumber] as? Int
        var fetched = try #require(try ModelContext(try container()).model(LazyScan.self, id: id))
        #expect(fetched.image?.isLoaded == false)
        let token = try #require(try context.fetchHistory(HistoryDescriptor()).last?.token)
        fetched.title = "renamed"
        context.update(fetched)
        try context.save()
        let changes = try context.fetchHistory(HistoryDescriptor(after: token)).flatMap(\.changes)
        #expect(changes == [.update(PersistentIdentifier(entityName: "Scan", id: id), updatedAttributes: ["title"])])
        let after = try FileManager.default.attributesOfItem(atPath: assetPath(libsodiumSHA256(image)))[.systemFileNumber] as? Int
        #expect(before == after)
        // The handle saved into a new record of the same store: one file for both.
        let copy = context.insert(LazyScan(title: "copy", image: fetched.image))
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(image)])
        #expect(try ModelContext(try container()).model(LazyScan.self, id: copy.id)?.image?.data() == image)
    }

    @Test("a handle saved into another store file is copied there; into an in-memory store, read into its row")
    func handleIntoOtherStores() throws {
        let image = externalBytes(2_500_000, seed: 3)
        let context = ModelContext(try container())
        let id = context.insert(LazyScan(title: "source", image: ExternalData(image))).id
        try context.save()
        let handle = try #require(try ModelContext(try container()).model(LazyScan.self, id: id)?.image)
        #expect(!handle.isLoaded)

        let other = try container("other")
        let otherContext = ModelContext(other)
        let copied = otherContext.insert(LazyScan(title: "copied", image: handle))
        try otherContext.save()
        #expect(assetFiles("other") == [libsodiumSHA256(image)])
        let reread = try #require(try ModelContext(other).model(LazyScan.self, id: copied.id)?.image)
        #expect(!reread.isLoaded)
        #expect(try reread.data() == image)
        // The source's file is untouched; deleting the source record leaves the copy readable.
        context.delete(try #require(try context.model(LazyScan.self, id: id)))
        try context.save()
        #expect(assetFiles() == [])
        #expect(try reread.data() == image)

        let memory = try container("memory", inMemory: true)
        let memoryContext = ModelContext(memory)
        let inline = memoryContext.insert(LazyScan(title: "inline", image: reread))
        try memoryContext.save()
        let fetched = try #require(try ModelContext(memory).model(LazyScan.self, id: inline.id)?.image)
        #expect(fetched.isLoaded)
        #expect(try fetched.data() == image)
    }

    @Test("a value made from a file is hashed in chunks and copied at save; a file changed before the save fails it, leaving nothing")
    func importFromFile() throws {
        let image = externalBytes(2 << 20 | 9, seed: 4)
        let source = directory.url.appendingPathComponent("camera.bin")
        try image.write(to: source)
        let value = try ExternalData(contentsOf: source)
        #expect(!value.isLoaded)
        #expect(value.count == image.count)
        #expect(value.sha256 == libsodiumSHA256(image))
        let context = ModelContext(try container())
        let id = context.insert(LazyScan(title: "imported", image: value)).id
        // Before the save, a fetch sees the pending value (its file description passes through the overlay).
        #expect(try context.fetch(FetchDescriptor<LazyScan>()).first?.image == value)
        try context.save()
        #expect(assetFiles() == [libsodiumSHA256(image)])
        #expect(try Data(contentsOf: URL(fileURLWithPath: assetPath(libsodiumSHA256(image)))) == image)
        #expect(try ModelContext(try container()).model(LazyScan.self, id: id)?.image?.data() == image)

        // The same file, changed (same size) after the handle was made.
        let second = try ExternalData(contentsOf: { try externalBytes(100, seed: 5).write(to: source); return source }())
        try externalBytes(100, seed: 6).write(to: source)
        context.insert(LazyScan(title: "changed", image: second))
        let error = externalStorageProblem { try context.save() }
        #expect(error?.problem == .hashMismatch)
        #expect(error?.attribute == "image")
        context.rollback()
        #expect(assetFiles() == [libsodiumSHA256(image)])
        #expect(try context.fetchCount(FetchDescriptor<LazyScan>()) == 1)

        let missing = directory.url.appendingPathComponent("nothing-here.bin")
        #expect(externalStorageProblem { _ = try ExternalData(contentsOf: missing) }?.problem == .missingFile)
        #expect(externalStorageProblem { _ = try ExternalData(contentsOf: directory.url) }?.problem == .notRegularFile)
    }

    @Test("a handle whose record was deleted since the fetch throws missingFile, naming the record, for reads and saves")
    func staleHandle() throws {
        let image = externalBytes(50_000, seed: 7)
        let context = ModelContext(try container())
        let model = context.insert(LazyScan(title: "gone", image: ExternalData(image)))
        try context.save()
        let handle = try #require(try ModelContext(try container()).model(LazyScan.self, id: model.id)?.image)
        context.delete(model)
        try context.save()
        #expect(assetFiles() == [])
        let read = externalStorageProblem { _ = try handle.data() }
        #expect(read?.problem == .missingFile)
        #expect(read?.recordID == model.id)
        #expect(read?.entity == "Scan")
        #expect(read?.attribute == "image")
        #expect(read?.store == "scans")
        context.insert(LazyScan(title: "again", image: handle))
        #expect(externalStorageProblem { try context.save() }?.problem == .missingFile)
    }

    @Test("a damaged file: whole and chunked reads throw hashMismatch, a ranged read returns the bytes as they are")
    func damagedFile() throws {
        let image = externalBytes(1_500_000, seed: 8)
        let context = ModelContext(try container())
        let id = context.insert(LazyScan(title: "bad", image: ExternalData(image))).id
        try context.save()
        var damaged = image
        damaged[700_000] ^= 0xFF
        try damaged.write(to: URL(fileURLWithPath: assetPath(libsodiumSHA256(image))))
        let handle = try #require(try ModelContext(try container()).model(LazyScan.self, id: id)?.image)
        #expect(externalStorageProblem { _ = try handle.data() }?.problem == .hashMismatch)
        var received = 0
        #expect(externalStorageProblem { try handle.forEachChunk { received += $0.count } }?.problem == .hashMismatch)
        #expect(received == image.count)
        #expect(try handle.read(699_999..<700_002) == damaged.subdata(in: 699_999..<700_002))
        let exported = directory.url.appendingPathComponent("export.bin")
        #expect(externalStorageProblem { try handle.write(to: exported) }?.problem == .hashMismatch)
        #expect(!FileManager.default.fileExists(atPath: exported.path))
        // Truncated: the size check fails before any byte is read.
        try image.prefix(10).write(to: URL(fileURLWithPath: assetPath(libsodiumSHA256(image))))
        #expect(externalStorageProblem { _ = try handle.data() }?.problem == .sizeMismatch(expected: image.count, found: 10))
    }

    @Test("an in-memory store's handles hold the bytes; the same API reads them")
    func inMemoryHandles() throws {
        let image = externalBytes(40_000, seed: 9)
        let memory = try container("memory", inMemory: true)
        let context = ModelContext(memory)
        let id = context.insert(LazyScan(title: "m", image: ExternalData(image))).id
        try context.save()
        let handle = try #require(try ModelContext(memory).model(LazyScan.self, id: id)?.image)
        #expect(handle.isLoaded)
        #expect(try handle.data() == image)
        #expect(try handle.read(10..<20) == image.subdata(in: 10..<20))
        var joined = Data()
        try handle.forEachChunk(size: 7_000) { joined.append($0) }
        #expect(joined == image)
    }

    @Test("a handle encodes as its bytes, and its description never shows them")
    func codableAndDescription() throws {
        let image = externalBytes(1_000, seed: 10)
        let context = ModelContext(try container())
        let id = context.insert(LazyScan(title: "c", image: ExternalData(image))).id
        try context.save()
        let model = try #require(try ModelContext(try container()).model(LazyScan.self, id: id))
        let json = try JSONEncoder().encode(model)
        let decoded = try JSONDecoder().decode(LazyScan.self, from: json)
        #expect(decoded.image?.isLoaded == true)
        #expect(try decoded.image?.data() == image)
        #expect(decoded == model)
        #expect(model.image?.description == "ExternalData(1000 bytes, in a file)")
        #expect(!(model.image?.description.contains(libsodiumSHA256(image)) ?? true))
    }
}
