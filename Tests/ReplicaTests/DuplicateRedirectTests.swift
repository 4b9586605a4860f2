import Foundation
import Testing
@testable import Replica

@Suite("Duplicates and redirects")
struct DuplicateRedirectTests {
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
