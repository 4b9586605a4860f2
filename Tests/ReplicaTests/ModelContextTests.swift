// ModelContext: insert, update, delete, save, rollback, pending-change coalescing, fetch by identifier, errors.
import CSQLite
import Foundation
import Testing
@testable import Replica

/// Counts the commits of one connection (through SQLite's commit hook).
final class CommitCounter {
    private(set) var commits = 0

    init(_ connection: Connection) {
        sqlite3_commit_hook(connection.handle, { context in
            Unmanaged<CommitCounter>.fromOpaque(context!).takeUnretainedValue().commits += 1
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
    }
}

@Suite("Model context")
struct ModelContextTests {
    let directory = TestDirectory()

    private func tripsContainer(seed: UInt64 = 1) throws -> ModelContainer {
        try ModelContainer(for: Trip.self, Item.self, Note.self, environment: directory.environment(seed: seed))
    }

    // MARK: Insert and identifiers

    @Test func insertAssignsTimeOrderedIdentifiersFromTheEnvironment() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "A"))
        #expect(trip.id != .unassigned)
        let bytes = trip.id.bytes
        // UUIDv7: 48 bits of Unix milliseconds from the environment's clock, version 7, RFC 9562 variant.
        let milliseconds = bytes.prefix(6).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        #expect(milliseconds == UInt64(container.environment.clock.nowMilliseconds()))
        #expect(bytes[6] >> 4 == 7)
        #expect(bytes[8] >> 6 == 0b10)
        // An ID the model already has is kept.
        let explicit = try #require(UUID(uuidString: "01890000-0000-7000-8000-000000000042"))
        var given = Trip(name: "B")
        given.id = explicit
        #expect(context.insert(given).id == explicit)
    }

    @Test func identifiersAreDeterministicForTheSameSeed() throws {
        func ids(seed: UInt64, in subdirectory: String) throws -> [UUID] {
            let url = directory.url.appendingPathComponent(subdirectory)
            let container = try ModelContainer(for: Trip.self, Item.self, environment: .seeded(seed: seed, directory: url))
            let context = ModelContext(container)
            let ids = (0..<5).map { context.insert(Trip(name: "\($0)")).id }
            try context.save()
            return ids
        }
        let first = try ids(seed: 42, in: "one")
        #expect(try ids(seed: 42, in: "two") == first)
        #expect(Set(first).count == 5)
        #expect(try ids(seed: 43, in: "three") != first)
    }

    @Test func insertedModelsAreSavedAndReadBack() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Iceland", destination: "Reykjavík", rating: 5))
        #expect(context.insertedIdentifiers == [trip.persistentModelID])
        try context.save()
        #expect(context.insertedIdentifiers.isEmpty)
        #expect(try rowCount("Trip", in: directory.storeURL()) == 1)
        let fetched = try ModelContext(container).model(Trip.self, id: trip.id)
        #expect(fetched == trip)
    }

    // MARK: Update

    @Test func updateWritesOnlyTheChangedFields() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        var trip = context.insert(Trip(name: "Iceland", destination: "Reykjavík", rating: 3))
        try context.save()

        // Log every column an UPDATE statement assigns (UPDATE OF fires for assigned columns, changed or not).
        let raw = try rawConnection(directory.storeURL())
        try raw.execute("""
            CREATE TABLE update_log (field TEXT);
            CREATE TRIGGER log_name AFTER UPDATE OF "name" ON "Trip" BEGIN INSERT INTO update_log VALUES ('name'); END;
            CREATE TRIGGER log_destination AFTER UPDATE OF "destination" ON "Trip" BEGIN INSERT INTO update_log VALUES ('destination'); END;
            CREATE TRIGGER log_rating AFTER UPDATE OF "rating" ON "Trip" BEGIN INSERT INTO update_log VALUES ('rating'); END;
            CREATE TRIGGER log_any AFTER UPDATE ON "Trip" BEGIN INSERT INTO update_log VALUES ('*'); END;
            """)
        func log() throws -> [SQLiteValue] { try raw.rows("SELECT field FROM update_log ORDER BY rowid", cache: false).map { $0[0] } }

        trip.rating = 4
        context.update(trip)
        #expect(context.updatedIdentifiers == [trip.persistentModelID])
        try context.save()
        #expect(try log().count == 2)
        #expect(Set(try log()) == [.text("rating"), .text("*")])

        trip.destination = nil
        trip.name = "Ísland"
        context.update(trip)
        try context.save()
        #expect(try log().count == 5)
        #expect(Set(try log().suffix(3)) == [.text("name"), .text("destination"), .text("*")])

        // An update that changes nothing writes nothing.
        context.update(trip)
        #expect(context.hasChanges)
        try context.save()
        #expect(try log().count == 5)
        #expect(!context.hasChanges)
        #expect(try ModelContext(container).model(Trip.self, id: trip.id) == trip)
    }

    @Test func storeChangesNameOnlyTheChangedFields() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "Iceland", destination: "Reykjavík", rating: 3))
        try context.save()

        var changed = trip
        changed.rating = 4
        changed.destination = "Akureyri"
        let store = container.stores[0]
        let db = try store.openConnection()
        try db.begin(.immediate)
        defer { db.rollback() }
        var writer = StoreWriter(store: store, db: db)
        try writer.apply([(trip.persistentModelID, .update(Trip.entity.snapshot(of: changed), fields: nil))])
        #expect(writer.failures.isEmpty)
        #expect(writer.changes.inserted.isEmpty)
        #expect(writer.changes.updated.map(\.0.id) == [trip.id])
        #expect(writer.changes.updated.map(\.1) == [["destination", "rating"]])

        var unchanged = StoreWriter(store: store, db: db)
        try unchanged.apply([(trip.persistentModelID, .update(Trip.entity.snapshot(of: changed), fields: nil))])
        #expect(unchanged.changes.updated.isEmpty)
    }

    @Test func updatingARecordDeletedElsewhereFails() throws {
        let container = try tripsContainer()
        let first = ModelContext(container)
        var trip = first.insert(Trip(name: "Doomed"))
        try first.save()

        let second = ModelContext(container)
        second.delete(trip)
        try second.save()

        trip.name = "Too late"
        first.update(trip)
        #expect(throws: ReplicaError.recordNotFound(trip.persistentModelID)) { try first.save() }
        #expect(first.hasChanges) // kept, as documented
        #expect(try rowCount("Trip", in: directory.storeURL()) == 0)
    }

    @Test func updatingARecordThatWasNeverSavedFails() throws {
        let context = ModelContext(try tripsContainer())
        var trip = Trip(name: "Never inserted")
        trip.id = try #require(UUID(uuidString: "01890000-0000-7000-8000-000000000001"))
        context.update(trip)
        #expect(throws: ReplicaError.recordNotFound(trip.persistentModelID)) { try context.save() }
    }

    @Test func insertingAnExistingIdentifierFails() throws {
        let container = try tripsContainer()
        let first = ModelContext(container)
        let note = first.insert(Note(text: "original", slug: "a"))
        try first.save()

        let second = ModelContext(container)
        var copy = Note(text: "copy", slug: "b")
        copy.id = note.id
        second.insert(copy)
        #expect(throws: ReplicaError.modelValidationFailure([.duplicateIdentifier(note.persistentModelID)])) { try second.save() }
        #expect(try ModelContext(container).model(Note.self, id: note.id)?.text == "original")
    }

    // MARK: Delete

    @Test func deleteRemovesTheRecord() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        let keep = context.insert(Note(text: "keep", slug: "keep"))
        let drop = context.insert(Note(text: "drop", slug: "drop"))
        try context.save()
        context.delete(drop)
        #expect(context.deletedIdentifiers == [drop.persistentModelID])
        #expect(try context.model(Note.self, id: drop.id) == nil) // pending delete is visible
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 1)
        let reader = ModelContext(container)
        #expect(try reader.model(Note.self, id: drop.id) == nil)
        #expect(try reader.model(Note.self, id: keep.id) == keep)
        // Deleting by identifier works the same.
        reader.delete(keep.persistentModelID)
        try reader.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 0)
        // Deleting a record that is already gone is not an error.
        reader.delete(keep.persistentModelID)
        try reader.save()
    }

    // MARK: Coalescing

    @Test func insertThenDeleteIsNothing() throws {
        let context = ModelContext(try tripsContainer())
        let note = context.insert(Note(text: "t", slug: "s"))
        context.delete(note)
        #expect(!context.hasChanges)
        #expect(context.insertedIdentifiers.isEmpty && context.deletedIdentifiers.isEmpty)
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 0)
    }

    @Test func deleteThenInsertReplacesTheRecord() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        let note = context.insert(Note(text: "old", slug: "slug"))
        try context.save()

        context.delete(note)
        var replacement = Note(text: "new", slug: "slug")
        replacement.id = note.id
        context.insert(replacement)
        #expect(context.deletedIdentifiers.isEmpty)
        #expect(try context.model(Note.self, id: note.id)?.text == "new")
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 1)
        #expect(try ModelContext(container).model(Note.self, id: note.id) == replacement)

        // Delete, insert, update: the replacement takes the last values; a delete after that deletes.
        context.delete(replacement)
        replacement.text = "newer"
        context.insert(replacement)
        replacement.text = "newest"
        context.update(replacement)
        try context.save()
        #expect(try ModelContext(container).model(Note.self, id: note.id)?.text == "newest")
        context.delete(replacement)
        context.insert(replacement)
        context.delete(replacement)
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 0)
    }

    @Test func insertThenUpdateInsertsTheNewValues() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        var note = context.insert(Note(text: "draft", slug: "s"))
        note.text = "final"
        context.update(note)
        #expect(context.insertedIdentifiers == [note.persistentModelID])
        #expect(context.updatedIdentifiers.isEmpty)
        try context.save()
        #expect(try ModelContext(container).model(Note.self, id: note.id)?.text == "final")
    }

    @Test func updateThenDeleteDeletes() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        var note = context.insert(Note(text: "a", slug: "s"))
        try context.save()
        note.text = "b"
        context.update(note)
        context.delete(note)
        #expect(context.updatedIdentifiers.isEmpty)
        #expect(context.deletedIdentifiers == [note.persistentModelID])
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 0)
    }

    @Test func repeatedUpdatesKeepTheLastValues() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        var note = context.insert(Note(text: "0", slug: "s"))
        try context.save()
        for i in 1...3 {
            note.text = "\(i)"
            context.update(note)
        }
        #expect(context.updatedIdentifiers == [note.persistentModelID])
        try context.save()
        #expect(try ModelContext(container).model(Note.self, id: note.id)?.text == "3")
    }

    // MARK: hasChanges, rollback, author

    @Test func hasChangesAndRollback() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        #expect(!context.hasChanges)
        let note = context.insert(Note(text: "t", slug: "s"))
        #expect(context.hasChanges)
        context.rollback()
        #expect(!context.hasChanges)
        #expect(try context.model(Note.self, id: note.id) == nil)
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL()) == 0)

        context.insert(note)
        try context.save()
        #expect(!context.hasChanges)
        var changed = note
        changed.text = "changed"
        context.update(changed)
        let other = context.insert(Note(text: "other", slug: "other"))
        #expect(context.hasChanges)
        context.rollback()
        #expect(!context.hasChanges)
        #expect(context.updatedIdentifiers.isEmpty && context.insertedIdentifiers.isEmpty)
        #expect(try context.model(Note.self, id: note.id)?.text == "t")
        #expect(try context.model(Note.self, id: other.id) == nil)
        context.delete(note)
        context.rollback()
        #expect(try context.model(Note.self, id: note.id)?.text == "t")
    }

    @Test func authorIsAWritableProperty() throws {
        let context = ModelContext(try tripsContainer())
        #expect(context.author == nil)
        context.author = "importer"
        #expect(context.author == "importer")
        context.insert(Note(text: "t", slug: "s"))
        try context.save()
        #expect(context.author == "importer")
    }

    // MARK: Fetching

    @Test func modelByIdentifierSeesPendingChanges() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        #expect(try context.model(Trip.self, id: UUID()) == nil)
        var trip = context.insert(Trip(name: "pending"))
        #expect(try context.model(Trip.self, id: trip.id)?.name == "pending")
        #expect(try ModelContext(container).model(Trip.self, id: trip.id) == nil) // other contexts do not see it
        try context.save()
        trip.name = "updated"
        context.update(trip)
        #expect(try context.model(Trip.self, id: trip.id)?.name == "updated")
        #expect(try ModelContext(container).model(Trip.self, id: trip.id)?.name == "pending")
        // A record of another entity with the same ID is not returned.
        #expect(try context.model(Item.self, id: trip.id) == nil)
    }

    @Test func fetchReturnsEveryModelOfTheEntityInCreationOrder() throws {
        let container = try tripsContainer()
        let context = ModelContext(container)
        // Many inserts within one millisecond of the (manual) clock.
        let trips = (0..<50).map { context.insert(Trip(name: "trip \($0)")) }
        context.insert(Item(title: "not a trip"))
        try context.save()
        let fetched = try ModelContext(container).fetch(Trip.self)
        #expect(fetched.map(\.name) == trips.map(\.name))
        #expect(try ModelContext(container).fetch(Item.self).count == 1)
        #expect(try ModelContext(container).fetch(Note.self).isEmpty)
    }

    // MARK: Save across stores

    private func twoStoreContainer() throws -> ModelContainer {
        let notes = ModelConfiguration("notes", schema: Schema([Note.self]))
        let users = ModelConfiguration("users", schema: Schema([User.self, Membership.self]))
        return try ModelContainer(for: Note.self, User.self, Membership.self, configurations: notes, users,
                                  environment: directory.environment())
    }

    @Test func saveCommitsOneTransactionPerAffectedStore() throws {
        let container = try twoStoreContainer()
        let context = ModelContext(container)
        let notes = CommitCounter(try context.connection(for: 0))
        let users = CommitCounter(try context.connection(for: 1))
        for i in 0..<5 { context.insert(Note(text: "\(i)", slug: "\(i)")) }
        for i in 0..<3 { context.insert(User(email: "\(i)@example.com")) }
        try context.save()
        #expect(notes.commits == 1)
        #expect(users.commits == 1)

        // A save that touches only one store commits only there.
        context.insert(Note(text: "more", slug: "more"))
        try context.save()
        #expect(notes.commits == 2)
        #expect(users.commits == 1)
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 6)
        #expect(try rowCount("User", in: directory.storeURL("users")) == 3)
    }

    @Test func aValidationFailureInTheSecondStoreLeavesTheFirstUnchanged() throws {
        let container = try twoStoreContainer()
        let context = ModelContext(container)
        var a = context.insert(User(email: "a@example.com"))
        var b = context.insert(User(email: "b@example.com"))
        try context.save()
        let note = context.insert(Note(text: "first store", slug: "n"))
        a.email = "same@example.com"
        b.email = "same@example.com"
        context.update(a)
        context.update(b)
        let error = #expect(throws: ReplicaError.self) { try context.save() }
        #expect(error?.validationFailures == [
            .uniqueConstraintViolation(entity: "User", attributes: ["email"], id: a.persistentModelID),
            .uniqueConstraintViolation(entity: "User", attributes: ["email"], id: b.persistentModelID),
        ])
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 0)
        #expect(try ModelContext(container).model(User.self, id: a.id)?.email == "a@example.com")
        // Nothing is lost: the changes stay pending, and a fixed batch saves.
        #expect(context.insertedIdentifiers == [note.persistentModelID])
        #expect(context.updatedIdentifiers == [a.persistentModelID, b.persistentModelID])
        var fixed = b
        fixed.email = "other@example.com"
        context.update(fixed)
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 1)
        #expect(try rowCount("User", in: directory.storeURL("users")) == 2)
    }

    @Test func anErrorInTheSecondStoreLeavesTheFirstUnchanged() throws {
        let container = try twoStoreContainer()
        let context = ModelContext(container)
        context.insert(Note(text: "first store", slug: "n"))
        var ghost = User(email: "ghost@example.com")
        ghost.id = try #require(UUID(uuidString: "01890000-0000-7000-8000-00000000000F"))
        context.update(ghost)
        #expect(throws: ReplicaError.recordNotFound(ghost.persistentModelID)) { try context.save() }
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 0)
        // Both connections are out of their transactions: a later save works.
        context.rollback()
        context.insert(Note(text: "again", slug: "n"))
        context.insert(User(email: "real@example.com"))
        try context.save()
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 1)
        #expect(try rowCount("User", in: directory.storeURL("users")) == 1)
    }

    @Test func aCommitFailureInALaterStoreIsAPartialSave() throws {
        let container = try twoStoreContainer()
        // Make the second store's COMMIT fail: a trigger leaves a dangling deferred foreign key on every new user.
        let raw = try rawConnection(directory.storeURL("users"))
        try raw.execute("""
            CREATE TABLE fk_parent (id INTEGER PRIMARY KEY);
            CREATE TABLE fk_child (parent INTEGER REFERENCES fk_parent (id) DEFERRABLE INITIALLY DEFERRED);
            CREATE TRIGGER dangle AFTER INSERT ON "User" BEGIN INSERT INTO fk_child VALUES (42); END;
            """)
        let context = ModelContext(container)
        let note = context.insert(Note(text: "committed", slug: "n"))
        let user = context.insert(User(email: "u@example.com"))
        let error = #expect(throws: ReplicaError.self) { try context.save() }
        guard case let .partialSave(committed, failed, underlying)? = error else {
            Issue.record("expected .partialSave, got \(String(describing: error))")
            return
        }
        #expect(committed == ["notes"])
        #expect(failed == "users")
        #expect(underlying.extendedResultCode == 787) // SQLITE_CONSTRAINT_FOREIGNKEY
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 1)
        #expect(try rowCount("User", in: directory.storeURL("users")) == 0)
        // The committed store's changes are done; the failed store's stay pending and save once the cause is gone.
        #expect(context.insertedIdentifiers == [user.persistentModelID])
        #expect(try context.model(Note.self, id: note.id) != nil)
        try raw.execute("DROP TRIGGER dangle")
        try context.save()
        #expect(try rowCount("User", in: directory.storeURL("users")) == 1)
        #expect(try rowCount("Note", in: directory.storeURL("notes")) == 1)
    }

    @Test func validationErrorsNeverContainAttributeValues() throws {
        let container = try twoStoreContainer()
        let context = ModelContext(container)
        let secret = "very-private-address@example.com"
        context.insert(User(email: secret))
        var other = context.insert(User(email: "other@example.com"))
        try context.save()
        other.email = secret
        context.update(other)
        let error = #expect(throws: ReplicaError.self) { try context.save() }
        #expect(error?.validationFailures.count == 1)
        for text in [error?.description ?? "", "\(String(describing: error))", String(reflecting: error as Any)] {
            #expect(!text.contains(secret))
            #expect(!text.contains("very-private"))
        }
    }

    // MARK: Programming errors trap

    /// A context on an in-memory container of notes only (nothing on disk: a trapping child process cannot clean up).
    static func notesContext() throws -> ModelContext {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: URL(fileURLWithPath: "/nonexistent-replica-tests"))
        let container = try ModelContainer(for: Note.self, configurations: ModelConfiguration("notes", isStoredInMemoryOnly: true),
                                           environment: environment)
        return ModelContext(container)
    }

    @Test func programmingErrorsTrap() async throws {
        // The control: the same set-up without the mistake exits normally.
        await #expect(processExitsWith: .success) {
            let context = try ModelContextTests.notesContext()
            context.insert(Note(text: "t", slug: "s"))
            try context.save()
        }
        await #expect(processExitsWith: .failure, "insert of a model whose entity is not in the container") {
            try ModelContextTests.notesContext().insert(Trip(name: "not in the schema"))
        }
        await #expect(processExitsWith: .failure, "delete of an identifier whose entity is not in the container") {
            try ModelContextTests.notesContext().delete(PersistentIdentifier(entityName: "Trip", id: UUID()))
        }
        await #expect(processExitsWith: .failure, "update of a model that was never inserted") {
            try ModelContextTests.notesContext().update(Note(text: "t", slug: "s"))
        }
        await #expect(processExitsWith: .failure, "update of a model deleted in the same context") {
            let context = try ModelContextTests.notesContext()
            let note = context.insert(Note(text: "t", slug: "s"))
            try context.save()
            context.delete(note)
            context.update(note)
        }
        await #expect(processExitsWith: .failure, "a reference to a model that was never inserted") {
            _ = Reference(Trip(name: "no id"))
        }
    }
}

@Suite("Field-level change tracking")
struct FieldLevelChangeTrackingTests {
    struct Card: PersistentModel, Codable {
        var id = UUID.unassigned
        var front: String = ""
        var back: String = ""
        static let entity = ModelEntity<Card>([.attribute("front", \.front, default: ""), .attribute("back", \.back, default: "")])
    }

    @Test("a stale copy writes only the fields the app changed, never back values another writer changed meanwhile")
    func staleCopyKeepsOthersChanges() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-ftrack-\(UUID().uuidString)")
        let container = try ModelContainer(for: Card.self, environment: .seeded(seed: 1, directory: directory))
        let setup = ModelContext(container)
        let card = setup.insert(Card(front: "f", back: "b"))
        try setup.save()

        let mine = ModelContext(container)
        var stale = try #require(try mine.model(Card.self, id: card.id))
        let other = ModelContext(container)
        var theirs = try #require(try other.model(Card.self, id: card.id))
        theirs.front = "front by the other writer"
        other.update(theirs)
        try other.save()

        stale.back = "back by me"
        mine.update(stale)
        try mine.save()
        let stored = try #require(try ModelContext(container).model(Card.self, id: card.id))
        #expect(stored.front == "front by the other writer")
        #expect(stored.back == "back by me")
    }

    @Test("after a large save, the inserted copies are the bases of change tracking (registered as one batch)",
          arguments: [1, ReadRegistry.savedBatchMinimum, 500])
    func largeSaveRegistersInsertedCopies(count: Int) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-ftrack-\(UUID().uuidString)")
        let container = try ModelContainer(for: Card.self, environment: .seeded(seed: 2, directory: directory))
        let mine = ModelContext(container)
        let cards = (0..<count).map { mine.insert(Card(front: "f\($0)", back: "b\($0)")) }
        try mine.save()

        let other = ModelContext(container)
        var theirs = try #require(try other.model(Card.self, id: cards[count - 1].id))
        theirs.front = "front by the other writer"
        other.update(theirs)
        try other.save()

        // The copy `mine` inserted is stale: only the field changed here may be written.
        var stale = cards[count - 1]
        stale.back = "back by me"
        mine.update(stale)
        try mine.save()
        let stored = try #require(try ModelContext(container).model(Card.self, id: cards[count - 1].id))
        #expect(stored.front == "front by the other writer")
        #expect(stored.back == "back by me")
        #expect(try ModelContext(container).fetchCount(FetchDescriptor<Card>()) == count)
    }
}

@Suite("Context edge cases")
struct ContextEdgeCaseTests {
    /// A synced store tracks, uploads and merges records by ID alone (the cloud's record ID): an ID used by two
    /// entities of one synced store must be refused on save, or both records must still replicate.
    @Test("two entities of one synced store saved with the same record ID both reach another device, or the save is refused",
          arguments: [false, true])
    func sameIDInTwoEntities(inOneSave: Bool) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1, models: [SyncNote.self, SyncTag.self])
        let b = try Device("B", seed: 2, models: [SyncNote.self, SyncTag.self])
        let note = a.context.insert(SyncNote(title: "note"))
        if !inOneSave { try a.context.save() }
        a.context.insert(SyncTag(id: note.id, label: "tag"))
        do {
            try a.context.save()
        } catch let error as ReplicaError {
            #expect(error.validationFailures == [.duplicateIdentifier(PersistentIdentifier(entityName: "SyncTag", id: note.id))])
            return
        }
        try a.sync(cloud)
        try b.sync(cloud)
        let context = ModelContext(b.container)
        #expect(try context.fetch(SyncNote.self).map(\.title) == ["note"])
        #expect(try context.fetch(SyncTag.self).map(\.label) == ["tag"])
    }
}
