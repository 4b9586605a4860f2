import Foundation
import Testing
@testable import Replica

/// R15 when a resolved duplicate's ID is inserted again: the new incarnation is a record of its own, and the loser's
/// record keeps an ended redirect (incarnation → winner), so an edit made offline to the ended incarnation still
/// reaches the winner — whatever the delivery order, repetition, later collisions, deletes and re-inserts of the winner,
/// or an older device that drops `endedRedirects`.
@Suite("Duplicate resolution: re-inserted duplicates and ended redirects")
struct DuplicateReinsertTests {
    private static let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]

    /// Every live person of a device as (id, email, name, nickname), sorted by ID.
    private static func people(_ device: Device) throws -> [String] {
        try ModelContext(device.container).fetch(DPerson.self)
            .sorted { $0.id.uuidString < $1.id.uuidString }
            .map { "\($0.id) \($0.email) \($0.name) \($0.nickname ?? "-")" }
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
        try settle([phone, laptop, tablet], cloud)
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
        try settle([tablet, phone, laptop], cloud)
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
        try settle([desk, phone, laptop, tablet], cloud, rounds: 4)
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
        try settle([tablet, phone, laptop], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
        #expect(try laptop.context.model(DPerson.self, id: loser)?.name == "reborn")
    }

    @Test("random schedules of duplicate keys, re-inserts, deletes and offline edits on three devices converge")
    func randomSchedulesConverge() throws {
        for seed in UInt64(1)...UInt64(ProcessInfo.processInfo.environment["REPLICA_DUPLICATE_REINSERT_SEEDS"].flatMap(Int.init) ?? 12) {
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
            try settle(devices, cloud, rounds: 4)
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
        try settle([early, tablet, phone, laptop], cloud, rounds: 4)
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
        try settle([laptop, tablet, phone], cloud, rounds: 4)
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
        try settle([tablet, phone, laptop], cloud, rounds: 3)
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
        try settle([tablet, laptop, phone], cloud, rounds: 4)
        let reference = try Self.people(laptop)
        for device in [laptop, phone, tablet] {
            #expect(try Self.people(device) == reference, "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: winner)?.nickname == "tablet", "\(device.name)")
            #expect(try device.context.model(DPerson.self, id: loser)?.name == "phone reborn", "\(device.name)")
            #expect(try device.engine.status().pendingRecords == 0, "\(device.name)")
        }
    }
}
