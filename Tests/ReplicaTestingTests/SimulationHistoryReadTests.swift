import Foundation
import Replica
@testable import ReplicaTesting
import Testing

private struct HistoryNote: PersistentModel, Codable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<HistoryNote>([.attribute("text", \.text, default: "")])
}

/// The idempotence check reads each store's history again after its re-read of every zone, but in full only when
/// it may have changed (`storeHistory(_:storeName:unlessUnchangedFrom:)`): these cases must each come back as the
/// full read would, so the check still sees every added or removed transaction.
@Suite("Simulator: history after the idempotence re-read")
struct SimulationHistoryReadTests {
    private static let store = "sim-history-reread"

    private func makeContext(_ name: String) throws -> ModelContext {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sim-history-\(name)", isDirectory: true)
        let container = try ModelContainer(for: Schema([HistoryNote.self]),
                                           configurations: [ModelConfiguration("\(Self.store)-\(name)", isStoredInMemoryOnly: true)],
                                           environment: .seeded(seed: 7, directory: directory))
        return ModelContext(container)
    }

    private func save(_ context: ModelContext, _ count: Int) throws {
        for i in 0..<count {
            context.insert(HistoryNote(text: "n\(i)"))
            try context.save()
        }
    }

    private func fullRead(_ context: ModelContext, _ name: String) throws -> [HistoryTransaction] {
        try context.fetchHistory(HistoryDescriptor(storeNames: ["\(Self.store)-\(name)"]))
    }

    @Test("unchanged history: the earlier read is returned, equal to a full read")
    func unchanged() throws {
        let context = try makeContext("unchanged")
        try save(context, 4)
        let before = try fullRead(context, "unchanged")
        let after = try storeHistory(context, storeName: "\(Self.store)-unchanged", unlessUnchangedFrom: before)
        #expect(after == before)
        #expect(after == (try fullRead(context, "unchanged")))
    }

    @Test("an added transaction: the full history, one transaction longer")
    func added() throws {
        let context = try makeContext("added")
        try save(context, 3)
        let before = try fullRead(context, "added")
        try save(context, 1)
        let after = try storeHistory(context, storeName: "\(Self.store)-added", unlessUnchangedFrom: before)
        #expect(after.count == before.count + 1)
        #expect(after == (try fullRead(context, "added")))
    }

    @Test("pruned transactions, with or without a new one: the full history, shorter")
    func pruned() throws {
        let context = try makeContext("pruned")
        try save(context, 5)
        let before = try fullRead(context, "pruned")
        _ = try context.deleteHistory(through: before[1].token)
        var after = try storeHistory(context, storeName: "\(Self.store)-pruned", unlessUnchangedFrom: before)
        #expect(after.count == before.count - 2)
        #expect(after == (try fullRead(context, "pruned")))
        // Pruned and added: same newest-but-one, more transactions after the last one seen.
        try save(context, 1)
        after = try storeHistory(context, storeName: "\(Self.store)-pruned", unlessUnchangedFrom: before)
        #expect(after == (try fullRead(context, "pruned")))
    }

    @Test("an empty earlier read: the full history")
    func emptyBefore() throws {
        let context = try makeContext("empty")
        try save(context, 2)
        let after = try storeHistory(context, storeName: "\(Self.store)-empty", unlessUnchangedFrom: [])
        #expect(after.count == 2)
    }
}
