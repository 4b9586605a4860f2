import Foundation
import Testing
@testable import Replica

struct STrip: PersistentModel, Codable, Equatable {
    static var entityName: String { "Trip" }
    var id = UUID.unassigned
    var name: String = ""
    var items: [Reference<SItem>] = []
    static let entity = ModelEntity<STrip>([
        .attribute("name", \.name, default: ""),
        .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
    ])
}

struct SItem: PersistentModel, Codable, Equatable {
    static var entityName: String { "Item" }
    var id = UUID.unassigned
    var title: String = ""
    var trip: Reference<STrip>?
    var steps: [Reference<SStep>] = []
    static let entity = ModelEntity<SItem>([
        .attribute("title", \.title, default: ""),
        .toOne("trip", \.trip, inverse: "items"),
        .toMany("steps", \.steps, inverse: "item", deleteRule: .cascade),
    ])
}

struct SStep: PersistentModel, Codable, Equatable {
    static var entityName: String { "Step" }
    var id = UUID.unassigned
    var text: String = ""
    var item: Reference<SItem>?
    static let entity = ModelEntity<SStep>([
        .attribute("text", \.text, default: ""),
        .toOne("item", \.item, inverse: "steps"),
    ])
}

/// Like STrip, but its items are nullified (not cascaded) when it is deleted.
struct NTrip: PersistentModel, Codable, Equatable {
    static var entityName: String { "Trip" }
    var id = UUID.unassigned
    var name: String = ""
    var items: [Reference<NItem>] = []
    static let entity = ModelEntity<NTrip>([
        .attribute("name", \.name, default: ""),
        .toMany("items", \.items, inverse: "trip", deleteRule: .nullify),
    ])
}

struct NItem: PersistentModel, Codable, Equatable {
    static var entityName: String { "Item" }
    var id = UUID.unassigned
    var title: String = ""
    var trip: Reference<NTrip>?
    static let entity = ModelEntity<NItem>([
        .attribute("title", \.title, default: ""),
        .toOne("trip", \.trip, inverse: "items"),
    ])
}

private let tripModels: [any PersistentModel.Type] = [STrip.self, SItem.self, SStep.self]

private func permutations<T>(_ items: [T]) -> [[T]] {
    guard items.count > 1 else { return [items] }
    return items.indices.flatMap { i -> [[T]] in
        var rest = items
        let head = rest.remove(at: i)
        return permutations(rest).map { [head] + $0 }
    }
}

private func graph(of device: Device) throws -> String {
    let context = ModelContext(device.container)
    let trips = try context.fetch(STrip.self).map { "trip \($0.name) items \($0.items.map(\.id))" }
    let items = try context.fetch(SItem.self).map { "item \($0.title) trip \($0.trip?.id.uuidString ?? "nil") steps \($0.steps.count)" }
    return (trips + items).joined(separator: "\n")
}

@Suite("Replication across relationships")
struct SyncRelationshipTests {
    @Test("a parent and its children converge under every delivery order; children arriving first wait, then link")
    func everyDeliveryOrder() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: tripModels)
        let trip = a.context.insert(STrip(name: "Iceland"))
        for title in ["lights", "spring", "glacier"] { a.context.insert(SItem(title: title, trip: Reference(trip))) }
        try a.context.save()
        try a.sync(cloud)
        let records = cloud.records(in: "notes")
        #expect(records.count == 4)

        var outcomes: Set<String> = []
        for (n, order) in permutations(records).enumerated() {
            let device = try Device("B\(n)", seed: UInt64(100 + n), models: tripModels)
            for (step, record) in order.enumerated() {
                #expect(try device.deliver([record], cloud: cloud))
                // A child that arrived before its parent is kept and marked waiting.
                let parentArrived = order[...step].contains { $0.recordType == "Trip" }
                if !parentArrived, record.recordType == "Item" {
                    let entry = try #require(try device.engine.ledgerEntry(for: PersistentIdentifier(entityName: "Item", id: record.recordID)))
                    #expect(entry.state == .waitingForParent(trip.id))
                    #expect(try !device.engine.status().isUpToDate)
                }
            }
            #expect(try device.engine.ledgerEntries(in: .waitingForParent).isEmpty)
            #expect(try device.engine.status().waitingForParent == 0)
            outcomes.insert(try graph(of: device))
        }
        #expect(outcomes.count == 1)
        #expect(outcomes.first == (try graph(of: a)))
    }

    @Test("a local cascade over three levels emits a tombstone for every descendant; a new device sees no orphans")
    func threeLevelCascade() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: tripModels)
        let trip = a.context.insert(STrip(name: "T"))
        let item = a.context.insert(SItem(title: "I", trip: Reference(trip)))
        a.context.insert(SStep(text: "S1", item: Reference(item)))
        a.context.insert(SStep(text: "S2", item: Reference(item)))
        try a.context.save()
        try a.sync(cloud)
        a.context.delete(trip)
        try a.context.save()
        try a.sync(cloud)
        #expect(cloud.records(in: "notes").count == 4)
        #expect(cloud.records(in: "notes").allSatisfy { !$0.isAlive })
        let fresh = try Device("new", seed: 2, models: tripModels)
        try fresh.sync(cloud)
        let context = ModelContext(fresh.container)
        #expect(try context.fetch(STrip.self).isEmpty)
        #expect(try context.fetch(SItem.self).isEmpty)
        #expect(try context.fetch(SStep.self).isEmpty)
        #expect(try fresh.engine.status().isUpToDate)
    }

    @Test("a child created on one device while another deletes its parent follows the parent's cascade rule everywhere")
    func childOfDeletedParentCascade() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: tripModels)
        let b = try Device("B", seed: 2, models: tripModels)
        let trip = a.context.insert(STrip(name: "T"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        a.context.delete(trip)
        try a.context.save()
        let late = b.context.insert(SItem(title: "added offline", trip: Reference(trip)))
        try b.context.save()
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud); try b.sync(cloud)
        for device in [a, b] {
            #expect(try ModelContext(device.container).fetch(SItem.self).isEmpty)
            #expect(try device.engine.status().isUpToDate)
        }
        #expect(cloud.records(in: "notes").first { $0.recordID == late.id }?.isAlive == false)
    }

    @Test("with the nullify rule, children of a parent deleted elsewhere lose the reference and stay, on every device")
    func childOfDeletedParentNullify() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [NTrip.self, NItem.self]
        let a = try Device("A", seed: 1, models: models)
        let b = try Device("B", seed: 2, models: models)
        let trip = a.context.insert(NTrip(name: "T"))
        let kept = a.context.insert(NItem(title: "kept", trip: Reference(trip)))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        a.context.delete(trip)
        try a.context.save()
        let late = b.context.insert(NItem(title: "added offline", trip: Reference(trip)))
        try b.context.save()
        try b.sync(cloud); try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)
        for device in [a, b] {
            let items = try ModelContext(device.container).fetch(NItem.self)
            let ids: Set<UUID> = Set(items.map(\.id))
            let expectedIDs: Set<UUID> = [kept.id, late.id]
            #expect(ids == expectedIDs)
            #expect(items.allSatisfy { $0.trip == nil })
            #expect(try ModelContext(device.container).fetch(NTrip.self).isEmpty)
        }
    }

    @Test("a rejected parent upload never turns into a local delete of its children")
    func rejectedParentKeepsChildren() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: tripModels)
        let trip = a.context.insert(STrip(name: "T"))
        let item = a.context.insert(SItem(title: "I", trip: Reference(trip)))
        try a.context.save()
        let upload = try #require(try a.nextUpload(cloud))
        try a.engine.handle(upload.id, .success(.modified([
            .failed(recordID: trip.id, error: .invalidRecord(reason: "refused")),
            .saved(recordID: item.id, changeTag: "1.1"),
        ])))
        let context = ModelContext(a.container)
        #expect(try context.fetch(SItem.self).map(\.id) == [item.id])
        #expect(try context.fetch(STrip.self).map(\.id) == [trip.id])
        #expect(try a.engine.ledgerEntry(for: trip.persistentModelID)?.state == .rejected(reason: "invalid record: refused"))
        #expect(try a.engine.status().rejectedRecords == 1)
        #expect(try !a.engine.status().isUpToDate)
    }

    @Test("the ledger and the conflict log are queryable")
    func ledgerAndConflicts() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        #expect(try a.engine.ledgerEntry(for: note.persistentModelID)?.state == .pending)
        try a.sync(cloud); try b.sync(cloud)
        #expect(try a.engine.ledgerEntry(for: note.persistentModelID)?.state == .synced)
        var onB = try #require(try b.context.model(SyncNote.self, id: note.id))
        onB.title = "B wins"
        b.clock.advance(by: 5_000)
        b.context.update(onB)
        try b.context.save()
        try b.sync(cloud)
        var onA = note
        onA.title = "A loses"
        a.context.update(onA)
        try a.context.save()
        try a.sync(cloud)
        #expect(try a.notes().first?.title == "B wins")
        let log = try a.engine.conflictLog()
        #expect(log.count == 1)
        #expect(log.first?.field == "title")
        #expect(log.first.map { $0.localStamp < $0.winningStamp } == true)
    }
}

@Suite("Additive-only schema gate")
struct SchemaGateTests {
    @Test("a version 2 device and a version 1 device sync the same zone both ways; v1 keeps v2's field")
    func twoVersions() throws {
        let cloud = InMemoryCloudDatabase()
        let v2 = try Device("v2", seed: 2, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let written = v2.context.insert(SyncNoteV2(title: "from v2", mood: "happy"))
        try v2.context.save()
        try v2.sync(cloud)
        let v1 = try Device("v1", seed: 1, models: [SyncNote.self], version: Schema.Version(1, 0, 0))
        try v1.sync(cloud)
        #expect(try v1.engine.status().isUpToDate)
        var edited = try #require(try v1.context.model(SyncNote.self, id: written.id))
        edited.rating = 4
        v1.context.update(edited)
        v1.context.insert(SyncNote(title: "from v1"))
        try v1.context.save()
        try v1.sync(cloud); try v2.sync(cloud)
        let seen = try ModelContext(v2.container).fetch(SyncNoteV2.self)
        #expect(Set(seen.map(\.title)) == ["from v2", "from v1"])
        let mine = try #require(seen.first { $0.id == written.id })
        #expect(mine.mood == "happy")
        #expect(mine.rating == 4)
        #expect(seen.first { $0.id != written.id }?.mood == "calm")  // declared default for a record from the older version
    }

    @Test("after a zone reset a running engine writes the union schema into the re-created zone (found by the crypto work)")
    func schemaRewrittenAfterReset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        try a.sync(cloud)
        #expect(try cloud.zoneMetadata("notes")["schema"] != nil)
        cloud.resetZone("notes")
        try a.sync(cloud)
        #expect(try cloud.zoneMetadata("notes")["schema"] != nil)
    }

    @Test("a device that removes or retypes an attribute is refused with the differences named, and writes nothing")
    func incompatibleRefused() throws {
        struct Retyped: PersistentModel, Codable {
            static var entityName: String { "SyncNote" }
            var id = UUID.unassigned
            var title: String = ""
            var rating: String = ""
            static let entity = ModelEntity<Retyped>([
                .attribute("title", \.title, default: ""),
                .attribute("rating", \.rating, default: ""),
            ])
        }
        let cloud = InMemoryCloudDatabase()
        let v1 = try Device("v1", seed: 1)
        v1.context.insert(SyncNote(title: "t", body: "b"))
        try v1.context.save()
        try v1.sync(cloud)
        let before = cloud.storedBytes(of: "notes")
        let bad = try Device("bad", seed: 3, models: [Retyped.self], version: Schema.Version(1, 1, 0))
        bad.context.insert(Retyped(title: "should not upload"))
        try bad.context.save()
        let expected = ReplicaError.incompatibleSchema([
            .attributeRemoved(entity: "SyncNote", attribute: "body"),
            .attributeRetyped(entity: "SyncNote", attribute: "rating", zoneType: .integer, localType: .string),
            .versions(device: Schema.Version(1, 1, 0), zone: Schema.Version(1, 0, 0)),
        ])
        #expect(throws: expected) { try bad.sync(cloud) }
        #expect(expected.description.contains("declare a new attribute of the new type and copy the values into it"))
        #expect(try bad.engine.status().blockedBy == expected)
        #expect(try !bad.engine.status().isUpToDate)
        #expect(cloud.storedBytes(of: "notes") == before)
        #expect(try ModelContext(bad.container).fetch(Retyped.self).count == 1)  // local data untouched
    }
}
