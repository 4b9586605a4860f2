import Foundation
import Testing
import ReplicaTesting
@testable import Replica

struct DPerson: PersistentModel, Codable, Equatable {
    static var entityName: String { "Person" }
    var id = UUID.unassigned
    var email: String = ""
    var name: String = ""
    var nickname: String?
    var addresses: [Reference<DAddress>] = []
    static let entity = ModelEntity<DPerson>([
        .attribute("email", \.email, default: "", options: .unique),
        .attribute("name", \.name, default: ""),
        .attribute("nickname", \.nickname),
        .toMany("addresses", \.addresses, inverse: "person", deleteRule: .cascade),
    ])
}

struct DAddress: PersistentModel, Codable, Equatable {
    static var entityName: String { "Address" }
    var id = UUID.unassigned
    var city: String = ""
    var person: Reference<DPerson>?
    static let entity = ModelEntity<DAddress>([
        .attribute("city", \.city, default: ""),
        .toOne("person", \.person, inverse: "addresses"),
    ])
}

private let peopleModels: [any PersistentModel.Type] = [DPerson.self, DAddress.self]

/// Every live person (email, name) and address (city → the ID of its person, "dangling ID" when that person is not
/// live, or "-") of a device, sorted: the state of the DPerson/DAddress tests.
func peopleState(_ device: Device) throws -> [String] {
    let context = ModelContext(device.container)
    let persons = try context.fetch(DPerson.self)
    let byID = Dictionary(uniqueKeysWithValues: persons.map { ($0.id, $0) })
    var lines = persons.map { "person \($0.id) \($0.email) \($0.name)" }
    for address in try context.fetch(DAddress.self) {
        let owner = address.person.map { byID[$0.id].map { "\($0.id)" } ?? "dangling \($0.id)" } ?? "-"
        lines.append("address \(address.id) \(address.city) -> \(owner)")
    }
    return lines.sorted()
}

/// The whole observable state of a device: live people (with their addresses) and addresses, by ID.
private func people(_ device: Device) throws -> String {
    let context = ModelContext(device.container)
    let persons = try context.fetch(DPerson.self).map { "\($0.id) \($0.email) \($0.name) \($0.nickname ?? "-") \($0.addresses.map(\.id))" }
    let addresses = try context.fetch(DAddress.self).map { "\($0.id) \($0.city) -> \($0.person?.id.uuidString ?? "nil")" }
    return (persons + addresses).joined(separator: "\n")
}

private func permutations<T>(_ items: [T]) -> [[T]] {
    guard items.count > 1 else { return [items] }
    return items.indices.flatMap { i -> [[T]] in
        var rest = items
        let head = rest.remove(at: i)
        return permutations(rest).map { [head] + $0 }
    }
}

@Suite("Duplicate resolution for unique keys")
struct DeduplicationTests {
    /// Three devices each create the same person (same email) with an address, offline.
    /// Device 1 creates first (the winner), device 0 last (its name is the newest write); device 2 then edits its
    /// nickname, the newest edit of all.
    private func threeCollidingDevices(_ cloud: InMemoryCloudDatabase) throws -> [Device] {
        let devices = try (0..<3).map { try Device("D\($0)", seed: UInt64(10 + $0), models: peopleModels) }
        for (i, device) in devices.enumerated() {
            device.clock.advance(by: Int64([30, 10, 20][i]))
            var person = device.context.insert(DPerson(email: "ada@example.com", name: "Ada \(i)"))
            device.context.insert(DAddress(city: ["London", "Paris", "Rome"][i], person: Reference(person)))
            try device.context.save()
            if i == 2 {
                device.clock.advance(by: 20)
                person.nickname = "countess"
                device.context.update(person)
                try device.context.save()
            }
        }
        return devices
    }

    @Test("a unique key is enforced locally on save: an update to a taken key fails with a typed error, an insert upserts")
    func localEnforcement() throws {
        let device = try Device("A", seed: 1, models: peopleModels)
        let first = device.context.insert(DPerson(email: "x@example.com"))
        var other = device.context.insert(DPerson(email: "y@example.com"))
        try device.context.save()
        other.email = "x@example.com"
        device.context.update(other)
        #expect(throws: ReplicaError.self) { try device.context.save() }
        device.context.rollback()
        device.context.insert(DPerson(email: "x@example.com", name: "again"))
        try device.context.save()
        #expect(try ModelContext(device.container).model(DPerson.self, id: first.id)?.name == "again")
    }

    @Test("three devices creating the same key converge, under every sync order, to one winner with every edit and child")
    func everySyncOrder() throws {
        var outcomes: Set<String> = []
        for order in permutations([0, 1, 2]) {
            let cloud = InMemoryCloudDatabase()
            let devices = try threeCollidingDevices(cloud)
            for i in order { try devices[i].sync(cloud) }
            for i in order { try devices[i].sync(cloud) }
            for i in order { try devices[i].sync(cloud) }
            let states = try devices.map(people)
            #expect(Set(states).count == 1, "order \(order)")
            let context = ModelContext(devices[0].container)
            let persons = try context.fetch(DPerson.self)
            #expect(persons.count == 1)
            // The winner is the earliest creation (device 1's record); its fields take the newest write of each:
            // device 0's name (written last) and device 2's later nickname edit.
            let firstCreated = try #require(try ModelContext(devices[1].container).fetch(DPerson.self).first)
            #expect(persons.first?.id == firstCreated.id)
            #expect(persons.first?.name == "Ada 0")
            #expect(persons.first?.nickname == "countess")
            #expect(Set(try context.fetch(DAddress.self).map(\.city)) == ["London", "Paris", "Rome"])
            #expect(try context.fetch(DAddress.self).allSatisfy { $0.person?.id == persons.first?.id })
            for device in devices { #expect(try device.engine.status().isUpToDate) }
            outcomes.insert(states[0])
        }
        #expect(outcomes.count == 1)
    }

    @Test("every delivery order of the colliding records and their children to a new device gives the same state")
    func everyDeliveryOrder() throws {
        let cloud = InMemoryCloudDatabase()
        let devices = try threeCollidingDevices(cloud)
        // Upload without letting anyone resolve: the cloud holds three live duplicates and three children.
        for device in devices {
            while let upload = try device.nextUpload(cloud) { try device.engine.handle(upload.id, cloud.performNow(upload.operation)) }
        }
        let records = cloud.records(in: "notes")
        #expect(records.count == 6)
        var outcomes: Set<String> = []
        for (n, order) in permutations(records).enumerated() where n % 5 == 0 {  // 144 of the 720 orders
            let device = try Device("N\(n)", seed: UInt64(1_000 + n), models: peopleModels)
            for record in order { #expect(try device.deliver([record], cloud: cloud)) }
            outcomes.insert(try people(device))
        }
        #expect(outcomes.count == 1)
        // And the devices that created them end in that same state after syncing.
        for device in devices { try device.sync(cloud) }
        for device in devices { try device.sync(cloud) }
        #expect(try Set(devices.map(people)) == outcomes)
    }

    @Test("a loser edited, or given a child, on a device that has not seen the winner loses nothing")
    func loserEditedElsewhere() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: peopleModels)
        let b = try Device("B", seed: 2, models: peopleModels)
        let c = try Device("C", seed: 3, models: peopleModels)
        let winner = a.context.insert(DPerson(email: "k@example.com", name: "winner"))
        try a.context.save()
        b.clock.advance(by: 100)
        let loser = b.context.insert(DPerson(email: "k@example.com", name: "loser"))
        try b.context.save()
        try b.sync(cloud)
        try c.sync(cloud)  // C knows only the loser
        try a.sync(cloud)  // A resolves: the loser becomes a redirecting tombstone
        // C, not having seen the winner, edits the loser and adds a child to it.
        c.clock.advance(by: 10_000)
        var edited = try #require(try c.context.model(DPerson.self, id: loser.id))
        edited.nickname = "edited on C"
        c.context.update(edited)
        let child = c.context.insert(DAddress(city: "Oslo", person: Reference(loser)))
        try c.context.save()
        for _ in 0..<3 { for device in [c, a, b] { try device.sync(cloud) } }
        let states = try [a, b, c].map(people)
        #expect(Set(states).count == 1)
        let context = ModelContext(a.container)
        let persons = try context.fetch(DPerson.self)
        #expect(persons.map(\.id) == [winner.id])
        #expect(persons.first?.nickname == "edited on C")
        #expect(try context.model(DAddress.self, id: child.id)?.person?.id == winner.id)
        // The loser was uploaded before it was resolved, and its fields live on in the winner: B and C lost no write
        // the cloud did not hold (R16). A's own name for the winner, never uploaded, gave way to the loser's newer one:
        // that one loss is logged, on A.
        for device in [b, c] { #expect(try device.engine.conflictLog().isEmpty) }
        let log = try a.engine.conflictLog()
        #expect(log.map(\.field) == ["name"] && log.first?.id.id == winner.id && log.first?.kind == .overwritten)
        #expect(persons.first?.name == "loser")
    }

    @Test("random schedules of random key collisions converge with one live record per key on every device")
    func randomCollisions() throws {
        let emails = ["a@x", "b@x", "c@x"]
        let step = Gen.zip(Gen.int(in: 0...2), Gen.int(in: 0...4), Gen.int(in: 0...2))  // device, action, key
        let result = checkProperty("dedup converges", configuration: PropertyConfiguration(cases: 25, persistence: .disabled),
                                   Gen.array(of: step, maxLength: 14)) { steps in
            let cloud = InMemoryCloudDatabase()
            let devices = try (0..<3).map { try Device("P\($0)", seed: UInt64(200 + $0), models: peopleModels) }
            for (deviceIndex, action, key) in steps {
                let device = devices[deviceIndex]
                device.clock.advance(by: 7)
                let context = device.context
                let existing = try context.fetch(DPerson.self).first { $0.email == emails[key] }
                switch action {
                case 0, 1:
                    if existing == nil { context.insert(DPerson(email: emails[key], name: "n\(deviceIndex)")) }
                case 2:
                    if var person = existing { person.nickname = "nick \(deviceIndex)"; context.update(person) }
                case 3:
                    if let person = existing { context.insert(DAddress(city: "c\(deviceIndex)", person: Reference(person))) }
                default:
                    try device.sync(cloud)
                }
                try context.save()
            }
            for _ in 0..<3 { for device in devices { try device.sync(cloud) } }
            let states = try devices.map(people)
            try Property.require(Set(states).count == 1, "devices diverged")
            for device in devices {
                let persons = try ModelContext(device.container).fetch(DPerson.self)
                try Property.require(Set(persons.map(\.email)).count == persons.count, "two live records share a key")
                try Property.require(try device.engine.status().isUpToDate, "not up to date")
            }
        }
        #expect(result.passed, "\(result.report)")
    }

    /// A cloud holding a losing duplicate (redirected to the winner, its address retargeted), a person deleted
    /// normally with its address (plain tombstones), and the winner with an address of its own. Returns the cloud
    /// and the settled reference state.
    private static func dedupCloud() throws -> (InMemoryCloudDatabase, [String]) {
        let cloud = InMemoryCloudDatabase()
        let laptop = try Device("laptop", seed: 1, models: peopleModels), phone = try Device("phone", seed: 2, models: peopleModels)
        let winner = laptop.context.insert(DPerson(email: "ada@example.com", name: "winner"))
        laptop.context.insert(DAddress(city: "Oslo", person: Reference(winner)))
        try laptop.context.save()
        phone.clock.advance(by: 1_000)
        let loser = phone.context.insert(DPerson(email: "ada@example.com", name: "loser"))
        phone.context.insert(DAddress(city: "Bergen", person: Reference(loser)))
        let bob = phone.context.insert(DPerson(email: "bob@example.com", name: "bob"))
        phone.context.insert(DAddress(city: "Tromsø", person: Reference(bob)))
        try phone.context.save()
        try phone.sync(cloud)
        try laptop.sync(cloud)
        try phone.sync(cloud)
        // A third device adds an address to bob, concurrently with the phone deleting bob (and, by cascade, his
        // address): a live child of a plain tombstone.
        let other = try Device("other", seed: 4, models: peopleModels)
        try other.sync(cloud)
        other.clock.advance(by: 1_500)
        other.context.insert(DAddress(city: "Narvik", person: Reference(bob)))
        try other.context.save()
        phone.clock.advance(by: 1_000)
        phone.context.delete(try #require(try phone.context.model(DPerson.self, id: bob.id)))
        try phone.context.save()
        try other.sync(cloud)
        #expect(cloud.records(in: "notes").contains { $0.recordType == "Address" && $0.fields["city"]?.value == .text("Narvik") })
        try phone.sync(cloud)
        try settle([other, laptop, phone], cloud)
        let reference = try peopleState(laptop)
        #expect(try peopleState(phone) == reference)
        #expect(try peopleState(other) == reference)
        #expect(cloud.records(in: "notes").contains { $0.recordID == loser.id && $0.redirect == winner.id })
        return (cloud, reference)
    }

    @Test("a new device receiving redirected and plain tombstones with their children in any order and batching reaches the same state",
          arguments: 0..<10)
    func tombstonesInAnyOrder(seed: UInt64) throws {
        let (cloud, reference) = try Self.dedupCloud()
        var generator = SplitMix(seed: seed)
        let records = cloud.records(in: "notes").shuffled(using: &generator)
        let tablet = try Device("tablet", seed: 3, models: peopleModels)
        // Seeds 0..<5: one batch; otherwise batches of random sizes (a record may repeat in a later batch).
        var batches: [[CloudRecord]] = []
        if seed < 5 {
            batches = [records]
        } else {
            var rest = records[...]
            while !rest.isEmpty {
                let size = Int.random(in: 1...max(1, rest.count), using: &generator)
                var batch = Array(rest.prefix(size))
                rest = rest.dropFirst(size)
                if let again = batches.last?.randomElement(using: &generator) { batch.append(again) }
                batches.append(batch)
            }
        }
        for batch in batches { #expect(try tablet.deliver(batch, cloud: cloud)) }
        #expect(try peopleState(tablet) == reference, "seed \(seed)")
        #expect(try tablet.engine.status().waitingForParent == 0, "seed \(seed)")
        try tablet.sync(cloud)
        #expect(try peopleState(tablet) == reference, "seed \(seed)")
        #expect(try tablet.engine.status().isUpToDate, "seed \(seed)")
    }
}

/// A small seeded generator (SplitMix64) for reproducible shuffles.
private struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49EB_133A_11EB
        return z ^ (z >> 31)
    }
}
