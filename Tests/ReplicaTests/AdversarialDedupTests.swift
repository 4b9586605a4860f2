import Foundation
import Testing
@testable import Replica

@Suite("Adversarial: duplicates and redirects")
struct AdversarialRedirectTests {
    @Test("duplicate parents whose children collide on a compound key with the parent reference resolve to one child")
    func cascadingDuplicates() throws {
        let cloud = InMemoryCloudDatabase()
        let devices = try (0..<2).map { try Device("D\($0)", seed: UInt64(20 + $0), models: [UTrip.self, UItem.self]) }
        for (i, device) in devices.enumerated() {
            device.clock.advance(by: Int64(10 * (i + 1)))
            let trip = device.context.insert(UTrip(name: "Iceland"))
            device.context.insert(UItem(title: "Northern lights", trip: Reference(trip)))
            try device.context.save()
        }
        for _ in 0..<3 { for device in devices { try device.sync(cloud) } }
        for device in devices {
            let context = ModelContext(device.container)
            #expect(try context.fetch(UTrip.self).count == 1, "\(device.name)")
            let items = try context.fetch(UItem.self)
            #expect(items.count == 1, "\(device.name): \(items.count) live items share one (trip, title) key")
            // The survivor can still be edited.
            if var item = items.first {
                item.done = true
                context.update(item)
                #expect(throws: Never.self) { try context.save() }
            }
        }
    }

    @Test("a tombstone redirecting to a record of another entity never retargets references to it")
    func redirectToAnotherEntity() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1, models: [DPerson.self, DAddress.self])
        let person = device.context.insert(DPerson(email: "p@example.com", name: "P"))
        let address = device.context.insert(DAddress(city: "Oslo", person: Reference(person)))
        try device.context.save()
        try device.sync(cloud)
        var tombstone = try #require(cloud.records(in: "notes").first { $0.recordID == person.id })
        tombstone.changeTag = "forged"  // another version has another tag (see `CloudRecord.changeTag`)
        tombstone.causalLength = 2
        tombstone.redirect = address.id
        tombstone.fields = [:]
        try device.deliver([tombstone], cloud: cloud)
        let context = ModelContext(device.container)
        for stored in try context.fetch(DAddress.self) {
            #expect(stored.person?.id != address.id, "an Address now references an Address as its person")
        }
        // A redirect can only name a record of the same entity: this is a plain delete, whose cascade rule applies.
        #expect(try context.fetch(DAddress.self).isEmpty)
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

@Suite("Adversarial: relationship cycles")
struct AdversarialCycleTests {
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

@Suite("Adversarial: compound keys with NULL parts")
struct AdversarialCompoundKeyTests {
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
