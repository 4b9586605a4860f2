// Damaged, missing and stray external-storage files never brick a store, make a save unreadable or outlive their
// references (breaker R1, R5, R6, R8, R11 of the external-storage trial).
import CSodium
import Foundation
import Testing
@testable import Replica

/// `Scan` as a schema that does not mark the image `.externalStorage` declares it (a widget's).
private struct PlainScan: PersistentModel, Codable, Equatable {
    static var entityName: String { "Scan" }
    var id = UUID.unassigned
    var title: String = ""
    var image: Data?
    var thumbnail: Data?
    static let entity = ModelEntity<PlainScan>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image),
        .attribute("thumbnail", \.thumbnail),
    ])
}

/// A model of its own, for a schema without `Scan`.
private struct Memo: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<Memo>([.attribute("text", \.text, default: "")])
}

enum DocsV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Doc.self] }

    struct Doc: PersistentModel, Codable, Equatable {
        static var entityName: String { "Doc" }
        var id = UUID.unassigned
        var title: String = ""
        var scan: Data?
        static let entity = ModelEntity<Doc>([
            .attribute("title", \.title, default: ""),
            .attribute("scan", \.scan, options: .externalStorage),
        ])
    }
}

/// Version 2 drops the external scan.
enum DocsV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Doc.self] }

    struct Doc: PersistentModel, Codable, Equatable {
        static var entityName: String { "Doc" }
        var id = UUID.unassigned
        var title: String = ""
        static let entity = ModelEntity<Doc>([.attribute("title", \.title, default: "")])
    }
}

enum DocsPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [DocsV1.self, DocsV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: DocsV1.self, toVersion: DocsV2.self)] }
}

@Suite("External storage faults")
struct ExternalStorageFaultTests {
    let directory = TestDirectory()

    var storeURL: URL { directory.storeURL("scans") }
    var assetDirectory: URL { URL(fileURLWithPath: storeURL.path + "-assets") }

    func container(synced: Bool = false, canaries: Set<Canary> = []) throws -> ModelContainer {
        var environment = directory.environment(seed: 1)
        environment.canaries = canaries
        let schema = Schema([Scan.self])
        let configuration = synced
            ? ModelConfiguration("scans", schema: schema, cloudKitDatabase: .private("iCloud.test"))
            : ModelConfiguration("scans", schema: schema)
        return try ModelContainer(for: schema, configurations: [configuration], environment: environment)
    }

    func assetFiles(_ directory: URL? = nil) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: (directory ?? assetDirectory).path)) ?? []).sorted()
    }

    func hasSyncLedger() throws -> Bool {
        try rawConnection(storeURL, readOnly: true)
            .scalar("SELECT count(*) FROM sqlite_master WHERE name = 'replica_sync_record'") == .integer(1)
    }

    /// A local store with two scans; returns their IDs and images.
    func seedTwo() throws -> (good: UUID, bad: UUID, goodImage: Data, badImage: Data) {
        let goodImage = externalBytes(5000, seed: 1), badImage = externalBytes(6000, seed: 2)
        let context = ModelContext(try container())
        let good = context.insert(Scan(title: "good", image: goodImage)).id
        let bad = context.insert(Scan(title: "bad", image: badImage)).id
        try context.save()
        return (good, bad, goodImage, badImage)
    }

    func damage(_ image: Data, missing: Bool) throws {
        let file = assetDirectory.appendingPathComponent(libsodiumSHA256(image))
        if missing {
            try FileManager.default.removeItem(at: file)
        } else {
            var damaged = image
            damaged[10] ^= 0xFF
            try damaged.write(to: file)
        }
    }

    @Test("R1: turning sync on keeps the files (values sync as assets); a missing or damaged file fails only its record's reads",
          arguments: [true, false])
    func syncOnWithBadFile(missing: Bool) throws {
        let seeded = try seedTwo()
        try damage(seeded.badImage, missing: missing)
        let context = ModelContext(try container(synced: true))
        #expect(try hasSyncLedger())
        #expect(try context.model(Scan.self, id: seeded.good)?.image == seeded.goodImage)
        let problem: ExternalStorageError.Problem = missing ? .missingFile : .hashMismatch
        #expect(throws: ReplicaError.externalStorage(ExternalStorageError(store: "scans", entity: "Scan", recordID: seeded.bad,
                                                                          attribute: "image", problem: problem))) {
            try context.model(Scan.self, id: seeded.bad)
        }
        // Recovery: the damaged value is overwritten (with other bytes: the same bytes hash to the reference the row
        // holds, and such an update writes nothing).
        var descriptor = FetchDescriptor<Scan>(predicate: #Predicate { $0.title == "bad" })
        descriptor.propertiesToFetch = [\Scan.title]
        var bad = try #require(try context.fetch(descriptor).first)
        let replacement = externalBytes(7000, seed: 9)
        bad.image = replacement
        context.update(bad)
        try context.save()
        #expect(try context.fetch(FetchDescriptor<Scan>()).map(\.image).sorted { $0!.count < $1!.count } == [seeded.goodImage, replacement])
    }

    @Test("R1: a store with sync bookkeeping and references opens local-only; only the record whose file is missing fails")
    func bookkeepingLeftBehind() throws {
        let seeded = try seedTwo()
        try damage(seeded.badImage, missing: true)
        // The state an open that turned sync on left before it was one transaction: bookkeeping, references kept.
        let db = try rawConnection(storeURL)
        try db.execute(SyncLedger.createSQL)
        try SyncLedger.migrate(db)
        let context = ModelContext(try container())
        #expect(try context.model(Scan.self, id: seeded.good)?.image == seeded.goodImage)
        #expect(throws: ReplicaError.externalStorage(ExternalStorageError(store: "scans", entity: "Scan", recordID: seeded.bad,
                                                                          attribute: "image", problem: .missingFile))) {
            try context.model(Scan.self, id: seeded.bad)
        }
        var descriptor = FetchDescriptor<Scan>()
        descriptor.propertiesToFetch = [\Scan.title]
        #expect(try context.fetch(descriptor).map(\.title).sorted() == ["bad", "good"])
        // Deleting the record whose file is gone makes the store whole again.
        _ = try context.delete(model: Scan.self, where: #Predicate { $0.title == "bad" })
        try context.save()
        #expect(try ModelContext(try container(synced: true)).fetch(FetchDescriptor<Scan>()).map(\.image) == [seeded.goodImage])
    }

    @Test("R5: a save of bytes whose file was damaged (same size) rewrites the file; both records read back")
    func damagedFileRewritten() throws {
        let image = externalBytes(8000, seed: 3)
        let first: UUID
        do {
            let context = ModelContext(try container())
            first = context.insert(Scan(title: "first", image: image)).id
            try context.save()
        }
        try damage(image, missing: false)
        let context = ModelContext(try container())
        let second = context.insert(Scan(title: "second", image: image)).id
        try context.save()
        let reader = ModelContext(try container())
        #expect(try reader.model(Scan.self, id: second)?.image == image)
        #expect(try reader.model(Scan.self, id: first)?.image == image)
        #expect(try Data(contentsOf: assetDirectory.appendingPathComponent(libsodiumSHA256(image))) == image)
    }

    @Test("R6: a lightweight stage that drops an external attribute removes its files")
    func droppedAttributeFilesRemoved() throws {
        let secret = Data("SECRET-PASSPORT-SCAN".utf8) + externalBytes(3000, seed: 4)
        let assets = URL(fileURLWithPath: directory.storeURL().path + "-assets")
        do {
            let v1 = try ModelContainer(for: DocsV1.schema, migrationPlan: nil, environment: directory.environment(seed: 1))
            let context = ModelContext(v1)
            context.insert(DocsV1.Doc(title: "passport", scan: secret))
            try context.save()
        }
        #expect(assetFiles(assets) == [libsodiumSHA256(secret)])
        let v2 = try ModelContainer(for: DocsV2.schema, migrationPlan: DocsPlan.self, environment: directory.environment(seed: 2))
        #expect(try ModelContext(v2).fetch(DocsV2.Doc.self).map(\.title) == ["passport"])
        #expect(assetFiles(assets).isEmpty, "the dropped attribute's file is still there")
    }

    @Test("R6: a schema without the entity, or without its external attribute, keeps the files other schemas reference")
    func subsetSchemasKeepFiles() throws {
        let seeded = try seedTwo()
        let files = [libsodiumSHA256(seeded.goodImage), libsodiumSHA256(seeded.badImage)].sorted()
        let memos = Schema([Memo.self, KeptScan.self])
        _ = try ModelContainer(for: memos, configurations: [ModelConfiguration("scans", schema: memos)], environment: directory.environment(seed: 2))
        #expect(assetFiles() == files)
        let reopened = ModelContext(try container())
        #expect(try reopened.model(Scan.self, id: seeded.good)?.image == seeded.goodImage)
    }

    @Test("R8: a schema declaring the attribute plain Data is told the column holds external-storage references")
    func plainDataSchema() throws {
        let seeded = try seedTwo()
        let schema = Schema([PlainScan.self])
        let widget = try ModelContainer(for: schema, configurations: [ModelConfiguration("scans", schema: schema)],
                                        environment: directory.environment(seed: 2))
        do {
            _ = try ModelContext(widget).model(PlainScan.self, id: seeded.good)
            Issue.record("reading a reference as Data succeeded")
        } catch {
            #expect("\(error)".contains("declare the attribute .externalStorage"), "\(error)")
        }
    }

    @Test("R11: an asset path that is a directory is reported as not a regular file")
    func directoryInPlace() throws {
        let seeded = try seedTwo()
        let file = assetDirectory.appendingPathComponent(libsodiumSHA256(seeded.badImage))
        try FileManager.default.removeItem(at: file)
        try FileManager.default.createDirectory(at: file, withIntermediateDirectories: false)
        let context = ModelContext(try container())
        #expect(throws: ReplicaError.externalStorage(ExternalStorageError(store: "scans", entity: "Scan", recordID: seeded.bad,
                                                                          attribute: "image", problem: .notRegularFile))) {
            try context.model(Scan.self, id: seeded.bad)
        }
        // A save of the same bytes does not replace the directory: it fails, naming the problem.
        context.insert(Scan(title: "again", image: seeded.badImage))
        #expect(throws: ReplicaError.self) { try context.save() }
    }
}
