// Undo managers and the contexts they serve: a manager that outlives its context, one manager for two contexts.
import Foundation
import Testing
@testable import Replica

@Suite("Undo managers and contexts")
struct UndoContextsTests {
    @Test("a manager that outlives its context has nothing to undo: canUndo is false and undo() does nothing")
    func outlivesContext() throws {
        let container = try observationContainer()
        let manager = ModelUndoManager()
        do {
            let context = ModelContext(container)
            context.undoManager = manager
            context.insert(OTag(label: "y"))
            try context.save()
            #expect(manager.canUndo)
        }
        #expect(!manager.canUndo)
        #expect(try manager.undo().isComplete)
        #expect(try manager.redo().isComplete)
        #expect(try ModelContext(container).fetch(OTag.self).map(\.label) == ["y"])
    }

    @Test("one manager serves two contexts: undo takes the newest group of either, on the context that saved it")
    func sharedManager() throws {
        let container = try observationContainer()
        let manager = ModelUndoManager()
        let first = ModelContext(container)
        let second = ModelContext(container)
        first.undoManager = manager
        second.undoManager = manager
        first.insert(OTag(label: "one"))
        try first.save()
        second.insert(OTag(label: "two"))
        try second.save()
        try manager.undo()
        #expect(try ModelContext(container).fetch(OTag.self).map(\.label) == ["one"])
        try manager.undo()
        #expect(try ModelContext(container).fetch(OTag.self).isEmpty)
        try manager.redo()
        #expect(try ModelContext(container).fetch(OTag.self).map(\.label) == ["one"])
        // Unsaved changes of every context are saved first; the newest is undone.
        first.insert(OTag(label: "three"))
        try manager.undo()
        #expect(try ModelContext(container).fetch(OTag.self).map(\.label) == ["one"])
        #expect(!first.hasChanges && !second.hasChanges)
        // A context given another manager takes its groups with it: the shared one forgets them.
        second.insert(OTag(label: "four"))
        try second.save()
        second.undoManager = nil
        try manager.undo()
        #expect(try ModelContext(container).fetch(OTag.self).map(\.label).sorted() == ["four"])
        #expect(!manager.canUndo)
    }
}
