import Foundation
import Testing
@testable import Replica

@Suite("Replication core")
struct SyncEngineTests {
    @Test("two devices converge: inserts, field-level concurrent edits, deletes")
    func basicConvergence() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "Groceries", body: "milk", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try b.notes().map(\.title) == ["Groceries"])

        // Concurrent edits of different fields both survive.
        var onA = note
        onA.body = "milk, eggs"
        a.context.update(onA)
        try a.context.save()
        var onB = try #require(try b.context.model(SyncNote.self, id: note.id))
        onB.rating = 5
        b.context.update(onB)
        try b.context.save()
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)
        let merged = try a.notes()
        #expect(merged == (try b.notes()))
        #expect(merged.first?.body == "milk, eggs")
        #expect(merged.first?.rating == 5)
        #expect(try a.engine.status().isUpToDate)
        #expect(try b.engine.status().isUpToDate)

        // Delete replicates.
        b.context.delete(note)
        try b.context.save()
        try b.sync(cloud); try a.sync(cloud)
        #expect(try a.notes().isEmpty)
        #expect(cloud.records(in: "notes").first?.isAlive == false)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("Groceries"))  // preserved in the tombstone
    }

    @Test("concurrent edits of one field: the later HLC wins on every device, whatever the wall clocks say")
    func lastWriterWins() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        b.clock.advance(by: -3_600_000)  // B's clock is an hour behind
        var first = note
        first.title = "from A"
        a.context.update(first)
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        // B edits after having seen A's edit: it must win although B's wall clock is behind.
        var second = try #require(try b.context.model(SyncNote.self, id: note.id))
        second.title = "from B, later"
        b.context.update(second)
        try b.context.save()
        try b.sync(cloud); try a.sync(cloud)
        #expect(try a.notes().map(\.title) == ["from B, later"])
        #expect(try b.notes().map(\.title) == ["from B, later"])
    }
}

@Suite("Store names")
struct StoreNameErrorTests {
    @Test("a misspelled store and a local-only store get different typed errors")
    func typedStoreErrors() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-names-\(UUID().uuidString)")
        struct Local: PersistentModel, Codable {
            var id = UUID.unassigned
            var text: String = ""
            static let entity = ModelEntity<Local>([.attribute("text", \.text, default: "")])
        }
        let container = try ModelContainer(for: Schema([SyncNote.self, Local.self]), configurations: [
            ModelConfiguration("notes", schema: Schema([SyncNote.self]), cloudKitDatabase: .private("iCloud.test")),
            ModelConfiguration("local", schema: Schema([Local.self])),
        ], environment: .seeded(seed: 1, directory: directory))
        #expect(throws: ReplicaError.unknownStore("nots")) { try SyncEngine(container: container, storeName: "nots") }
        #expect(throws: ReplicaError.storeNotSynced("local")) { try SyncEngine(container: container, storeName: "local") }
        let context = ModelContext(container)
        #expect(throws: ReplicaError.unknownStore("nots")) { try context.currentHistoryToken(of: "nots") }
        #expect(throws: ReplicaError.unknownStore("nots")) { try context.fetchHistory(HistoryDescriptor(storeNames: ["nots"])) }
        #expect(throws: ReplicaError.unknownEntity("syncnote")) { try context.fetchHistory(HistoryDescriptor(entityNames: ["syncnote"])) }
    }
}
