// Unique attributes and compound keys, enforced on save (inserts of a taken key upsert: see UpsertTests).
import Foundation
import Testing
@testable import Replica

/// Unique keys of other attribute types: an integer, and a compound key of a date and a composite.
struct Ticket: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var number: Int = 0
    var issued: Date = Date(timeIntervalSince1970: 0)
    var seat: Address = Address(street: "", city: "")

    static let entity = ModelEntity<Ticket>([
        .attribute("number", \.number, options: .unique),
        .attribute("issued", \.issued),
        .attribute("seat", \.seat),
    ], uniquenessConstraints: [["issued", "seat"]])
}

@Suite("Uniqueness")
struct UniquenessTests {
    let directory = TestDirectory()
    let container: ModelContainer

    init() throws {
        container = try ModelContainer(for: User.self, Membership.self, Ticket.self, environment: directory.environment())
    }

    private func violation(_ model: User, _ attributes: [String] = ["email"]) -> ModelValidationFailure {
        .uniqueConstraintViolation(entity: "User", attributes: attributes, id: model.persistentModelID)
    }

    @Test func updatingToATakenKeyIsRefused() throws {
        let context = ModelContext(container)
        _ = context.insert(User(email: "a@example.com"))
        var b = context.insert(User(email: "b@example.com"))
        try context.save()
        b.email = "a@example.com"
        context.update(b)
        #expect(throws: ReplicaError.modelValidationFailure([violation(b)])) { try context.save() }
        #expect(try ModelContext(container).model(User.self, id: b.id)?.email == "b@example.com")
    }

    @Test func updatesToOneNewKeyInOneBatchAreAllReported() throws {
        // (Inserts of one key upsert: see UpsertTests.)
        let context = ModelContext(container)
        var a = context.insert(User(email: "a@example.com"))
        var b = context.insert(User(email: "b@example.com"))
        context.insert(User(email: "c@example.com", nickname: "nick"))
        var d = context.insert(User(email: "d@example.com", nickname: "other"))
        try context.save()
        a.email = "same@example.com"
        b.email = "same@example.com"
        d.nickname = "nick"
        context.update(a)
        context.update(b)
        context.update(d)
        #expect(throws: ReplicaError.modelValidationFailure([
            violation(a), violation(b), violation(d, ["nickname"]),
        ])) { try context.save() }
        #expect(try ModelContext(container).model(User.self, id: a.id)?.email == "a@example.com")
    }

    @Test func swappingKeysBetweenTwoRecordsInOneSaveIsAllowed() throws {
        let context = ModelContext(container)
        var a = context.insert(User(email: "a@example.com", nickname: "alpha"))
        var b = context.insert(User(email: "b@example.com", nickname: "beta"))
        try context.save()
        (a.email, b.email) = (b.email, a.email)
        (a.nickname, b.nickname) = (b.nickname, a.nickname)
        context.update(a)
        context.update(b)
        try context.save()
        let reader = ModelContext(container)
        #expect(try reader.model(User.self, id: a.id)?.email == "b@example.com")
        #expect(try reader.model(User.self, id: b.id)?.email == "a@example.com")
        #expect(try reader.model(User.self, id: a.id)?.nickname == "beta")
    }

    @Test func aKeyFreedByADeleteInTheSameSaveCanBeReused() throws {
        let context = ModelContext(container)
        let old = context.insert(User(email: "a@example.com"))
        try context.save()
        let new = context.insert(User(email: "a@example.com"))
        context.delete(old)
        try context.save()
        #expect(try ModelContext(container).fetch(User.self).map(\.id) == [new.id])
    }

    @Test func nullKeysNeverCollide() throws {
        let context = ModelContext(container)
        context.insert(User(email: "a@example.com", nickname: nil))
        context.insert(User(email: "b@example.com", nickname: nil))
        context.insert(Membership(group: "g", member: nil, role: "x"))
        context.insert(Membership(group: "g", member: nil, role: "y"))
        try context.save()
        context.insert(User(email: "c@example.com", nickname: nil))
        context.insert(Membership(group: "g", member: nil, role: "z"))
        try context.save()
        #expect(try rowCount("User", in: directory.storeURL()) == 3)
        #expect(try rowCount("Membership", in: directory.storeURL()) == 3)
    }

    @Test func compoundKeysCollideOnlyWhenEveryPartIsEqual() throws {
        let context = ModelContext(container)
        context.insert(Membership(group: "g", member: "m", role: "owner"))
        context.insert(Membership(group: "g", member: "n", role: "owner"))
        context.insert(Membership(group: "h", member: "m", role: "owner"))
        try context.save()

        var moved = context.insert(Membership(group: "g", member: "x", role: "guest"))
        try context.save()
        moved.member = "m"
        context.update(moved)
        #expect(throws: ReplicaError.modelValidationFailure([
            .uniqueConstraintViolation(entity: "Membership", attributes: ["group", "member"], id: moved.persistentModelID),
        ])) { try context.save() }
        context.rollback()
        moved.member = "o"
        context.update(moved)
        try context.save()
        #expect(try rowCount("Membership", in: directory.storeURL()) == 4)
    }

    @Test func uniqueKeysOfOtherTypes() throws {
        let context = ModelContext(container)
        let day = Date(timeIntervalSince1970: 1_767_225_600.5)
        let seat = Address(street: "Row 1", city: "Seat 2", postalCode: nil)
        context.insert(Ticket(number: 1, issued: day, seat: seat))
        var second = context.insert(Ticket(number: 2, issued: day, seat: Address(street: "Row 1", city: "Seat 3")))
        var third = context.insert(Ticket(number: 3, issued: day.addingTimeInterval(1), seat: seat))
        try context.save()
        second.number = 1
        third.issued = day
        context.update(second)
        context.update(third)
        #expect(throws: ReplicaError.modelValidationFailure([
            .uniqueConstraintViolation(entity: "Ticket", attributes: ["number"], id: second.persistentModelID),
            .uniqueConstraintViolation(entity: "Ticket", attributes: ["issued", "seat"], id: third.persistentModelID),
        ])) { try context.save() }
    }

    @Test func updatesThatLeaveTheKeyAloneAreFine() throws {
        let context = ModelContext(container)
        var membership = context.insert(Membership(group: "g", member: "m", role: "guest"))
        try context.save()
        membership.role = "owner"
        context.update(membership)
        try context.save()
        #expect(try ModelContext(container).model(Membership.self, id: membership.id)?.role == "owner")
    }

    @Test func violationsNeverContainTheDuplicatedValue() throws {
        let context = ModelContext(container)
        let secretEmail = "secret.person@hidden.example"
        let secretGroup = "classified-group-name"
        context.insert(User(email: secretEmail))
        context.insert(Membership(group: secretGroup, member: "agent", role: "r"))
        var user = context.insert(User(email: "other@example.com"))
        var membership = context.insert(Membership(group: secretGroup, member: "spare", role: "r"))
        try context.save()
        user.email = secretEmail
        membership.member = "agent"
        context.update(user)
        context.update(membership)
        let error = #expect(throws: ReplicaError.self) { try context.save() }
        #expect(error?.validationFailures.count == 2)
        let texts = [error.map { "\($0)" } ?? "", error?.description ?? "", String(reflecting: error as Any)]
            + (error?.validationFailures.map(\.description) ?? [])
        for text in texts {
            #expect(!text.contains(secretEmail))
            #expect(!text.contains("secret.person"))
            #expect(!text.contains(secretGroup))
            #expect(!text.contains("agent"))
        }
        // What it does say: the entity, the attributes and the record.
        #expect(error?.description.contains("User") == true)
        #expect(error?.description.contains("email") == true)
    }
}

/// A synced entity with a compound unique key whose second part is optional.
struct SyncMembership: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var group: String = ""
    var member: String?
    var note: String = ""
    static let entity = ModelEntity<SyncMembership>([
        .attribute("group", \.group, default: ""),
        .attribute("member", \.member),
        .attribute("note", \.note, default: ""),
    ], uniquenessConstraints: [["group", "member"]])
}

@Suite("Compound keys with NULL parts")
struct CompoundKeyNullPartTests {
    @Test("keys with a NULL part never collide; once both are set alike, every device keeps one record with the newest edit")
    func nullPartsThenCollision() throws {
        let cloud = InMemoryCloudDatabase()
        let devices = try (0..<2).map { try Device("D\($0)", seed: UInt64(50 + $0), models: [SyncMembership.self]) }
        var mine = devices[0].context.insert(SyncMembership(group: "g", member: nil, note: "from D0"))
        try devices[0].context.save()
        devices[1].clock.advance(by: 5)
        var theirs = devices[1].context.insert(SyncMembership(group: "g", member: nil))
        try devices[1].context.save()
        for _ in 0..<2 { for device in devices { try device.sync(cloud) } }
        for device in devices { #expect(try ModelContext(device.container).fetch(SyncMembership.self).count == 2) }
        // Both set the missing part to the same value, offline.
        mine.member = "ada"
        devices[0].context.update(mine)
        try devices[0].context.save()
        devices[1].clock.advance(by: 10)
        theirs.member = "ada"
        theirs.note = "from D1, later"
        devices[1].context.update(theirs)
        try devices[1].context.save()
        for _ in 0..<3 { for device in devices { try device.sync(cloud) } }
        let states = try devices.map { try ModelContext($0.container).fetch(SyncMembership.self) }
        #expect(states[0] == states[1])
        #expect(states[0].count == 1)
        #expect(states[0].first?.note == "from D1, later")
        for device in devices { #expect(try device.engine.status().isUpToDate) }
    }
}
