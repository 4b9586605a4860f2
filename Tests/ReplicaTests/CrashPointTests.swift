import Foundation
import Synchronization
import Testing
@testable import Replica

/// A fault hook that throws at the points a test arms, counting the points it passes.
final class ArmedFaults: Sendable {
    struct Injected: Error {}
    private let state = Mutex<(armed: [FaultPoint: Int], seen: [FaultPoint: Int])>(([:], [:]))

    /// Throws the next `times` times `point` is reached.
    func arm(_ point: FaultPoint, times: Int = 1) { state.withLock { $0.armed[point, default: 0] += times } }

    func seen(_ point: FaultPoint) -> Int { state.withLock { $0.seen[point] ?? 0 } }

    var hook: @Sendable (FaultPoint) throws -> Void {
        { point in
            let fire = self.state.withLock { state -> Bool in
                state.seen[point, default: 0] += 1
                guard let left = state.armed[point], left > 0 else { return false }
                state.armed[point] = left - 1
                return true
            }
            if fire { throw Injected() }
        }
    }
}

/// A local-only model beside the synced notes.
struct LocalDraft: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<LocalDraft>([.attribute("text", \.text, default: "")])
}

@Suite("Crash points")
struct CrashPointTests {
    private func container(_ faults: ArmedFaults, directory: URL, seed: UInt64 = 1) throws -> ModelContainer {
        var environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
        environment.faultHook = faults.hook
        return try ModelContainer(for: Schema([SyncNote.self, LocalDraft.self]), configurations: [
            ModelConfiguration("notes", schema: Schema([SyncNote.self]), cloudKitDatabase: .private("iCloud.test")),
            ModelConfiguration("drafts", schema: Schema([LocalDraft.self])),
        ], environment: environment)
    }

    /// Everything a store holds, as a raw connection reads it: rows, history, ledger and the HLC.
    private func snapshot(_ url: URL) throws -> String {
        let db = try rawConnection(url, readOnly: true)
        var parts: [String] = []
        for table in ["replica_history_transaction", "replica_history_change"] {
            parts.append("\(table): \(try db.rows("SELECT count(*) FROM \(table)")[0][0])")
        }
        if try db.scalar("SELECT 1 FROM sqlite_master WHERE name = 'replica_sync_record'") != nil {
            parts.append("ledger: \(try db.rows("SELECT count(*) FROM replica_sync_record")[0][0])")
            let hlc = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'hlc'")
            parts.append("hlc: \(hlc.map { if case let .text(t) = $0 { t } else { "?" } } ?? "none")")
        }
        return parts.joined(separator: ", ")
    }

    @Test("a fault before the second store commits rolls back both stores: rows, history, ledger and HLC",
          arguments: ["notes", "drafts"])
    func faultBeforeCommitOfEitherStore(store: String) throws {
        let directory = temporaryTestDirectory()
        let faults = ArmedFaults()
        let container = try self.container(faults, directory: directory)
        let context = ModelContext(container)
        context.insert(SyncNote(title: "first"))
        try context.save()
        let before = try [container.url(of: "notes")!, container.url(of: "drafts")!].map(snapshot)

        faults.arm(.beforeCommit(store: store))
        context.insert(SyncNote(title: "second"))
        context.insert(LocalDraft(text: "draft"))
        #expect(throws: ArmedFaults.Injected.self) { try context.save() }
        #expect(try [container.url(of: "notes")!, container.url(of: "drafts")!].map(snapshot) == before)
        #expect(try ModelContext(container).fetch(SyncNote.self).map(\.title) == ["first"])
        #expect(try ModelContext(container).fetch(LocalDraft.self).isEmpty)

        // The changes are still pending: the retried save commits them once, and sync uploads each record once.
        try context.save()
        let engine = try SyncEngine(container: container, storeName: "notes")
        let cloud = InMemoryCloudDatabase()
        engine.setNeedsFetch()
        while let request = try engine.nextRequest() { try engine.handle(request.id, cloud.performNow(request.operation)) }
        #expect(cloud.records(in: "notes").compactMap { $0.fields["title"]?.value }.count == 2)
        #expect(try engine.status().isUpToDate)
    }

    @Test("a fault before importing any page of a paged full read resumes from the last page, with nothing lost or doubled")
    func faultBeforeEachImport() throws {
        let cloud = InMemoryCloudDatabase()
        let writer = try Device("W", seed: 9)
        for i in 0..<6 { writer.context.insert(SyncNote(title: "n\(i)")) }
        try writer.context.save()
        try writer.sync(cloud)

        let faults = ArmedFaults()
        let container = try self.container(faults, directory: temporaryTestDirectory(), seed: 2)
        var options = SyncEngine.Options()
        options.fetchLimit = 2
        let engine = try SyncEngine(container: container, storeName: "notes", options: options)
        engine.setNeedsFetch()
        var failures = 0
        var fetches = 0
        for _ in 0..<100 {
            guard let request = try engine.nextRequest() else { break }
            if case .fetchZoneChanges = request.operation {
                fetches += 1
                // Every page fails once before it is imported.
                if fetches % 2 == 1 { faults.arm(.beforeImport(store: "notes")) }
            }
            do {
                try engine.handle(request.id, cloud.performNow(request.operation))
            } catch is ArmedFaults.Injected {
                failures += 1
            }
        }
        #expect(failures >= 3)
        let context = ModelContext(container)
        #expect(try context.fetch(SyncNote.self).map(\.title) == (0..<6).map { "n\($0)" })
        // Each record was imported exactly once: six inserts in history, no updates.
        let changes = try context.fetchHistory().flatMap(\.changes)
        #expect(changes.count == 6)
        #expect(changes.allSatisfy { if case .insert = $0 { true } else { false } })
        #expect(try engine.status().isUpToDate)
    }
}
