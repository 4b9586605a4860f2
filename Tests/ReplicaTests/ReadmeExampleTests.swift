// The README's tour, compiled and run. Each region between `// README:begin NAME` and `// README:end` is quoted in
// README.md (ReadmeTests keeps every ```swift block of README equal to one region, indentation aside); the code
// around a region sets up what the README's prose describes and checks what the README says happens.
import Foundation
import Testing
@testable import trips_example
import ReplicaTesting
import Replica

// README:begin models
struct Passport: PersistentModel, Codable {
    var id = UUID.unassigned
    var holder: String = ""
    var number: String?

    static let entity = ModelEntity<Passport>([
        .attribute("holder", \.holder, default: ""),
        .attribute("number", \.number, options: .allowsCloudEncryption),
    ])
}

struct Tag: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""

    static let entity = ModelEntity<Tag>([
        .attribute("name", \.name, default: "", options: .unique),
    ])
}
// README:end

@Suite("README tour")
struct ReadmeExampleTests {
    /// The example app's models (Sources/trips-example/main.swift) under the names the README uses; the test target
    /// has models of its own named `Trip`.
    typealias Trip = trips_example.Trip
    typealias BucketListItem = trips_example.BucketListItem
    typealias Draft = trips_example.Draft

    @Test("a container with a synced, an app-group and a local store puts each file where the README says")
    func threeKindsOfStore() throws {
        let root = temporaryTestDirectory("readme")
        defer { try? FileManager.default.removeItem(at: root) }
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: root)
        // README:begin stores
        let trips = ModelConfiguration("trips", schema: Schema([Trip.self, BucketListItem.self]),
                                       cloudKitDatabase: .private("iCloud.com.example.trips"))
        let tags = ModelConfiguration("tags", schema: Schema([Tag.self]),
                                      groupContainer: .identifier("group.com.example.trips"))
        let drafts = ModelConfiguration("drafts", schema: Schema([Draft.self]))
        let container = try ModelContainer(
            for: Schema([Trip.self, BucketListItem.self, Tag.self, Draft.self], version: Schema.Version(1, 1, 0)),
            configurations: [trips, tags, drafts], environment: environment)
        // README:end
        #expect(container.schema.version == Schema.Version(1, 1, 0))
        let files = [trips, tags, drafts].map { $0.url(in: environment)! }
        #expect(files[1] == environment.appGroupDirectory("group.com.example.trips").appendingPathComponent("tags.store"))
        #expect(files[0] == environment.defaultStoreDirectory.appendingPathComponent("trips.store"))
        for file in files { #expect(FileManager.default.fileExists(atPath: file.path), "\(file.lastPathComponent)") }
    }

    @Test("update(_:) writes only what a copy changed; update(_:from:) names the copy an edit started from")
    func staleCopies() throws {
        let root = temporaryTestDirectory("readme")
        defer { try? FileManager.default.removeItem(at: root) }
        let container = try ModelContainer(for: Trip.self, BucketListItem.self,
                                           environment: .seeded(seed: 2, directory: root))
        // README:begin update
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Lisbon"))
        try context.save()

        var withDestination = trip          // two copies of what the context read, edited in two places
        withDestination.destination = "Portugal"
        var renamed = trip
        renamed.name = "Porto"
        context.update(withDestination)     // writes destination only
        context.update(renamed)             // writes name only: a stale copy never undoes another edit
        try context.save()                  // Porto, Portugal

        let before = try context.fetch(Trip.self)[0]
        var undo = before
        undo.name = "Lisbon"                // a field set back to an earlier value, and another edit:
        undo.destination = nil              // say which copy the edit started from
        context.update(undo, from: before)
        try context.save()                  // Lisbon, no destination
        // README:end
        let saved = try ModelContext(container).fetch(Trip.self)
        #expect(saved.map(\.name) == ["Lisbon"])
        #expect(saved.map(\.destination) == [nil])
        #expect(before.name == "Porto" && before.destination == "Portugal")
    }

    @Test("the README's query runs in SQL and finds the trip it describes")
    func query() throws {
        let root = temporaryTestDirectory("readme")
        defer { try? FileManager.default.removeItem(at: root) }
        let container = try ModelContainer(for: Trip.self, BucketListItem.self,
                                           environment: .seeded(seed: 3, directory: root))
        let setUp = ModelContext(container)
        let iceland = setUp.insert(Trip(name: "Iceland", destination: "Reykjavík", startDate: Date(timeIntervalSince1970: 1_780_000_000)))
        setUp.insert(BucketListItem(title: "See the northern lights", trip: Reference(iceland)))
        let done = setUp.insert(Trip(name: "Nice", destination: "France", startDate: Date(timeIntervalSince1970: 1_770_000_000)))
        setUp.insert(BucketListItem(title: "Promenade", isDone: true, trip: Reference(done)))
        setUp.insert(Trip(name: "Greece"))
        try setUp.save()
        let context = ModelContext(container)
        // README:begin query
        var descriptor = FetchDescriptor<Trip>(
            predicate: #Predicate { $0.startDate != nil && $0.items.contains { $0.isDone == false } && $0.name.localizedStandardContains("ice") },
            sortBy: [SortDescriptor(\.startDate, order: .reverse), SortDescriptor(\.name)])
        descriptor.fetchLimit = 20
        descriptor.relationshipKeyPathsForPrefetching = [\.items]   // one query for all trips' items
        let trips = try context.fetch(descriptor)
        let plan = try context.queryPlan(for: descriptor)           // the SQL, and whether anything runs in memory
        // README:end
        #expect(trips.map(\.name) == ["Iceland"])
        #expect(trips.first?.items.count == 1)
        #expect(plan.filtersInMemory == false)
    }

    @Test("a live query delivers the result now and again after a commit that changes it")
    func liveQuery() async throws {
        let root = temporaryTestDirectory("readme")
        defer { try? FileManager.default.removeItem(at: root) }
        let container = try ModelContainer(for: Trip.self, BucketListItem.self,
                                           environment: .seeded(seed: 4, directory: root))
        let first = ModelContext(container)
        first.insert(Trip(name: "Lisbon"))
        try first.save()
        let writer = Task {
            let context = ModelContext(container)
            context.insert(Trip(name: "Porto"))
            try context.save()
        }
        // README:begin observe
        var names: [String] = []
        for try await trips in container.observe(FetchDescriptor<Trip>(sortBy: [SortDescriptor(\.name)])) {
            names = trips.map(\.name)       // the result now, then after each commit that changes it
            if names.contains("Porto") { break }
        }
        // README:end
        try await writer.value
        #expect(names == ["Lisbon", "Porto"])
    }

    @Test("an encrypted attribute reaches the cloud sealed; the key provider can be replaced")
    func encryption() async throws {
        let root = temporaryTestDirectory("readme")
        defer { try? FileManager.default.removeItem(at: root) }
        let environment = ReplicaEnvironment.seeded(seed: 5, directory: root)
        let cloudFile = root.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: cloudFile)
        let passphrase = "correct horse battery staple", retyped = passphrase
        // README:begin encryption
        let travel = ModelConfiguration("travel", schema: Schema([Passport.self]),
                                        cloudKitDatabase: .private("iCloud.com.example.trips"))
        let container = try ModelContainer(for: Passport.self, configurations: travel, environment: environment)
        let engine = try SyncEngine(container: container, storeName: "travel", encryption: try .passphrase(passphrase))
        let context = ModelContext(container)
        context.insert(Passport(holder: "Ada", number: "X1234567"))
        try context.save()
        try await SyncDriver.syncUntilIdle(engine, with: cloud)   // the cloud holds `number` sealed

        // After FieldEncryptionError.wrongKey(zone:), with the passphrase the user typed again:
        try engine.setEncryptionKeyProvider(try PassphraseKeyProvider(passphrase: retyped))
        // README:end
        #expect(try engine.status().isUpToDate)
        let stored = try [cloudFile, URL(fileURLWithPath: cloudFile.path + "-wal")]
            .filter { FileManager.default.fileExists(atPath: $0.path) }.map { try Data(contentsOf: $0) }
        let bytes = stored.reduce(Data(), +)
        #expect(bytes.range(of: Data("X1234567".utf8)) == nil, "the passport number is in the cloud file in plaintext")
        #expect(bytes.range(of: Data("Ada".utf8)) != nil, "the unencrypted holder is not in the cloud file")
        #expect(try await SyncDriver.syncUntilIdle(engine, with: cloud).isUpToDate)
    }

    @Test("a unique key created on two devices resolves to one record on both")
    func duplicates() async throws {
        let root = temporaryTestDirectory("readme")
        defer { try? FileManager.default.removeItem(at: root) }
        let cloud = InMemoryCloudDatabase()
        func device(_ name: String, seed: UInt64) throws -> ModelContainer {
            try ModelContainer(for: Tag.self, configurations: ModelConfiguration(
                "tags", cloudKitDatabase: .private("iCloud.com.example.trips")),
                environment: .seeded(seed: seed, directory: root.appendingPathComponent(name)))
        }
        let phone = try device("phone", seed: 6), laptop = try device("laptop", seed: 7)
        // README:begin duplicates
        for device in [phone, laptop] {     // both devices create the tag "hiking" before they sync
            let context = ModelContext(device)
            context.insert(Tag(name: "hiking"))
            try context.save()
        }
        let engines = try [phone, laptop].map { try SyncEngine(container: $0, storeName: "tags") }
        for engine in engines + engines { try await SyncDriver.syncUntilIdle(engine, with: cloud) }
        let tags = try ModelContext(laptop).fetch(Tag.self)       // one "hiking" tag, the same on both devices
        let resolutions = try engines.flatMap { try $0.conflictLog() }.filter { $0.duplicateOf != nil }
        // README:end
        #expect(tags.map(\.name) == ["hiking"])
        #expect(try ModelContext(phone).fetch(Tag.self).map(\.id) == tags.map(\.id))
        #expect(!resolutions.isEmpty)
        #expect(resolutions.allSatisfy { $0.duplicateOf?.id == tags.first?.id })
    }
}
