import Foundation
import Testing
@testable import Replica

@Suite("Concurrent writers on one store")
struct ConcurrentWriterTests {
    private func openNotes(_ directory: URL, seed: UInt64) throws -> ModelContainer {
        try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
        ], environment: .seeded(seed: seed, directory: directory))
    }

    @Test("two containers on one file edit different fields of one record from stale copies: both edits sync")
    func twoContainersStaleCopies() throws {
        let directory = temporaryTestDirectory()
        let first = try openNotes(directory, seed: 1), second = try openNotes(directory, seed: 2)
        let writer = ModelContext(first)
        let note = writer.insert(SyncNote(title: "t", body: "b", rating: 1))
        try writer.save()
        let a = ModelContext(first), b = ModelContext(second)
        var copyA = try #require(try a.model(SyncNote.self, id: note.id))
        var copyB = try #require(try b.model(SyncNote.self, id: note.id))
        copyA.title = "title from A"
        copyB.rating = 7
        a.update(copyA)
        b.update(copyB)
        try a.save()
        try b.save()
        let cloud = InMemoryCloudDatabase()
        let engine = try SyncEngine(container: second, storeName: "notes")
        engine.setNeedsFetch()
        while let request = try engine.nextRequest() { try engine.handle(request.id, cloud.performNow(request.operation)) }
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["title"]?.value == .text("title from A"))
        #expect(record.fields["rating"]?.value == .integer(7))
        #expect(record.fields["body"]?.value == .text("b"))
    }

    @Test("saves between an upload request and its answer are never lost: an edit and a delete")
    func saveBetweenRequestAndAnswer() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        let other = try Device("B", seed: 2)
        var note = device.context.insert(SyncNote(title: "v1"))
        let doomed = device.context.insert(SyncNote(title: "doomed"))
        try device.context.save()
        let upload = try #require(try device.nextUpload(cloud))
        note.title = "v2, saved while v1 was in flight"
        device.context.update(note)
        device.context.delete(doomed)
        try device.context.save()
        try device.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try device.engine.status().pendingRecords == 2)
        try device.sync(cloud)
        try other.sync(cloud)
        #expect(try other.notes().map(\.title) == ["v2, saved while v1 was in flight"])
        #expect(try device.engine.status().isUpToDate)
    }

    @Test("an answer the engine cannot store because another writer holds the store is retried, and converges")
    func answerWhileStoreIsBusy() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryTestDirectory()
        let device = try Device("A", seed: 1, directory: directory)
        device.context.insert(SyncNote(title: "mine"))
        try device.context.save()
        let writer = try Device("W", seed: 2)
        writer.context.insert(SyncNote(title: "theirs"))
        try writer.context.save()
        try writer.sync(cloud)
        let upload = try #require(try device.nextUpload(cloud))
        let answer = cloud.performNow(upload.operation)
        // Another process holds the store's write lock while the answer arrives (the busy timeout passes).
        let blocker = try rawConnection(directory.appendingPathComponent("notes.store"))
        try blocker.begin(.immediate)
        #expect(throws: SQLiteError.self) { try device.engine.handle(upload.id, answer) }
        blocker.rollback()
        try device.sync(cloud)
        #expect(try device.notes().map(\.title).sorted() == ["mine", "theirs"])
        #expect(cloud.records(in: "notes").count == 2)
        #expect(try device.engine.status().isUpToDate)
    }
}
