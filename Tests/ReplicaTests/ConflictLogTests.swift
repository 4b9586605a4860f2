import Foundation
import Testing
import ReplicaTesting
@testable import Replica

/// R16: every merge decision in which a local write the cloud did not hold lost is logged exactly once, on the device
/// whose write lost, with the winner — and nothing else is.
@Suite("Conflict log")
struct ConflictLogTests {
    /// A note created on A and synced to B (both in the cloud).
    private func shared(_ cloud: InMemoryCloudDatabase) throws -> (Device, Device, SyncNote) {
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "t", body: "b"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        return (a, b, note)
    }

    private func edit(_ device: Device, _ id: UUID, advance: Int64 = 1_000, _ change: (inout SyncNote) -> Void) throws {
        var note = try #require(try device.context.model(SyncNote.self, id: id))
        change(&note)
        device.clock.advance(by: advance)
        device.context.update(note)
        try device.context.save()
    }

    @Test("a device that changed only body gets no entry when another device's newer title wins")
    func noEntryForAFieldLeftUnchanged() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b, note) = try shared(cloud)
        try edit(b, note.id, advance: 5_000) { $0.title = "B's title" }
        try b.sync(cloud)
        try edit(a, note.id) { $0.body = "A's body" }
        try a.sync(cloud); try b.sync(cloud)
        #expect(try a.notes().first.map { [$0.title, $0.body] } == ["B's title", "A's body"])
        #expect(try a.engine.conflictLog().isEmpty)
        #expect(try b.engine.conflictLog().isEmpty)
    }

    @Test("a local edit that lost to a newer remote write is logged once, with the winner's stamp and replica")
    func overwrittenFieldLoggedOnce() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b, note) = try shared(cloud)
        try edit(b, note.id, advance: 5_000) { $0.title = "B's title" }
        try b.sync(cloud)
        try edit(a, note.id) { $0.title = "A's title"; $0.body = "A's body" }
        try settle([a, b], cloud)
        let log = try a.engine.conflictLog()
        #expect(log.count == 1)
        let entry = try #require(log.first)
        #expect(entry.field == "title" && entry.kind == .overwritten && entry.id == noteID(note.id))
        #expect(entry.winningStamp.clock.replica == b.container.stores[0].identity)
        #expect(entry.localStamp.clock.replica == a.container.stores[0].identity)
        #expect(try b.engine.conflictLog().isEmpty)
    }

    @Test("a local value already uploaded that a later remote write replaces is not logged")
    func uploadedValueNotLogged() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b, note) = try shared(cloud)
        try edit(a, note.id) { $0.title = "A's title" }
        try a.sync(cloud)
        try edit(b, note.id, advance: 5_000) { $0.title = "B's title" }
        try b.sync(cloud)
        // A edits another field; its uploaded title is not a loss.
        try edit(a, note.id) { $0.rating = 3 }
        try settle([a, b], cloud)
        #expect(try a.notes().first?.title == "B's title")
        #expect(try a.engine.conflictLog().isEmpty)
        #expect(try b.engine.conflictLog().isEmpty)
    }

    @Test("equal values and local wins are not logged")
    func equalValuesAndLocalWinsNotLogged() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b, note) = try shared(cloud)
        try edit(b, note.id, advance: 5_000) { $0.title = "same" }
        try b.sync(cloud)
        try edit(a, note.id) { $0.title = "same" }
        try edit(a, note.id, advance: 10_000) { $0.body = "A wins body" }
        try edit(b, note.id) { $0.body = "B loses body" }
        try settle([a, b], cloud)
        #expect(try a.engine.conflictLog().isEmpty)
        #expect(try b.engine.conflictLog().map { [$0.field] } == [["body"]])
    }

    @Test("an unsynced local edit removed by a remote delete is logged once per edited field")
    func remoteDeleteOfUnsyncedEdit() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b, note) = try shared(cloud)
        let onB = try #require(try b.context.model(SyncNote.self, id: note.id))
        b.clock.advance(by: 5_000)
        b.context.delete(onB)
        try b.context.save()
        try b.sync(cloud)
        try edit(a, note.id) { $0.body = "A's body" }
        try settle([a, b], cloud)
        #expect(try a.notes().isEmpty)
        let log = try a.engine.conflictLog()
        #expect(log.map(\.field) == ["body"])
        #expect(log.first?.kind == .deleted)
        #expect(log.first?.description.contains("lost to a delete of the record") == true)
        #expect(try b.engine.conflictLog().isEmpty)
    }

    @Test("a record written offline that a remote cascade removed is logged, one entry per written field")
    func cascadeOfOfflineRecord() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [STrip.self, SItem.self, SStep.self]
        let a = try Device("A", seed: 1, models: models)
        let b = try Device("B", seed: 2, models: models)
        let trip = a.context.insert(STrip(name: "Alps"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        let item = a.context.insert(SItem(title: "glacier", trip: Reference(trip)))
        try a.context.save()
        let tripOnB = try #require(try b.context.model(STrip.self, id: trip.id))
        b.clock.advance(by: 5_000)
        b.context.delete(tripOnB)
        try b.context.save()
        try b.sync(cloud)
        try settle([a, b], cloud)
        #expect(try ModelContext(a.container).fetch(SItem.self).isEmpty)
        let log = try a.engine.conflictLog()
        #expect(!log.isEmpty)
        #expect(log.allSatisfy { $0.id == item.persistentModelID && $0.kind == .cascaded })
        #expect(log.contains { $0.field == "title" })
        #expect(Set(log.map(\.field)).count == log.count)
        #expect(try b.engine.conflictLog().isEmpty)
    }

    @Test("a synced record that a remote cascade removed is not logged")
    func cascadeOfSyncedRecordNotLogged() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [STrip.self, SItem.self, SStep.self]
        let a = try Device("A", seed: 1, models: models)
        let b = try Device("B", seed: 2, models: models)
        let trip = a.context.insert(STrip(name: "Alps"))
        a.context.insert(SItem(title: "glacier", trip: Reference(trip)))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        let tripOnB = try #require(try b.context.model(STrip.self, id: trip.id))
        b.context.delete(tripOnB)
        try b.context.save()
        try settle([a, b], cloud)
        #expect(try a.engine.conflictLog().isEmpty)
        #expect(try b.engine.conflictLog().isEmpty)
    }

    @Test("a record created offline that loses as a duplicate of a unique key is logged once, on its creator")
    func unsyncedDuplicateLoggedOnItsCreator() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let a = try Device("A", seed: 1, models: models)
        let b = try Device("B", seed: 2, models: models)
        let winner = a.context.insert(DPerson(email: "k@example.com", name: "first"))
        try a.context.save()
        try a.sync(cloud)
        b.clock.advance(by: 100)
        let loser = b.context.insert(DPerson(email: "k@example.com", name: "second"))
        try b.context.save()
        try settle([b, a], cloud)
        let log = try b.engine.conflictLog()
        #expect(log.count == 1)
        #expect(log.first?.kind == .duplicate && log.first?.id.id == loser.id && log.first?.duplicateOf?.id == winner.id)
        #expect(try a.engine.conflictLog().isEmpty)
    }

    /// Found by the simulator's conflict-log invariant (Simulations/regressions/dedup-winner-edit-replaced-unlogged…):
    /// the winner of a duplicate absorbs the loser's newer fields, which replaced the winner's own unsynced value
    /// without an entry.
    @Test("an unsynced field of a duplicate's winner that the loser's newer value replaces is logged once, on the winner's device")
    func winnerFieldReplacedByAbsorbedValueIsLogged() throws {
        let cloud = InMemoryCloudDatabase()
        let models: [any PersistentModel.Type] = [DPerson.self, DAddress.self]
        let a = try Device("A", seed: 1, models: models)
        let b = try Device("B", seed: 2, models: models)
        let winner = a.context.insert(DPerson(email: "k@example.com", name: "first"))
        try a.context.save()
        b.clock.advance(by: 100)
        _ = b.context.insert(DPerson(email: "k@example.com", name: "second"))
        try b.context.save()
        try b.sync(cloud)
        try settle([a, b], cloud)
        #expect(try a.context.model(DPerson.self, id: winner.id)?.name == "second")
        let log = try a.engine.conflictLog()
        #expect(log.count == 1)
        #expect(log.first?.kind == .overwritten && log.first?.id.id == winner.id && log.first?.field == "name")
        #expect(try b.engine.conflictLog().isEmpty)
    }

    /// A reference model of one note on each device and in the cloud: per field the value and the step that wrote it,
    /// and per device the fields written since the last upload. Syncing a device merges the cloud's note (each field
    /// by the step that wrote it; a delete wins over a live note) and then uploads; a local write the merge replaces by
    /// a different value, or a delete removes, is a loss.
    private struct NoteModel {
        struct Copy {
            var alive = true
            var fields: [String: (value: String, step: Int)] = [:]
            var unsynced: Set<String> = []
        }
        var cloud: Copy
        var devices: [Copy]
        var losses: [[String]]

        init(devices count: Int, initial: [String: String]) {
            var copy = Copy()
            for (name, value) in initial { copy.fields[name] = (value, 0) }
            cloud = copy
            devices = Array(repeating: copy, count: count)
            losses = Array(repeating: [], count: count)
        }

        /// Returns whether the write changes the value (only changed fields are stamped).
        mutating func write(_ device: Int, _ field: String, _ value: String, step: Int) -> Bool {
            guard devices[device].alive, devices[device].fields[field]?.value != value else { return false }
            devices[device].fields[field] = (value, step)
            devices[device].unsynced.insert(field)
            return true
        }

        mutating func delete(_ device: Int) -> Bool {
            guard devices[device].alive else { return false }
            devices[device] = Copy(alive: false)
            return true
        }

        mutating func sync(_ device: Int) {
            var copy = devices[device]
            if !cloud.alive, copy.alive {
                losses[device] += copy.unsynced.sorted().map { "\($0) deleted" }
                copy = Copy(alive: false)
            } else if copy.alive {
                for (name, remote) in cloud.fields.sorted(by: { $0.key < $1.key }) where remote.step > copy.fields[name]!.step {
                    if copy.unsynced.contains(name), copy.fields[name]!.value != remote.value { losses[device].append("\(name) overwritten") }
                    copy.fields[name] = remote
                    copy.unsynced.remove(name)
                }
                for name in copy.unsynced where copy.fields[name]!.step > cloud.fields[name]!.step { cloud.fields[name] = copy.fields[name] }
                copy.unsynced = []
            } else {
                cloud = Copy(alive: false)
            }
            devices[device] = copy
        }
    }

    @Test("random edits, deletes and syncs on three devices log exactly the local writes the reference model says lost")
    func logEqualsReferenceModel() throws {
        let strings = ["a", "b", "c"]
        let step = Gen.zip(Gen.int(in: 0...2), Gen.int(in: 0...6), Gen.int(in: 0...2))  // device, action, value
        let result = checkProperty("conflict log equals the model", configuration: PropertyConfiguration(cases: 30, persistence: .disabled),
                                   Gen.array(of: step, maxLength: 16)) { steps in
            let cloud = InMemoryCloudDatabase()
            let devices = try (0..<3).map { try Device("L\($0)", seed: UInt64(300 + $0)) }
            let note = devices[0].context.insert(SyncNote(title: "a", body: "a", rating: 0))
            try devices[0].context.save()
            for device in devices { try device.sync(cloud) }
            var model = NoteModel(devices: 3, initial: ["title": "a", "body": "a", "rating": "0"])
            for (index, (deviceIndex, action, value)) in steps.enumerated() {
                let device = devices[deviceIndex]
                // One global timeline: each step's writes order after every earlier step's.
                let now = devices.map { $0.clock.nowMilliseconds() }.max()! + 1_000
                device.clock.set(milliseconds: now)
                let current = try device.context.model(SyncNote.self, id: note.id)
                if action <= 3, model.devices[deviceIndex].alive {
                    try Property.require(current != nil, "the model has a live note the device lacks")
                }
                switch action {
                case 0, 1, 2:
                    let field = ["title", "body", "rating"][action]
                    let text = field == "rating" ? String(value) : strings[value]
                    guard model.write(deviceIndex, field, text, step: index + 1) else { continue }
                    guard var edited = current else { continue }
                    switch action {
                    case 0: edited.title = text
                    case 1: edited.body = text
                    default: edited.rating = value
                    }
                    device.context.update(edited)
                    try device.context.save()
                case 3:
                    guard model.delete(deviceIndex) else { continue }
                    guard let current else { continue }
                    device.context.delete(current)
                    try device.context.save()
                default:
                    try device.sync(cloud)
                    model.sync(deviceIndex)
                }
            }
            for _ in 0..<2 {
                for (index, device) in devices.enumerated() { try device.sync(cloud); model.sync(index) }
            }
            for (index, device) in devices.enumerated() {
                let logged = try device.engine.conflictLog(limit: 1_000).map { "\($0.field) \($0.kind == .overwritten ? "overwritten" : "\($0.kind)")" }
                try Property.require(logged.sorted() == model.losses[index].sorted(),
                                     "device \(index) logged \(logged.sorted()), the model lost \(model.losses[index].sorted())")
            }
        }
        #expect(result.passed, "\(result.report)")
    }
}
