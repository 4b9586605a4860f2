import CSQLite
import Foundation
import Testing
@testable import Replica

/// Adversarial tests of what changed on 2026-11-29: ended redirects (R15), connection reuse of in-memory stores,
/// SQLiteCloudDatabase error mapping and after-token history reads.
@Suite("Adversarial session 3")
struct AdversarialSession3Tests {
    private static let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]

    /// Every live person of a device as (id, email, name, nickname), sorted by ID.
    private static func people(_ device: Device) throws -> [String] {
        try ModelContext(device.container).fetch(DPerson.self)
            .sorted { $0.id.uuidString < $1.id.uuidString }
            .map { "\($0.id) \($0.email) \($0.name) \($0.nickname ?? "-")" }
    }

    private static func settle(_ devices: [Device], _ cloud: InMemoryCloudDatabase, rounds: Int = 3) throws {
        for _ in 0..<rounds { for device in devices { try device.sync(cloud) } }
    }

    /// The laptop creates the winner, the phone a duplicate a little later; the tablet receives the duplicate alive
    /// before the laptop resolves it.
    private static func duplicate(_ cloud: InMemoryCloudDatabase, laptop: Device, phone: Device, tablet: Device) throws -> (UUID, UUID) {
        let winner = laptop.context.insert(DPerson(email: "ada@example.com", name: "winner"))
        try laptop.context.save()
        phone.clock.advance(by: 1_000)
        let loser = phone.context.insert(DPerson(email: "ada@example.com", name: "loser"))
        try phone.context.save()
        try phone.sync(cloud)
        try tablet.sync(cloud)
        try laptop.sync(cloud)
        #expect(cloud.records(in: "notes").first { $0.recordID == loser.id }?.redirect == winner.id)
        return (winner.id, loser.id)
    }

    // MARK: Ended redirects

    @Test("a version of a re-inserted duplicate saved by an older device without endedRedirects: an offline edit of the ended incarnation still reaches the winner")
    func olderDeviceDropsEndedRedirects() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        // An older app version re-saves the reborn record: it does not know `endedRedirects` and drops them.
        var stripped = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        #expect(!stripped.endedRedirects.isEmpty)
        stripped.endedRedirects = []
        _ = try cloud.modifyRecords([stripped], in: "notes")
        // The tablet, offline, edits the incarnation-1 copy it holds, then syncs before anyone repairs the record.
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        try tablet.sync(cloud)
        try Self.settle([phone, laptop, tablet], cloud)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try device.context.model(DPerson.self, id: winner)?.name == "tablet edit", "\(device.name)")
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }

    @Test("the same fetch answer delivered twice (tombstone, re-insert, winner) changes nothing the second time and converges")
    func duplicatedAnswers() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        let tombstone = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        let reborn = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        let winnerRecord = try #require(cloud.records(in: "notes").first { $0.recordID == winner })
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        copy.nickname = "nick"
        tablet.context.update(copy)
        try tablet.context.save()
        // Out of order and repeated: the re-insert, then the tombstone (older), then both again.
        for batch in [[reborn], [tombstone], [reborn, tombstone], [winnerRecord, tombstone, reborn]] {
            #expect(try tablet.deliver(batch, cloud: cloud))
        }
        try Self.settle([tablet, phone, laptop], cloud)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            let person = try device.context.model(DPerson.self, id: winner)
            #expect(person?.name == "tablet edit" && person?.nickname == "nick", "\(device.name)")
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }

    @Test("a re-inserted duplicate that collides again and is resolved again: both ended incarnations' edits reach the winner, newest write wins")
    func reinsertCollidesAgain() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        // A fourth device that knows only the loser's tombstone (not the winner) re-inserts the loser with the SAME
        // key: incarnation 3 collides again.
        let desk = try Device("desk", seed: 4, models: Self.models)
        let tombstone = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        #expect(try desk.deliver([tombstone], cloud: InMemoryCloudDatabase()))
        desk.clock.advance(by: 3_000)
        desk.context.insert(DPerson(id: loser, email: "ada@example.com", name: "again", nickname: "desk"))
        try desk.context.save()
        // The tablet (offline) edits incarnation 1 later than everything.
        tablet.clock.advance(by: 20_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.nickname = "tablet"
        tablet.context.update(copy)
        try tablet.context.save()
        try Self.settle([desk, phone, laptop, tablet], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet, desk] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: loser) == nil, "\(device.name)")
            let person = try device.context.model(DPerson.self, id: winner)
            #expect(person?.nickname == "tablet", "\(device.name): the newest write (tablet, incarnation 1) wins")
            #expect(person?.name == "again", "\(device.name): the desk's write of incarnation 3 is newer than the winner's")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }

    @Test("a winner deleted and re-created elsewhere while a loser's ended incarnation holds an edit: all devices agree")
    func winnerDeletedWhileEndedEditsWait() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        // The phone deletes the winner.
        try phone.sync(cloud)
        phone.clock.advance(by: 3_000)
        try phone.context.delete(#require(try phone.context.model(DPerson.self, id: winner)))
        try phone.context.save()
        try phone.sync(cloud)
        // The tablet edits its stale incarnation-1 copy of the loser, then syncs.
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        try Self.settle([tablet, phone, laptop], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
        #expect(try laptop.context.model(DPerson.self, id: loser)?.name == "reborn")
    }

    @Test("random schedules of duplicate keys, re-inserts, deletes and offline edits on three devices converge")
    func randomSchedulesConverge() throws {
        for seed in UInt64(1)...UInt64(ProcessInfo.processInfo.environment["ADV3_SEEDS"].flatMap(Int.init) ?? 12) {
            var rng = SeededGenerator(seed: seed)
            let cloud = InMemoryCloudDatabase()
            let devices = try (0..<3).map { try Device("d\($0)", seed: seed * 10 + UInt64($0), models: Self.models) }
            var ids: [UUID] = []
            let emails = ["a@x", "b@x", "c@x"]
            for step in 0..<40 {
                let device = devices[Int(rng.next() % 3)]
                device.clock.advance(by: Int64(rng.next() % 2_000) + 1)
                let live = try device.context.fetch(DPerson.self)
                switch rng.next() % 6 {
                case 0:
                    let person = device.context.insert(DPerson(email: emails[Int(rng.next() % 3)], name: "n\(step)"))
                    ids.append(person.id)
                case 1 where !ids.isEmpty:
                    let id = ids[Int(rng.next() % UInt64(ids.count))]
                    if try device.context.model(DPerson.self, id: id) == nil {
                        device.context.insert(DPerson(id: id, email: emails[Int(rng.next() % 3)], name: "re\(step)"))
                    }
                case 2 where !live.isEmpty:
                    device.context.delete(live[Int(rng.next() % UInt64(live.count))])
                case 3, 4:
                    if !live.isEmpty {
                        var person = live[Int(rng.next() % UInt64(live.count))]
                        person.name = "e\(step)"
                        person.nickname = "\(device.name)-\(step)"
                        device.context.update(person)
                    }
                default:
                    try device.sync(cloud)
                }
                do { try device.context.save() } catch { device.context.rollback() }
            }
            try Self.settle(devices, cloud, rounds: 4)
            let reference = try Self.people(devices[0])
            for device in devices {
                #expect(try Self.people(device) == reference, "seed \(seed) \(device.name)")
                #expect(try device.engine.status().pendingRecords == 0, "seed \(seed) \(device.name)")
            }
            let emailsLive = try ModelContext(devices[0].container).fetch(DPerson.self).map(\.email)
            #expect(Set(emailsLive).count == emailsLive.count, "seed \(seed): unique keys stay unique")
        }
    }

    @Test("every delivery order of the winner, the redirecting tombstone, a live edit of the ended incarnation and the re-insert gives fresh devices the same state")
    func everyOrderOfEndedIncarnationRecords() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        let tombstone = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        let reborn = try #require(cloud.records(in: "notes").first { $0.recordID == loser })
        let winnerRecord = try #require(cloud.records(in: "notes").first { $0.recordID == winner })
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        let live = try #require(try tablet.nextUpload(cloud).flatMap { request -> CloudRecord? in
            guard case let .modifyRecords(records, _) = request.operation else { return nil }
            return records.first { $0.recordID == loser }
        })
        let records = [winnerRecord, tombstone, live, reborn]
        func permutations(_ items: [Int]) -> [[Int]] {
            items.count <= 1 ? [items] : items.indices.flatMap { i in
                permutations(items.enumerated().filter { $0.offset != i }.map(\.element)).map { [items[i]] + $0 }
            }
        }
        var outcomes: [String: [[Int]]] = [:]
        for (n, order) in permutations([0, 1, 2, 3]).enumerated() {
            let fresh = try Device("fresh\(n)", seed: UInt64(100 + n), models: Self.models)
            for index in order { #expect(try fresh.deliver([records[index]], cloud: InMemoryCloudDatabase())) }
            let state = try Self.people(fresh).joined(separator: " | ")
            outcomes[state, default: []].append(order)
        }
        #expect(outcomes.count == 1, "states by delivery order (0 winner, 1 tombstone, 2 live edit, 3 re-insert): \(outcomes)")
        #expect(outcomes.keys.allSatisfy { $0.contains("tablet edit") && $0.contains("reborn") })
    }

    @Test("a winner that itself loses to an older duplicate arriving late passes an ended incarnation's edit on to the final winner")
    func chainedWinners() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        // An offline device creates the oldest record with the key.
        let early = try Device("early", seed: 4, models: Self.models)
        early.clock.advance(by: -5_000)
        let oldest = early.context.insert(DPerson(email: "ada@example.com", name: "oldest"))
        try early.context.save()
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.nickname = "tablet"
        tablet.context.update(copy)
        try tablet.context.save()
        early.clock.advance(by: 6_000)
        try Self.settle([early, tablet, phone, laptop], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet, early] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: winner) == nil, "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: oldest.id)?.nickname == "tablet", "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: loser)?.name == "reborn", "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }

    @Test("a winner deleted and re-inserted (same ID) while an ended incarnation's edit travels: every device agrees")
    func winnerReinsertedWhileEndedEditTravels() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "reborn"))
        try laptop.context.save()
        try laptop.sync(cloud)
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.nickname = "tablet"
        tablet.context.update(copy)
        try tablet.context.save()
        // The phone deletes the winner and re-inserts its ID (after the tablet's edit, by clock).
        try phone.sync(cloud)
        phone.clock.advance(by: 15_000)
        try phone.context.delete(#require(try phone.context.model(DPerson.self, id: winner)))
        try phone.context.save()
        phone.context.insert(DPerson(id: winner, email: "ada@example.com", name: "recreated"))
        try phone.context.save()
        // The laptop syncs the tablet's edit first on one path, the phone's re-insert first on the other.
        try tablet.sync(cloud)
        try phone.sync(cloud)
        try Self.settle([laptop, tablet, phone], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
        let fresh = try Device("fresh", seed: 9, models: Self.models)
        try fresh.sync(cloud)
        #expect(try Self.people(fresh) == reference)
    }

    @Test("a duplicate re-inserted, deleted plainly and re-inserted again keeps its ended redirect; an offline edit of incarnation 1 arriving last reaches the winner")
    func reinsertDeleteReinsert() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        for (step, name) in ["reborn", nil, "reborn again"].enumerated() {
            laptop.clock.advance(by: 1_000)
            if let name {
                laptop.context.insert(DPerson(id: loser, email: "x\(step)@example.com", name: name))
            } else {
                try laptop.context.delete(#require(try laptop.context.model(DPerson.self, id: loser)))
            }
            try laptop.context.save()
            try laptop.sync(cloud)
            try phone.sync(cloud)
        }
        #expect(cloud.records(in: "notes").first { $0.recordID == loser }?.endedRedirects == [EndedRedirect(incarnation: 1, winner: winner)])
        tablet.clock.advance(by: 20_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.name = "tablet edit"
        tablet.context.update(copy)
        try tablet.context.save()
        try Self.settle([tablet, phone, laptop], cloud, rounds: 3)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: winner)?.name == "tablet edit", "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: loser)?.name == "reborn again", "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }

    @Test("two devices re-insert the same resolved duplicate concurrently while a third edits the ended incarnation: convergence, newest writes kept")
    func concurrentReinserts() throws {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: Self.models), phone = try Device("phone", seed: 2, models: Self.models)
        let tablet = try Device("tablet", seed: 3, models: Self.models)
        let (winner, loser) = try Self.duplicate(cloud, laptop: laptop, phone: phone, tablet: tablet)
        try phone.sync(cloud)
        laptop.clock.advance(by: 2_000)
        laptop.context.insert(DPerson(id: loser, email: "grace@example.com", name: "laptop reborn"))
        try laptop.context.save()
        phone.clock.advance(by: 3_000)
        phone.context.insert(DPerson(id: loser, email: "grace@example.com", name: "phone reborn", nickname: "p"))
        try phone.context.save()
        tablet.clock.advance(by: 10_000)
        var copy = try #require(try tablet.context.model(DPerson.self, id: loser))
        copy.nickname = "tablet"
        tablet.context.update(copy)
        try tablet.context.save()
        // Interleaved: each device uploads before having seen the others' writes.
        for device in [laptop, phone, tablet] { _ = try device.nextUpload(cloud).map { try device.engine.handle($0.id, cloud.performNow($0.operation)) } }
        try Self.settle([tablet, laptop, phone], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: winner)?.nickname == "tablet", "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: loser)?.name == "phone reborn", "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }

    // MARK: Connection reuse

    @Test("an in-memory store's only connection refused for reuse (a statement still held) does not take the database with it")
    func refusedReuseKeepsTheDatabase() throws {
        let environment = ReplicaEnvironment.seeded(seed: 3, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-adv3-\(UUID().uuidString)"))
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        var held: Statement?
        do {
            // The first context takes the connection that created the store (the only one).
            let context = ModelContext(container)
            context.insert(Trip(name: "kept"))
            try context.save()
            held = try Statement(connection: context.connection(for: 0), sql: "SELECT 1")
        }
        // The context is gone; its connection was not taken back (a statement is still held) and closes once the
        // statement goes.
        held = nil
        _ = held
        #expect(try ModelContext(container).fetch(Trip.self).map(\.name) == ["kept"])
    }

    @Test("contexts on many threads at once share an in-memory store's connections without losing or leaking writes")
    func manyThreadsManyContexts() async throws {
        let environment = ReplicaEnvironment.seeded(seed: 4, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-adv3-\(UUID().uuidString)"))
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<8 {
                group.addTask {
                    for i in 0..<25 {
                        let context = ModelContext(container)
                        context.author = "w\(worker)"
                        context.insert(Trip(name: "w\(worker)-\(i)"))
                        if i % 5 == 0 {
                            // Leave a transaction open and an unfinished statement behind.
                            let db = try context.connection(for: 0)
                            try db.begin(.deferred)
                            let statement = try db.cachedStatement("SELECT name FROM \"Trip\"")
                            _ = try statement.step()
                            continue
                        }
                        try context.save()
                    }
                }
            }
            try await group.waitForAll()
        }
        let context = ModelContext(container)
        #expect(try context.fetchCount(FetchDescriptor<Trip>()) == 8 * 20)
        let history = try context.fetchHistory()
        #expect(history.count == 8 * 20)
        for transaction in history {
            let names = try transaction.changes.compactMap { change -> String? in
                guard case let .insert(id) = change, id.entityName == "Trip" else { return nil }
                return try context.model(Trip.self, id: id.id)?.name
            }
            #expect(names.allSatisfy { $0.hasPrefix(transaction.author ?? "?") }, "author of another owner leaked: \(transaction.author ?? "nil") \(names)")
        }
    }

    @Test("an in-memory store's sync engine dropped with a request outstanding: the next engine gets its connection and uploads everything once")
    func engineDroppedMidRequest() throws {
        let cloud = InMemoryCloudDatabase()
        var environment = ReplicaEnvironment.seeded(seed: 61, directory: adversarialDirectory())
        environment.canaries = []
        let clock = environment.clock as! ManualClock
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.test"))], environment: environment)
        let context = ModelContext(container)
        for i in 0..<5 { context.insert(SyncNote(title: "n\(i)")) }
        try context.save()
        for round in 0..<3 {
            let engine = try SyncEngine(container: container, storeName: "notes")
            engine.setNeedsFetch()
            // Perform a few requests, then leave one outstanding (its answer never handled) and drop the engine.
            for _ in 0..<(round + 1) {
                guard let request = try engine.nextRequest() else { break }
                try engine.handle(request.id, cloud.performNow(request.operation))
            }
            if let request = try engine.nextRequest() { _ = cloud.performNow(request.operation) }
            context.insert(SyncNote(title: "r\(round)"))
            try context.save()
        }
        let engine = try SyncEngine(container: container, storeName: "notes")
        engine.setNeedsFetch()
        for _ in 0..<200 {
            if let request = try engine.nextRequest() {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else { break }
        }
        #expect(try engine.status().pendingRecords == 0)
        #expect(cloud.records(in: "notes").count == 8)
        #expect(Set(cloud.records(in: "notes").compactMap { $0.fields["title"]?.value }).count == 8)
    }

    // MARK: SQLiteCloudDatabase failures

    @Test("a cloud file truncated or overwritten while open: transient errors without record values, local data and queue kept, recovery by a new file")
    func damagedCloudFile() async throws {
        for damage in ["truncate", "garbage", "delete", "delete-main", "delete-all"] {
            let directory = adversarialDirectory()
            defer { try? FileManager.default.removeItem(at: directory) }
            let cloudURL = directory.appendingPathComponent("cloud.sqlite")
            let cloud = try SQLiteCloudDatabase(url: cloudURL)
            let device = try Device("a", seed: 51, directory: directory.appendingPathComponent("a"))
            for i in 0..<40 { device.context.insert(SyncNote(title: "n\(i)", body: "secret-body-\(i)", rating: i)) }
            try device.context.save()
            _ = try await drive(device, cloud)
            #expect(try device.engine.status().pendingRecords == 0)
            let other = try Connection(location: .file(cloudURL))
            // Deleting files leaves the write-ahead log as it is (the open connections keep using it).
            if !damage.hasPrefix("delete-") { try other.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
            let handle = try FileHandle(forWritingTo: cloudURL)
            switch damage {
            case "truncate": try handle.truncate(atOffset: 4096)
            case "garbage":
                try handle.seek(toOffset: 4096)
                handle.write(Data(repeating: 0xA5, count: 16_384))
            case "delete-all":
                for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: cloudURL.path + suffix) }
            default: try FileManager.default.removeItem(at: cloudURL)
            }
            try handle.close()
            var note = try #require(try device.context.fetch(SyncNote.self).first)
            note.body = "secret-edit"
            device.context.update(note)
            try device.context.save()
            _ = try await drive(device, cloud, maxRequests: 12)
            let status = try device.engine.status()
            #expect(try device.context.fetchCount(FetchDescriptor<SyncNote>()) == 40, "\(damage)")
            #expect(try device.context.model(SyncNote.self, id: note.id)?.body == "secret-edit", "\(damage)")
            if let error = status.lastError {
                #expect(!error.description.contains("secret"), "\(damage): \(error)")
                #expect(error.isTransient, "\(damage): \(error)")
                #expect(status.pendingRecords >= 1, "\(damage)")
            }
            if damage.hasPrefix("delete") {
                // The file was deleted while open: the engine's writes must reach the file now at that path (which
                // other processes see), not the unlinked one.
                #expect(status.pendingRecords == 0 && status.lastError == nil)
                let seen = try SQLiteCloudDatabase(url: cloudURL).records(in: "notes")
                #expect(seen.count == 40, "\(damage): records in the file at the cloud's path after it was deleted while open")
                #expect(seen.contains { $0.fields["body"]?.value == .text("secret-edit") })
            }
            // A new, empty cloud file at another path: everything reaches it again (zone not found → re-upload).
            let fresh = try SQLiteCloudDatabase(url: directory.appendingPathComponent("cloud2.sqlite"))
            _ = try await drive(device, fresh)
            let uploaded = try fresh.records(in: "notes")
            let lastError = try device.engine.status().lastError
            #expect(uploaded.count == 40, "\(damage): \(String(describing: lastError))")
            #expect(uploaded.contains { $0.fields["body"]?.value == .text("secret-edit") }, "\(damage)")
        }
    }

    @Test("a cloud file deleted while open, with no other connection to it: writes go to the file now at its path and a separate connection sees them all")
    func deletedCloudFileKeepsNewLog() async throws {
        let directory = adversarialDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let cloudURL = directory.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: cloudURL)
        let device = try Device("a", seed: 52, directory: directory.appendingPathComponent("a"))
        for i in 0..<10 { device.context.insert(SyncNote(title: "n\(i)", rating: i)) }
        try device.context.save()
        _ = try await drive(device, cloud)
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: cloudURL.path + suffix) }
        var note = try #require(try device.context.fetch(SyncNote.self).first)
        note.rating = 99
        device.context.update(note)
        try device.context.save()
        _ = try await drive(device, cloud, maxRequests: 30)
        #expect(try device.engine.status().pendingRecords == 0)
        // A separate connection to the path finds every record, with the edit. (The cross-process hazard of the stale
        // connection unlinking the new file's `-wal` by name on close is prevented with SQLITE_FCNTL_PERSIST_WAL; an
        // in-process connection shares SQLite's per-inode state and cannot show it.)
        let seen = try SQLiteCloudDatabase(url: cloudURL).records(in: "notes")
        #expect(seen.count == 10)
        #expect(seen.contains { $0.fields["rating"]?.value == .integer(99) })
    }

    // MARK: History

    @Test("one save mixing inserts, updates, plain deletes and deletes with preserved values records every change once, tombstones on the right records")
    func mixedSaveHistory() throws {
        let environment = ReplicaEnvironment.seeded(seed: 7, directory: adversarialDirectory())
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        let context = ModelContext(container)
        var trips: [Trip] = [], items: [Item] = []
        for i in 0..<6 { trips.append(context.insert(Trip(name: "t\(i)"))) }
        for i in 0..<6 { items.append(context.insert(Item(title: "i\(i)"))) }
        try context.save()
        let before = try #require(try context.fetchHistory().last).token
        // Interleave: delete item, delete trip (preserved name), update trip, delete item, insert, delete trip...
        context.delete(items[0]); context.delete(trips[0])
        var t = trips[1]; t.rating = 5; context.update(t)
        context.delete(items[1]); context.insert(Item(title: "new")); context.delete(trips[2])
        var u = items[2]; u.title = "changed"; context.update(u)
        context.delete(trips[3]); context.delete(items[3])
        try context.save()
        let transactions = try context.fetchHistory(HistoryDescriptor(after: before))
        #expect(transactions.count == 1)
        let changes = try #require(transactions.first).changes
        var deletes: [UUID: HistoryTombstone] = [:], inserts = 0, updates = 0
        for change in changes {
            switch change {
            case let .delete(id, tombstone): deletes[id.id] = tombstone
            case .insert: inserts += 1
            case .update: updates += 1
            }
        }
        #expect(inserts == 1 && updates == 2 && deletes.count == 6, "\(changes)")
        for trip in [trips[0], trips[2], trips[3]] { #expect(deletes[trip.id]?["name"] == .text(trip.name)) }
        for item in [items[0], items[1], items[3]] { #expect(deletes[item.id]?.values.isEmpty == true) }
    }

    @Test("after-token reads match a brute-force filter for every combination of token, dates, author, entity, sort and limit")
    func historyBruteForce() throws {
        let environment = ReplicaEnvironment.seeded(seed: 5, directory: FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-adv3-\(UUID().uuidString)"))
        let clock = environment.clock as! ManualClock
        let container = try ModelContainer(for: Schema([Trip.self, Item.self]), configurations: [
            ModelConfiguration("main", isStoredInMemoryOnly: true)], environment: environment)
        let context = ModelContext(container)
        var rng = SeededGenerator(seed: 9)
        var trips: [Trip] = []
        for i in 0..<80 {
            // The clock jumps back now and then: timestamps are not in token order.
            clock.advance(by: Int64(rng.next() % 50) - (i % 7 == 0 ? 120 : 0))
            context.author = ["a", "b", nil][Int(rng.next() % 3)]
            switch rng.next() % 3 {
            case 0: trips.append(context.insert(Trip(name: "t\(i)")))
            case 1 where !trips.isEmpty: context.insert(Item(title: "i\(i)", trip: Reference(trips[Int(rng.next() % UInt64(trips.count))].id)))
            default:
                if !trips.isEmpty {
                    var trip = trips[Int(rng.next() % UInt64(trips.count))]
                    trip.rating = i
                    context.update(trip)
                } else {
                    trips.append(context.insert(Trip(name: "t\(i)")))
                }
            }
            try context.save()
        }
        let all = try context.fetchHistory()
        #expect(all.count == 80)
        let times = all.map(\.timestamp).sorted()
        let dates: [Date?] = [nil, times[10], times[40], times[40].addingTimeInterval(0.0005), times[79]]
        var checked = 0
        for tokenIndex in [nil, 0, 20, 50, 79] as [Int?] {
            for from in dates { for to in dates { for authors in [nil, ["a"], ["b", "c"]] as [[String]?] {
                for entities in [nil, ["Item"], ["Trip"]] as [[String]?] {
                    for sort in [HistoryDescriptor.SortKey.token, .timestamp] { for reverse in [false, true] {
                        for limit in [nil, 0, 3] as [Int?] {
                            let token = tokenIndex.map { all[$0].token }
                            let descriptor = HistoryDescriptor(after: token, authors: authors, from: from, to: to, entityNames: entities,
                                                               sortBy: sort, reverse: reverse, fetchLimit: limit)
                            var expected = all.filter { t in
                                (tokenIndex.map { t.token > all[$0].token } ?? true)
                                    && (authors.map { t.author.map($0.contains) ?? false } ?? true)
                                    && (from.map { t.timestamp >= $0 } ?? true) && (to.map { t.timestamp < $0 } ?? true)
                                    && (entities.map { names in t.changes.contains { names.contains($0.changedPersistentIdentifier.entityName) } } ?? true)
                            }
                            if sort == .timestamp {
                                expected.sort { ($0.timestamp, $0.token.value) < ($1.timestamp, $1.token.value) }
                            }
                            if reverse { expected.reverse() }
                            if let limit { expected = Array(expected.prefix(limit)) }
                            let actual = try context.fetchHistory(descriptor)
                            #expect(actual.map(\.token) == expected.map(\.token), "\(descriptor)")
                            if let entities {
                                #expect(actual.allSatisfy { $0.changes.allSatisfy { entities.contains($0.changedPersistentIdentifier.entityName) } })
                            }
                            checked += 1
                        }
                    } }
                }
            } } }
        }
        #expect(checked > 1000)
    }
}

