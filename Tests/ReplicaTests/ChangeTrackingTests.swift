// Change tracking in one context: several copies of one record, copies read before a save, and a record deleted and
// inserted again in one save (rows, history and sync ledger).
import Foundation
import Testing
@testable import Replica

/// A local model with three independent fields, for the copy tests.
struct CopyNote: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var rating: Int = 0
    static let entity = ModelEntity<CopyNote>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body),
        .attribute("rating", \.rating, default: 0),
    ])
}

@Suite("Change tracking: copies and re-inserts")
struct ChangeTrackingTests {
    let directory = TestDirectory()

    private func container() throws -> ModelContainer {
        try ModelContainer(for: CopyNote.self, environment: directory.environment())
    }

    /// A stored note and a fresh context on the same container.
    private func storedNote(_ container: ModelContainer, title: String = "t", body: String? = "b0", rating: Int = 1) throws -> CopyNote {
        let setup = ModelContext(container)
        let note = setup.insert(CopyNote(title: title, body: body, rating: rating))
        try setup.save()
        return note
    }

    private func stored(_ container: ModelContainer, _ id: UUID) throws -> CopyNote? {
        try ModelContext(container).model(CopyNote.self, id: id)
    }

    // MARK: Several copies in one context

    @Test("two copies of one record edited in one context both keep their edits")
    func twoCopiesInOneSave() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        var c1 = try #require(try context.model(CopyNote.self, id: note.id))
        var c2 = c1
        c1.rating = 7
        context.update(c1)
        c2.body = "b"
        context.update(c2)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "t", body: "b", rating: 7))
        // History names both fields.
        let last = try #require(try context.fetchHistory().last)
        #expect(last.changes == [.update(note.persistentModelID, updatedAttributes: ["body", "rating"])])
    }

    @Test("copies fetched separately count as copies of one version; a later change of the same field wins")
    func laterChangeOfTheSameFieldWins() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        var c1 = try #require(try context.model(CopyNote.self, id: note.id))
        var c2 = try #require(try context.fetch(CopyNote.self).first)
        c1.rating = 7
        c1.title = "one"
        context.update(c1)
        c2.rating = 9
        context.update(c2)
        // The pending state is what a fetch with pending changes shows.
        #expect(try context.model(CopyNote.self, id: note.id) == CopyNote(id: note.id, title: "one", body: "b0", rating: 9))
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "one", body: "b0", rating: 9))
    }

    @Test("a copy read before the context saved another edit writes only its own edits")
    func copyReadBeforeASave() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        var a = try #require(try context.model(CopyNote.self, id: note.id))
        var b = try #require(try context.model(CopyNote.self, id: note.id))
        a.rating = 7
        context.update(a)
        try context.save()
        b.body = "x"
        context.update(b)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "t", body: "x", rating: 7))
        let last = try #require(try context.fetchHistory().last)
        #expect(last.changes == [.update(note.persistentModelID, updatedAttributes: ["body"])])

        // The same copy, changed again after its own save: only the new edit counts.
        a.title = "a again"
        context.update(a)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "a again", body: "x", rating: 7))
    }

    @Test("a copy of the newest state writes only its new edits; a copy of the first read, only its own")
    func copyOfTheNewestState() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        let read = try #require(try context.model(CopyNote.self, id: note.id))
        var first = read
        first.rating = 2
        context.update(first)
        try context.save()
        var newest = try #require(try context.model(CopyNote.self, id: note.id))
        #expect(newest.rating == 2)
        newest.title = "new title"
        context.update(newest)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "new title", body: "b0", rating: 2))
        // A stale copy of the first read, two saves later, still writes only its own edit.
        var stale = read
        stale.body = "stale body"
        context.update(stale)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "new title", body: "stale body", rating: 2))
    }

    @Test("a value saved and set back on the same copy is written: toggles work, also repeatedly")
    func toggleSavedAndSetBack() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        var copy = try #require(try context.model(CopyNote.self, id: note.id))
        for rating in [7, 1, 7, 1, 7] {
            copy.rating = rating
            context.update(copy)
            try context.save()
            #expect(try stored(container, note.id)?.rating == rating)
        }
        // Each save wrote the field: history names it every time.
        let updates = try context.fetchHistory().suffix(5).map(\.changes)
        #expect(updates == Array(repeating: [.update(note.persistentModelID, updatedAttributes: ["rating"])], count: 5))
    }

    @Test("an unedited stale copy updated after a save of another copy writes nothing")
    func uneditedStaleCopyWritesNothingWithoutASave() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        let stale = try #require(try context.model(CopyNote.self, id: note.id))
        // Another context changed the record and this one read it again: no save of this context is newer than the
        // stale copy's version, so the copy equal to it is read as that version.
        let other = ModelContext(container)
        var changed = try #require(try other.model(CopyNote.self, id: note.id))
        changed.rating = 5
        other.update(changed)
        try other.save()
        _ = try context.model(CopyNote.self, id: note.id)
        context.update(stale)
        try context.save()
        #expect(try stored(container, note.id)?.rating == 5)
    }

    @Test("the ambiguous case: a value set back beside other edits is read as a stale copy; update(_:from:) says which")
    func setBackBesideOtherEditsAndTheExplicitOriginal() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        var copy = try #require(try context.model(CopyNote.self, id: note.id))
        copy.rating = 7
        context.update(copy)
        try context.save()
        // Set back and edit another field: nearest the first read (as a stale copy with an edit is), so only the
        // other edit is written.
        var edited = copy
        edited.rating = 1
        edited.title = "edited"
        context.update(edited)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "edited", body: "b0", rating: 7))
        // With the copy the edit started from, both fields are the app's edits.
        let original = try #require(try context.model(CopyNote.self, id: note.id))
        var again = original
        again.rating = 1
        again.title = "again"
        context.update(again, from: original)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "again", body: "b0", rating: 1))
        // update(_:from:) writes only what differs from the original: a stale original's other fields stay.
        let other = ModelContext(container)
        var changed = try #require(try other.model(CopyNote.self, id: note.id))
        changed.body = "other"
        other.update(changed)
        try other.save()
        var late = original
        late.title = "late"
        context.update(late, from: original)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "late", body: "other", rating: 1))
    }

    @Test("a stale copy saved after another context changed the record, and this context read it again, keeps the other change")
    func staleCopyAfterAnotherWriterAndARefetch() throws {
        let container = try container()
        let note = try storedNote(container)
        let mine = ModelContext(container)
        var stale = try #require(try mine.model(CopyNote.self, id: note.id))
        let other = ModelContext(container)
        var theirs = try #require(try other.model(CopyNote.self, id: note.id))
        theirs.title = "by the other writer"
        other.update(theirs)
        try other.save()
        // This context reads the record again (e.g. a list refreshed), then saves the copy it read first.
        let fresh = try #require(try mine.fetch(CopyNote.self).first)
        #expect(fresh.title == "by the other writer")
        stale.rating = 5
        mine.update(stale)
        try mine.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "by the other writer", body: "b0", rating: 5))
    }

    @Test("two copies of a pending insert both keep their edits")
    func twoCopiesOfAPendingInsert() throws {
        let container = try container()
        let context = ModelContext(container)
        let inserted = context.insert(CopyNote(title: "t", body: "b0", rating: 1))
        var c1 = inserted, c2 = inserted
        c1.rating = 7
        context.update(c1)
        c2.body = "b"
        context.update(c2)
        #expect(context.insertedIdentifiers == [inserted.persistentModelID])
        try context.save()
        #expect(try stored(container, inserted.id) == CopyNote(id: inserted.id, title: "t", body: "b", rating: 7))
        let last = try #require(try context.fetchHistory().last)
        #expect(last.changes == [.insert(inserted.persistentModelID)])
    }

    @Test("a copy of a record this context never read writes every field that differs; the state it saved is a version")
    func copyWithoutABase() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        // Built by the app, not read through this context: it has no base, so all of its fields are its own.
        var built = CopyNote(id: note.id, title: "t", body: nil, rating: 3)
        context.update(built)
        try context.save()
        #expect(try stored(container, note.id) == built)
        // Another writer changes the title; the same copy, edited again, writes only its new edit.
        let writer = ModelContext(container)
        writer.update(CopyNote(id: note.id, title: "w", body: nil, rating: 3))
        try writer.save()
        built.rating = 4
        context.update(built)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "w", body: nil, rating: 4))
    }

    @Test("a context keeps the last versions of a record: a copy older than all of them compares with the oldest kept")
    func versionsAreBounded() throws {
        let container = try container()
        let note = try storedNote(container, rating: 0)
        let context = ModelContext(container)
        let first = try #require(try context.model(CopyNote.self, id: note.id))
        var copy = first
        for rating in 1...ReadRegistry.versionLimit {
            copy.rating = rating
            context.update(copy)
            try context.save()
        }
        // The first read is no longer kept: a stale copy of it with a new title writes its title, and its rating too
        // (it differs from every version kept).
        var stale = first
        stale.title = "stale"
        context.update(stale)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "stale", body: "b0", rating: 0))
    }

    @Test("updates of copies a streaming enumeration hands out, batch after batch, and of copies read before it")
    func enumerationCopies() throws {
        let container = try container()
        let setup = ModelContext(container)
        let notes = (0..<6_000).map { setup.insert(CopyNote(title: "n\($0)", body: "b", rating: $0)) }
        try setup.save()
        let context = ModelContext(container)
        // A copy read before the enumeration, edited in another field afterwards.
        var early = try #require(try context.model(CopyNote.self, id: notes[10].id))
        // Many small batches: the index of copies drops the batches each turn leaves behind (and is rebuilt).
        try context.enumerate(FetchDescriptor<CopyNote>(), batchSize: 50) { note in
            var copy = note
            copy.rating += 1
            context.update(copy)
        }
        early.title = "early"
        context.update(early)
        try context.save()
        let stored = try ModelContext(container).fetch(CopyNote.self)
        #expect(stored.count == notes.count)
        #expect(stored.allSatisfy { $0.rating == Int($0.title.dropFirst()).map { $0 + 1 } ?? 11 })
        #expect(try self.stored(container, notes[10].id) == CopyNote(id: notes[10].id, title: "early", body: "b", rating: 11))
    }

    // MARK: Update after delete

    /// A context on an in-memory container (nothing on disk: a trapping child process cannot clean up).
    static func memoryContext() throws -> ModelContext {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        let container = try ModelContainer(for: CopyNote.self, configurations: ModelConfiguration("notes", isStoredInMemoryOnly: true),
                                           environment: environment)
        return ModelContext(container)
    }

    @Test("update of a record deleted in the same context traps, and the message recommends a re-insert, which keeps the data")
    func updateAfterDeleteTraps() async throws {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let context = try ChangeTrackingTests.memoryContext()
            let note = context.insert(CopyNote(title: "t"))
            try context.save()
            context.delete(note)
            context.update(note)
        }
        let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("deleted"), "\(message)")
        #expect(message.contains("insert(_:)"), "\(message)")
        #expect(message.contains("rollback()"), "\(message)")
    }

    @Test("the re-insert that the update-after-delete message recommends keeps the record with the copy's values")
    func reinsertInsteadOfUpdateAfterDelete() throws {
        let container = try container()
        let note = try storedNote(container)
        let context = ModelContext(container)
        var copy = try #require(try context.model(CopyNote.self, id: note.id))
        context.delete(copy)
        copy.rating = 9
        context.insert(copy)
        try context.save()
        #expect(try stored(container, note.id) == CopyNote(id: note.id, title: "t", body: "b0", rating: 9))
    }
}

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
        // Another record still cannot take the key: its insert is an upsert of the re-inserted record (R15).
        a.context.insert(UTrip(name: "Iceland"))
        try a.context.save()
        #expect(try ModelContext(a.container).fetch(UTrip.self).map(\.id) == [trip.id])
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
