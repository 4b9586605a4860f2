import Foundation
import Testing
@testable import Replica

/// Library bugs the simulator (`replica-sim`) found, one focused test each. The shrunk traces that found them are
/// replayed by `SimulationRegressionTests` (Simulations/regressions/).
@Suite("Bugs found by the simulator")
struct SimulatorFindingsTests {
    private static func record(_ n: UInt8) -> CloudRecord {
        let id = UUID(uuid: (1, 0, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, n))
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: Int64(n), logical: 0, replica: id))
        return CloudRecord(recordID: id, recordType: "T", causalLength: 1, created: stamp,
                           fields: ["n": CloudField(value: .integer(Int64(n)), stamp: stamp)])
    }

    @Test("after the change tokens of a zone expire, a paged re-read from the start completes (trips seed 1, liveness)")
    func pagedRereadAfterExpiry() throws {
        let db = InMemoryCloudDatabase()
        try db.createZone("z")
        _ = try db.modifyRecords((1...5).map(Self.record), in: "z")
        let before = try db.fetchZoneChanges("z", since: nil, limit: 10)
        db.expireChangeTokens(in: "z")
        #expect(throws: CloudError.changeTokenExpired) { try db.fetchZoneChanges("z", since: before.token, limit: 10) }
        // The full re-read pages through the zone with tokens issued after the expiry: they must stay valid.
        var token: ServerChangeToken?
        var seen: [UUID] = []
        for _ in 0..<10 {
            let page = try db.fetchZoneChanges("z", since: token, limit: 2)
            seen += page.records.map(\.recordID)
            token = page.token
            if !page.moreComing { break }
        }
        #expect(seen == (1...5).map { Self.record($0).recordID })
        // Records saved before the expiry keep their change tags: an upload based on them is not a conflict.
        var stored = try #require(db.records(in: "z").first)
        stored.fields["n"]?.value = .integer(42)
        guard case .saved? = try db.modifyRecords([stored], in: "z").first else {
            Issue.record("a record saved before the expiry conflicted with its own change tag")
            return
        }
    }

    // MARK: Zone resets learned of through an expired change token (Simulations/regressions/zone-reset-not-detected--*)

    /// Runs `engine` against `cloud` until it has nothing to do, skipping backoffs by moving `clock`.
    private static func drive(_ engine: SyncEngine, _ cloud: InMemoryCloudDatabase, _ clock: ManualClock) throws {
        engine.setNeedsFetch()
        for _ in 0..<1_000 {
            if let request = try engine.nextRequest() {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else {
                return
            }
        }
        Issue.record("the engine did not settle")
    }

    @Test("a device that learns of a zone reset only as an expired change token re-uploads what only it holds (zone-reset seed 5)")
    func resetSeenAsExpiredToken() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1), tablet = try Device("tablet", seed: 2)
        try tablet.sync(cloud)
        phone.context.insert(SyncNote(title: "only on the phone"))
        try phone.context.save()
        try phone.sync(cloud)
        cloud.resetZone("notes")
        // The tablet meets the missing zone first and re-creates it; the phone then only sees a token of another epoch.
        try tablet.sync(cloud)
        #expect(cloud.records(in: "notes").isEmpty)
        let status = try phone.sync(cloud)
        #expect(cloud.records(in: "notes").map { $0.fields["title"]?.value } == [.text("only on the phone")])
        #expect(status.isUpToDate)
        try tablet.sync(cloud)
        #expect(try tablet.notes().map(\.title) == ["only on the phone"])
    }

    @Test("a freshly started engine that re-creates a reset zone re-uploads the store's records (zone-reset seed 6)")
    func freshEngineRecreatesResetZone() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-findings-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            let phone = try Device("phone", seed: 1, directory: directory)
            phone.context.insert(SyncNote(title: "synced before the restart"))
            try phone.context.save()
            try phone.sync(cloud)
        }
        cloud.resetZone("notes")
        // After a restart the engine starts with createZone, which silently re-creates the reset zone.
        let restarted = try Device("phone", seed: 1, directory: directory)
        let status = try restarted.sync(cloud)
        #expect(cloud.records(in: "notes").map { $0.fields["title"]?.value } == [.text("synced before the restart")])
        #expect(status.isUpToDate)
    }

    @Test("a zone reset (re-created by another device) in the middle of a paged full re-read re-uploads every record the new zone lacks")
    func resetDuringPagedResync() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1)
        var options = SyncEngine.Options()
        options.fetchLimit = 2
        let engine = try SyncEngine(container: phone.container, storeName: "notes", options: options)
        for i in 0..<5 { phone.context.insert(SyncNote(title: "note \(i)")) }
        try phone.context.save()
        try Self.drive(engine, cloud, phone.clock)
        #expect(cloud.records(in: "notes").count == 5)
        // The tokens expire: the phone re-reads the zone from the start, a page of two records at a time.
        cloud.expireChangeTokens(in: "notes")
        engine.setNeedsFetch()
        var firstPageRead = false
        for _ in 0..<20 where !firstPageRead {
            let request = try #require(try engine.nextRequest())
            if case .fetchZoneChanges(_, nil, _) = request.operation { firstPageRead = true }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        #expect(firstPageRead)
        // After the first page the zone is reset and another device re-creates it (empty).
        cloud.resetZone("notes")
        try cloud.createZone("notes")
        try Self.drive(engine, cloud, phone.clock)
        #expect(cloud.records(in: "notes").count == 5)
        #expect(try engine.status().isUpToDate)
    }

    // MARK: Backward clock jumps (Simulations/regressions/backward-clock-jump-stalls-sync--*)

    @Test("a retry-after followed by a backward clock jump waits no longer than the retry-after (clock-jumps seed 1)")
    func backoffSurvivesBackwardClockJump() throws {
        let laptop = try Device("laptop", seed: 1)
        let request = try #require(try laptop.engine.nextRequest())
        try laptop.engine.handle(request.id, .failure(.rateLimited(retryAfterMilliseconds: 100)))
        #expect(try laptop.engine.nextRequest() == nil)
        // The device clock jumps back 30 minutes (an NTP correction).
        laptop.clock.advance(by: -1_800_000)
        let now = laptop.clock.nowMilliseconds()
        let wake = try #require(laptop.engine.wakeTime)
        #expect(wake - now <= 100)
        laptop.clock.advance(by: 100)
        #expect(try laptop.engine.nextRequest() != nil)
    }

    @Test("a backoff that has ended stays ended after a backward clock jump (clock-jumps seed 15)")
    func endedBackoffStaysEndedAfterBackwardClockJump() throws {
        let laptop = try Device("laptop", seed: 1)
        let request = try #require(try laptop.engine.nextRequest())
        try laptop.engine.handle(request.id, .failure(.rateLimited(retryAfterMilliseconds: 100)))
        // The wait ends and the engine sees that it has (asking for its next request)...
        laptop.clock.advance(by: 10_000)
        let retry = try #require(try laptop.engine.nextRequest())
        #expect(laptop.engine.wakeTime == nil)
        // ...then the clock goes back 27 minutes: the old deadline lies ahead again, but the wait is over.
        laptop.clock.advance(by: -1_652_829)
        #expect(laptop.engine.wakeTime == nil)
        try laptop.engine.handle(retry.id, .failure(.networkUnavailable))
        let wake = try #require(laptop.engine.wakeTime) - laptop.clock.nowMilliseconds()
        #expect(wake <= SyncEngine.Options().maxBackoffMilliseconds * 2)
    }

    @Test("a backoff that is over stays over when the clock then jumps back (clock-jumps seed 140)")
    func elapsedBackoffStaysOverAfterBackwardJump() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1)
        let request = try #require(try phone.engine.nextRequest())
        try phone.engine.handle(request.id, .failure(.rateLimited(retryAfterMilliseconds: 100)))
        phone.clock.advance(by: 100)
        let retry = try #require(try phone.engine.nextRequest())
        try phone.engine.handle(retry.id, cloud.performNow(retry.operation))
        // The wait ended and the retry succeeded; then the clock jumps back 30 minutes.
        phone.clock.advance(by: -1_800_000)
        #expect(phone.engine.wakeTime == nil)
        #expect(try phone.engine.nextRequest() != nil)
    }

    @Test("a backoff deadline never lies further ahead than the delay asked for, whatever the clock does")
    func exponentialBackoffSurvivesBackwardClockJump() throws {
        let laptop = try Device("laptop", seed: 1)
        let request = try #require(try laptop.engine.nextRequest())
        try laptop.engine.handle(request.id, .failure(.networkUnavailable))
        let first = try #require(laptop.engine.wakeTime) - laptop.clock.nowMilliseconds()
        laptop.clock.advance(by: -600_000)
        let after = try #require(laptop.engine.wakeTime) - laptop.clock.nowMilliseconds()
        #expect(after <= first)
        // Going forward again does not make the engine wait longer either.
        laptop.clock.advance(by: 600_000)
        #expect((laptop.engine.wakeTime ?? laptop.clock.nowMilliseconds()) - laptop.clock.nowMilliseconds() <= first)
    }

    @Test("an upload lease taken before a backward clock jump holds another engine back at most one lease duration")
    func leaseSurvivesBackwardClockJump() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 1)
        // The app's engine takes the lease, then its process dies without releasing it.
        let app = phone.engine
        let first = try #require(try app.nextRequest())
        try app.handle(first.id, cloud.performNow(first.operation))
        let options = SyncEngine.Options()
        let widget = try SyncEngine(container: phone.container, storeName: "notes", options: options)
        #expect(try widget.nextRequest() == nil)
        phone.clock.advance(by: -1_800_000)
        var waited: Int64 = 0
        var request = try widget.nextRequest()
        while request == nil, let wake = widget.wakeTime, waited <= options.leaseDurationMilliseconds {
            waited += wake - phone.clock.nowMilliseconds()
            phone.clock.set(milliseconds: wake)
            request = try widget.nextRequest()
        }
        #expect(request != nil)
        #expect(waited <= options.leaseDurationMilliseconds)
    }

    // MARK: Duplicates absorbed with their own clocks (Simulations/regressions/dedup-absorb-restamped--*)

    @Test("a winner absorbs an edit of its duplicate with the edit's own clock, not the clock of the device that merged it (people-unique seed 242)")
    func absorbedEditKeepsItsClock() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let laptop = try Device("laptop", seed: 1, models: models), phone = try Device("phone", seed: 2, models: models)
        // The laptop creates the person first (the winner); the phone creates the same key a little later.
        let winner = laptop.context.insert(DPerson(email: "ada@example.com", name: "laptop"))
        try laptop.context.save()
        phone.clock.advance(by: 1_000)
        var loser = phone.context.insert(DPerson(email: "ada@example.com", name: "phone"))
        try phone.context.save()
        try phone.sync(cloud)
        try laptop.sync(cloud)
        // The laptop resolved the duplicate and uploaded the loser's tombstone; the phone has not seen it yet and
        // edits its copy of the loser.
        phone.clock.advance(by: 1_000)
        loser.name = "phone, edited"
        phone.context.update(loser)
        try phone.context.save()
        let edit = try #require(try phone.engine.replicationState(of: loser.id)?.stamps["name"])
        // Much later the phone merges the tombstone: the edit travels into the winner with the clock it was made at.
        phone.clock.advance(by: 60_000)
        try phone.sync(cloud)
        let absorbed = try #require(try phone.engine.replicationState(of: winner.id)?.stamps["name"])
        #expect(absorbed.clock == edit.clock)
        #expect(try phone.context.model(DPerson.self, id: winner.id)?.name == "phone, edited")
        // The laptop edits the winner after the phone's edit (by their clocks) without having seen the phone's
        // merge: that later edit wins everywhere.
        laptop.clock.advance(by: 3_000)
        var later = try #require(try laptop.context.model(DPerson.self, id: winner.id))
        later.name = "laptop, edited later"
        laptop.context.update(later)
        try laptop.context.save()
        try laptop.sync(cloud)
        try phone.sync(cloud)
        #expect(try laptop.context.model(DPerson.self, id: winner.id)?.name == "laptop, edited later")
        #expect(try phone.context.model(DPerson.self, id: winner.id)?.name == "laptop, edited later")
    }

    @Test("a duplicate re-inserted elsewhere and then deleted is a plain delete: it does not redirect to its old winner (people-unique seeds 210, 298)")
    func reinsertedLoserForgetsItsRedirect() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let laptop = try Device("laptop", seed: 1, models: models), phone = try Device("phone", seed: 2, models: models)
        let winner = laptop.context.insert(DPerson(email: "ada@example.com", name: "winner"))
        try laptop.context.save()
        phone.clock.advance(by: 1_000)
        let loser = phone.context.insert(DPerson(email: "ada@example.com", name: "loser"))
        try phone.context.save()
        try phone.sync(cloud)
        try laptop.sync(cloud)
        try phone.sync(cloud)
        #expect(try phone.context.model(DPerson.self, id: loser.id) == nil)
        // The phone re-inserts the loser's ID with another key: a new incarnation, no longer a duplicate.
        phone.clock.advance(by: 1_000)
        phone.context.insert(DPerson(id: loser.id, email: "grace@example.com", name: "reborn"))
        try phone.context.save()
        try phone.sync(cloud)
        try laptop.sync(cloud)
        #expect(try laptop.context.model(DPerson.self, id: loser.id)?.email == "grace@example.com")
        // The laptop deletes it: an ordinary delete, whose fields must not flow into the old winner.
        laptop.clock.advance(by: 1_000)
        laptop.context.delete(try #require(try laptop.context.model(DPerson.self, id: loser.id)))
        try laptop.context.save()
        try laptop.sync(cloud)
        try phone.sync(cloud)
        try laptop.sync(cloud)
        #expect(cloud.records(in: "notes").first { $0.recordID == loser.id }?.redirect == nil)
        for device in [laptop, phone] {
            let person = try #require(try device.context.model(DPerson.self, id: winner.id))
            #expect(person.email == "ada@example.com")
            #expect(person.name != "reborn")
        }
    }

    // MARK: Ended incarnations of a duplicate (Simulations/regressions/dedup-reinserted-duplicate-edit-lost--*)

    /// Three devices: the laptop creates the winner, the phone a duplicate of its key a little later, and the tablet
    /// receives the duplicate (alive) before anyone resolves it. Returns the winner's and the loser's IDs.
    private static func duplicateSeenByTablet(_ cloud: InMemoryCloudDatabase, laptop: Device, phone: Device, tablet: Device) throws -> (UUID, UUID) {
        let winner = laptop.context.insert(DPerson(email: "ada@example.com", name: "winner"))
        try laptop.context.save()
        phone.clock.advance(by: 1_000)
        let loser = phone.context.insert(DPerson(email: "ada@example.com", name: "loser"))
        try phone.context.save()
        try phone.sync(cloud)
        try tablet.sync(cloud)
        #expect(try tablet.context.model(DPerson.self, id: loser.id)?.name == "loser")
        // The laptop resolves the duplicate: the loser becomes a tombstone that redirects to the winner.
        try laptop.sync(cloud)
        #expect(cloud.records(in: "notes").first { $0.recordID == loser.id }?.redirect == winner.id)
        return (winner.id, loser.id)
    }

    @Test("an offline edit of a duplicate reaches the winner even when the duplicate was re-inserted before the edit arrived (people-unique seed 210)")
    func editOfReinsertedDuplicateReachesWinner() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let laptop = try Device("laptop", seed: 1, models: models), phone = try Device("phone", seed: 2, models: models)
        let tablet = try Device("tablet", seed: 3, models: models)
        let (winner, loser) = try Self.duplicateSeenByTablet(cloud, laptop: laptop, phone: phone, tablet: tablet)
        // The laptop re-inserts the loser's ID with another key: a new incarnation (3), no longer a duplicate.
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        #expect(cloud.records(in: "notes").first { $0.recordID == loser }?.endedRedirects == [EndedRedirect(incarnation: 1, winner: winner)])
        // The tablet, offline all along, edits the duplicate it still holds (incarnation 1) after everything else.
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        // It then learns of the re-insert (incarnation 3) only: its edit of incarnation 1 still belongs to the winner.
        for _ in 0..<2 { for device in [tablet, phone, laptop] { try device.sync(cloud) } }
        for device in [laptop, phone, tablet] {
            #expect(try device.context.model(DPerson.self, id: winner)?.name == "tablet edit", "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: winner)?.email == "ada@example.com", "\(device.name)")
            let reborn = try #require(try device.context.model(DPerson.self, id: loser), "\(device.name)")
            #expect(reborn.email == "grace@example.com" && reborn.name == "reborn", "\(device.name)")
        }
    }

    @Test("an edit of a duplicate reaches the winner when its device learns of a concurrent plain delete before the resolution (people-unique seed 298)")
    func editReachesWinnerThroughConcurrentPlainDelete() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let laptop = try Device("laptop", seed: 1, models: models), phone = try Device("phone", seed: 2, models: models)
        let tablet = try Device("tablet", seed: 3, models: models)
        let (winner, loser) = try Self.duplicateSeenByTablet(cloud, laptop: laptop, phone: phone, tablet: tablet)
        // The tablet edits the duplicate after everything else (it has not seen the resolution).
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        // Concurrently the phone, which has not seen the resolution either, deletes the duplicate: a plain tombstone
        // of the same causal length (2) as the laptop's redirecting one. The tablet learns of the plain delete first.
        let redirecting = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        let plain = CloudRecord(recordID: loser, recordType: "Person", causalLength: 2, created: redirecting.created, fields: [:])
        try phone.context.delete(#require(try phone.context.model(DPerson.self, id: loser)))
        try phone.context.save()
        #expect(try tablet.deliver([plain], cloud: cloud))
        #expect(try tablet.context.model(DPerson.self, id: loser) == nil)
        // Both tombstones of incarnation 1 join into the redirecting one, which claims every write of that incarnation.
        for _ in 0..<2 { for device in [tablet, phone, laptop] { try device.sync(cloud) } }
        #expect(cloud.records(in: "notes").first { $0.recordID == loser }?.redirect == winner)
        for device in [laptop, phone, tablet] {
            #expect(try device.context.model(DPerson.self, id: winner)?.name == "tablet edit", "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: loser) == nil, "\(device.name)")
        }
    }

    @Test("a live version of a duplicate and its redirecting tombstone give the winner the same writes in either arrival order")
    func liveVersionAndTombstoneInEitherOrder() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let laptop = try Device("laptop", seed: 1, models: models), phone = try Device("phone", seed: 2, models: models)
        let tablet = try Device("tablet", seed: 3, models: models)
        let (winner, loser) = try Self.duplicateSeenByTablet(cloud, laptop: laptop, phone: phone, tablet: tablet)
        let tombstone = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        let winnerRecord = try #require(cloud.records(in: "notes").first { $0.recordID == winner })
        // The tablet edits its live copy after the resolution (by clock); its upload would be the live version.
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        let live = try #require(try tablet.nextUpload(cloud).flatMap { request -> CloudRecord? in
            guard case let .modifyRecords(records, _) = request.operation else { return nil }
            return records.first { $0.recordID == loser }
        })
        #expect(live.isAlive && live.fields["name"]?.value == .text("tablet edit"))
        // Two fresh devices receive the winner, the tombstone and the live version, in the two orders.
        var names: [String] = []
        for (seed, order) in [(UInt64(4), [winnerRecord, tombstone, live]), (UInt64(5), [winnerRecord, live, tombstone])] {
            let fresh = try Device("fresh\(seed)", seed: seed, models: models)
            for record in order { #expect(try fresh.deliver([record], cloud: InMemoryCloudDatabase())) }
            names.append(try #require(try fresh.context.model(DPerson.self, id: winner)).name)
            #expect(try fresh.context.model(DPerson.self, id: loser) == nil)
        }
        #expect(names == ["tablet edit", "tablet edit"])
    }
}
