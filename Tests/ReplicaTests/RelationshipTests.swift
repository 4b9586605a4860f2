// Relationships: to-many members filled on fetch, delete rules (cascade, nullify, deny, noAction) and required to-one
// relationships.
import Foundation
import Testing
@testable import Replica

@Suite("Relationships and delete rules")
struct RelationshipTests {
    let directory = TestDirectory()
    let container: ModelContainer

    init() throws {
        container = try ModelContainer(
            for: Trip.self, Item.self, Folder.self, Document.self, Page.self, Shelf.self, Book.self, Team.self, Player.self,
            Person.self, Account.self, Album.self, Photo.self, environment: directory.environment())
    }

    private func count(_ table: String) throws -> Int64 { try rowCount(table, in: directory.storeURL()) }

    // MARK: To-many

    @Test func toManyMembersAreFilledOnFetch() throws {
        let context = ModelContext(container)
        let iceland = context.insert(Trip(name: "Iceland"))
        let japan = context.insert(Trip(name: "Japan"))
        let empty = context.insert(Trip(name: "Empty"))
        let lights = context.insert(Item(title: "Lights", trip: Reference(iceland)))
        let sushi = context.insert(Item(title: "Sushi", trip: Reference(japan)))
        let springs = context.insert(Item(title: "Springs", trip: Reference(iceland)))
        context.insert(Item(title: "Unassigned"))
        try context.save()

        let reader = ModelContext(container)
        let trips = try reader.fetch(Trip.self)
        #expect(trips.map(\.name) == ["Iceland", "Japan", "Empty"])
        #expect(trips.map { $0.items.map(\.id) } == [[lights.id, springs.id], [sushi.id], []])
        #expect(try reader.model(Trip.self, id: iceland.id)?.items.map(\.id) == [lights.id, springs.id])
        #expect(try reader.model(Trip.self, id: empty.id)?.items == [])
        #expect(try reader.model(Item.self, id: sushi.id)?.trip == Reference(japan))

        // Moving an item moves it between the arrays.
        var moved = try #require(try reader.model(Item.self, id: springs.id))
        moved.trip = Reference(japan)
        reader.update(moved)
        try reader.save()
        let after = try ModelContext(container).fetch(Trip.self)
        #expect(after.map { $0.items.map(\.id) } == [[lights.id], [sushi.id, springs.id], []])
    }

    @Test func toManyMembersAreLoadedForLargeBatches() throws {
        let context = ModelContext(container)
        let trips = (0..<600).map { context.insert(Trip(name: "t\($0)")) }
        for (i, trip) in trips.enumerated() where i % 2 == 0 { context.insert(Item(title: "i\(i)", trip: Reference(trip))) }
        try context.save()
        let fetched = try ModelContext(container).fetch(Trip.self)
        #expect(fetched.count == 600)
        #expect(fetched.enumerated().allSatisfy { $0.element.items.count == ($0.offset % 2 == 0 ? 1 : 0) })
    }

    @Test func toManyMembersReflectPendingChanges() throws {
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Trip"))
        let other = context.insert(Trip(name: "Other"))
        let deleted = context.insert(Item(title: "deleted", trip: Reference(trip)))
        var moved = context.insert(Item(title: "moved", trip: Reference(trip)))
        try context.save()

        let added = context.insert(Item(title: "added", trip: Reference(trip)))
        moved.trip = Reference(other)
        context.update(moved)
        context.delete(deleted)

        // The context's own view includes its pending changes, as for the records themselves...
        #expect(try context.model(Item.self, id: deleted.id) == nil)
        #expect(try context.model(Trip.self, id: trip.id)?.items.map(\.id) == [added.id])
        #expect(try context.model(Trip.self, id: other.id)?.items.map(\.id) == [moved.id])
        #expect(try context.fetch(Trip.self).map { $0.items.map(\.id) } == [[added.id], [moved.id]])
        let newTrip = context.insert(Trip(name: "New"))
        let newItem = context.insert(Item(title: "new", trip: Reference(newTrip)))
        #expect(try context.model(Trip.self, id: newTrip.id)?.items.map(\.id) == [newItem.id])

        // ...unless they are excluded, and other contexts never see them.
        var storedOnly = FetchDescriptor<Trip>()
        storedOnly.includePendingChanges = false
        #expect(try context.fetch(storedOnly).map { $0.items.map(\.id) } == [[deleted.id, moved.id], []])
        #expect(try ModelContext(container).fetch(Trip.self).map { $0.items.map(\.id) } == [[deleted.id, moved.id], []])

        try context.save()
        #expect(try ModelContext(container).fetch(Trip.self).map { $0.items.map(\.id) } == [[added.id], [moved.id], [newItem.id]])
    }

    // MARK: Cascade

    @Test func cascadeDeletesOverSeveralLevels() throws {
        let context = ModelContext(container)
        let folder = context.insert(Folder(name: "Work"))
        let other = context.insert(Folder(name: "Home"))
        for d in 0..<3 {
            let document = context.insert(Document(title: "doc \(d)", folder: Reference(folder)))
            for p in 0..<4 { context.insert(Page(number: p, document: Reference(document))) }
        }
        let kept = context.insert(Document(title: "kept", folder: Reference(other)))
        let keptPage = context.insert(Page(number: 1, document: Reference(kept)))
        let loose = context.insert(Page(number: 99))
        try context.save()
        #expect(try count("Document") == 4)
        #expect(try count("Page") == 14)

        context.delete(folder)
        try context.save()
        #expect(try count("Folder") == 1)
        #expect(try ModelContext(container).fetch(Document.self).map(\.id) == [kept.id])
        #expect(try Set(ModelContext(container).fetch(Page.self).map(\.id)) == [keptPage.id, loose.id])
    }

    @Test func cascadeIsReportedInTheStoreChanges() throws {
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Preserved name"))
        let a = context.insert(Item(title: "a", trip: Reference(trip)))
        let b = context.insert(Item(title: "b", trip: Reference(trip)))
        try context.save()

        let store = container.stores[0]
        let db = try store.openConnection()
        try db.begin(.immediate)
        defer { db.rollback() }
        var writer = StoreWriter(store: store, db: db)
        try writer.apply([(trip.persistentModelID, .delete)])
        #expect(writer.failures.isEmpty)
        #expect(writer.changes.deleted.map(\.id) == [a.persistentModelID, b.persistentModelID, trip.persistentModelID])
        // Attributes marked preserveValueOnDeletion keep their value in the deletion record; others do not.
        let tripDeletion = try #require(writer.changes.deleted.last)
        #expect(tripDeletion.preservedValues.map(\.0) == ["name"])
        #expect(tripDeletion.preservedValues.map(\.1) == [.text("Preserved name")])
        #expect(writer.changes.deleted.first?.preservedValues.isEmpty == true)
    }

    // MARK: Nullify

    @Test func nullifyClearsTheChildrensReferences() throws {
        let context = ModelContext(container)
        let team = context.insert(Team(name: "Reds"))
        let other = context.insert(Team(name: "Blues"))
        let a = context.insert(Player(name: "a", team: Reference(team)))
        let b = context.insert(Player(name: "b", team: Reference(team)))
        let c = context.insert(Player(name: "c", team: Reference(other)))
        try context.save()

        context.delete(team)
        try context.save()
        let reader = ModelContext(container)
        #expect(try reader.fetch(Team.self).map(\.id) == [other.id])
        #expect(try reader.fetch(Player.self).count == 3)
        #expect(try reader.model(Player.self, id: a.id)?.team == nil)
        #expect(try reader.model(Player.self, id: b.id)?.team == nil)
        #expect(try reader.model(Player.self, id: c.id)?.team == Reference(other))
        #expect(try reader.model(Team.self, id: other.id)?.players.map(\.id) == [c.id])
    }

    @Test func nullifyIsReportedInTheStoreChanges() throws {
        let context = ModelContext(container)
        let team = context.insert(Team(name: "Reds"))
        let player = context.insert(Player(name: "a", team: Reference(team)))
        try context.save()
        let store = container.stores[0]
        let db = try store.openConnection()
        try db.begin(.immediate)
        defer { db.rollback() }
        var writer = StoreWriter(store: store, db: db)
        try writer.apply([(team.persistentModelID, .delete)])
        #expect(writer.changes.updated.map(\.0.id) == [player.id])
        #expect(writer.changes.updated.map(\.1) == [["team"]])
    }

    @Test func deletingAChildLeavesTheParent() throws {
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Trip"))
        let a = context.insert(Item(title: "a", trip: Reference(trip)))
        let b = context.insert(Item(title: "b", trip: Reference(trip)))
        try context.save()
        context.delete(a)
        try context.save()
        #expect(try ModelContext(container).model(Trip.self, id: trip.id)?.items.map(\.id) == [b.id])
    }

    // MARK: No action

    @Test func noActionLeavesReferencesDangling() throws {
        let context = ModelContext(container)
        let album = context.insert(Album(title: "Holiday"))
        let photo = context.insert(Photo(caption: "Beach", album: Reference(album)))
        try context.save()
        context.delete(album)
        try context.save()
        let reader = ModelContext(container)
        #expect(try reader.fetch(Album.self).isEmpty)
        #expect(try reader.model(Photo.self, id: photo.id)?.album == Reference(album))
    }

    // MARK: Deny

    @Test func denyRefusesToDeleteWhileRelatedRecordsExist() throws {
        let context = ModelContext(container)
        let shelf = context.insert(Shelf(label: "Fiction"))
        var first = context.insert(Book(title: "One", shelf: Reference(shelf)))
        var second = context.insert(Book(title: "Two", shelf: Reference(shelf)))
        let empty = context.insert(Shelf(label: "Empty"))
        try context.save()

        context.delete(shelf)
        #expect(throws: ReplicaError.modelValidationFailure([.deleteDenied(entity: "Shelf", relationship: "books", count: 2)])) {
            try context.save()
        }
        #expect(try count("Shelf") == 2)
        #expect(try count("Book") == 2)
        context.rollback()

        // An empty shelf can go; once its books have moved, so can the other.
        context.delete(empty)
        try context.save()
        first.shelf = nil
        second.shelf = nil
        context.update(first)
        context.update(second)
        try context.save()
        context.delete(shelf)
        try context.save()
        #expect(try count("Shelf") == 0)
        #expect(try count("Book") == 2)
    }

    @Test(arguments: [true, false])
    func denyAllowsDeletingTheRelatedRecordsInTheSameSave(booksFirst: Bool) throws {
        let context = ModelContext(container)
        let shelf = context.insert(Shelf(label: "Fiction"))
        let books = (0..<2).map { context.insert(Book(title: "\($0)", shelf: Reference(shelf))) }
        try context.save()

        // The outcome of a save does not depend on the order the deletes were registered in.
        if booksFirst {
            books.forEach(context.delete)
            context.delete(shelf)
        } else {
            context.delete(shelf)
            books.forEach(context.delete)
        }
        try context.save()
        #expect(try count("Shelf") == 0)
        #expect(try count("Book") == 0)
    }


    @Test func denyAllowsDeletingAfterMovingTheRelatedRecordsInTheSameSave() throws {
        let context = ModelContext(container)
        let old = context.insert(Shelf(label: "Old"))
        let new = context.insert(Shelf(label: "New"))
        var book = context.insert(Book(title: "Moved", shelf: Reference(old)))
        try context.save()
        context.delete(old)
        book.shelf = Reference(new)
        context.update(book)
        try context.save()
        #expect(try ModelContext(container).model(Shelf.self, id: new.id)?.books.map(\.id) == [book.id])
        #expect(try count("Shelf") == 1)
    }

    @Test func denyCountsOnlyTheRecordsThatRemain() throws {
        let context = ModelContext(container)
        let shelf = context.insert(Shelf(label: "Fiction"))
        let books = (0..<3).map { context.insert(Book(title: "\($0)", shelf: Reference(shelf))) }
        try context.save()
        context.delete(shelf)
        context.delete(books[1])
        #expect(throws: ReplicaError.modelValidationFailure([.deleteDenied(entity: "Shelf", relationship: "books", count: 2)])) {
            try context.save()
        }
        #expect(try count("Book") == 3)
    }


    // MARK: Required to-one

    @Test func deletingTheTargetOfARequiredRelationshipIsRefused() throws {
        let context = ModelContext(container)
        let person = context.insert(Person(name: "Ada"))
        let checking = context.insert(Account(number: "1", owner: Reference(person)))
        let savings = context.insert(Account(number: "2", owner: Reference(person)))
        try context.save()

        context.delete(person)
        #expect(throws: ReplicaError.modelValidationFailure([
            .missingRequiredRelationship(entity: "Account", relationship: "owner", id: checking.persistentModelID),
            .missingRequiredRelationship(entity: "Account", relationship: "owner", id: savings.persistentModelID),
        ])) { try context.save() }
        #expect(try count("Person") == 1)
        #expect(try count("Account") == 2)
    }

    @Test(arguments: [true, false])
    func deletingTheTargetWithItsDependentsInOneSaveIsAllowed(dependentsFirst: Bool) throws {
        let context = ModelContext(container)
        let person = context.insert(Person(name: "Ada"))
        let accounts = (0..<2).map { context.insert(Account(number: "\($0)", owner: Reference(person))) }
        try context.save()
        if dependentsFirst {
            accounts.forEach(context.delete)
            context.delete(person)
        } else {
            context.delete(person)
            accounts.forEach(context.delete)
        }
        try context.save()
        #expect(try count("Person") == 0)
        #expect(try count("Account") == 0)
    }

    @Test func aRequiredRelationshipLeftUnassignedIsRefused() throws {
        let context = ModelContext(container)
        let orphan = context.insert(Account(number: "orphan", owner: Reference(UUID.unassigned)))
        #expect(throws: ReplicaError.modelValidationFailure([
            .missingRequiredRelationship(entity: "Account", relationship: "owner", id: orphan.persistentModelID),
        ])) { try context.save() }
        #expect(try count("Account") == 0)
        context.rollback()

        // The same on update.
        let person = context.insert(Person(name: "Ada"))
        var account = context.insert(Account(number: "1", owner: Reference(person)))
        try context.save()
        account.owner = Reference(UUID.unassigned)
        context.update(account)
        #expect(throws: ReplicaError.modelValidationFailure([
            .missingRequiredRelationship(entity: "Account", relationship: "owner", id: account.persistentModelID),
        ])) { try context.save() }
        #expect(try ModelContext(container).model(Account.self, id: account.id)?.owner == Reference(person))
    }
}

/// A self-referencing synced entity: a node's children are cascaded when it is deleted.
struct CycleNode: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var parent: Reference<CycleNode>?
    var children: [Reference<CycleNode>] = []
    static let entity = ModelEntity<CycleNode>([
        .attribute("name", \.name, default: ""),
        .toOne("parent", \.parent, inverse: "children"),
        .toMany("children", \.children, inverse: "parent", deleteRule: .cascade),
    ])
}

@Suite("Relationship cycles")
struct RelationshipCycleTests {
    @Test("a reference cycle deleted on one device while edited on another ends deleted everywhere, in any sync order",
          arguments: [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
    func cascadeThroughACycle(order: [Int]) throws {
        let cloud = InMemoryCloudDatabase()
        let devices = try (0..<3).map { try Device("D\($0)", seed: UInt64(40 + $0), models: [CycleNode.self]) }
        let context = devices[0].context
        var a = context.insert(CycleNode(name: "a"))
        let b = context.insert(CycleNode(name: "b", parent: Reference(a)))
        let c = context.insert(CycleNode(name: "c", parent: Reference(b)))
        try context.save()
        a.parent = Reference(c)  // a → c → b → a
        context.update(a)
        try context.save()
        for device in devices { try device.sync(cloud) }
        // D1 deletes b (cascading through the whole cycle); D2 renames c meanwhile.
        let doomed = try #require(try devices[1].context.model(CycleNode.self, id: b.id))
        devices[1].context.delete(doomed)
        try devices[1].context.save()
        #expect(try ModelContext(devices[1].container).fetch(CycleNode.self).isEmpty)
        var renamed = try #require(try devices[2].context.model(CycleNode.self, id: c.id))
        renamed.name = "c, renamed"
        devices[2].context.update(renamed)
        try devices[2].context.save()
        for _ in 0..<2 { for i in order { try devices[i].sync(cloud) } }
        for device in devices {
            #expect(try ModelContext(device.container).fetch(CycleNode.self).isEmpty, "\(device.name)")
            #expect(try device.engine.status().isUpToDate, "\(device.name)")
        }
    }
}

@Suite("Deep cascades")
struct DeepCascadeTests {
    /// Deletes the head of a cascade chain of `length` records (each record's children cascade), in memory.
    static func deleteChain(length: Int) throws {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        let container = try ModelContainer(for: CycleNode.self, configurations: ModelConfiguration("chain", isStoredInMemoryOnly: true),
                                           environment: environment)
        let context = ModelContext(container)
        var previous = context.insert(CycleNode(name: "0"))
        let head = previous
        for i in 1..<length { previous = context.insert(CycleNode(name: "\(i)", parent: Reference(previous))) }
        try context.save()
        context.delete(head)
        try context.save()
        guard try ModelContext(container).fetch(CycleNode.self).isEmpty else { exit(3) }
    }

    @Test("deleting the head of a long cascade chain never overflows the stack")
    func longCascadeChain() async throws {
        await #expect(processExitsWith: .success) { try DeepCascadeTests.deleteChain(length: 1_000) }
        await #expect(processExitsWith: .success) { try DeepCascadeTests.deleteChain(length: 3_000) }
        await #expect(processExitsWith: .success) { try DeepCascadeTests.deleteChain(length: 8_000) }
        await #expect(processExitsWith: .success) { try DeepCascadeTests.deleteChain(length: 20_000) }
    }
}
