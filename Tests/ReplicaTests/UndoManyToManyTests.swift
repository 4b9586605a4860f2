// Undo and redo of many-to-many links: undoing a delete restores the record's links, undoing a link change sets the
// members back, redo removes or re-applies them; in a synced store the restored links are a new, stamped change.
import Foundation
import Testing
@testable import Replica

@Suite("Undo of many-to-many links")
struct UndoManyToManyTests {
    private func localContainer() throws -> ModelContainer {
        let environment = ReplicaEnvironment.seeded(seed: 7, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        return try ModelContainer(for: LinkTrip.self, LinkTag.self, configurations: ModelConfiguration("links", isStoredInMemoryOnly: true),
                                  environment: environment)
    }

    private func undoContext(_ container: ModelContainer) -> ModelContext {
        let context = ModelContext(container)
        context.undoManager = ModelUndoManager()
        return context
    }

    private func tagLinks(_ container: ModelContainer) throws -> [String: Set<UUID>] {
        var result: [String: Set<UUID>] = [:]
        for tag in try ModelContext(container).fetch(LinkTag.self) { result[tag.label] = Set(tag.trips.map(\.id)) }
        return result
    }

    private func tripLinks(_ container: ModelContainer) throws -> [String: Set<UUID>] {
        var result: [String: Set<UUID>] = [:]
        for trip in try ModelContext(container).fetch(LinkTrip.self) { result[trip.name] = Set(trip.tags.map(\.id)) }
        return result
    }

    @Test("undoing a delete brings the record back with its many-to-many links, seen from both sides; redo removes them again")
    func undoDeleteRestoresLinks() throws {
        let container = try localContainer()
        let context = undoContext(container)
        let lisbon = context.insert(LinkTrip(name: "Lisbon"))
        let beach = context.insert(LinkTag(label: "beach", trips: [Reference(lisbon)]))
        let food = context.insert(LinkTag(label: "food", trips: [Reference(lisbon)]))
        try context.save()
        context.delete(lisbon)
        try context.save()
        #expect(try tagLinks(container) == ["beach": [], "food": []])

        try #require(context.undoManager).undo()
        #expect(try tagLinks(container) == ["beach": [lisbon.id], "food": [lisbon.id]])
        #expect(try tripLinks(container) == ["Lisbon": [beach.id, food.id]])

        try #require(context.undoManager).redo()
        #expect(try ModelContext(container).model(LinkTrip.self, id: lisbon.id) == nil)
        #expect(try tagLinks(container) == ["beach": [], "food": []])

        // And undo again after the redo: the links come back once more.
        try #require(context.undoManager).undo()
        #expect(try tagLinks(container) == ["beach": [lisbon.id], "food": [lisbon.id]])
    }

    @Test("undoing a link change sets the record's members back; redo applies the change again")
    func undoLinkChange() throws {
        let container = try localContainer()
        let context = undoContext(container)
        let trips = ["t1", "t2", "t3"].map { context.insert(LinkTrip(name: $0)) }
        var tag = context.insert(LinkTag(label: "x", trips: [Reference(trips[0]), Reference(trips[1])]))
        try context.save()
        tag.trips = [Reference(trips[1]), Reference(trips[2])]
        context.update(tag)
        try context.save()
        #expect(try tagLinks(container) == ["x": [trips[1].id, trips[2].id]])

        try #require(context.undoManager).undo()
        #expect(try tagLinks(container) == ["x": [trips[0].id, trips[1].id]])
        #expect(try tripLinks(container) == ["t1": [tag.id], "t2": [tag.id], "t3": []])

        try #require(context.undoManager).redo()
        #expect(try tagLinks(container) == ["x": [trips[1].id, trips[2].id]])
    }

    @Test("undoing a link change made from the other side (the trip's) restores the links without touching the trip's fields")
    func undoLinkChangeFromOtherSide() throws {
        let container = try localContainer()
        let context = undoContext(container)
        var trip = context.insert(LinkTrip(name: "Rome"))
        let tag = context.insert(LinkTag(label: "art"))
        try context.save()
        trip.tags = [Reference(tag)]
        context.update(trip)
        try context.save()
        // Another context renames the trip meanwhile: the undo of the link keeps the name.
        let other = ModelContext(container)
        var copy = try #require(try other.model(LinkTrip.self, id: trip.id))
        copy.name = "Roma"
        other.update(copy)
        try other.save()

        try #require(context.undoManager).undo()
        #expect(try tripLinks(container) == ["Roma": []])
        #expect(try tagLinks(container) == ["art": []])
    }

    @Test("in a synced store the links an undo restores replicate to another device as a new change (new causal lengths)")
    func restoredLinksReplicate() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: [LinkTrip.self, LinkTag.self], version: Schema.Version(1, 1, 0))
        let b = try Device("B", seed: 2, models: [LinkTrip.self, LinkTag.self], version: Schema.Version(1, 1, 0))
        let context = undoContext(a.container)
        let lisbon = context.insert(LinkTrip(name: "Lisbon"))
        let beach = context.insert(LinkTag(label: "beach", trips: [Reference(lisbon)]))
        try context.save()
        try settle([a, b], cloud)
        #expect(try b.tagLinks() == ["beach": [lisbon.id]])

        context.delete(lisbon)
        try context.save()
        try settle([a, b], cloud)
        #expect(try b.tagLinks() == ["beach": []])
        let removed = try #require(try b.linkSet(of: beach.id))

        try #require(context.undoManager).undo()
        try settle([a, b], cloud)
        #expect(try b.tagLinks() == ["beach": [lisbon.id]])
        #expect(try b.tripLinks() == ["Lisbon": [beach.id]])
        let restored = try #require(try b.linkSet(of: beach.id))
        // Added (1), removed by the delete (2), added again by the undo (3): a new change, not the old stamp.
        #expect(removed.lengths[lisbon.id] == 2)
        #expect(restored.lengths[lisbon.id] == 3)
        #expect(try a.linkSet(of: beach.id) == restored)
        #expect(try a.sync(cloud).isUpToDate && b.sync(cloud).isUpToDate)
    }
}
