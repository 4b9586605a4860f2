import Foundation
import Testing
@testable import Replica

/// Issue 3, part 4: to-one and to-many with inverses, many-to-many, and delete rules on every delete.
@Suite("Relationships and delete rules")
struct QueryRelationshipTests {
    func makeContext() throws -> ModelContext {
        ModelContext(try makeQueryContainer(deleteRuleModelTypes))
    }

    @Test("to-one references and their to-many inverses stay consistent")
    func oneToMany() throws {
        let context = try makeContext()
        let paris = context.insert(QTrip(name: "Paris"))
        let rome = context.insert(QTrip(name: "Rome"))
        var bag = context.insert(QItem(title: "bag", trip: Reference(paris)))
        let map = context.insert(QItem(title: "map", trip: Reference(paris)))
        try context.save()
        #expect(try context.model(QTrip.self, id: paris.id)?.items.map(\.id) == [bag.id, map.id].sorted(by: idPrecedes))
        bag.trip = Reference(rome)
        context.update(bag)
        // Pending: visible before the save...
        #expect(try context.model(QTrip.self, id: rome.id)?.items.map(\.id) == [bag.id])
        try context.save()
        // ...and after it.
        #expect(try context.model(QTrip.self, id: paris.id)?.items.map(\.id) == [map.id])
        #expect(try context.fetch(FetchDescriptor<QItem>(predicate: #Predicate { $0.trip?.name == "Rome" })).map(\.id) == [bag.id])
    }

    @Test("many-to-many: stored in a link table, editable from either side")
    func manyToMany() throws {
        let context = try makeContext()
        let beach = context.insert(QTag(label: "beach"))
        let food = context.insert(QTag(label: "food"))
        var nice = context.insert(QTrip(name: "Nice"))
        nice.tags = [Reference(beach), Reference(food)]
        context.update(nice)
        let lima = context.insert(QTrip(name: "Lima", tags: [Reference(food)]))
        try context.save()
        func tags(_ trip: QTrip) throws -> Set<String> {
            var descriptor = FetchDescriptor<QTrip>(predicate: #Predicate { $0.id == trip.id })
            descriptor.relationshipKeyPathsForPrefetching = [\.tags]
            return Set(try context.fetch(descriptor).first?.tags.compactMap { $0.resolved?.label } ?? [])
        }
        #expect(try tags(nice) == ["beach", "food"])
        #expect(try tags(lima) == ["food"])
        #expect(Set(try context.model(QTag.self, id: food.id)?.trips.map(\.id) ?? []) == [nice.id, lima.id])

        // From the other side: the tag drops Nice and keeps Lima.
        var foodTag = try #require(try context.model(QTag.self, id: food.id))
        foodTag.trips.removeAll { $0.id == nice.id }
        context.update(foodTag)
        try context.save()
        #expect(try tags(nice) == ["beach"])
        #expect(try tags(lima) == ["food"])

        // A stale copy saved later wins for the links it disagrees on (as for attributes).
        var staleNice = try #require(try context.model(QTrip.self, id: nice.id))
        var beachTag = try #require(try context.model(QTag.self, id: beach.id))
        beachTag.trips = []
        context.update(beachTag)
        staleNice.name = "Nice!"
        context.update(staleNice)  // still lists beach
        try context.save()
        #expect(try tags(nice) == ["beach"])

        // An update that changes only links is still written.
        var limaTrip = try #require(try context.model(QTrip.self, id: lima.id))
        limaTrip.tags.append(Reference(beach))
        context.update(limaTrip)
        try context.save()
        #expect(try tags(lima) == ["beach", "food"])
    }

    @Test("a snapshot decodes back into its model, relationships included")
    func snapshotRoundTrip() throws {
        let trip = QTrip(id: UUID(), name: "Lima", destination: nil, rating: 3, lodging: Reference(UUID()),
                         items: [Reference(UUID())], tags: [Reference(UUID()), Reference(UUID())])
        let decoded = try QTrip.entity.model(from: QTrip.entity.snapshot(of: trip))
        #expect(decoded.id == trip.id && decoded.name == trip.name && decoded.rating == 3 && decoded.destination == nil)
        #expect(decoded.lodging == trip.lodging && decoded.items == trip.items && decoded.tags == trip.tags)
    }

    @Test("cascade, nullify and deny on single deletes")
    func deleteRules() throws {
        let context = try makeContext()
        // Cascade (trip -> items).
        let trip = context.insert(QTrip(name: "Oslo"))
        for title in ["a", "b", "c"] { context.insert(QItem(title: title, trip: Reference(trip))) }
        let loose = context.insert(QItem(title: "loose"))
        // Nullify (folder -> notes).
        let folder = context.insert(QFolder(name: "f"))
        let note = context.insert(QNote(text: "n", folder: Reference(folder)))
        // Deny (lodging with trips).
        let lodging = context.insert(QLodging(city: "Oslo"))
        var staying = context.insert(QTrip(name: "Stay", lodging: Reference(lodging)))
        try context.save()

        context.delete(trip)
        context.delete(folder)
        try context.save()
        #expect(try context.fetch(QItem.self).map(\.id) == [loose.id])
        #expect(try context.model(QNote.self, id: note.id)?.folder == nil)

        context.delete(lodging)
        #expect {
            try context.save()
        } throws: { error in
            guard case let ReplicaError.modelValidationFailure(failures) = error else { return false }
            return failures == [.deleteDenied(entity: "QLodging", relationship: "trips", count: 1)]
        }
        context.rollback()
        #expect(try context.model(QLodging.self, id: lodging.id) != nil)
        staying.lodging = nil
        context.update(staying)
        context.delete(lodging)
        try context.save()
        #expect(try context.model(QLodging.self, id: lodging.id) == nil)
    }

    @Test("delete rules over many-to-many links")
    func manyToManyDeleteRules() throws {
        let context = try makeContext()
        let one = context.insert(QSong(title: "one"))
        let two = context.insert(QSong(title: "two"))
        let three = context.insert(QSong(title: "three"))
        let mix = context.insert(QPlaylist(name: "mix", songs: [Reference(one), Reference(two)]))
        let best = context.insert(QPlaylist(name: "best", songs: [Reference(two), Reference(three)]))
        let tag = context.insert(QTag(label: "t"))
        let trip = context.insert(QTrip(name: "x", tags: [Reference(tag)]))
        try context.save()

        // Nullify: deleting a tag removes its links only.
        context.delete(tag)
        try context.save()
        #expect(try context.model(QTrip.self, id: trip.id)?.tags == [])

        // Cascade from mix reaches song "two", whose deny rule still sees "best": refused, nothing written.
        context.delete(mix)
        #expect(throws: ReplicaError.self) { try context.save() }
        context.rollback()
        #expect(try context.fetchCount(FetchDescriptor<QSong>()) == 3)
        #expect(Set(try context.model(QPlaylist.self, id: mix.id)?.songs.map(\.id) ?? []) == [one.id, two.id])

        // Deleting both playlists cascades to every song; the deny rule ignores playlists deleted by the same save.
        try context.delete(model: QPlaylist.self)
        try context.save()
        #expect(try context.fetchCount(FetchDescriptor<QSong>()) == 0)
        #expect(try context.fetchCount(FetchDescriptor<QPlaylist>()) == 0)
        _ = best
    }
}
