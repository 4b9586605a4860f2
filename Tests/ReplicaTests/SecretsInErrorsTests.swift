import Foundation
import Testing
@testable import Replica

/// Principle 7: attribute values never appear in errors, ledger reasons or statuses — including on the paths that
/// report malformed data, where the value is the very thing that is wrong.
@Suite("Secrets in errors")
struct SecretsInErrorsTests {
    static let secret = "hunter2-correct-horse-battery"

    private func expectNoSecret(_ texts: [String], sourceLocation: SourceLocation = #_sourceLocation) {
        for text in texts { #expect(!text.contains(Self.secret), "leaked: \(text)", sourceLocation: sourceLocation) }
    }

    @Test("a received field of the wrong type holding a secret: the ledger reason and status name the field only")
    func wrongTypeReason() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        let bad = noteRecord(UUID(), stamp: foreignStamp(seededStart + 5), rating: .text(Self.secret))
        try device.deliver([bad], cloud: cloud)
        let entries = try device.engine.ledgerEntries()
        #expect(entries.count == 1)
        expectNoSecret(entries.map { "\($0)" } + [String(reflecting: try device.engine.status())])
    }

    @Test("a stored value that cannot be read as its type: the error names the attribute and storage class only")
    func valueConversionError() throws {
        let directory = TestDirectory()
        do {
            let container = try ModelContainer(for: CodeV2.self, environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(CodeV2(value: Self.secret))
            try context.save()
        }
        // Another tool rewrites the value as a blob: the next read fails.
        try rawConnection(directory.storeURL()).execute("UPDATE Code SET value = CAST(value AS BLOB)")
        let container = try ModelContainer(for: CodeV2.self, environment: directory.environment(seed: 2))
        do {
            _ = try ModelContext(container).fetch(CodeV2.self)
            Issue.record("expected a value conversion error")
        } catch {
            expectNoSecret(["\(error)", String(reflecting: error), error.localizedDescription])
        }
    }

    @Test("an unreadable record in the cloud file holding a secret: its rejection names the record only")
    func unreadableCloudRecordReason() async throws {
        let root = temporaryTestDirectory()
        let file = root.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: file)
        let a = try Device("A", seed: 1, directory: root.appendingPathComponent("a"))
        a.context.insert(SyncNote(title: Self.secret))
        try a.context.save()
        try await drive(a, cloud)
        try rawConnection(file).execute("UPDATE cloud_record SET record = substr(record, 1, length(record) - 3)")
        let b = try Device("B", seed: 2, directory: root.appendingPathComponent("b"))
        try await drive(b, cloud, maxRequests: 10)
        let status = try b.engine.status()
        #expect(status.rejectedRecords == 1)
        let entries = try b.engine.ledgerEntries()
        #expect(entries.count == 1)
        expectNoSecret([String(reflecting: status), "\(String(describing: status.lastError))", String(describing: entries)])
    }

    @Test("requests, records and statuses print without the values they carry (what a driver would log)")
    func requestsPrintWithoutValues() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        device.context.insert(SyncNote(title: Self.secret, body: Self.secret))
        try device.context.save()
        let upload = try #require(try device.nextUpload(cloud))
        let answer = cloud.performNow(upload.operation)
        try device.engine.handle(upload.id, answer)
        let history = try device.context.fetchHistory()
        expectNoSecret([String(describing: upload), String(reflecting: upload), String(describing: answer),
                        String(describing: cloud.records(in: "notes")), String(describing: history),
                        String(describing: try device.engine.ledgerEntries())])
    }
}
