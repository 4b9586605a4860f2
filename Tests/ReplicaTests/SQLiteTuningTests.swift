import CSQLite
import Foundation
import Testing
@testable import Replica

/// Replica leaves process-wide SQLite settings alone unless the app opts in (`SQLiteTuning`).
@Suite("SQLite tuning")
struct SQLiteTuningTests {
    @Test("opening stores leaves SQLite's memory statistics on; opting out after SQLite started changes nothing")
    func memoryStatisticsAreTheAppsChoice() throws {
        let container = try ModelContainer(for: SyncNote.self, configurations: ModelConfiguration("tuning", isStoredInMemoryOnly: true))
        let context = ModelContext(container)
        context.insert(SyncNote(title: "counted"))
        try context.save()
        // Opening and writing a store did not turn the statistics off (nothing in this test process does before).
        #expect(sqlite3_memory_used() > 0)
        // SQLite is initialized now, so the opt-out reports that it could not take effect...
        #expect(SQLiteTuning.disableMemoryStatistics() == false)
        // ...and the statistics, and the stores, keep working.
        #expect(sqlite3_memory_used() > 0)
        #expect(try ModelContext(container).fetch(FetchDescriptor<SyncNote>()).map(\.title) == ["counted"])
    }
}
