// Undo and redo of saves through ModelUndoManager: each undo is a new save (history, change stream, sync).
import Foundation
import Testing
@_spi(Simulation) @testable import Replica

@Suite("Undo and redo")
struct UndoTests {
    private func context(_ container: ModelContainer) -> ModelContext {
        let context = ModelContext(container)
        context.undoManager = ModelUndoManager()
        return context
    }

    @Test("undoing an insert deletes the record; redo inserts it again with its values")
    func insert() throws {
        let container = try observationContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        #expect(!undo.canUndo)
        let list = context.insert(OList(name: "Groceries"))
        try context.save()
        #expect(undo.canUndo && !undo.canRedo)
        try undo.undo()
        #expect(try ModelContext(container).model(OList.self, id: list.id) == nil)
        #expect(!undo.canUndo && undo.canRedo)
        try undo.redo()
        #expect(try ModelContext(container).model(OList.self, id: list.id)?.name == "Groceries")
        #expect(undo.canUndo && !undo.canRedo)
    }

    @Test("undo with an unsaved edit pending undoes that edit (saved first as its own change), not the save before it; redo brings the edit back")
    func undoWithUnsavedEdit() throws {
        let container = try observationContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        var task = context.insert(OTask(title: "milk", priority: 1))
        try context.save()
        task.priority = 2
        context.update(task)
        try undo.undo()
        #expect(!context.hasChanges)
        #expect(try ModelContext(container).model(OTask.self, id: task.id)?.priority == 1)
        try undo.redo()
        #expect(try ModelContext(container).model(OTask.self, id: task.id)?.priority == 2)
        // The insert is still there to undo.
        try undo.undo()
        try undo.undo()
        #expect(try ModelContext(container).model(OTask.self, id: task.id) == nil)
    }

    @Test("redo with an unsaved edit pending saves it as a new change, which clears the redo stack: the edit is kept")
    func redoWithUnsavedEdit() throws {
        let container = try observationContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        var task = context.insert(OTask(title: "milk", priority: 1))
        try context.save()
        task.title = "oat milk"
        context.update(task)
        try context.save()
        try undo.undo()
        task.title = "soy milk"
        context.update(task)
        try undo.redo()
        #expect(!undo.canRedo)
        #expect(try ModelContext(container).model(OTask.self, id: task.id)?.title == "soy milk")
    }

    @Test("undoing an update sets the fields it changed back, and only those")
    func update() throws {
        let container = try observationContainer()
        let context = context(container)
        var task = context.insert(OTask(title: "milk", priority: 1))
        try context.save()
        task.title = "oat milk"
        context.update(task)
        try context.save()
        // Another context changes another field meanwhile: the undo keeps it.
        let other = ModelContext(container)
        var copy = try #require(try other.model(OTask.self, id: task.id))
        copy.priority = 5
        other.update(copy)
        try other.save()
        try context.undoManager?.undo()
        let restored = try #require(try ModelContext(container).model(OTask.self, id: task.id))
        #expect(restored.title == "milk")
        #expect(restored.priority == 5)
        try context.undoManager?.redo()
        #expect(try ModelContext(container).model(OTask.self, id: task.id)?.title == "oat milk")
    }

    @Test("undoing a cascading delete brings back the record and the children the cascade deleted")
    func cascadeDelete() throws {
        let container = try observationContainer()
        let context = context(container)
        let list = context.insert(OList(name: "Groceries"))
        let tasks = ["milk", "bread"].map { context.insert(OTask(title: $0, list: Reference(list))) }
        try context.save()
        context.delete(list)
        try context.save()
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OTask>()) == 0)
        try context.undoManager?.undo()
        let reader = ModelContext(container)
        #expect(try reader.model(OList.self, id: list.id)?.tasks.map(\.id).sorted { $0.bytesPrecede($1) } == tasks.map(\.id))
        #expect(try reader.fetch(OTask.self).allSatisfy { $0.list?.id == list.id })
    }

    @Test("an explicit group undoes several saves at once; levelsOfUndo bounds the stack; a new save clears redo")
    func groupsAndLevels() throws {
        let container = try observationContainer()
        let context = context(container)
        let undo = try #require(context.undoManager)
        undo.beginUndoGrouping()
        var list = context.insert(OList(name: "a"))
        try context.save()
        list.name = "b"
        context.update(list)
        try context.save()
        undo.endUndoGrouping()
        try undo.undo()
        #expect(try ModelContext(container).model(OList.self, id: list.id) == nil)
        #expect(!undo.canUndo)
        // A new save after an undo clears the redo stack.
        context.insert(OTag(label: "x"))
        try context.save()
        #expect(!undo.canRedo)
        undo.levelsOfUndo = 2
        for label in ["y", "z", "w"] {
            context.insert(OTag(label: label))
            try context.save()
        }
        try undo.undo()
        try undo.undo()
        #expect(!undo.canUndo)
        #expect(try ModelContext(container).fetch(OTag.self).map(\.label).sorted() == ["x", "y"])
    }

    @Test("undo saves are announced on the change stream like any other")
    func announced() async throws {
        let container = try observationContainer()
        let context = context(container)
        let iterator = container.changes.makeAsyncIterator()
        let list = context.insert(OList(name: "a"))
        try context.save()
        try context.undoManager?.undo()
        let events = try await nextEvents(iterator, count: 2).compactMap(\.change)
        #expect(events.map(\.origin) == [.localSave, .localSave])
        #expect(events[1].deletedIdentifiers == [list.persistentModelID])
    }

    @Test("undoing a synced change is a new change with new stamps: it replicates to another device")
    func syncedUndoReplicates() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 51)
        let b = try Device("B", seed: 52)
        a.context.undoManager = ModelUndoManager()
        var note = a.context.insert(SyncNote(title: "draft"))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        a.clock.advance(by: 1_000)
        note.title = "final"
        a.context.update(note)
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try ModelContext(b.container).model(SyncNote.self, id: note.id)?.title == "final")
        let stampBefore = try #require(try a.engine.replicationStamps(of: note.id)?.stamps["title"])
        a.clock.advance(by: 1_000)
        try a.context.undoManager?.undo()
        let stampAfter = try #require(try a.engine.replicationStamps(of: note.id)?.stamps["title"])
        #expect(stampBefore < stampAfter)
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try ModelContext(b.container).model(SyncNote.self, id: note.id)?.title == "draft")
        // Undoing a delete re-inserts the record on every device (a new incarnation).
        a.context.delete(note)
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try ModelContext(b.container).model(SyncNote.self, id: note.id) == nil)
        try a.context.undoManager?.undo()
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try ModelContext(b.container).model(SyncNote.self, id: note.id)?.title == "draft")
        #expect(try a.engine.replicationStamps(of: note.id)?.causalLength == 3)
    }
}
