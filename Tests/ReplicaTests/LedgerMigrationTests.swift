// Stores written before the compact `stamps` form hold JSON text in that column. They must open, read and merge
// exactly as before, and every row a change touches is rewritten in the compact form (SQLite columns are dynamically
// typed, so old and new rows live side by side).
import Foundation
import Testing
@testable import Replica

@Suite("Ledger: stores written in the JSON stamps form")
struct LedgerMigrationTests {
    /// Rewrites the `stamps` column of every ledger row (but `except`) the way earlier versions wrote it: JSON text.
    static func rewriteAsJSON(_ engine: SyncEngine, except: Set<UUID> = []) throws {
        for state in try engine.replicationStates() where !except.contains(state.id.id) {
            try engine.db.run("UPDATE replica_sync_record SET stamps = ? WHERE id = ?",
                              [.text(LedgerCodingTests.slowJSON(state.stamps)), state.id.id.sqliteValue])
        }
    }

    /// The storage class of each ledger row's `stamps` column, by record ID.
    static func forms(_ engine: SyncEngine) throws -> [UUID: String] {
        var result: [UUID: String] = [:]
        for row in try engine.db.rows("SELECT id, typeof(stamps) FROM replica_sync_record") {
            if case let .text(form) = row[1] { result[try UUID(sqliteValue: row[0])] = form }
        }
        return result
    }

    @Test("a JSON-form ledger opens and reads as before; merges and saves rewrite the rows they touch")
    func jsonLedgerMigrates() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-ledger-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        var notes: [SyncNote] = []
        let before: [ReplicationState]
        do {
            let a = try Device("A", seed: 1, directory: directory)
            for (index, title) in ["one", "two", "three", "four"].enumerated() {
                a.clock.advance(by: 10)
                notes.append(a.context.insert(SyncNote(title: title, body: index == 0 ? nil : "body \(index)", rating: index)))
                try a.context.save()
            }
            try a.sync(cloud)
            try a.sync(cloud)  // fetches its own uploads back: later syncs fetch only what others write
            #expect(Set(try Self.forms(a.engine).values) == ["blob"])
            before = try a.engine.replicationStates()
            // Every row but the last in the old form: a store in the middle of its migration.
            try Self.rewriteAsJSON(a.engine, except: [notes[3].id])
            #expect(try Self.forms(a.engine) == [notes[0].id: "text", notes[1].id: "text", notes[2].id: "text", notes[3].id: "blob"])
            #expect(try a.engine.replicationStates() == before)
        }

        // Reopened: the inspection API reads both forms.
        let a = try Device("A again", seed: 11, directory: directory)
        #expect(try a.engine.replicationStates() == before)
        #expect(try a.notes().map(\.title) == ["one", "two", "three", "four"])

        // Another device edits the first note's title; merging it here rewrites that row only.
        let b = try Device("B", seed: 2)
        try b.sync(cloud)
        b.clock.set(milliseconds: a.clock.nowMilliseconds() + 60_000)
        var edited = try #require(try b.notes().first { $0.id == notes[0].id })
        edited.title = "one, edited on B"
        b.context.update(edited)
        try b.context.save()
        try b.sync(cloud)
        try a.sync(cloud)
        let merged = try #require(try a.engine.replicationState(of: notes[0].id))
        let old = try #require(before.first { $0.id.id == notes[0].id })
        #expect(merged.stamps["title"] != old.stamps["title"])
        #expect(merged.stamps["title"] == (try b.engine.replicationState(of: notes[0].id))?.stamps["title"])
        #expect(merged.stamps["body"] == old.stamps["body"] && merged.stamps["rating"] == old.stamps["rating"])
        #expect(try a.notes().first { $0.id == notes[0].id }?.title == "one, edited on B")
        #expect(try Self.forms(a.engine) == [notes[0].id: "blob", notes[1].id: "text", notes[2].id: "text", notes[3].id: "blob"])

        // A local edit of a JSON-form row stamps only the changed field and rewrites the row.
        a.clock.advance(by: 120_000)
        var local = try #require(try a.notes().first { $0.id == notes[1].id })
        local.rating = 42
        a.context.update(local)
        try a.context.save()
        let saved = try #require(try a.engine.replicationState(of: notes[1].id))
        let savedBefore = try #require(before.first { $0.id.id == notes[1].id })
        #expect(saved.stamps["rating"]! > savedBefore.stamps["rating"]!)
        #expect(saved.stamps["title"] == savedBefore.stamps["title"] && saved.stamps["body"] == savedBefore.stamps["body"])
        #expect(try Self.forms(a.engine)[notes[1].id] == "blob")

        // The devices converge, and the rows neither touched keep reading as before.
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try a.notes() == b.notes())
        #expect(try a.engine.replicationState(of: notes[2].id) == before.first { $0.id.id == notes[2].id })
        for id in notes.map(\.id) {
            #expect(try a.engine.replicationState(of: id)?.stamps == b.engine.replicationState(of: id)?.stamps)
        }
    }

    @Test("changed defaults reach the unstamped fields of a JSON-form ledger (R8)")
    func changedDefaultsOnJSONLedger() throws {
        let cloud = InMemoryCloudDatabase()
        let old = try Device("v1", seed: 1, models: [MoodNoteV1.self])
        old.context.insert(MoodNoteV1(title: "written before moods existed"))
        try old.context.save()
        try old.sync(cloud)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-ledger-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            let upgraded = try Device("v2", seed: 2, models: [MoodNoteV2.self], version: Schema.Version(2, 0, 0), directory: directory)
            try upgraded.sync(cloud)
            upgraded.context.insert(MoodNoteV2(title: "with a mood", mood: "grumpy"))
            try upgraded.context.save()
            #expect(try ModelContext(upgraded.container).fetch(MoodNoteV2.self).map(\.mood).sorted() == ["calm", "grumpy"])
            try Self.rewriteAsJSON(upgraded.engine)
            #expect(Set(try Self.forms(upgraded.engine).values) == ["text"])
        }
        let reopened = try Device("v3", seed: 3, models: [MoodNoteV3.self], version: Schema.Version(3, 0, 0), directory: directory)
        let moods = try ModelContext(reopened.container).fetch(MoodNoteV3.self).map { "\($0.title): \($0.mood)" }.sorted()
        #expect(moods == ["with a mood: grumpy", "written before moods existed: happy"])
    }
}
