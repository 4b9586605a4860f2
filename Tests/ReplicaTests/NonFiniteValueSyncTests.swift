import Foundation
import Testing
@testable import Replica

@Suite("Non-finite values in sync")
struct NonFiniteValueSyncTests {
    @Test("an infinite double syncs through the SQLite cloud file and never makes the zone unreadable")
    func infinityThroughCloudFile() async throws {
        let root = temporaryTestDirectory()
        let cloud = try SQLiteCloudDatabase(url: root.appendingPathComponent("cloud.sqlite"))
        let a = try Device("A", seed: 1, models: [AdvMeasure.self], directory: root.appendingPathComponent("a"))
        let b = try Device("B", seed: 2, models: [AdvMeasure.self], directory: root.appendingPathComponent("b"))
        a.context.insert(AdvMeasure(label: "finite", value: 1))
        a.context.insert(AdvMeasure(label: "infinite", value: .infinity))
        try a.context.save()
        try await drive(a, cloud)
        try await drive(b, cloud)
        let seen = try ModelContext(b.container).fetch(AdvMeasure.self).map { "\($0.label)=\($0.value)" }
        #expect(seen == ["finite=1.0", "infinite=inf"])
        #expect(try b.engine.status().isUpToDate)
    }

    @Test("a deleted record's preserved infinite double stays in its tombstone")
    func infinityInTombstone() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: [AdvMeasure.self])
        let m = a.context.insert(AdvMeasure(label: "gone", value: -.infinity))
        try a.context.save()
        try a.sync(cloud)
        a.context.delete(m)
        try a.context.save()
        try a.sync(cloud)
        let tombstone = try #require(cloud.records(in: "notes").first)
        #expect(!tombstone.isAlive)
        #expect(tombstone.fields["label"]?.value == .text("gone"))
        #expect(tombstone.fields["value"]?.value == .real(-.infinity))
        // History keeps the preserved values too.
        let deletes = try a.context.fetchHistory().flatMap(\.changes).compactMap { change -> HistoryTombstone? in
            if case let .delete(_, tombstone) = change { return tombstone } else { return nil }
        }
        #expect(deletes.first?["label"] == .text("gone"))
        #expect(deletes.first?["value"] == .real(-.infinity))
    }

    @Test("a composite attribute holding an infinite double never traps, and reads back")
    func infinityInComposite() async throws {
        await #expect(processExitsWith: .success) {
            let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
            let container = try ModelContainer(for: AdvPlace.self, configurations: ModelConfiguration("p", isStoredInMemoryOnly: true),
                                               environment: environment)
            let context = ModelContext(container)
            let place = context.insert(AdvPlace(point: AdvPoint(x: .infinity, y: 1)))
            try context.save()
            guard try ModelContext(container).model(AdvPlace.self, id: place.id)?.point == AdvPoint(x: .infinity, y: 1) else { exit(3) }
        }
    }
}
