// Change tracking in one context: several copies of one record, copies read before a save, and a record deleted and
// inserted again in one save (rows, history and sync ledger).
import Foundation
import Testing
@testable import Replica

@Suite("Change tracking: delete and re-insert in one save")
struct ReinsertInOneSaveTests {
    private static func note(_ id: UUID) -> PersistentIdentifier { PersistentIdentifier(entityName: "SyncNote", id: id) }

    /// The kinds of the changes of record `id` among `changes`, in order.
    private static func kinds(of id: PersistentIdentifier, in changes: [HistoryChange]) -> [String] {
        changes.filter { $0.changedPersistentIdentifier == id }.map { change in
            switch change {
            case .insert: "insert"
            case .update: "update"
            case .delete: "delete"
            }
        }
    }

    @Test("a save that deletes and re-inserts a live record starts a new incarnation: causal length 1 → 3, history delete then insert")
    func deleteAndReinsertInOneSave() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let note = a.context.insert(SyncNote(title: "first", body: "old body", rating: 2))
        try a.context.save()
        let before = try #require(try a.engine.replicationState(of: note.id))
        #expect(before.causalLength == 1)

        a.context.delete(note)
        a.context.insert(SyncNote(id: note.id, title: "second", rating: 5))
        try a.context.save()

        // Rows: the record exists, with the new values.
        #expect(try a.notes() == [SyncNote(id: note.id, title: "second", body: nil, rating: 5)])
        // Ledger: a new incarnation, every field stamped in it, nothing of the old one kept.
        let state = try #require(try a.engine.replicationState(of: note.id))
        #expect(state.causalLength == 3)
        #expect(state.isAlive && state.isPending)
        #expect(state.created.incarnation == 3 && state.created > before.created)
        #expect(Set(state.stamps.keys) == ["title", "body", "rating"])
        #expect(state.stamps.values.allSatisfy { $0.incarnation == 3 })
        #expect(state.tombstone.isEmpty && state.unknownFields.isEmpty && state.redirect == nil)
        // History: one transaction, the delete (with the old incarnation's preserved title) and then the insert.
        let history = try a.context.fetchHistory()
        #expect(history.count == 2)
        #expect(history.last?.changes == [
            .delete(Self.note(note.id), tombstone: HistoryTombstone(values: ["title": .text("first")])),
            .insert(Self.note(note.id)),
        ])
        // Upload: the live record of the new incarnation.
        let upload = try #require(try a.nextUpload(cloud))
        guard case let .modifyRecords(records, _) = upload.operation else { Issue.record("not an upload"); return }
        let record = try #require(records.first { $0.recordID == note.id })
        #expect(record.causalLength == 3 && record.isAlive)
        #expect(record.fields["title"]?.value == .text("second"))
        #expect(record.fields["body"]?.value == .null)
        #expect(record.fields["rating"]?.value == .integer(5))
    }

    @Test("a save that re-inserts an ID deleted by an earlier save: causal length 2 → 3")
    func reinsertAfterAnEarlierDelete() throws {
        let a = try Device("A", seed: 1)
        let note = a.context.insert(SyncNote(title: "first", body: "old body", rating: 2))
        try a.context.save()
        a.context.delete(note)
        try a.context.save()
        #expect(try a.engine.replicationState(of: note.id)?.causalLength == 2)
        a.context.insert(SyncNote(id: note.id, title: "again"))
        try a.context.save()
        let state = try #require(try a.engine.replicationState(of: note.id))
        #expect(state.causalLength == 3 && state.tombstone.isEmpty)
        #expect(state.stamps.values.allSatisfy { $0.incarnation == 3 })
        #expect(try a.notes() == [SyncNote(id: note.id, title: "again", body: nil, rating: 0)])
        #expect(try a.context.fetchHistory().last?.changes == [.insert(Self.note(note.id))])
    }

    @Test("delete, re-insert and update of one record in one save: the update's edits join the new incarnation")
    func deleteReinsertUpdate() throws {
        let a = try Device("A", seed: 1)
        let note = a.context.insert(SyncNote(title: "first", body: "old body", rating: 2))
        try a.context.save()
        a.context.delete(note)
        var again = a.context.insert(SyncNote(id: note.id, title: "second"))
        again.rating = 8
        a.context.update(again)
        var other = again
        other.body = "new body"
        a.context.update(other)
        try a.context.save()
        #expect(try a.notes() == [SyncNote(id: note.id, title: "second", body: "new body", rating: 8)])
        let state = try #require(try a.engine.replicationState(of: note.id))
        #expect(state.causalLength == 3 && state.stamps.values.allSatisfy { $0.incarnation == 3 })
        #expect(try a.context.fetchHistory().last?.changes == [
            .delete(Self.note(note.id), tombstone: HistoryTombstone(values: ["title": .text("first")])),
            .insert(Self.note(note.id)),
        ])
    }

    @Test("an ID that was never stored: insert, delete and insert again in one save is a plain insert")
    func neverStored() throws {
        let a = try Device("A", seed: 1)
        let draft = a.context.insert(SyncNote(title: "draft"))
        a.context.delete(draft)
        a.context.insert(SyncNote(id: draft.id, title: "kept"))
        try a.context.save()
        #expect(try a.notes() == [SyncNote(id: draft.id, title: "kept")])
        let state = try #require(try a.engine.replicationState(of: draft.id))
        #expect(state.causalLength == 1 && state.tombstone.isEmpty)
        #expect(try a.context.fetchHistory().last?.changes == [.insert(Self.note(draft.id))])
    }

    @Test("delete and re-insert of a parent under cascade: the children are deleted, the re-inserted parent stays alive")
    func reinsertParentUnderCascade() throws {
        let a = try Device("A", seed: 1, models: [STrip.self, SItem.self, SStep.self])
        let trip = a.context.insert(STrip(name: "Iceland"))
        let items = (0..<2).map { a.context.insert(SItem(title: "item \($0)", trip: Reference(trip))) }
        try a.context.save()
        a.context.delete(trip)
        a.context.insert(STrip(id: trip.id, name: "Iceland again"))
        try a.context.save()

        let reader = ModelContext(a.container)
        #expect(try reader.fetch(STrip.self).map(\.name) == ["Iceland again"])
        #expect(try reader.fetch(SItem.self).isEmpty)
        #expect(try a.engine.replicationState(of: trip.id)?.causalLength == 3)
        for item in items { #expect(try a.engine.replicationState(of: item.id)?.causalLength == 2) }
        let changes = try #require(try a.context.fetchHistory().last).changes
        let tripID = PersistentIdentifier(entityName: "Trip", id: trip.id)
        // The trip's delete comes before its insert; the items are deleted (before the trip, by the cascade).
        #expect(Self.kinds(of: tripID, in: changes) == ["delete", "insert"])
        #expect(Set(changes.compactMap { if case let .delete(id, _) = $0, id.entityName == "Item" { id.id } else { nil } }) == Set(items.map(\.id)))
    }

    @Test("a child the cascade deletes and the same save inserts again: a new incarnation of the child")
    func reinsertCascadedChild() throws {
        let a = try Device("A", seed: 1, models: [STrip.self, SItem.self, SStep.self])
        let trip = a.context.insert(STrip(name: "Iceland"))
        let item = a.context.insert(SItem(title: "kept", trip: Reference(trip)))
        try a.context.save()
        a.context.delete(trip)
        a.context.insert(SItem(id: item.id, title: "kept alone"))
        try a.context.save()
        #expect(try ModelContext(a.container).fetch(SItem.self).map(\.title) == ["kept alone"])
        #expect(try a.engine.replicationState(of: item.id)?.causalLength == 3)
        #expect(try a.engine.replicationState(of: trip.id)?.causalLength == 2)
        let changes = try #require(try a.context.fetchHistory().last).changes
        let itemID = PersistentIdentifier(entityName: "Item", id: item.id)
        #expect(Self.kinds(of: itemID, in: changes) == ["delete", "insert"])
    }

    @Test("delete and re-insert of a record with a unique attribute, keeping its key")
    func reinsertWithAUniqueKey() throws {
        let a = try Device("A", seed: 1, models: [UTrip.self, UItem.self])
        let trip = a.context.insert(UTrip(name: "Iceland"))
        try a.context.save()
        a.context.delete(trip)
        a.context.insert(UTrip(id: trip.id, name: "Iceland"))
        try a.context.save()
        #expect(try ModelContext(a.container).fetch(UTrip.self).map(\.id) == [trip.id])
        #expect(try a.engine.replicationState(of: trip.id)?.causalLength == 3)
        // Another record still cannot take the key.
        a.context.insert(UTrip(name: "Iceland"))
        #expect(throws: ReplicaError.self) { try a.context.save() }
    }

    @Test("a batch delete beside inserts of the same IDs in one save re-inserts them; the others stay deleted")
    func batchDeleteBesideInserts() throws {
        let a = try Device("A", seed: 1)
        let notes = (0..<3).map { a.context.insert(SyncNote(title: "n\($0)")) }
        try a.context.save()
        #expect(try a.context.delete(model: SyncNote.self) == 3)
        a.context.insert(SyncNote(id: notes[0].id, title: "n0 again"))
        a.context.insert(SyncNote(id: notes[2].id, title: "n2 again"))
        try a.context.save()
        #expect(try a.notes().map(\.title) == ["n0 again", "n2 again"])
        #expect(try notes.map { try a.engine.replicationState(of: $0.id)?.causalLength } == [3, 2, 3])
        // And the other order: inserts (of IDs deleted just now) first, then a batch delete of everything, pending
        // inserts included, then one more insert.
        a.context.insert(SyncNote(id: notes[1].id, title: "n1 again"))
        #expect(try a.context.delete(model: SyncNote.self) == 3)
        a.context.insert(SyncNote(id: notes[2].id, title: "n2 third"))
        try a.context.save()
        #expect(try a.notes().map(\.title) == ["n2 third"])
        #expect(try notes.map { try a.engine.replicationState(of: $0.id)?.causalLength } == [4, 2, 5])
    }

    @Test("delete and re-insert in one save of a local store with a unique key")
    func localStoreReinsert() throws {
        let directory = TestDirectory()
        let container = try ModelContainer(for: Trip.self, Item.self, Note.self, environment: directory.environment())
        let context = ModelContext(container)
        let note = context.insert(Note(text: "old", slug: "slug"))
        try context.save()
        context.delete(note)
        var replacement = Note(text: "new", slug: "slug")
        replacement.id = note.id
        context.insert(replacement)
        try context.save()
        #expect(try ModelContext(container).fetch(Note.self) == [replacement])
        let pid = note.persistentModelID
        #expect(try context.fetchHistory().last?.changes == [.delete(pid, tombstone: HistoryTombstone()), .insert(pid)])
    }
}
