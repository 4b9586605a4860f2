import Foundation
import Testing
@testable import Replica

@Suite("Engine options, cloud resets and an unreadable cloud file")
struct SyncEngineOptionsTests {
    @Test("an upload batch size of 0 never leaves the outbox stuck while the engine reports idle")
    func zeroUploadBatch() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-adv-\(UUID().uuidString)")
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: directory)
        let container = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        var options = SyncEngine.Options()
        options.uploadBatchSize = 0
        let engine = try SyncEngine(container: container, storeName: "notes", options: options)
        let context = ModelContext(container)
        context.insert(SyncNote(title: "t"))
        try context.save()
        let cloud = InMemoryCloudDatabase()
        engine.setNeedsFetch()
        for _ in 0..<100 {
            guard let request = try engine.nextRequest() else { break }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        // Either the engine uploads, or it says it cannot: it never goes idle with a pending record and no error.
        let status = try engine.status()
        #expect(cloud.records(in: "notes").count == 1 || status.lastError != nil)
    }

    @Test("after a zone reset, a device whose schema contradicts the zone's is still refused (R13)")
    func schemaGateSurvivesZoneReset() throws {
        struct Retyped: PersistentModel, Codable {
            static var entityName: String { "SyncNote" }
            var id = UUID.unassigned
            var title: String = ""
            var body: String?
            var rating: String = "high"
            static let entity = ModelEntity<Retyped>([
                .attribute("title", \.title, default: "", options: .preserveValueOnDeletion),
                .attribute("body", \.body),
                .attribute("rating", \.rating, default: "high"),
            ])
        }
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        a.context.insert(SyncNote(title: "a", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        cloud.resetZone("notes")
        try a.sync(cloud)  // re-creates the zone and uploads everything again
        #expect(cloud.records(in: "notes").count == 1)
        let c = try Device("C", seed: 3, models: [Retyped.self])
        c.context.insert(Retyped(title: "c", rating: "very"))
        try c.context.save()
        _ = try? c.sync(cloud)
        #expect(try c.engine.status().blockedBy != nil)
        #expect(cloud.records(in: "notes").count == 1)
    }

    @Test("a record the cloud file cannot read is rejected by ID for that record only: the rest of the zone arrives, the engine never spins")
    func unreadableCloudRecord() async throws {
        let root = temporaryTestDirectory()
        let file = root.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: file)
        let a = try Device("A", seed: 1, directory: root.appendingPathComponent("a"))
        let b = try Device("B", seed: 2, directory: root.appendingPathComponent("b"))
        a.context.insert(SyncNote(title: "one"))
        a.context.insert(SyncNote(title: "two"))
        try a.context.save()
        try await drive(a, cloud)
        let raw = try rawConnection(file)
        try raw.execute("UPDATE cloud_record SET record = '{\"recordID\": 42' WHERE sequence = 1")
        b.context.insert(SyncNote(title: "from b"))
        try b.context.save()
        try await drive(b, cloud, maxRequests: 20)
        let status = try b.engine.status()
        #expect(!status.isUpToDate)
        #expect(status.rejectedRecords == 1)
        #expect(status.lastError == nil, "one bad record is not a zone-wide failure")
        // The readable record and the device's own arrive and upload.
        #expect(try b.notes().map(\.title).sorted() == ["from b", "two"])
        #expect(try cloud.records(in: "notes").count == 2, "the unreadable record stays as it is; b's own was uploaded")
        // A clear reason naming the record that cannot be read, in its own ledger entry...
        let badID = try #require(a.notes().first?.id)
        let entry = try b.engine.ledgerEntries(in: .rejected).first { $0.id.id == badID }
        guard case let .rejected(reason)? = entry?.state else {
            Issue.record("expected a rejected entry for the unreadable record, got \(String(describing: entry))")
            return
        }
        #expect(reason.contains(badID.uuidString.lowercased()))
        // ...and nothing left to ask: the engine does not spin on it.
        #expect(try b.engine.nextRequest() == nil)
    }

    /// The engine reads the zone before it uploads; a zone the cloud cannot serve must not keep this device's own
    /// changes in its outbox for as long as the bad record stays in the cloud file (saves are guarded by change
    /// tags and conflicts merge, so uploading meanwhile is safe).
    @Test("a device's own changes still upload while the cloud file holds a record it cannot read")
    func uploadsDespiteUnreadableCloudRecord() async throws {
        let root = temporaryTestDirectory()
        let file = root.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: file)
        let a = try Device("A", seed: 1, directory: root.appendingPathComponent("a"))
        let b = try Device("B", seed: 2, directory: root.appendingPathComponent("b"))
        a.context.insert(SyncNote(title: "one"))
        try a.context.save()
        try await drive(a, cloud)
        try rawConnection(file).execute("UPDATE cloud_record SET record = 'not json' WHERE sequence = 1")
        b.context.insert(SyncNote(title: "from b"))
        try b.context.save()
        try await drive(b, cloud, maxRequests: 50)
        #expect(try rawConnection(file).rows("SELECT id FROM cloud_record").count == 2)
        let status = try b.engine.status()
        #expect(status.pendingRecords == 0)
        #expect(!status.isUpToDate)  // the unreadable record stays rejected
    }

    /// Runs one engine against a cloud whose first answer is a rate limit with `milliseconds`; exits non-zero when
    /// the wait exceeds the maximum backoff or the record never uploads (a trap exits with a signal).
    static func retryAfter(_ milliseconds: Int64) throws {
        let device = try Device("A", seed: 1, inMemory: true)
        device.context.insert(SyncNote(title: "t"))
        try device.context.save()
        let cloud = InMemoryCloudDatabase()
        cloud.injectFailure(.rateLimited(retryAfterMilliseconds: milliseconds), for: .any)
        guard let request = try device.engine.nextRequest() else { exit(2) }
        try device.engine.handle(request.id, cloud.performNow(request.operation))
        let wake = device.engine.wakeTime ?? device.clock.nowMilliseconds()
        guard wake - device.clock.nowMilliseconds() <= SyncEngine.Options().maxBackoffMilliseconds else { exit(3) }
        try device.sync(cloud)
        guard cloud.records(in: "notes").count == 1 else { exit(4) }
    }

    @Test("a server asking to retry after an absurd delay never crashes the engine, and the delay is capped")
    func absurdRetryAfter() async throws {
        await #expect(processExitsWith: .success) { try SyncEngineOptionsTests.retryAfter(5) }
        await #expect(processExitsWith: .success) { try SyncEngineOptionsTests.retryAfter(Int64.max) }
        await #expect(processExitsWith: .success) { try SyncEngineOptionsTests.retryAfter(Int64.min) }
        await #expect(processExitsWith: .success) { try SyncEngineOptionsTests.retryAfter(-5) }
    }
}
