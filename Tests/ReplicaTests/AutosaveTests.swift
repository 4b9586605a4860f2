// Autosave of the main context: at the end of the current main-actor turn, announced like any save, errors reported.
import Foundation
import Testing
@testable import Replica

/// Lets the main actor run what is enqueued on it (the autosave task) until `done` holds, at most `limit` turns.
@MainActor
private func turns(until done: () -> Bool, limit: Int = 1_000) async {
    for _ in 0..<limit where !done() { await Task.yield() }
}

@Suite("Autosave")
struct AutosaveTests {
    @Test("autosaveEnabled on a context made with ModelContext(_:) on an actor autosaves at the end of that actor's turn")
    @MainActor
    func plainContextOnAnActor() async throws {
        let container = try observationContainer()
        let context = ModelContext(container)
        context.autosaveEnabled = true
        #expect(context.autosaveEnabled)
        context.insert(OList(name: "Groceries"))
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OList>()) == 0)
        await turns(until: { !context.hasChanges })
        #expect(!context.hasChanges)
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OList>()) == 1)
    }

    @Test("autosaveEnabled on a context made in nonisolated code does not trap; it has no turn to save at, so it stays off")
    func plainContextNonisolated() throws {
        let container = try observationContainer()
        let context = ModelContext(container)
        context.autosaveEnabled = true
        #expect(!context.autosaveEnabled)
        context.insert(OList(name: "Groceries"))
        try context.save()
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OList>()) == 1)
    }

    @Test("the main context saves at the end of the turn: every change of one synchronous stretch in one save")
    @MainActor
    func savesAtTheEndOfTheTurn() async throws {
        let container = try observationContainer()
        let iterator = container.changes.makeAsyncIterator()
        let main = container.mainContext
        let list = main.insert(OList(name: "Groceries"))
        main.insert(OTask(title: "milk", list: Reference(list)))
        // Nothing is saved in the middle of the code that registers changes.
        #expect(main.hasChanges)
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OList>()) == 0)
        await turns(until: { !main.hasChanges })
        #expect(!main.hasChanges)
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OTask>()) == 1)
        // One save, announced on the change stream like any other.
        let events = try await nextEvents(iterator, count: 1)
        #expect(events.first?.change?.origin == .localSave)
        #expect(events.first?.change?.insertedIdentifiers.count == 2)
        #expect(try main.fetchHistory().count == 1)
    }

    @Test("a failed autosave is reported through autosaveError and the handler; its changes stay pending")
    @MainActor
    func errorsAreReported() async throws {
        let container = try ModelContainer(for: User.self, environment: TestDirectory().environment())
        let main = container.mainContext
        main.autosaveEnabled = false
        main.insert(User(email: "a@example.com"))
        var b = main.insert(User(email: "b@example.com"))
        try main.save()
        var reported: [String] = []
        main.autosaveErrorHandler = { reported.append("\($0)") }
        main.autosaveEnabled = true
        b.email = "a@example.com"
        main.update(b)
        await turns(until: { main.autosaveError != nil })
        let error = try #require(main.autosaveError as? ReplicaError)
        #expect(error.validationFailures == [.uniqueConstraintViolation(entity: "User", attributes: ["email"], id: b.persistentModelID)])
        #expect(reported.count == 1)
        #expect(main.hasChanges)
        // Fixed, the next change saves, and the error clears.
        b.email = "c@example.com"
        main.update(b)
        await turns(until: { !main.hasChanges })
        #expect(main.autosaveError == nil)
        #expect(try ModelContext(container).model(User.self, id: b.id)?.email == "c@example.com")
        #expect(reported.count == 1)
    }

    @Test("with autosave off the main context saves only when asked")
    @MainActor
    func off() async throws {
        let container = try observationContainer()
        let main = container.mainContext
        main.autosaveEnabled = false
        main.insert(OList(name: "kept pending"))
        await turns(until: { false }, limit: 50)
        #expect(main.hasChanges)
        try main.save()
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<OList>()) == 1)
    }
}
