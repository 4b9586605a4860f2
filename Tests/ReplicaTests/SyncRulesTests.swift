import Foundation
import Testing
@testable import Replica

/// The merge rules of DESIGN.md's replication contract, one test each (Specs/replication-protocol.md names them).
@Suite("Replication rules")
struct SyncRulesTests {
    @Test("only fields the app changed get new stamps")
    func onlyChangedFieldsStamped() throws {
        let a = try Device("A", seed: 1)
        let note = a.context.insert(SyncNote(title: "t", body: "b"))
        try a.context.save()
        let before = try #require(try SyncLedger.loadAsStored(note.id, a.engine.db))
        a.clock.advance(by: 10)
        var changed = note
        changed.rating = 3
        a.context.update(changed)
        try a.context.save()
        let after = try #require(try SyncLedger.loadAsStored(note.id, a.engine.db))
        #expect(after.stamps["title"] == before.stamps["title"])
        #expect(after.stamps["body"] == before.stamps["body"])
        #expect(after.stamps["rating"]! > before.stamps["rating"]!)
    }

    @Test("a concurrent update and delete resolve to the delete; a stale copy never resurrects it")
    func deleteWinsAndNoResurrection() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        let staleCopy = try #require(cloud.records(in: "notes").first)
        var edited = note
        edited.title = "edited later"
        a.clock.advance(by: 60_000)
        a.context.update(edited)
        try a.context.save()
        b.context.delete(note)
        try b.context.save()
        try b.sync(cloud); try a.sync(cloud); try b.sync(cloud)
        #expect(try a.notes().isEmpty)
        #expect(try b.notes().isEmpty)
        // Replaying the old live version (e.g. a delayed duplicate) changes nothing.
        var hlc = try SyncLedger.loadHLC(a.engine.db, replica: a.container.stores[0].identity)
        _ = try a.engine.db.transaction { try SyncLedger.merge(staleCopy, store: a.container.stores[0], db: a.engine.db, hlc: &hlc, wall: 0) }
        #expect(try a.notes().isEmpty)
    }

    @Test("delete then re-insert of the same ID ends as 'exists with the new values' everywhere")
    func deleteThenReinsert() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "first", body: "old body", rating: 2))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        a.context.delete(note)
        try a.context.save()
        a.context.insert(SyncNote(id: note.id, title: "second"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        for device in [a, b] {
            let notes = try device.notes()
            #expect(notes.count == 1)
            #expect(notes.first?.title == "second")
            #expect(notes.first?.body == nil)  // the new incarnation starts fresh
            #expect(notes.first?.rating == 0)
        }
        #expect(cloud.records(in: "notes").first?.causalLength == 3)
    }

    @Test("a record missing fields never nulls local values (absent is not null); an explicit null does")
    func absentIsNotNull() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let note = a.context.insert(SyncNote(title: "keep me", body: "and me", rating: 4))
        try a.context.save()
        try a.sync(cloud)
        // A partial writer saves only `rating` (newer), with no title or body.
        var partial = try #require(cloud.records(in: "notes").first)
        let newer = FieldStamp(incarnation: 1, clock: HLC(physical: a.clock.nowMilliseconds() + 1_000, logical: 0, replica: UUID()))
        partial.fields = ["rating": CloudField(value: .integer(9), stamp: newer)]
        #expect(try cloud.modifyRecords([partial], in: "notes").first.map { if case .saved = $0 { true } else { false } } == true)
        try a.sync(cloud)
        let merged = try #require(try a.notes().first)
        #expect(merged.title == "keep me")
        #expect(merged.body == "and me")
        #expect(merged.rating == 9)
        // A's next upload restores the fields the partial writer left out.
        #expect(cloud.records(in: "notes").first?.fields.keys.sorted() == ["body", "rating", "title"])

        // An explicit null is a value with a clock like any other.
        var nulling = try #require(cloud.records(in: "notes").first)
        let newest = FieldStamp(incarnation: 1, clock: HLC(physical: a.clock.nowMilliseconds() + 2_000, logical: 0, replica: UUID()))
        nulling.fields["body"] = CloudField(value: .null, stamp: newest)
        _ = try cloud.modifyRecords([nulling], in: "notes")
        try a.sync(cloud)
        #expect(try a.notes().first?.body == nil)
        #expect(note.id == merged.id)
    }

    @Test("an older app version keeps a newer version's field untouched, and a new field takes its default for old records")
    func olderSchemaRoundTrip() throws {
        let cloud = InMemoryCloudDatabase()
        let v1 = try Device("v1", seed: 1, models: [SyncNote.self])
        let v2 = try Device("v2", seed: 2, models: [SyncNoteV2.self], version: Schema.Version(1, 1, 0))
        // A record created by the old version: v2 reads the declared default for the field v1 does not know.
        let old = v1.context.insert(SyncNote(title: "from v1"))
        try v1.context.save()
        try v1.sync(cloud); try v2.sync(cloud)
        #expect(try ModelContext(v2.container).model(SyncNoteV2.self, id: old.id)?.mood == "calm")

        // v2 writes the new field; v1 edits another field and uploads the whole record.
        var onV2 = try #require(try v2.context.model(SyncNoteV2.self, id: old.id))
        onV2.mood = "excited"
        v2.context.update(onV2)
        try v2.context.save()
        try v2.sync(cloud); try v1.sync(cloud)
        var onV1 = try #require(try v1.context.model(SyncNote.self, id: old.id))
        onV1.title = "edited on v1"
        v1.context.update(onV1)
        try v1.context.save()
        try v1.sync(cloud); try v2.sync(cloud)
        let seen = try #require(try ModelContext(v2.container).model(SyncNoteV2.self, id: old.id))
        #expect(seen.title == "edited on v1")
        #expect(seen.mood == "excited")
        #expect(cloud.records(in: "notes").first?.fields["mood"]?.value == .text("excited"))
    }

    @Test("records of a type this schema does not know are kept, not dropped")
    func unknownRecordTypesKept() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        try a.sync(cloud)
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: UUID()))
        let alien = CloudRecord(recordID: UUID(), recordType: "Sticker", causalLength: 1, created: stamp,
                                fields: ["shape": CloudField(value: .text("star"), stamp: stamp)])
        _ = try cloud.modifyRecords([alien], in: "notes")
        try a.sync(cloud)
        let kept = try a.engine.db.rows("SELECT record_type FROM replica_sync_unknown_record")
        #expect(kept == [[.text("Sticker")]])
        #expect(try a.engine.status().isUpToDate)
    }
}

@Suite("Replication under cloud errors and delivery faults")
struct SyncFaultTests {
    @Test("a save conflict merges the server's record field by field and pushes again")
    func conflictMerges() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        var onA = note
        onA.body = "A's body"
        a.context.update(onA)
        try a.context.save()
        var onB = try #require(try b.context.model(SyncNote.self, id: note.id))
        onB.rating = 7
        b.context.update(onB)
        try b.context.save()
        try a.sync(cloud)
        // B pushes with a stale change tag: conflict, merge, push again — without fetching first.
        let request = try #require(try b.engine.nextRequest())  // createZone
        try b.engine.handle(request.id, cloud.performNow(request.operation))
        try b.sync(cloud)
        try a.sync(cloud)
        #expect(try a.notes() == (try b.notes()))
        #expect(try a.notes().first?.body == "A's body")
        #expect(try a.notes().first?.rating == 7)
    }

    @Test("rate limit, quota and zone busy keep the change pending and retry after the delay", arguments: [
        CloudError.rateLimited(retryAfterMilliseconds: 5_000), .quotaExceeded, .zoneBusy(retryAfterMilliseconds: 2_000),
        .networkUnavailable,
    ])
    func transientErrors(error: CloudError) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        // Zone creation, schema check and the first fetch go through; the upload fails.
        let upload = try #require(try a.nextUpload(cloud))
        cloud.injectFailure(error, for: .modify)
        try a.engine.handle(upload.id, cloud.performNow(upload.operation))
        let status = try a.engine.status()
        #expect(status.pendingRecords == 1)
        #expect(status.lastError == error)
        #expect(!status.isUpToDate)
        #expect(try a.engine.nextRequest() == nil)  // backing off
        let wake = try #require(a.engine.wakeTime)
        if let retryAfter = error.retryAfterMilliseconds { #expect(wake == a.clock.nowMilliseconds() + retryAfter) }
        a.clock.set(milliseconds: wake)
        let retry = try #require(try a.engine.nextRequest())
        try a.engine.handle(retry.id, cloud.performNow(retry.operation))
        #expect(try a.engine.status().isUpToDate)
        #expect(cloud.records(in: "notes").count == 1)
    }

    @Test("a per-record failure in a partial failure keeps that record pending; a permanent one marks it rejected")
    func partialFailure() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let first = a.context.insert(SyncNote(title: "1"))
        let second = a.context.insert(SyncNote(title: "2"))
        try a.context.save()
        let upload = try #require(try a.nextUpload(cloud))
        try a.engine.handle(upload.id, .failure(.partialFailure([
            .failed(recordID: first.id, error: .invalidRecord(reason: "too large")),
            .failed(recordID: second.id, error: .zoneBusy(retryAfterMilliseconds: 10)),
        ])))
        let status = try a.engine.status()
        #expect(status.rejectedRecords == 1)
        #expect(status.pendingRecords == 1)
        #expect(!status.isUpToDate)
        try a.sync(cloud)
        #expect(cloud.records(in: "notes").map(\.recordID) == [second.id])
        #expect(try !a.engine.status().isUpToDate)  // the rejected record is still failing
    }

    @Test("an expired change token leads to a full, idempotent resync: no duplicates, no loss")
    func expiredToken() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        for i in 0..<5 { a.context.insert(SyncNote(title: "n\(i)")) }
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        cloud.expireChangeTokens(in: "notes")
        a.context.insert(SyncNote(title: "n5"))
        try a.context.save()
        try a.sync(cloud)
        let historyBefore = try b.context.fetchHistory().count
        try b.sync(cloud)
        #expect(try b.notes().map(\.title) == ["n0", "n1", "n2", "n3", "n4", "n5"])
        // The resync re-read six records but only one was new: one history transaction with one insert.
        let imported = try b.context.fetchHistory().dropFirst(historyBefore)
        #expect(imported.flatMap(\.changes).count == 1)
    }

    @Test("a zone reset re-uploads local data and never deletes it")
    func zoneReset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let kept = a.context.insert(SyncNote(title: "kept"))
        let gone = a.context.insert(SyncNote(title: "gone"))
        try a.context.save()
        a.context.delete(gone)
        try a.context.save()
        try a.sync(cloud)
        cloud.resetZone("notes")
        try a.sync(cloud)
        #expect(try a.notes().map(\.id) == [kept.id])
        let records = cloud.records(in: "notes")
        #expect(records.count == 2)
        #expect(records.first { $0.recordID == gone.id }?.isAlive == false)
    }

    @Test("a zone reset and re-created by another device: records the zone lost are uploaded again (found by the property test)")
    func zoneRecreatedElsewhere() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "only on A"))
        try a.context.save()
        try a.sync(cloud)
        cloud.resetZone("notes")
        try b.sync(cloud)  // B re-creates the zone: A's token is now expired, not "zone not found"
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(cloud.records(in: "notes").map(\.recordID) == [note.id])
        #expect(try b.notes().map(\.title) == ["only on A"])
    }

    @Test("a cloud database file deleted and re-created is filled again, not reported up to date (found by a new user)")
    func cloudFileRecreated() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-recreated-\(UUID().uuidString)")
        let cloudFile = directory.appendingPathComponent("cloud.sqlite")
        let a = try Device("A", seed: 1)
        for i in 0..<3 { a.context.insert(SyncNote(title: "n\(i)")) }
        try a.context.save()
        let environment = ReplicaEnvironment.seeded(seed: 77, directory: directory)
        #expect(try await SyncDriver.syncUntilIdle(a.engine, with: SQLiteCloudDatabase(url: cloudFile, environment: environment)).isUpToDate)
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: cloudFile.path + suffix) }
        let recreated = try SQLiteCloudDatabase(url: cloudFile, environment: .seeded(seed: 78, directory: directory))
        // A fresh engine (an app relaunch) talks to the re-created file.
        a.engine.releaseLease()
        let relaunched = try SyncEngine(container: a.container, storeName: "notes")
        #expect(try await SyncDriver.syncUntilIdle(relaunched, with: recreated).isUpToDate)
        #expect(try recreated.records(in: "notes").count == 3)
    }

    @Test("a change token from the future (another database) is expired, not trusted")
    func futureTokenExpired() throws {
        let cloud = InMemoryCloudDatabase()
        try cloud.createZone("z")
        #expect(throws: CloudError.changeTokenExpired) {
            try cloud.fetchZoneChanges("z", since: ServerChangeToken(epoch: 1, sequence: 99), limit: 10)
        }
    }

    @Test("the same response delivered twice changes nothing")
    func duplicateResponse() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        try a.sync(cloud)
        var responses: [(UInt64, Result<CloudOperationResult, CloudError>)] = []
        b.engine.setNeedsFetch()
        while let request = try b.engine.nextRequest() {
            let response = cloud.performNow(request.operation)
            responses.append((request.id, response))
            try b.engine.handle(request.id, response)
        }
        let history = try b.context.fetchHistory()
        let rows = try b.notes()
        for (id, response) in responses { try b.engine.handle(id, response) }
        #expect(try b.context.fetchHistory() == history)
        #expect(try b.notes() == rows)
    }

    @Test("an offline device's records upload exactly once however often the push is retried")
    func uploadExactlyOnce() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        for i in 0..<3 { a.context.insert(SyncNote(title: "offline \(i)")) }
        try a.context.save()
        // The first two uploads reach the server, but their answers are lost.
        var lostAnswers = 0
        for _ in 0..<20 {
            guard let request = try a.engine.nextRequest() else {
                guard let wake = a.engine.wakeTime else { break }
                a.clock.set(milliseconds: wake)
                continue
            }
            let response = cloud.performNow(request.operation)
            if case .modifyRecords = request.operation, lostAnswers < 2 {
                lostAnswers += 1
                try a.engine.abandon(request.id)
                continue
            }
            try a.engine.handle(request.id, response)
        }
        try a.sync(cloud)
        #expect(cloud.records(in: "notes").count == 3)
        let b = try Device("B", seed: 2)
        try b.sync(cloud)
        #expect(try b.notes().count == 3)
        #expect(try a.engine.status().isUpToDate)
    }

    @Test("every delivery order of a small batch converges to identical stores")
    func everyOrderConverges() throws {
        // Three devices each make one change to a shared record and one insert; every order of syncing converges.
        let orders: [[Int]] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
        var finals: [[SyncNote]] = []
        for order in orders {
            let cloud = InMemoryCloudDatabase()
            let devices = try (0..<3).map { try Device("D\($0)", seed: UInt64($0 + 1)) }
            let shared = devices[0].context.insert(SyncNote(id: UUID(uuidString: "01900000-0000-7000-8000-000000000001")!, title: "shared"))
            try devices[0].context.save()
            try devices[0].sync(cloud)
            for device in devices { try device.sync(cloud) }
            for (i, device) in devices.enumerated() {
                var note = try #require(try device.context.model(SyncNote.self, id: shared.id))
                switch i {
                case 0: note.title = "title by 0"
                case 1: note.body = "body by 1"
                default: note.title = "title by 2"; note.rating = 2
                }
                device.clock.advance(by: Int64(i * 7))
                device.context.update(note)
                device.context.insert(SyncNote(id: UUID(uuidString: "01900000-0000-7000-8000-00000000001\(i)")!, title: "own \(i)"))
                try device.context.save()
            }
            for i in order { try devices[i].sync(cloud) }
            for i in order { try devices[i].sync(cloud) }
            let states = try devices.map { try $0.notes() }
            #expect(states[0] == states[1] && states[1] == states[2])
            finals.append(states[0])
        }
        #expect(Set(finals.map { "\($0)" }).count == 1)
        #expect(finals[0].count == 4)
    }
}
