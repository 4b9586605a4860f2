// Inserting a unique key an existing record holds updates that record (SwiftData's upsert).
import Foundation
import Testing
import ReplicaTesting
@testable import Replica

@Suite("Upserts of unique keys")
struct UpsertTests {
    let directory = TestDirectory()
    let container: ModelContainer

    init() throws {
        container = try ModelContainer(for: User.self, Membership.self, Ticket.self, DPerson.self, DAddress.self,
                                       environment: directory.environment())
    }

    private func kinds(of changes: [HistoryChange]) -> [String] {
        changes.map { change in
            switch change {
            case let .insert(id): return "insert \(id.entityName)"
            case let .update(id, fields): return "update \(id.entityName) \(fields.sorted())"
            case let .delete(id, _): return "delete \(id.entityName)"
            }
        }
    }

    @Test("an insert of a stored record's unique key updates that record, which keeps its identity")
    func insertOfATakenKeyUpdatesTheStoredRecord() throws {
        let context = ModelContext(container)
        let first = context.insert(User(email: "a@example.com"))
        try context.save()
        let second = context.insert(User(email: "a@example.com", nickname: "ada"))
        #expect(second.id != first.id)
        try context.save()

        #expect(try rowCount("User", in: directory.storeURL()) == 1)
        let stored = try ModelContext(container).fetch(User.self)
        #expect(stored == [User(id: first.id, email: "a@example.com", nickname: "ada")])
        #expect(context.resolvedIdentifier(for: second.persistentModelID) == first.persistentModelID)
        #expect(context.resolvedIdentifier(for: first.persistentModelID) == first.persistentModelID)
        #expect(try context.model(for: second.persistentModelID, as: User.self)?.id == first.id)
        // History records an update of the existing record with the field that changed, not an insert.
        let last = try #require(try context.fetchHistory().last)
        #expect(kinds(of: last.changes) == ["update User [\"nickname\"]"])
        #expect(last.changes.first?.changedPersistentIdentifier == first.persistentModelID)
    }

    @Test("an upsert writes every field of the inserted model, nil included, as SwiftData does; a partial change is an update")
    func upsertWritesEveryField() throws {
        let context = ModelContext(container)
        let first = context.insert(User(email: "a@example.com", nickname: "ada"))
        try context.save()
        // The new model leaves nickname nil: the stored record's nickname is cleared, not kept.
        context.insert(User(email: "a@example.com"))
        try context.save()
        #expect(try ModelContext(container).fetch(User.self) == [User(id: first.id, email: "a@example.com", nickname: nil)])
        // To change some fields only, fetch by the key and update.
        var stored = try #require(try context.fetch(FetchDescriptor<User>(predicate: #Predicate { $0.email == "a@example.com" })).first)
        stored.nickname = "countess"
        context.update(stored)
        try context.save()
        #expect(try ModelContext(container).fetch(User.self) == [User(id: first.id, email: "a@example.com", nickname: "countess")])
    }

    @Test("an upsert from another context, and one that changes nothing, write nothing new")
    func upsertFromAnotherContextAndWithoutChanges() throws {
        let writer = ModelContext(container)
        let first = writer.insert(User(email: "a@example.com", nickname: "ada"))
        try writer.save()
        let other = ModelContext(container)
        other.insert(User(email: "a@example.com", nickname: "ada"))
        let before = try other.fetchHistory().count
        try other.save()
        #expect(try other.fetchHistory().count == before)
        #expect(try ModelContext(container).fetch(User.self).map(\.id) == [first.id])
    }

    @Test("two inserts of one key in one save leave one record, with the later insert's values")
    func twoInsertsOfOneKeyInOneSave() throws {
        let context = ModelContext(container)
        let a = context.insert(User(email: "same@example.com", nickname: "first"))
        let b = context.insert(User(email: "same@example.com", nickname: "second"))
        try context.save()
        #expect(try ModelContext(container).fetch(User.self) == [User(id: a.id, email: "same@example.com", nickname: "second")])
        #expect(context.resolvedIdentifier(for: b.persistentModelID) == a.persistentModelID)
        let last = try #require(try context.fetchHistory().last)
        #expect(kinds(of: last.changes) == ["insert User"])
    }

    @Test("compound keys upsert only when every part is equal; a key with a NULL part never does")
    func compoundKeys() throws {
        let context = ModelContext(container)
        let owner = context.insert(Membership(group: "g", member: "m", role: "owner"))
        context.insert(Membership(group: "g", member: "n", role: "owner"))
        context.insert(Membership(group: "g", member: nil, role: "x"))
        try context.save()

        context.insert(Membership(group: "g", member: "m", role: "guest"))
        context.insert(Membership(group: "h", member: "m", role: "guest"))
        context.insert(Membership(group: "g", member: nil, role: "y"))
        try context.save()
        let rows = try ModelContext(container).fetch(FetchDescriptor<Membership>(sortBy: [SortDescriptor(\.role)]))
        #expect(rows.count == 5)
        #expect(try ModelContext(container).model(Membership.self, id: owner.id)?.role == "guest")
    }

    @Test("keys of other types (an integer; a compound of a date and a composite) upsert")
    func keysOfOtherTypes() throws {
        let context = ModelContext(container)
        let day = Date(timeIntervalSince1970: 1_767_225_600.5)
        let seat = Address(street: "Row 1", city: "Seat 2", postalCode: nil)
        let first = context.insert(Ticket(number: 1, issued: day, seat: seat))
        try context.save()
        context.insert(Ticket(number: 7, issued: day, seat: seat))
        try context.save()
        #expect(try ModelContext(container).fetch(Ticket.self) == [Ticket(id: first.id, number: 7, issued: day, seat: seat)])
        context.insert(Ticket(number: 7, issued: day.addingTimeInterval(60), seat: seat))
        try context.save()
        #expect(try ModelContext(container).fetch(Ticket.self).map(\.id) == [first.id])
        #expect(try ModelContext(container).fetch(Ticket.self).first?.issued == day.addingTimeInterval(60))
    }

    @Test("an insert whose keys match two different records is refused, as an update to a taken key is")
    func ambiguousUpsertIsRefused() throws {
        let context = ModelContext(container)
        context.insert(User(email: "a@example.com", nickname: "x"))
        context.insert(User(email: "b@example.com", nickname: "y"))
        try context.save()
        let both = context.insert(User(email: "a@example.com", nickname: "y"))
        #expect(throws: ReplicaError.modelValidationFailure([
            .uniqueConstraintViolation(entity: "User", attributes: ["email"], id: both.persistentModelID),
            .uniqueConstraintViolation(entity: "User", attributes: ["nickname"], id: both.persistentModelID),
        ])) { try context.save() }
        #expect(try rowCount("User", in: directory.storeURL()) == 2)
    }

    @Test("a pending update that moves a record off a key lets an insert of that key be new; one onto a key takes the upsert")
    func pendingUpdatesDecideTheKey() throws {
        let context = ModelContext(container)
        var a = context.insert(User(email: "a@example.com"))
        var b = context.insert(User(email: "b@example.com"))
        try context.save()
        a.email = "moved@example.com"
        context.update(a)
        let fresh = context.insert(User(email: "a@example.com", nickname: "new"))
        b.email = "c@example.com"
        context.update(b)
        let onto = context.insert(User(email: "c@example.com", nickname: "onto b"))
        try context.save()
        let reader = ModelContext(container)
        #expect(try reader.model(User.self, id: fresh.id)?.nickname == "new")
        #expect(try reader.model(User.self, id: a.id)?.email == "moved@example.com")
        #expect(try reader.model(User.self, id: b.id) == User(id: b.id, email: "c@example.com", nickname: "onto b"))
        #expect(context.resolvedIdentifier(for: onto.persistentModelID) == b.persistentModelID)
        #expect(try rowCount("User", in: directory.storeURL()) == 3)
    }

    @Test("a child inserted with its upserted parent points at the existing parent")
    func childrenFollowTheirUpsertedParent() throws {
        let context = ModelContext(container)
        let ada = context.insert(DPerson(email: "ada@example.com", name: "Ada"))
        try context.save()
        // The child registered before and after the parent: both follow it.
        let again = DPerson(id: container.environment.makeIdentifier(), email: "ada@example.com", name: "Ada Lovelace")
        context.insert(DAddress(city: "London", person: Reference(again.id)))
        context.insert(again)
        context.insert(DAddress(city: "Paris", person: Reference(again.id)))
        try context.save()
        let reader = ModelContext(container)
        #expect(try reader.fetch(DPerson.self).map(\.id) == [ada.id])
        #expect(try reader.fetch(DPerson.self).first?.name == "Ada Lovelace")
        let addresses = try reader.fetch(DAddress.self)
        #expect(addresses.count == 2)
        #expect(addresses.allSatisfy { $0.person?.id == ada.id })
        #expect(try reader.fetch(DPerson.self).first?.addresses.count == 2)
    }

    @Test("a key freed by a delete in the same save is inserted as a new record")
    func keyFreedByADeleteIsANewRecord() throws {
        let context = ModelContext(container)
        let old = context.insert(User(email: "a@example.com"))
        try context.save()
        context.delete(old)
        let new = context.insert(User(email: "a@example.com"))
        try context.save()
        #expect(try ModelContext(container).fetch(User.self).map(\.id) == [new.id])
        #expect(context.resolvedIdentifier(for: new.persistentModelID) == new.persistentModelID)
    }

    @Test("a local upsert in a synced store uploads as an update of the existing record, not a new record")
    func syncedUpsertUploadsAnUpdate() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 41, models: [DPerson.self, DAddress.self])
        let b = try Device("B", seed: 42, models: [DPerson.self, DAddress.self])
        let ada = a.context.insert(DPerson(email: "ada@example.com", name: "Ada"))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        b.clock.advance(by: 1_000)
        let again = b.context.insert(DPerson(email: "ada@example.com", name: "Ada Lovelace", nickname: "countess"))
        try b.context.save()
        #expect(b.context.resolvedIdentifier(for: again.persistentModelID) == ada.persistentModelID)
        try b.sync(cloud)
        let records = cloud.records(in: "notes").filter { $0.recordType == "Person" }
        #expect(records.map(\.recordID) == [ada.id])
        #expect(records.first?.causalLength == 1)
        #expect(records.first?.redirect == nil)
        try a.sync(cloud)
        let seen = try ModelContext(a.container).fetch(DPerson.self)
        #expect(seen.map(\.id) == [ada.id])
        #expect(seen.first?.name == "Ada Lovelace")
        #expect(seen.first?.nickname == "countess")
        #expect(try peopleState(a) == peopleState(b))
    }
}
