// Undo and redo when other writers (another context, another device through sync) changed the group's records:
// an undo never clobbers a newer edit, never upserts onto another record, and never leaves anything pending.
import Foundation
import Testing
@testable import Replica

private struct UTag: PersistentModel, Codable {
    var id = UUID.unassigned
    var name: String = ""
    var note: String = ""
    static let entity = ModelEntity<UTag>([
        .attribute("name", \.name, default: "", options: .unique),
        .attribute("note", \.note, default: ""),
    ])
}

private func tagContainer() throws -> ModelContainer {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-undo-\(UUID().uuidString)")
    return try ModelContainer(for: Schema([UTag.self]), configurations: [ModelConfiguration("tags", isStoredInMemoryOnly: true)],
                              environment: .seeded(seed: 7, directory: directory))
}

@Suite("Undo against other writers")
struct UndoConflictTests {
    private func context(_ container: ModelContainer) -> ModelContext {
        let context = ModelContext(container)
        context.undoManager = ModelUndoManager()
        return context
    }

    @Test("undo of an edit to a record another context deleted skips that record, sets the rest back, leaves nothing pending; earlier groups stay reachable")
    func deletedElsewhere() throws {
        let container = try observationContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        var a = context.insert(OTask(title: "a"))
        var b = context.insert(OTask(title: "b"))
        try context.save()
        a.title = "a2"
        b.title = "b2"
        context.update(a)
        context.update(b)
        try context.save()
        let other = ModelContext(container)
        other.delete(b)
        try other.save()
        let result = try undo.undo()
        #expect(result.deletedRecords == [b.persistentModelID])
        #expect(!result.isComplete)
        #expect(!context.hasChanges)
        #expect(try ModelContext(container).model(OTask.self, id: a.id)?.title == "a")
        // The context saves again as usual.
        context.insert(OTask(title: "c"))
        try context.save()
        try undo.undo()
        // The first group (the inserts) is still reachable: undoing it deletes a (b is gone already).
        #expect(try undo.undo().isComplete)
        #expect(try ModelContext(container).fetch(OTask.self).isEmpty)
        #expect(!context.hasChanges)
    }

    @Test("undo sets a field back only where it still holds the group's value: another context's newer edit is kept")
    func newerEditKept() throws {
        let container = try observationContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        var task = context.insert(OTask(title: "milk", priority: 1))
        try context.save()
        task.title = "oat milk"
        task.priority = 2
        context.update(task)
        try context.save()
        let other = ModelContext(container)
        var copy = try #require(try other.model(OTask.self, id: task.id))
        copy.title = "soy milk"
        other.update(copy)
        try other.save()
        let result = try undo.undo()
        #expect(result.keptFields == [UndoResult.KeptFields(id: task.persistentModelID, fields: ["title"])])
        var stored = try #require(try ModelContext(container).model(OTask.self, id: task.id))
        #expect(stored.title == "soy milk")
        #expect(stored.priority == 1)
        // Redo sets back what the undo did (priority), not the title.
        #expect(try undo.redo().isComplete)
        stored = try #require(try ModelContext(container).model(OTask.self, id: task.id))
        #expect(stored.title == "soy milk")
        #expect(stored.priority == 2)
    }

    @Test("undo after a newer remote edit of the same field, merged by sync, keeps the remote edit on every device")
    func newerRemoteEditKept() throws {
        let cloud = InMemoryCloudDatabase()
        let p = try Device("P", seed: 61)
        let q = try Device("Q", seed: 62)
        p.context.undoManager = ModelUndoManager()
        var note = p.context.insert(SyncNote(title: "a"))
        try p.context.save()
        try p.sync(cloud)
        try q.sync(cloud)
        p.clock.advance(by: 1_000)
        note.title = "p-edit"
        p.context.update(note)
        try p.context.save()
        q.clock.advance(by: 5_000)
        var copy = try #require(try q.context.model(SyncNote.self, id: note.id))
        copy.title = "q-edit"
        q.context.update(copy)
        try q.context.save()
        try q.sync(cloud)
        try p.sync(cloud)
        #expect(try ModelContext(p.container).model(SyncNote.self, id: note.id)?.title == "q-edit")
        let result = try #require(p.context.undoManager).undo()
        #expect(result.keptFields.map(\.fields) == [["title"]])
        try p.sync(cloud)
        try q.sync(cloud)
        #expect(try ModelContext(p.container).model(SyncNote.self, id: note.id)?.title == "q-edit")
        #expect(try ModelContext(q.container).model(SyncNote.self, id: note.id)?.title == "q-edit")
    }

    @Test("undo of a delete after another record took the unique key fails with the save's unique-constraint error; the other record is untouched, nothing stays pending")
    func uniqueKeyTaken() throws {
        let container = try tagContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        let first = context.insert(UTag(name: "x", note: "first"))
        try context.save()
        context.delete(first)
        try context.save()
        let other = ModelContext(container)
        let second = other.insert(UTag(name: "x", note: "second"))
        try other.save()
        #expect(throws: ReplicaError.modelValidationFailure([
            .uniqueConstraintViolation(entity: "UTag", attributes: ["name"], id: first.persistentModelID),
        ])) { try undo.undo() }
        #expect(!context.hasChanges)
        let tags = try ModelContext(container).fetch(UTag.self)
        #expect(tags.map(\.id) == [second.id])
        #expect(tags.map(\.note) == ["second"])
        // The failed group is dropped; nothing is redone onto the other record.
        #expect(!undo.canRedo)
        try undo.redo()
        #expect(try ModelContext(container).fetch(UTag.self).map(\.note) == ["second"])
        context.insert(UTag(name: "y"))
        try context.save()
    }

    @Test("undo of a delete re-inserts the record as itself; redo deletes it again, leaving another record alone")
    func undoDeleteRedoDeletes() throws {
        let container = try tagContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        let first = context.insert(UTag(name: "x", note: "first"))
        try context.save()
        context.delete(first)
        try context.save()
        let other = ModelContext(container)
        var second = other.insert(UTag(name: "x", note: "second"))
        try other.save()
        second.name = "z"
        other.update(second)
        try other.save()
        try undo.undo()
        let reader = ModelContext(container)
        #expect(try reader.model(UTag.self, id: first.id)?.note == "first")
        #expect(try reader.model(UTag.self, id: second.id)?.note == "second")
        try undo.redo()
        #expect(try ModelContext(container).fetch(UTag.self).map(\.id) == [second.id])
    }

    @Test("undo of an insert after another context edited the new record keeps the record with that edit and reports it; redo has nothing to insert again")
    func insertEditedElsewhereKept() throws {
        let container = try tagContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        let tag = context.insert(UTag(name: "x", note: "c1"))
        try context.save()
        let other = ModelContext(container)
        var copy = try #require(try other.model(UTag.self, id: tag.id))
        copy.note = "c2 wrote a long note later"
        other.update(copy)
        try other.save()
        let result = try undo.undo()
        #expect(result.keptRecords == [UndoResult.KeptFields(id: tag.persistentModelID, fields: ["note"])])
        #expect(result.deletedRecords.isEmpty && result.keptFields.isEmpty)
        #expect(!result.isComplete)
        #expect(!context.hasChanges)
        #expect(try ModelContext(container).fetch(UTag.self).map { "\($0.name)/\($0.note)" } == ["x/c2 wrote a long note later"])
        // Nothing was undone, so nothing is redone: no second record, no error.
        #expect(!undo.canRedo)
        #expect(try undo.redo().isComplete)
        #expect(try ModelContext(container).fetch(UTag.self).map { "\($0.name)/\($0.note)" } == ["x/c2 wrote a long note later"])
        context.insert(UTag(name: "y"))
        try context.save()
    }

    @Test("undo of a group that inserted records, one of them edited elsewhere later, deletes the others and keeps that one; redo inserts only the deleted ones")
    func groupInsertPartlyKept() throws {
        let container = try tagContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        undo.beginUndoGrouping()
        var a = context.insert(UTag(name: "a", note: "1"))
        let b = context.insert(UTag(name: "b", note: "1"))
        try context.save()
        // The group's own later edit of a is what a holds: a is still the group's.
        a.note = "2"
        context.update(a)
        try context.save()
        undo.endUndoGrouping()
        let other = ModelContext(container)
        var copy = try #require(try other.model(UTag.self, id: b.id))
        copy.name = "b-renamed"
        other.update(copy)
        try other.save()
        let result = try undo.undo()
        #expect(result.keptRecords == [UndoResult.KeptFields(id: b.persistentModelID, fields: ["name"])])
        #expect(try ModelContext(container).fetch(UTag.self).map(\.name) == ["b-renamed"])
        let redone = try undo.redo()
        #expect(redone.isComplete)
        #expect(try Set(ModelContext(container).fetch(UTag.self).map { "\($0.name)/\($0.note)" }) == ["a/2", "b-renamed/1"])
    }

    @Test("redo of an undone delete keeps the re-inserted record when another context edited it since, and reports it")
    func redoDeleteOfEditedRecordKept() throws {
        let container = try tagContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        let tag = context.insert(UTag(name: "x", note: "first"))
        try context.save()
        context.delete(tag)
        try context.save()
        try undo.undo()
        let other = ModelContext(container)
        var copy = try #require(try other.model(UTag.self, id: tag.id))
        copy.note = "edited after the undo"
        other.update(copy)
        try other.save()
        let result = try undo.redo()
        #expect(result.keptRecords == [UndoResult.KeptFields(id: tag.persistentModelID, fields: ["note"])])
        #expect(try ModelContext(container).fetch(UTag.self).map(\.note) == ["edited after the undo"])
    }

    @Test("undo of an insert nobody else touched deletes it, external-storage and inline data included")
    func untouchedInsertDeleted() throws {
        let directory = TestDirectory()
        let container = try ModelContainer(for: Schema([Scan.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3))
        let context = context(container)
        let undo = try #require(context.undoManager)
        context.insert(Scan(title: "s", image: Data((0..<20_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }), thumbnail: Data([1, 2, 3])))
        try context.save()
        #expect(try undo.undo().isComplete)
        #expect(try ModelContext(container).fetch(Scan.self).isEmpty)
        try undo.redo()
        #expect(try ModelContext(container).fetch(Scan.self).map(\.title) == ["s"])
    }
}
