import Foundation
import Testing
@testable import Replica

/// Two processes of an app group on one synced store file, stood for by two containers on one file in this process
/// (the tests with real OS processes are in AppGroupProcessTests.swift): an acknowledgement that arrives after the
/// other process changed the record keeps it pending, merges by either process meet the other's upload, every save
/// gets its own history token, and the upload lease passes between them.
@Suite("App-group synced store: two processes on one file")
struct AppGroupSyncTests {
    @Test("two processes on one file: an acknowledgement arriving after the other process edited the record keeps it pending")
    func staleAckAfterOtherProcessEdit() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryTestDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let note = app.context.insert(SyncNote(title: "v1", rating: 1))
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        var theirs = try #require(try ext.context.model(SyncNote.self, id: note.id))
        theirs.title = "v2 by the extension"
        ext.context.update(theirs)
        try ext.context.save()
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        #expect(try app.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        #expect(try app.engine.status().pendingRecords == 1)
        try app.sync(cloud)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("v2 by the extension"))
        #expect(try app.engine.status().isUpToDate)
        #expect(try ext.engine.status().pendingRecords == 0)
        let other = try Device("other", seed: 2)
        try other.sync(cloud)
        #expect(try other.notes().map(\.title) == ["v2 by the extension"])
    }

    @Test("two processes on one file: the other process deletes and re-inserts the record while its upload is in flight",
          arguments: [false, true])
    func staleAckAfterOtherProcessDeleteAndReinsert(reinsert: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryTestDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let note = app.context.insert(SyncNote(title: "v1", rating: 1))
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        let theirs = try #require(try ext.context.model(SyncNote.self, id: note.id))
        ext.context.delete(theirs)
        try ext.context.save()
        if reinsert {
            ext.context.insert(SyncNote(id: note.id, title: "reborn", rating: 7))
            try ext.context.save()
        }
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        // The cloud holds incarnation 1 alive; the ledger holds a later state: still to upload.
        #expect(try app.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        #expect(try app.engine.replicationState(of: note.id)?.causalLength == (reinsert ? 3 : 2))
        try app.sync(cloud)
        let record = try #require(cloud.records(in: "notes").first { $0.recordID == note.id })
        #expect(record.causalLength == (reinsert ? 3 : 2))
        #expect(try app.engine.status().isUpToDate)
        let other = try Device("other", seed: 2)
        try other.sync(cloud)
        #expect(try other.notes().map(\.title) == (reinsert ? ["reborn"] : []))
        #expect(try other.notes().map(\.rating) == (reinsert ? [7] : []))
    }

    @Test("two processes on one file: the other process merges a remote edit of the record while this one's upload is in flight")
    func mergeByOtherProcessDuringUpload() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryTestDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let phone = try Device("phone", seed: 2)
        var note = app.context.insert(SyncNote(title: "v1", rating: 1))
        try app.context.save()
        try app.sync(cloud)
        try phone.sync(cloud)
        note.title = "title by app"
        app.context.update(note)
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        // The phone edits another field and uploads first.
        phone.clock.advance(by: 500)
        var copy = try #require(try phone.context.model(SyncNote.self, id: note.id))
        copy.rating = 42
        phone.context.update(copy)
        try phone.context.save()
        try phone.sync(cloud)
        // The extension's engine fetches the phone's version into the shared file before the app's answer arrives.
        let phoneVersion = try #require(cloud.records(in: "notes").first)
        #expect(try ext.deliver([phoneVersion, phoneVersion], cloud: cloud))
        #expect(try app.notes().first?.rating == 42)
        #expect(try app.notes().first?.title == "title by app")
        #expect(try app.engine.ledgerEntry(for: noteID(note.id))?.state == .pending)
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        try settle([app, ext, phone], cloud)
        for device in [app, ext, phone] {
            let notes = try device.notes()
            #expect(notes.map(\.title) == ["title by app"], "\(device.name)")
            #expect(notes.map(\.rating) == [42], "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["title"]?.value == .text("title by app"))
        #expect(record.fields["rating"]?.value == .integer(42))
    }

    @Test("two processes on one file: interleaved saves and a merge each get their own history token, with their own changes")
    func historyTokensOfInterleavedProcesses() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryTestDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        let phone = try Device("phone", seed: 2)
        app.context.author = "app"
        ext.context.author = "ext"
        let a = app.context.insert(SyncNote(title: "a"))
        try app.context.save()
        var copy = try #require(try ext.context.model(SyncNote.self, id: a.id))
        copy.rating = 5
        ext.context.update(copy)
        try ext.context.save()
        let remote = phone.context.insert(SyncNote(title: "from the phone"))
        try phone.context.save()
        try phone.sync(cloud)
        #expect(try app.deliver(cloud.records(in: "notes"), cloud: cloud))
        // A save that fails validation writes no history; the next one does.
        let b = ext.context.insert(SyncNote(id: a.id, title: "clash"))
        #expect(throws: (any Error).self) { try ext.context.save() }
        ext.context.rollback()
        let c = ext.context.insert(SyncNote(title: "c"))
        try ext.context.save()
        _ = b
        for device in [app, ext] {
            let history = try ModelContext(device.container).fetchHistory(HistoryDescriptor(storeNames: ["notes"]))
            #expect(history.map(\.author) == ["app", "ext", HistoryTransaction.syncAuthor, "ext"], "\(device.name)")
            #expect(history.map(\.token) == history.map(\.token).sorted(), "\(device.name)")
            #expect(Set(history.map(\.token)).count == history.count, "\(device.name)")
            guard history.count == 4 else { continue }
            #expect(history[0].changes == [.insert(noteID(a.id))], "\(device.name)")
            #expect(history[1].changes == [.update(noteID(a.id), updatedAttributes: ["rating"])], "\(device.name)")
            #expect(history[2].changes.map(\.changedPersistentIdentifier) == [noteID(remote.id)], "\(device.name)")
            #expect(history[3].changes == [.insert(noteID(c.id))], "\(device.name)")
            let after = try ModelContext(device.container).fetchHistory(HistoryDescriptor(after: history[1].token, storeNames: ["notes"]))
            #expect(after.map(\.token) == [history[2].token, history[3].token], "\(device.name)")
        }
    }

    @Test("two processes on one file: while one holds the upload lease the other does not upload; after it releases, the other does, and the first waits again")
    func leaseAlternatesBetweenProcesses() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryTestDirectory()
        let app = try Device("app", seed: 1, directory: directory)
        let ext = try Device("ext", seed: 1, directory: directory)
        app.context.insert(SyncNote(title: "one"))
        try app.context.save()
        let upload = try #require(try app.nextUpload(cloud))
        #expect(try ext.nextUpload(cloud).map { _ in true } == nil)
        try app.engine.handle(upload.id, cloud.performNow(upload.operation))
        app.engine.releaseLease()
        ext.context.insert(SyncNote(title: "two"))
        try ext.context.save()
        // The extension waits out the wait it began while the app held the lease.
        if let wake = ext.engine.wakeTime { ext.clock.set(milliseconds: wake) }
        let extUpload = try #require(try ext.nextUpload(cloud))
        app.context.insert(SyncNote(title: "three"))
        try app.context.save()
        // The lease text changed since the app last parsed it (its own): the app must see the extension's lease.
        #expect(try app.nextUpload(cloud).map { _ in true } == nil)
        try ext.engine.handle(extUpload.id, cloud.performNow(extUpload.operation))
        ext.engine.releaseLease()
        try app.sync(cloud)
        #expect(Set(cloud.records(in: "notes").compactMap { $0.fields["title"]?.value }) == [.text("one"), .text("two"), .text("three")])
        #expect(try app.engine.status().isUpToDate)
    }
}
