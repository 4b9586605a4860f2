// A record deleted and inserted again with the same ID in one save, across devices: the new incarnation (causal length
// + 2) uploads alive, and every device ends with "exists, with the new values" (DESIGN: liveness by causal length).
import Foundation
import Testing
@testable import Replica

@Suite("Re-insert in one save across devices")
struct ReinsertSyncTests {
    /// Two devices that both hold `note` (inserted on A), synced through `cloud`.
    private func twoDevices(_ cloud: InMemoryCloudDatabase, models: [any PersistentModel.Type] = [SyncNote.self]) throws -> (Device, Device) {
        let a = try Device("A", seed: 1, models: models)
        let b = try Device("B", seed: 2, models: models)
        return (a, b)
    }

    @Test("delete and re-insert in one save ends as 'exists, with the new values' on both devices")
    func reinsertConverges() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try twoDevices(cloud)
        let note = a.context.insert(SyncNote(title: "first", body: "old body", rating: 2))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        #expect(try b.notes().map(\.title) == ["first"])

        a.context.delete(note)
        a.context.insert(SyncNote(id: note.id, title: "second", rating: 5))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)

        let expected = [SyncNote(id: note.id, title: "second", body: nil, rating: 5)]
        for device in [a, b] {
            #expect(try device.notes() == expected, "\(device.name)")
            let state = try #require(try device.engine.replicationState(of: note.id))
            #expect(state.causalLength == 3 && !state.isPending, "\(device.name)")
            #expect(state.stamps.values.allSatisfy { $0.incarnation == 3 }, "\(device.name)")
        }
        let record = try #require(cloud.records(in: "notes").first { $0.recordID == note.id })
        #expect(record.causalLength == 3 && record.isAlive)
        // B imported the new incarnation over its live row: its history shows the new values arriving.
        let imported = try #require(try b.context.fetchHistory().last)
        #expect(imported.author == HistoryTransaction.syncAuthor)
        #expect(imported.changes.map(\.changedPersistentIdentifier) == [PersistentIdentifier(entityName: "SyncNote", id: note.id)])
        // Both devices sync again: nothing changes (no resurrection of the old incarnation, no second tombstone).
        try b.sync(cloud); try a.sync(cloud)
        for device in [a, b] { #expect(try device.notes() == expected, "\(device.name)") }
    }

    @Test("an edit of the old incarnation made concurrently on another device loses to the re-insert")
    func concurrentEditOfTheOldIncarnation() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try twoDevices(cloud)
        let note = a.context.insert(SyncNote(title: "first", body: "old body", rating: 2))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)

        // B edits the old incarnation and uploads first; A deletes and re-inserts, then syncs.
        var edited = try #require(try b.context.model(SyncNote.self, id: note.id))
        edited.body = "B's body"
        edited.rating = 9
        b.context.update(edited)
        try b.context.save()
        try b.sync(cloud)
        a.context.delete(note)
        a.context.insert(SyncNote(id: note.id, title: "second"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)

        for device in [a, b] {
            #expect(try device.notes() == [SyncNote(id: note.id, title: "second", body: nil, rating: 0)], "\(device.name)")
            #expect(try device.engine.replicationState(of: note.id)?.causalLength == 3, "\(device.name)")
        }
    }

    @Test("a concurrent delete on another device does not beat the re-insert")
    func concurrentDelete() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try twoDevices(cloud)
        let note = a.context.insert(SyncNote(title: "first"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)

        b.context.delete(try #require(try b.context.model(SyncNote.self, id: note.id)))
        try b.context.save()
        a.context.delete(note)
        a.context.insert(SyncNote(id: note.id, title: "second"))
        try a.context.save()
        try b.sync(cloud); try a.sync(cloud); try b.sync(cloud)

        for device in [a, b] {
            #expect(try device.notes().map(\.title) == ["second"], "\(device.name)")
            #expect(try device.engine.replicationState(of: note.id)?.causalLength == 3, "\(device.name)")
        }
    }

    @Test("a re-inserted parent under cascade: the children's tombstones and the live parent reach the other device")
    func reinsertParentUnderCascade() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try twoDevices(cloud, models: [STrip.self, SItem.self, SStep.self])
        let trip = a.context.insert(STrip(name: "Iceland"))
        let item = a.context.insert(SItem(title: "boots", trip: Reference(trip)))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        #expect(try ModelContext(b.container).fetch(SItem.self).map(\.id) == [item.id])

        a.context.delete(trip)
        a.context.insert(STrip(id: trip.id, name: "Iceland, second try"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)

        for device in [a, b] {
            let reader = ModelContext(device.container)
            #expect(try reader.fetch(STrip.self).map(\.name) == ["Iceland, second try"], "\(device.name)")
            #expect(try reader.fetch(SItem.self).isEmpty, "\(device.name)")
            #expect(try device.engine.replicationState(of: trip.id)?.causalLength == 3, "\(device.name)")
            #expect(try device.engine.replicationState(of: item.id)?.causalLength == 2, "\(device.name)")
        }
    }

    @Test("a re-insert keeping a unique key converges without a duplicate resolution")
    func reinsertWithAUniqueKey() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try twoDevices(cloud, models: [UTrip.self, UItem.self])
        let trip = a.context.insert(UTrip(name: "Iceland"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)

        a.context.delete(trip)
        a.context.insert(UTrip(id: trip.id, name: "Iceland"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)

        for device in [a, b] {
            #expect(try ModelContext(device.container).fetch(UTrip.self).map(\.id) == [trip.id], "\(device.name)")
            let state = try #require(try device.engine.replicationState(of: trip.id))
            #expect(state.causalLength == 3 && state.redirect == nil, "\(device.name)")
        }
        #expect(cloud.records(in: "notes").filter(\.isAlive).map(\.recordID) == [trip.id])
    }

    @Test("a record deleted and re-inserted twice before syncing uploads its newest incarnation")
    func twoReinsertsBeforeSyncing() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try twoDevices(cloud)
        let note = a.context.insert(SyncNote(title: "first"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        for title in ["second", "third"] {
            a.context.delete(SyncNote(id: note.id))
            a.context.insert(SyncNote(id: note.id, title: title))
            try a.context.save()
        }
        #expect(try a.engine.replicationState(of: note.id)?.causalLength == 5)
        try a.sync(cloud); try b.sync(cloud)
        for device in [a, b] {
            #expect(try device.notes().map(\.title) == ["third"], "\(device.name)")
            #expect(try device.engine.replicationState(of: note.id)?.causalLength == 5, "\(device.name)")
        }
    }
}
