import Foundation
import Testing
@testable import Replica

@Suite("Adversarial: local API edge cases")
struct AdversarialLocalTests {
    /// A synced store tracks, uploads and merges records by ID alone (the cloud's record ID): an ID used by two
    /// entities of one synced store must be refused on save, or both records must still replicate.
    @Test("two entities of one synced store saved with the same record ID both reach another device, or the save is refused",
          arguments: [false, true])
    func sameIDInTwoEntities(inOneSave: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: [SyncNote.self, SyncTag.self])
        let b = try Device("B", seed: 2, models: [SyncNote.self, SyncTag.self])
        let note = a.context.insert(SyncNote(title: "note"))
        if !inOneSave { try a.context.save() }
        a.context.insert(SyncTag(id: note.id, label: "tag"))
        do {
            try a.context.save()
        } catch let error as ReplicaError {
            #expect(error.validationFailures == [.duplicateIdentifier(PersistentIdentifier(entityName: "SyncTag", id: note.id))])
            return
        }
        try a.sync(cloud)
        try b.sync(cloud)
        let context = ModelContext(b.container)
        #expect(try context.fetch(SyncNote.self).map(\.title) == ["note"])
        #expect(try context.fetch(SyncTag.self).map(\.label) == ["tag"])
    }
}

@Suite("Adversarial: fetch bounds")
struct AdversarialFetchTests {
    static func fetchWithHugeLimit() throws {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        let container = try ModelContainer(for: Ledger.self, configurations: ModelConfiguration("l", isStoredInMemoryOnly: true),
                                           environment: environment)
        let context = ModelContext(container)
        for memo in ["a", "b", "c"] { context.insert(Ledger(memo: memo)) }
        try context.save()
        var descriptor = FetchDescriptor<Ledger>()
        descriptor.fetchLimit = Int.max
        descriptor.fetchOffset = 1
        guard try context.fetch(descriptor).map(\.memo) == ["b", "c"] else { exit(3) }
    }

    @Test("a fetch limit of Int.max (\"no limit\") with an offset never traps")
    func hugeLimitWithOffset() async throws {
        await #expect(processExitsWith: .success) { try AdversarialFetchTests.fetchWithHugeLimit() }
    }
}

@Suite("Adversarial: deep cascades")
struct AdversarialCascadeTests {
    /// Deletes the head of a cascade chain of `length` records (each record's children cascade), in memory.
    static func deleteChain(length: Int) throws {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        let container = try ModelContainer(for: CycleNode.self, configurations: ModelConfiguration("chain", isStoredInMemoryOnly: true),
                                           environment: environment)
        let context = ModelContext(container)
        var previous = context.insert(CycleNode(name: "0"))
        let head = previous
        for i in 1..<length { previous = context.insert(CycleNode(name: "\(i)", parent: Reference(previous))) }
        try context.save()
        context.delete(head)
        try context.save()
        guard try ModelContext(container).fetch(CycleNode.self).isEmpty else { exit(3) }
    }

    @Test("deleting the head of a long cascade chain never overflows the stack")
    func longCascadeChain() async throws {
        await #expect(processExitsWith: .success) { try AdversarialCascadeTests.deleteChain(length: 1_000) }
        await #expect(processExitsWith: .success) { try AdversarialCascadeTests.deleteChain(length: 3_000) }
        await #expect(processExitsWith: .success) { try AdversarialCascadeTests.deleteChain(length: 8_000) }
        await #expect(processExitsWith: .success) { try AdversarialCascadeTests.deleteChain(length: 20_000) }
    }
}
