import Foundation
import Testing
@testable import Replica

@Suite("Sync edge cases")
struct SyncEdgeCaseTests {
    @Test("a record the cloud rejected for good is tried again once the app changes it")
    func rejectedRecordRetriedAfterLocalEdit() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        var note = a.context.insert(SyncNote(title: "far too long a title"))
        try a.context.save()
        let upload = try #require(try a.nextUpload(cloud))
        try a.engine.handle(upload.id, .failure(.partialFailure([.failed(recordID: note.id, error: .invalidRecord(reason: "title too long"))])))
        #expect(try a.engine.status().rejectedRecords == 1)
        #expect(try a.engine.ledgerEntry(for: note.persistentModelID)?.state.kind == .rejected)
        // The app fixes the record: the new content deserves a new attempt (the save's own ledger write clears the
        // rejection).
        note.title = "short"
        a.context.update(note)
        try a.context.save()
        #expect(try a.engine.ledgerEntry(for: note.persistentModelID)?.state == .pending)
        #expect(try a.engine.status().rejectedRecords == 0)
        let status = try a.sync(cloud)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("short"))
        #expect(status.isUpToDate)
    }

    @Test("a store that becomes synced uploads the records it already had")
    func syncEnabledOnAnExistingStore() throws {
        let directory = temporaryTestDirectory()
        do {
            let environment = ReplicaEnvironment.seeded(seed: 1, directory: directory)
            let local = try ModelContainer(for: Schema([SyncNote.self]), configurations: [ModelConfiguration("notes")],
                                           environment: environment)
            let context = ModelContext(local)
            context.insert(SyncNote(title: "written before sync was turned on"))
            try context.save()
        }
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 2, directory: directory)
        #expect(try a.notes().count == 1)
        let status = try a.sync(cloud)
        #expect(cloud.records(in: "notes").map { $0.fields["title"]?.value } == [.text("written before sync was turned on")])
        #expect(status.isUpToDate)
        // An edit of it syncs too.
        var note = try #require(try a.notes().first)
        note.rating = 5
        a.context.update(note)
        try a.context.save()
        try a.sync(cloud)
        #expect(cloud.records(in: "notes").first?.fields["rating"]?.value == .integer(5))
    }

    @Test("records of a type only a newer version knows survive a zone reset that an older device heals",
          arguments: [false, true])
    func unknownRecordTypesSurviveZoneReset(recreatedByAnotherDevice: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let newer = try Device("new", seed: 1, models: [SyncNote.self, SyncTag.self], version: Schema.Version(2, 0, 0))
        let older = try Device("old", seed: 2, models: [SyncNote.self])
        newer.context.insert(SyncTag(label: "only v2 knows tags"))
        newer.context.insert(SyncNote(title: "everyone knows notes"))
        try newer.context.save()
        try newer.sync(cloud)
        try older.sync(cloud)
        // The zone is reset while only the older device is around to upload again.
        cloud.resetZone("notes")
        if recreatedByAnotherDevice {
            // Someone else re-creates the zone first: the older device then finds it by a full resync.
            let bystander = try Device("bystander", seed: 5)
            bystander.context.insert(SyncNote(title: "bystander"))
            try bystander.context.save()
            try bystander.sync(cloud)
        }
        try older.sync(cloud)
        let reinstalled = try Device("new again", seed: 3, models: [SyncNote.self, SyncTag.self], version: Schema.Version(2, 0, 0))
        try reinstalled.sync(cloud)
        let context = ModelContext(reinstalled.container)
        #expect(Set(try context.fetch(SyncNote.self).map(\.title)).contains("everyone knows notes"))
        #expect(try context.fetch(SyncTag.self).map(\.label) == ["only v2 knows tags"])
        #expect(try older.engine.status().isUpToDate)
        #expect(try reinstalled.engine.status().isUpToDate)
    }

    @Test("a token that expires between pages of a small fetch limit still delivers everything exactly once")
    func tokenExpiresMidPaging() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        for i in 0..<7 { a.context.insert(SyncNote(title: "n\(i)", rating: i)) }
        try a.context.save()
        try a.sync(cloud)
        let directory = temporaryTestDirectory()
        let environment = ReplicaEnvironment.seeded(seed: 2, directory: directory)
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        var options = SyncEngine.Options()
        options.fetchLimit = 2
        options.uploadBatchSize = 1
        let engine = try SyncEngine(container: container, storeName: "notes", options: options)
        var fetches = 0
        engine.setNeedsFetch()
        for _ in 0..<200 {
            guard let request = try engine.nextRequest() else { break }
            if case .fetchZoneChanges = request.operation {
                fetches += 1
                // Expire every token after the second page; and reset the zone once, mid-read, later on.
                if fetches == 3 { cloud.expireChangeTokens(in: "notes") }
            }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        let notes = try ModelContext(container).fetch(SyncNote.self)
        #expect(notes.map(\.title) == (0..<7).map { "n\($0)" })
        #expect(try engine.status().isUpToDate)
        // Nothing was uploaded again: the cloud still holds each record once, unchanged.
        #expect(cloud.records(in: "notes").compactMap(\.changeTag).sorted() == (1...7).map { "1.\($0)" })
    }

    @Test("a zone reset between pages of a small fetch limit loses nothing and duplicates nothing")
    func zoneResetMidPaging() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        for i in 0..<5 { a.context.insert(SyncNote(title: "a\(i)")) }
        try a.context.save()
        try a.sync(cloud)
        let b = try Device("B", seed: 2)
        b.context.insert(SyncNote(title: "b0"))
        try b.context.save()
        var fetches = 0
        b.engine.setNeedsFetch()
        for _ in 0..<200 {
            guard let request = try b.engine.nextRequest() else {
                if let wake = b.engine.wakeTime { b.clock.set(milliseconds: wake); continue }
                break
            }
            if case .fetchZoneChanges(_, _, let limit) = request.operation {
                fetches += 1
                #expect(limit == 500)
                if fetches == 1 {
                    // Deliver one page of two, then the zone is reset under B's feet.
                    let page = try cloud.fetchZoneChanges("notes", since: nil, limit: 2)
                    try b.engine.handle(request.id, .success(.changes(page)))
                    cloud.resetZone("notes")
                    continue
                }
            }
            try b.engine.handle(request.id, cloud.performNow(request.operation))
        }
        try a.sync(cloud)
        try b.sync(cloud)
        try a.sync(cloud)
        let titles = Set(try a.notes().map(\.title))
        #expect(titles == ["a0", "a1", "a2", "a3", "a4", "b0"])
        #expect(Set(try b.notes().map(\.title)) == titles)
        #expect(cloud.records(in: "notes").count == 6)
    }

    @Test("delete and re-insert of one record racing on three devices converge (R5)")
    func deleteReinsertRaceOnThreeDevices() throws {
        let cloud = InMemoryCloudDatabase()
        let devices = try (0..<3).map { try Device("D\($0)", seed: UInt64(30 + $0)) }
        let original = devices[0].context.insert(SyncNote(title: "v0", rating: 1))
        try devices[0].context.save()
        for device in devices { try device.sync(cloud) }
        // D0 deletes and re-inserts the same ID; D1 edits the old incarnation; D2 deletes it.
        devices[0].clock.advance(by: 10)
        devices[0].context.delete(original)
        try devices[0].context.save()
        devices[0].context.insert(SyncNote(id: original.id, title: "reborn"))
        try devices[0].context.save()
        devices[1].clock.advance(by: 20)
        var edited = try #require(try devices[1].context.model(SyncNote.self, id: original.id))
        edited.body = "edited old incarnation"
        devices[1].context.update(edited)
        try devices[1].context.save()
        devices[2].clock.advance(by: 30)
        devices[2].context.delete(original)
        try devices[2].context.save()
        for order in [[2, 1, 0], [0, 2, 1], [1, 0, 2]] { for i in order { try devices[i].sync(cloud) } }
        let states = try devices.map { try $0.notes().map { "\($0.title)|\($0.body ?? "-")|\($0.rating)" } }
        #expect(Set(states).count == 1, "\(states)")
        // Two deletes of incarnation 1 are the same causal step (length 2): D0's re-insert (3) wins, fresh.
        #expect(states[0] == ["reborn|-|0"])
    }

    @Test("two engines on one store in one process: one holds the lease, the other waits, nothing uploads twice")
    func twoEnginesOneStore() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        let second = try SyncEngine(container: device.container, storeName: "notes")
        for i in 0..<3 { device.context.insert(SyncNote(title: "n\(i)")) }
        try device.context.save()
        let first = try #require(try device.engine.nextRequest())
        #expect(try second.nextRequest() == nil)
        try device.engine.handle(first.id, cloud.performNow(first.operation))
        try device.sync(cloud)
        // The first engine is done but still holds the lease until it expires; the second then takes over.
        device.clock.advance(by: 31_000)
        second.setNeedsFetch()
        for _ in 0..<50 {
            guard let request = try second.nextRequest() else { break }
            try second.handle(request.id, cloud.performNow(request.operation))
        }
        #expect(cloud.records(in: "notes").compactMap(\.changeTag).sorted() == ["1.1", "1.2", "1.3"])
        #expect(try second.status().isUpToDate)
    }
}
