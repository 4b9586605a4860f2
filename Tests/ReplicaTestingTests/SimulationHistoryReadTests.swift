import CSQLite
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

    @Test("a transaction deleted between the first and the newest (a bug the check must see): the full history, shorter")
    func middleDeleted() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sim-history-middle-\(getpid())", isDirectory: true)
        try? FileManager.default.removeItem(at: directory)
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let name = "\(Self.store)-middle"
        let url = directory.appendingPathComponent("middle.store")
        let container = try ModelContainer(for: Schema([HistoryNote.self]), configurations: [ModelConfiguration(name, url: url)],
                                           environment: .seeded(seed: 7, directory: directory))
        let context = ModelContext(container)
        try save(context, 4)
        let before = try context.fetchHistory(HistoryDescriptor(storeNames: [name]))
        #expect(before.count == 4)
        // What a faulty re-read could do behind the library's back: drop the second transaction, watermark untouched.
        var db: OpaquePointer?
        #expect(sqlite3_open_v2(url.path, &db, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        #expect(sqlite3_exec(db, "DELETE FROM replica_history_change WHERE token = \(before[1].token.value); DELETE FROM replica_history_transaction WHERE token = \(before[1].token.value)", nil, nil, nil) == SQLITE_OK)
        sqlite3_close_v2(db)
        let after = try storeHistory(context, storeName: name, unlessUnchangedFrom: before)
        #expect(after.count == 3)
        #expect(after == (try context.fetchHistory(HistoryDescriptor(storeNames: [name]))))
    }

    @Test("an empty earlier read: the full history")
    func emptyBefore() throws {
        let context = try makeContext("empty")
        try save(context, 2)
        let after = try storeHistory(context, storeName: "\(Self.store)-empty", unlessUnchangedFrom: [])
        #expect(after.count == 2)
    }
}
