// ModelContainer and ModelConfiguration: several stores per container, local-only, private-synced, app-group,
// in-memory and read-only stores, and the errors of opening a container.
import Foundation
import Testing
@testable import Replica

@Suite("Container and configurations")
struct ContainerTests {
    let directory = TestDirectory()

    var tripsOnly: Schema { Schema([Trip.self, Item.self]) }

    private func names(_ models: [any PersistentModel]) -> [String] { models.map { type(of: $0).entityName } }

    // MARK: Stores and routing

    @Test func withoutConfigurationsOneDefaultStoreHoldsEverything() throws {
        let container = try ModelContainer(for: Trip.self, Item.self, Note.self, environment: directory.environment())
        #expect(container.configurations.map(\.name) == ["default"])
        #expect(container.url(of: "default")?.path == directory.storeURL().path)
        #expect(FileManager.default.fileExists(atPath: directory.storeURL().path))
        #expect(try tableNames(in: directory.storeURL()) == ["Item", "Note", "Trip", "replica_metadata"])
        #expect(container.configuration(for: "Note")?.name == "default")
        #expect(container.schema.entityNames == ["Trip", "Item", "Note"])
    }

    @Test func eachConfigurationHoldsItsEntitiesInItsOwnFile() throws {
        let trips = ModelConfiguration("trips", schema: tripsOnly, cloudKitDatabase: .private("iCloud.com.example.trips"))
        let notes = ModelConfiguration("notes", schema: Schema([Note.self]))
        let rest = ModelConfiguration("rest") // every entity no other configuration names
        let container = try ModelContainer(for: Trip.self, Item.self, Note.self, Everything.self,
                                           configurations: trips, notes, rest, environment: directory.environment())
        #expect(container.configuration(for: "Trip")?.name == "trips")
        #expect(container.configuration(for: "Item")?.name == "trips")
        #expect(container.configuration(for: "Note")?.name == "notes")
        #expect(container.configuration(for: "Everything")?.name == "rest")
        #expect(container.configuration(for: "Unknown") == nil)

        for name in ["trips", "notes", "rest"] {
            #expect(FileManager.default.fileExists(atPath: directory.storeURL(name).path), "\(name).store")
            #expect(container.url(of: name)?.path == directory.storeURL(name).path)
        }
        #expect(try tableNames(in: directory.storeURL("trips")) == ["Item", "Trip", "replica_metadata"])
        #expect(try tableNames(in: directory.storeURL("notes")) == ["Note", "replica_metadata"])
        #expect(try tableNames(in: directory.storeURL("rest")) == ["Everything", "replica_metadata"])

        // Writes land in the file of the entity's store.
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Iceland"))
        context.insert(Item(title: "Lights", trip: Reference(trip)))
        context.insert(Note(text: "Socks", slug: "socks"))
        try context.save()
        #expect(try rowCount("Trip", in: directory.storeURL("trips")) == 1)
        #expect(try rowCount("Item", in: directory.storeURL("trips")) == 1)
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 1)
        #expect(try rowCount("Everything", in: directory.storeURL("rest")) == 0)

        // Every store has its own replica identity.
        let identities = ["trips", "notes", "rest"].compactMap { container.storeIdentity(of: $0) }
        #expect(Set(identities).count == 3)
        #expect(container.storeIdentity(of: "nope") == nil)
    }

    @Test func storeConnectionsUseTheStandardSettings() throws {
        let file = ModelConfiguration("file", schema: Schema([Note.self]))
        let memory = ModelConfiguration("memory", schema: tripsOnly, isStoredInMemoryOnly: true)
        let container = try ModelContainer(for: Note.self, Trip.self, Item.self, configurations: file, memory,
                                           environment: directory.environment())
        let context = ModelContext(container)
        for index in 0..<2 {
            let db = try context.connection(for: index)
            #expect(try db.scalar("PRAGMA synchronous") == .integer(1))
            #expect(try db.scalar("PRAGMA foreign_keys") == .integer(1))
            #expect(try db.scalar("PRAGMA busy_timeout") == .integer(5_000))
        }
        #expect(try context.connection(for: 0).scalar("PRAGMA journal_mode") == .text("wal"))
        // WAL is recorded in the file itself: any other connection sees it.
        #expect(try rawConnection(directory.storeURL("file"), readOnly: true).scalar("PRAGMA journal_mode") == .text("wal"))
    }

    @Test func reopeningAStoreKeepsItsIdentityAndData() throws {
        let first = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment(seed: 1))
        let context = ModelContext(first)
        let trip = context.insert(Trip(name: "Kept"))
        try context.save()
        let identity = first.storeIdentity(of: "default")
        let second = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment(seed: 2))
        #expect(second.storeIdentity(of: "default") == identity)
        #expect(try ModelContext(second).model(Trip.self, id: trip.id)?.name == "Kept")
    }

    @Test func explicitURLIsUsed() throws {
        let url = directory.url.appendingPathComponent("nested/deeper/custom.sqlite")
        let configuration = ModelConfiguration("custom", url: url)
        let container = try ModelContainer(for: Note.self, configurations: configuration, environment: directory.environment())
        #expect(container.url(of: "custom")?.path == url.path)
        #expect(FileManager.default.fileExists(atPath: url.path))
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL("custom").path))
        #expect(try tableNames(in: url) == ["Note", "replica_metadata"])
    }

    // MARK: Local-only and private-synced

    @Test func localOnlyStoresAcceptAnySchema() throws {
        let local = ModelConfiguration("local", schema: Schema([Note.self, Person.self, Account.self, Shelf.self, Book.self]))
        #expect(!local.isSynced)
        #expect(local.cloudKitDatabase == .none)
        let container = try ModelContainer(for: Note.self, Person.self, Account.self, Shelf.self, Book.self,
                                           configurations: local, environment: directory.environment())
        #expect(container.configuration(for: "Account")?.isSynced == false)
    }

    @Test func syncedStoresAcceptAdditiveSchemas() throws {
        let synced = ModelConfiguration("trips", schema: tripsOnly, cloudKitDatabase: .private("iCloud.com.example.trips"))
        #expect(synced.isSynced)
        #expect(synced.cloudKitDatabase == .private("iCloud.com.example.trips"))
        let container = try ModelContainer(for: Trip.self, Item.self, configurations: synced, environment: directory.environment())
        #expect(container.configuration(for: "Trip")?.isSynced == true)
    }

    @Test func syncedStoresReportEveryViolationOfTheSyncRules() throws {
        let synced = ModelConfiguration("synced", schema: Schema([Note.self, Person.self, Account.self, Shelf.self, Book.self]),
                                        cloudKitDatabase: .private("iCloud.com.example"))
        let local = ModelConfiguration("local", schema: Schema([Membership.self]))
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Note.self, Person.self, Account.self, Shelf.self, Book.self, Membership.self,
                                   configurations: synced, local, environment: directory.environment())
        }
        let expected: [SchemaViolation] = [
            .syncedAttributeNeedsDefault(entity: "Note", attribute: "text"),
            .syncedAttributeNeedsDefault(entity: "Note", attribute: "slug"),
            .syncedAttributeNeedsDefault(entity: "Person", attribute: "name"),
            .syncedAttributeNeedsDefault(entity: "Account", attribute: "number"),
            .syncedRelationshipNotOptional(entity: "Account", relationship: "owner"),
            .syncedAttributeNeedsDefault(entity: "Shelf", attribute: "label"),
            .syncedDenyRule(entity: "Shelf", relationship: "books"),
            .syncedAttributeNeedsDefault(entity: "Book", attribute: "title"),
        ]
        #expect(error?.schemaViolations == expected)
        // The local store's entity (required attributes without defaults) is not reported.
        #expect(error?.schemaViolations.contains { $0.description.contains("Membership") } == false)
        // Nothing was created.
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL("synced").path))
    }

    @Test("a synced store accepts many-to-many relationships (their links replicate, R17) and refuses only the deny rule; a local one keeps them")
    func syncedStoresAcceptManyToMany() throws {
        let schema = Schema([QTrip.self, QItem.self, QTag.self, QLodging.self])
        let synced = ModelConfiguration("synced", schema: schema, cloudKitDatabase: .private("iCloud.com.example"))
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: QTrip.self, QItem.self, QTag.self, QLodging.self, configurations: synced,
                                   environment: directory.environment())
        }
        #expect(error?.schemaViolations == [.syncedDenyRule(entity: "QLodging", relationship: "trips")])
        #expect(error?.description.contains("many-to-many") == false)
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL("synced").path))
        // The same schema in a local store opens, links and all.
        let local = ModelConfiguration("local", schema: schema)
        let container = try ModelContainer(for: QTrip.self, QItem.self, QTag.self, QLodging.self, configurations: local,
                                           environment: directory.environment())
        let context = ModelContext(container)
        let tag = context.insert(QTag(label: "beach"))
        context.insert(QTrip(name: "Lisbon", tags: [Reference(tag)]))
        try context.save()
        #expect(try ModelContext(container).model(QTag.self, id: tag.id)?.trips.count == 1)
    }

    @Test func syncRulesApplyToTheCatchAllConfigurationToo() {
        let synced = ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.com.example"))
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Note.self, configurations: synced, environment: directory.environment())
        }
        #expect(error?.schemaViolations == [
            .syncedAttributeNeedsDefault(entity: "Note", attribute: "text"),
            .syncedAttributeNeedsDefault(entity: "Note", attribute: "slug"),
        ])
    }

    @Test func anInvalidSchemaIsReportedWithEveryViolation() {
        let schema = Schema(entities: [
            Schema.Entity(name: "A", attributes: [Schema.Attribute(name: "id", type: .string, isOptional: false)]),
            Schema.Entity(name: "A", attributes: []),
        ])
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, environment: directory.environment())
        }
        #expect(error?.schemaViolations == [.duplicateMember(entity: "A", member: "id"), .duplicateEntity("A")])
    }

    @Test func structuralAndSyncViolationsAreReportedTogether() {
        let schema = Schema(entities: [
            Schema.Entity(name: "A", attributes: [
                Schema.Attribute(name: "count", type: .integer, isOptional: false, defaultValue: .text("zero")),
                Schema.Attribute(name: "required", type: .string, isOptional: false),
            ]),
            Schema.Entity(name: "B", attributes: [Schema.Attribute(name: "required", type: .string, isOptional: false)]),
        ])
        let synced = ModelConfiguration("synced", schema: Schema(entities: [schema.entities[0]]), cloudKitDatabase: .private("iCloud.x"))
        let rest = ModelConfiguration("rest", cloudKitDatabase: .private("iCloud.x"))
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, configurations: [synced, rest], environment: directory.environment())
        }
        #expect(error?.schemaViolations == [
            .defaultValueTypeMismatch(entity: "A", attribute: "count"),
            .syncedAttributeNeedsDefault(entity: "A", attribute: "required"),
            .syncedAttributeNeedsDefault(entity: "B", attribute: "required"),
        ])
    }

    // MARK: App groups

    @Test func appGroupStoresLiveInTheGroupDirectoryFromTheEnvironment() throws {
        let group = "group.com.example.trips"
        let configuration = ModelConfiguration("shared", schema: tripsOnly, groupContainer: .identifier(group))
        var environment = directory.environment()
        let groups = directory.url.appendingPathComponent("custom-groups")
        environment.appGroupDirectory = { groups.appendingPathComponent("resolved-\($0)") }
        let container = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: environment)
        let expected = groups.appendingPathComponent("resolved-\(group)/shared.store")
        #expect(container.url(of: "shared")?.path == expected.path)
        #expect(FileManager.default.fileExists(atPath: expected.path))
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL("shared").path))
    }

    @Test func twoContainersOnOneAppGroupShareDataAndOneIdentity() throws {
        let group = "group.com.example.trips"
        let configuration = ModelConfiguration("shared", schema: tripsOnly, groupContainer: .identifier(group))
        // Two processes of one app group: different environments (seeds, process identities), same group directory.
        let app = try ModelContainer(for: Trip.self, Item.self, configurations: configuration,
                                     environment: directory.environment(seed: 1))
        let widgetEnvironment = ReplicaEnvironment.seeded(
            seed: 2, directory: directory.url,
            processIdentity: ProcessIdentity(bundleIdentifier: "com.example.trips.widget", processName: "widget", processID: 2))
        let widget = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: widgetEnvironment)

        let url = directory.url.appendingPathComponent("app-groups/\(group)/shared.store")
        #expect(app.url(of: "shared")?.path == url.path)
        #expect(widget.url(of: "shared")?.path == url.path)
        let identity = try #require(app.storeIdentity(of: "shared"))
        #expect(widget.storeIdentity(of: "shared") == identity)

        let appContext = ModelContext(app)
        let trip = appContext.insert(Trip(name: "From the app"))
        try appContext.save()
        let widgetContext = ModelContext(widget)
        #expect(try widgetContext.model(Trip.self, id: trip.id)?.name == "From the app")
        let item = widgetContext.insert(Item(title: "From the widget", trip: Reference(trip)))
        try widgetContext.save()
        #expect(try appContext.model(Item.self, id: item.id)?.title == "From the widget")
        #expect(try appContext.model(Trip.self, id: trip.id)?.items.map(\.id) == [item.id])
    }

    // MARK: In-memory

    @Test func inMemoryStoresAreSharedByTheContextsOfOneContainer() throws {
        let configuration = ModelConfiguration("memory", isStoredInMemoryOnly: true)
        #expect(configuration.url(in: directory.environment()) == nil)
        let container = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment())
        #expect(container.url(of: "memory") == nil)
        #expect(container.storeIdentity(of: "memory") != nil)
        let writer = ModelContext(container)
        let trip = writer.insert(Trip(name: "In memory"))
        try writer.save()
        let reader = ModelContext(container)
        #expect(try reader.model(Trip.self, id: trip.id)?.name == "In memory")
        #expect(try reader.fetch(Trip.self).count == 1)
        // Nothing touched the disk.
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.url.path).isEmpty)
    }

    @Test func inMemoryStoresOfTwoContainersAreSeparate() throws {
        let configuration = ModelConfiguration("memory", isStoredInMemoryOnly: true)
        // Same seed, same directory: the environments produce the same identifiers, yet the stores must not be shared.
        let first = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment(seed: 7))
        let second = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment(seed: 7))
        let context = ModelContext(first)
        context.insert(Trip(name: "Only in the first"))
        try context.save()
        #expect(try ModelContext(first).fetch(Trip.self).count == 1)
        #expect(try ModelContext(second).fetch(Trip.self).isEmpty)
    }

    @Test(arguments: ["a?b", "a#b", "100%", "50%25", "a&vfs=unix", "a b"])
    func inMemoryStoreNamesMayContainURICharacters(name: String) throws {
        let configuration = ModelConfiguration(name, isStoredInMemoryOnly: true)
        let first = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment(seed: 1))
        let second = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment(seed: 2))
        let context = ModelContext(first)
        let trip = context.insert(Trip(name: name))
        try context.save()
        #expect(try ModelContext(first).model(Trip.self, id: trip.id)?.name == name)
        // The name must not cut the database URI short and open a file shared by every container of that name.
        #expect(try ModelContext(second).fetch(Trip.self).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.url.path).isEmpty)
    }

    @Test func inMemoryDataDiesWithItsContainer() throws {
        let configuration = ModelConfiguration("memory", isStoredInMemoryOnly: true)
        do {
            let container = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment(seed: 3))
            let context = ModelContext(container)
            context.insert(Trip(name: "Gone"))
            try context.save()
        }
        let container = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment(seed: 3))
        #expect(try ModelContext(container).fetch(Trip.self).isEmpty)
    }

    // MARK: Read-only

    @Test func readOnlyStoresReadButRefuseSaves() throws {
        let trip: Trip
        do {
            let container = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            trip = context.insert(Trip(name: "Stored"))
            try context.save()
        }
        let readOnly = ModelConfiguration("default", allowsSave: false)
        let container = try ModelContainer(for: Trip.self, Item.self, configurations: readOnly, environment: directory.environment(seed: 2))
        let context = ModelContext(container)
        #expect(try context.model(Trip.self, id: trip.id)?.name == "Stored")

        context.insert(Trip(name: "Refused"))
        #expect(throws: ReplicaError.readOnlyStore(configuration: "default")) { try context.save() }
        var changed = trip
        changed.name = "Changed"
        context.rollback()
        context.update(changed)
        #expect(throws: ReplicaError.readOnlyStore(configuration: "default")) { try context.save() }
        context.rollback()
        context.delete(trip)
        #expect(throws: ReplicaError.readOnlyStore(configuration: "default")) { try context.save() }
        #expect(try rowCount("Trip", in: directory.storeURL()) == 1)
        #expect(try ModelContext(container).model(Trip.self, id: trip.id)?.name == "Stored")
    }

    @Test func aReadOnlyStoreBlocksTheWholeSave() throws {
        let notes = ModelConfiguration("notes", schema: Schema([Note.self]))
        let trips = ModelConfiguration("trips", schema: tripsOnly)
        do {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: notes, trips, environment: directory.environment())
        }
        let readOnlyTrips = ModelConfiguration("trips", schema: tripsOnly, allowsSave: false)
        let container = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: notes, readOnlyTrips,
                                           environment: directory.environment())
        let context = ModelContext(container)
        context.insert(Note(text: "writable", slug: "w"))
        try context.save()
        context.insert(Note(text: "blocked", slug: "b"))
        context.insert(Trip(name: "read-only"))
        #expect(throws: ReplicaError.readOnlyStore(configuration: "trips")) { try context.save() }
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 1)
        #expect(context.hasChanges)
    }

    @Test func openingAMissingStoreReadOnlyIsALoadIssue() {
        let readOnly = ModelConfiguration("missing", allowsSave: false)
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Trip.self, Item.self, configurations: readOnly, environment: directory.environment())
        }
        guard case let .loadIssueModelContainer(configuration, _)? = error else {
            Issue.record("expected .loadIssueModelContainer, got \(String(describing: error))")
            return
        }
        #expect(configuration == "missing")
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL("missing").path))
    }

    // MARK: Errors

    @Test func duplicateConfigurationNamesAreRefused() {
        let a = ModelConfiguration("same", schema: tripsOnly)
        let b = ModelConfiguration("same", schema: Schema([Note.self]))
        #expect(throws: ReplicaError.duplicateConfiguration(name: "same")) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: a, b, environment: directory.environment())
        }
        let memoryA = ModelConfiguration("mem", schema: tripsOnly, isStoredInMemoryOnly: true)
        let memoryB = ModelConfiguration("mem", schema: Schema([Note.self]), isStoredInMemoryOnly: true)
        #expect(throws: ReplicaError.duplicateConfiguration(name: "mem")) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: memoryA, memoryB, environment: directory.environment())
        }
    }

    @Test func twoConfigurationsResolvingToOneFileAreRefused() {
        let a = ModelConfiguration("a", schema: tripsOnly)
        let explicit = ModelConfiguration("b", schema: Schema([Note.self]), url: directory.storeURL("a"))
        #expect(throws: ReplicaError.duplicateConfiguration(name: "b")) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: a, explicit, environment: directory.environment())
        }
        // The same file spelled differently.
        let roundabout = ModelConfiguration("c", schema: Schema([Note.self]),
                                            url: directory.url.appendingPathComponent("sub/../a.store"))
        #expect(throws: ReplicaError.duplicateConfiguration(name: "c")) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: a, roundabout, environment: directory.environment())
        }
        // An app-group store and an explicit URL to the same file.
        let grouped = ModelConfiguration("g", schema: tripsOnly, groupContainer: .identifier("group.x"))
        let sameFile = ModelConfiguration("h", schema: Schema([Note.self]),
                                          url: directory.url.appendingPathComponent("app-groups/group.x/g.store"))
        #expect(throws: ReplicaError.duplicateConfiguration(name: "h")) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: grouped, sameFile, environment: directory.environment())
        }
    }

    @Test func configurationSchemaMustBePartOfTheContainerSchema() {
        let configuration = ModelConfiguration("c", schema: Schema([Trip.self, Item.self, Note.self, User.self]))
        #expect(throws: ReplicaError.configurationSchemaNotFoundInContainerSchema(configuration: "c", entities: ["Note", "User"])) {
            _ = try ModelContainer(for: Trip.self, Item.self, configurations: configuration, environment: directory.environment())
        }
    }

    @Test(arguments: ["", ".", "..", "a/b", "/abs", "nul\u{0}byte", String(repeating: "x", count: 242)])
    func configurationNamesMustBeFileNames(name: String) throws {
        #expect(throws: ReplicaError.configurationFileNameContainsInvalidCharacters(name: name)) {
            _ = try ModelContainer(for: Note.self, configurations: ModelConfiguration(name), environment: directory.environment())
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.url.path).isEmpty)
    }

    @Test("a configuration name that cannot name a store file is refused with the reason and the limit, the name shown by its start (trial: a 1,000-character name echoed whole, no reason)")
    func invalidConfigurationNameSaysWhy() {
        let long = ReplicaError.configurationFileNameContainsInvalidCharacters(name: String(repeating: "y", count: 1_000)).description
        #expect(long == "configuration name '\(String(repeating: "y", count: 40))…' is not a valid file name: it is 1000 bytes long in UTF-8, longer than the 241 bytes a store file name leaves for it")
        #expect(ReplicaError.configurationFileNameContainsInvalidCharacters(name: "a/b").description == "configuration name 'a/b' is not a valid file name: it contains '/'")
    }

    @Test func longestValidConfigurationNameOpensAndSaves() throws {
        // 241 + ".store" + "-journal" = 255 bytes, the file-name limit: every file SQLite makes beside the store fits.
        let name = String(repeating: "x", count: 241)
        let container = try ModelContainer(for: Note.self, configurations: ModelConfiguration(name), environment: directory.environment())
        let context = ModelContext(container)
        context.insert(Note(text: "fits", slug: "fits"))
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL(name)) == 1)
    }

    @Test func aDirectoryAtTheStorePathIsALoadIssue() throws {
        try FileManager.default.createDirectory(at: directory.storeURL(), withIntermediateDirectories: true)
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment())
        }
        guard case let .loadIssueModelContainer(configuration, _)? = error else {
            Issue.record("expected .loadIssueModelContainer, got \(String(describing: error))")
            return
        }
        #expect(configuration == "default")
    }

    @Test func aFileThatIsNotADatabaseIsALoadIssueAndIsLeftAlone() throws {
        let garbage = Data(String(repeating: "this is not an SQLite database. ", count: 200).utf8)
        try garbage.write(to: directory.storeURL())
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment())
        }
        guard case let .loadIssueModelContainer(configuration, reason)? = error else {
            Issue.record("expected .loadIssueModelContainer, got \(String(describing: error))")
            return
        }
        #expect(configuration == "default")
        #expect(reason.contains("26") || reason.lowercased().contains("not a database"))
        #expect(try Data(contentsOf: directory.storeURL()) == garbage)
    }

    @Test func anUncreatableStoreDirectoryIsALoadIssue() throws {
        let blocker = directory.url.appendingPathComponent("blocker")
        try Data("a file where a directory should be".utf8).write(to: blocker)
        var environment = directory.environment()
        environment.defaultStoreDirectory = blocker.appendingPathComponent("stores")
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: Note.self, environment: environment)
        }
        guard case let .loadIssueModelContainer(configuration, _)? = error else {
            Issue.record("expected .loadIssueModelContainer, got \(String(describing: error))")
            return
        }
        #expect(configuration == "default")
    }

    @Test func anEntityMustBeInExactlyOneConfiguration() {
        let a = ModelConfiguration("a", schema: Schema([Trip.self, Item.self, Note.self]))
        let b = ModelConfiguration("b", schema: Schema([Note.self]))
        #expect(throws: ReplicaError.entityNotRoutable(entity: "Note", configurations: ["a", "b"])) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: a, b, environment: directory.environment())
        }
        let onlyTrips = ModelConfiguration("trips", schema: tripsOnly)
        #expect(throws: ReplicaError.entityNotRoutable(entity: "Note", configurations: [])) {
            _ = try ModelContainer(for: Trip.self, Item.self, Note.self, configurations: onlyTrips, environment: directory.environment())
        }
    }

    @Test func relationshipsMustNotCrossStores() throws {
        let trips = ModelConfiguration("trips", schema: Schema([Trip.self]))
        let items = ModelConfiguration("items", schema: Schema([Item.self]))
        #expect(throws: ReplicaError.crossStoreRelationship(entity: "Trip", relationship: "items")) {
            _ = try ModelContainer(for: Trip.self, Item.self, configurations: trips, items, environment: directory.environment())
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.url.path).isEmpty)
    }
}
