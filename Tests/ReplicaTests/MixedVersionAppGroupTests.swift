// Processes of two app versions on one app-group store file (an extension updates later than its app): defaults at
// the storage level, and fields an older process merges reaching the columns a newer one added.
import Foundation
import Testing
@testable import Replica

/// Version 1 of the shared note (what an older widget declares).
private struct SharedNoteV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "SharedNote" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<SharedNoteV1>([.attribute("text", \.text, default: "")])
}

/// Version 2: non-optional attributes with defaults of every storage class, including values a plain SQL literal
/// cannot carry exactly (a double SQLite's parser misreads, text with a NUL and a quote), and an optional one.
private struct SharedNoteV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "SharedNote" }
    static let oddDouble = -2.2606631148481385e-299
    var id = UUID.unassigned
    var text: String = ""
    var stars: Int = 3
    var minimum: Int = Int.min
    var weight: Double = 0.25
    var odd: Double = SharedNoteV2.oddDouble
    var label: String = "it's\0new"
    var pinned: Bool = true
    var tag: Data = Data([0, 0xFF])
    var mood: String? = "calm"
    static let entity = ModelEntity<SharedNoteV2>([
        .attribute("text", \.text, default: ""),
        .attribute("stars", \.stars, default: 3),
        .attribute("minimum", \.minimum, default: Int.min),
        .attribute("weight", \.weight, default: 0.25),
        .attribute("odd", \.odd, default: SharedNoteV2.oddDouble),
        .attribute("label", \.label, default: "it's\0new"),
        .attribute("pinned", \.pinned, default: true),
        .attribute("tag", \.tag, default: Data([0, 0xFF])),
        .attribute("mood", \.mood, default: "calm"),
    ])

    /// What a record written by version 1 with `text` reads as in version 2.
    static func fromV1(_ id: UUID, _ text: String) -> SharedNoteV2 { SharedNoteV2(id: id, text: text) }
}

private let group = "group.replica.mixed"

/// A container of one app-group store "shared" with the given model version, as a process of that version opens it.
private func process(_ model: any PersistentModel.Type, _ directory: TestDirectory, seed: UInt64, version: Int,
                     synced: Bool = false) throws -> ModelContainer {
    try process([model], directory, seed: seed, version: version, synced: synced)
}

private func process(_ models: [any PersistentModel.Type], _ directory: TestDirectory, seed: UInt64, version: Int,
                     synced: Bool = false) throws -> ModelContainer {
    var environment = directory.environment(seed: seed)
    environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.notes.v\(version)", processName: "v\(version)", processID: Int32(version))
    return try ModelContainer(for: Schema(models, version: Schema.Version(version, 0, 0)), configurations: [
        ModelConfiguration("shared", groupContainer: .identifier(group), cloudKitDatabase: synced ? .private("iCloud.mixed") : .none),
    ], environment: environment)
}

private func storeURL(_ directory: TestDirectory) -> URL {
    directory.url.appendingPathComponent("app-groups").appendingPathComponent(group).appendingPathComponent("shared.store")
}

@Suite("Mixed app versions on one app-group store")
struct MixedVersionAppGroupTests {
    let directory = TestDirectory()

    @Test("a row an older process inserts after a newer one added columns takes their declared defaults, exactly")
    func olderProcessInsertsAfterUpgrade() throws {
        let v1 = try process(SharedNoteV1.self, directory, seed: 1, version: 1)
        let writer = ModelContext(v1)
        let first = writer.insert(SharedNoteV1(text: "before the upgrade"))
        try writer.save()

        // The app updates first: version 2 adds columns to the file the widget still uses.
        let v2 = try process(SharedNoteV2.self, directory, seed: 2, version: 2)
        let later = writer.insert(SharedNoteV1(text: "from the old widget"))
        try writer.save()
        let seen = try ModelContext(v2).fetch(FetchDescriptor<SharedNoteV2>(sortBy: [SortDescriptor(\.text)]))
        #expect(seen == [SharedNoteV2.fromV1(first.id, "before the upgrade"), SharedNoteV2.fromV1(later.id, "from the old widget")])
        #expect(seen.last?.odd.bitPattern == SharedNoteV2.oddDouble.bitPattern)
        // Queries see the stored defaults too (they are values in the rows, not substitutions when reading).
        #expect(try ModelContext(v2).fetchCount(FetchDescriptor<SharedNoteV2>(predicate: #Predicate { $0.stars == 3 && $0.pinned })) == 2)
        // The older process keeps working on its columns.
        #expect(try ModelContext(v1).fetch(SharedNoteV1.self).map(\.text).sorted() == ["before the upgrade", "from the old widget"])
    }

    @Test("a store only one process opens is not rebuilt for its old columns; the columns it gains carry SQL defaults")
    func singleProcessStoreIsNotRebuilt() throws {
        do { _ = try ModelContainer(for: PinV1.self, environment: directory.environment(seed: 1)) }
        let db = try rawConnection(directory.storeURL())
        // A column as an earlier build added it: no SQL default.
        try db.execute("ALTER TABLE \"Pin\" ADD COLUMN \"rating\" INTEGER")
        try db.run("UPDATE \"Pin\" SET \"rating\" = 3")
        let cookie = try db.scalar("PRAGMA schema_version")
        _ = try ModelContainer(for: PinV2.self, environment: directory.environment(seed: 2))
        let defaults = try db.rows("SELECT name, dflt_value FROM pragma_table_info('Pin') ORDER BY cid")
        #expect(defaults.map(\.[0]) == [.text("id"), .text("title"), .text("rating"), .text("label"), .text("color"), .text("pinned")])
        #expect(defaults.map(\.[1]) == [.null, .null, .null, .text("'it''s new'"), .null, .text("1")])
        // Three columns were added (three schema changes), no table was copied.
        #expect(try db.scalar("PRAGMA schema_version") == cookie.map { if case let .integer(v) = $0 { .integer(v + 3) } else { $0 } })
    }

    @Test("the SQL form of every default reads back exactly: REALs SQLite's decimal parser would misread, text with NUL and quotes, blobs")
    func defaultExpressionsAreExact() throws {
        let db = try Connection(location: .memory(name: "replica-default-expressions"))
        let random = SeededRandomSource(seed: 11)
        var values: [SQLiteValue] = [.real(SharedNoteV2.oddDouble), .real(0.1), .real(-0.25), .real(.leastNonzeroMagnitude), .real(-Double.greatestFiniteMagnitude),
                                     .real(0x1p60), .real(.infinity), .real(-.infinity), .integer(.min), .integer(.max),
                                     .text("it's\0new"), .text(""), .text("ünïcödé 'quoted' \"double\""), .blob(Data()), .blob(Data([0, 1, 0xFF]))]
        for _ in 0..<2_000 {
            let value = Double(bitPattern: random.next())
            if value.isFinite { values.append(.real(value)) }
        }
        for value in values {
            let read = try db.scalar("SELECT \(ColumnDefaults.expression(value))")
            #expect(read.map { ColumnDefaults.same($0, value) } == true, "\(ColumnDefaults.expression(value))")
        }
    }

    @Test("a store created by the newer version gives an older process's inserts the defaults of columns it does not know")
    func newerVersionCreatesTheStore() throws {
        let v2 = try process(SharedNoteV2.self, directory, seed: 2, version: 2)
        let v1 = try process(SharedNoteV1.self, directory, seed: 1, version: 1)
        let context = ModelContext(v1)
        let note = context.insert(SharedNoteV1(text: "from the old widget"))
        try context.save()
        #expect(try ModelContext(v2).fetch(SharedNoteV2.self) == [SharedNoteV2.fromV1(note.id, "from the old widget")])
        let reader = ModelContext(v2)
        var edited = try #require(try reader.model(SharedNoteV2.self, id: note.id))
        edited.stars = 5
        reader.update(edited)
        try reader.save()
        // The older process's later save of its own field keeps the newer one's value.
        var old = try #require(try context.model(SharedNoteV1.self, id: note.id))
        old.text = "edited by the old widget"
        context.update(old)
        try context.save()
        #expect(try ModelContext(v2).model(SharedNoteV2.self, id: note.id)?.stars == 5)
        #expect(try ModelContext(v2).model(SharedNoteV2.self, id: note.id)?.text == "edited by the old widget")
    }

    @Test("a table whose columns were added without SQL defaults is rebuilt once: NULLs older writers left take the default, data and indexes stay")
    func columnsWithoutDefaultsAreRebuilt() throws {
        do { _ = try process(SharedNoteV1.self, directory, seed: 1, version: 1) }
        // The file as an earlier build left it: columns added without DEFAULT, and rows a version-1 process inserted
        // after that (NULL in every new column), beside a row version 2 wrote in full.
        let db = try rawConnection(storeURL(directory))
        for column in ["\"stars\" INTEGER", "\"minimum\" INTEGER", "\"weight\" REAL", "\"odd\" REAL", "\"label\" TEXT",
                       "\"pinned\" INTEGER", "\"tag\" BLOB", "\"mood\" TEXT"] {
            try db.execute("ALTER TABLE \"SharedNote\" ADD COLUMN \(column)")
        }
        let oldID = UUID(), fullID = UUID()
        try db.run("INSERT INTO \"SharedNote\" (\"id\", \"text\") VALUES (?, 'from the old widget')", [oldID.sqliteValue])
        try db.run("""
            INSERT INTO "SharedNote" ("id", "text", "stars", "minimum", "weight", "odd", "label", "pinned", "tag", "mood")
            VALUES (?, 'from version 2', 9, 1, 2.5, 3.5, 'x', 0, X'01', NULL)
            """, [fullID.sqliteValue])
        try db.execute("CREATE INDEX \"extra_index\" ON \"SharedNote\" (\"stars\")")

        let v2 = try process(SharedNoteV2.self, directory, seed: 2, version: 2)
        let notes = try ModelContext(v2).fetch(FetchDescriptor<SharedNoteV2>(sortBy: [SortDescriptor(\.text)]))
        #expect(notes.count == 2)
        var expectedOld = SharedNoteV2.fromV1(oldID, "from the old widget")
        expectedOld.mood = nil  // an optional column: NULL may be a value, so it is not replaced
        #expect(notes.first == expectedOld)
        #expect(notes.last == SharedNoteV2(id: fullID, text: "from version 2", stars: 9, minimum: 1, weight: 2.5, odd: 3.5, label: "x",
                                           pinned: false, tag: Data([1]), mood: nil))
        let indexes = try db.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'SharedNote' AND sql IS NOT NULL").map(\.[0])
        #expect(indexes == [.text("extra_index")])
        // Every defaulted column now has its SQL default, so an older process's insert gets it.
        try db.run("INSERT INTO \"SharedNote\" (\"id\", \"text\") VALUES (?, 'later')", [UUID().sqliteValue])
        #expect(try ModelContext(v2).fetch(FetchDescriptor<SharedNoteV2>(predicate: #Predicate { $0.text == "later" })).first?.label == "it's\0new")
        // Opening again finds nothing to rebuild (the schema cookie stays).
        let cookie = try db.scalar("PRAGMA schema_version")
        _ = try process(SharedNoteV2.self, directory, seed: 3, version: 2)
        #expect(try db.scalar("PRAGMA schema_version") == cookie)
    }
}

/// Version 2 of the note the `replica-widget` helper (version 1) declares: two more attributes with defaults.
private struct WidgetNoteV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var text: String = ""
    var stars: Int = 4
    var pinned: Bool = true
    static let entity = ModelEntity<WidgetNoteV2>([
        .attribute("text", \.text, default: ""),
        .attribute("stars", \.stars, default: 4),
        .attribute("pinned", \.pinned, default: true),
    ])
}

@Suite("Mixed app versions on one app-group store, in two OS processes", .serialized)
struct MixedVersionAppGroupProcessTests {
    @Test("an older widget process inserts into the store the newer app upgraded; the app reads the defaults")
    func olderWidgetProcess() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("replica-mixed-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        // The widget (version 1) creates the store; the app (version 2) upgrades it; the widget writes again.
        _ = try runWidget(["write", root.path, "before the upgrade"])
        var environment = ReplicaEnvironment.seeded(seed: 7, directory: root)
        environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
        let app = try ModelContainer(for: Schema([WidgetNoteV2.self], version: Schema.Version(2, 0, 0)),
                                     configurations: [ModelConfiguration("shared", groupContainer: .identifier("group.replica.tests"))],
                                     environment: environment)
        _ = try runWidget(["write", root.path, "from the old widget"])
        let notes = try ModelContext(app).fetch(FetchDescriptor<WidgetNoteV2>(sortBy: [SortDescriptor(\.text)]))
        #expect(notes.map(\.text) == ["before the upgrade", "from the old widget"])
        #expect(notes.allSatisfy { $0.stars == 4 && $0.pinned })
    }
}

/// Runs the `replica-widget` helper (built beside the test bundle) and returns its standard output.
private func runWidget(_ arguments: [String]) throws -> String {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent("replica-widget").path) {
        directory = directory.deletingLastPathComponent()
    }
    let process = Process()
    process.executableURL = directory.appendingPathComponent("replica-widget")
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    try process.run()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    #expect(process.terminationStatus == 0, "replica-widget \(arguments.first ?? "") failed")
    return String(decoding: data, as: UTF8.self)
}

// MARK: - Synced app-group stores shared by two app versions

/// Version 1 of a synced note without encrypted fields, and version 2 adding an encrypted one.
private struct LetterV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Letter" }
    var id = UUID.unassigned
    var title: String = ""
    static let entity = ModelEntity<LetterV1>([.attribute("title", \.title, default: "")])
}

private struct LetterV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Letter" }
    var id = UUID.unassigned
    var title: String = ""
    var secret: String = ""
    static let entity = ModelEntity<LetterV2>([
        .attribute("title", \.title, default: ""),
        .attribute("secret", \.secret, default: "", options: .allowsCloudEncryption),
    ])
}

/// Runs `engine` against `cloud` until it has nothing to do, moving `container`'s manual clock over backoffs.
@discardableResult
private func sync(_ engine: SyncEngine, _ container: ModelContainer, _ cloud: InMemoryCloudDatabase) throws -> SyncStatus {
    let clock = container.environment.clock as! ManualClock
    engine.setNeedsFetch()
    for _ in 0..<1_000 {
        if let request = try engine.nextRequest() {
            try engine.handle(request.id, cloud.performNow(request.operation))
        } else if let wake = engine.wakeTime {
            clock.set(milliseconds: wake)
        } else {
            return try engine.status()
        }
    }
    Issue.record("the engine did not settle")
    return try engine.status()
}

private func mood(_ container: ModelContainer, _ id: UUID) throws -> String? {
    try ModelContext(container).model(SyncNoteV2.self, id: id)?.mood
}

/// An entity only the newer app version declares.
private struct StickerV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Sticker" }
    var id = UUID.unassigned
    var label: String = ""
    static let entity = ModelEntity<StickerV2>([.attribute("label", \.label, default: "")])
}

@Suite("Mixed app versions on one synced app-group store")
struct MixedVersionSyncedAppGroupTests {
    let directory = TestDirectory()

    @Test("a record of an entity only the newer version declares, fetched by the older process, appears in the newer one's table")
    func entityFetchedByTheOlderProcessIsAdopted() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 3, models: [SyncNoteV2.self, StickerV2.self], version: Schema.Version(2, 0, 0))
        let sticker = phone.context.insert(StickerV2(label: "moon"))
        try phone.context.save()
        try phone.sync(cloud)
        let app = try process([SyncNoteV2.self, StickerV2.self], directory, seed: 2, version: 2, synced: true)
        let widget = try process(SyncNote.self, directory, seed: 1, version: 1, synced: true)
        // The older widget fetches first: it keeps the sticker as a record of an unknown type, and the shared change
        // token moves past it.
        let widgetEngine = try SyncEngine(container: widget, storeName: "shared", zone: "notes")
        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        #expect(try widgetEngine.unknownTypeRecords().map(\.recordID) == [sticker.id])
        widgetEngine.releaseLease()
        // The app's engine fetches nothing new, yet adopts the kept record: the sticker is in its table.
        let appEngine = try SyncEngine(container: app, storeName: "shared", zone: "notes")
        #expect(try sync(appEngine, app, cloud).isUpToDate)
        #expect(try ModelContext(app).model(StickerV2.self, id: sticker.id)?.label == "moon")
        #expect(try appEngine.unknownTypeRecords().isEmpty)
        #expect(try appEngine.ledgerEntry(for: PersistentIdentifier(entityName: "Sticker", id: sticker.id))?.state == .synced)
    }

    @Test("a record of an entity only the newer version declares stays queued while the older process syncs; the newer one uploads it")
    func entityOnlyTheNewerVersionDeclares() throws {
        let cloud = InMemoryCloudDatabase()
        let app = try process([SyncNoteV2.self, StickerV2.self], directory, seed: 2, version: 2, synced: true)
        let widget = try process(SyncNote.self, directory, seed: 1, version: 1, synced: true)
        let appContext = ModelContext(app)
        let sticker = appContext.insert(StickerV2(label: "star"))
        let note = appContext.insert(SyncNoteV2(title: "beside it", mood: "glad"))
        try appContext.save()
        // The older widget syncs first: it uploads the note, cannot read the sticker's row, and leaves it queued —
        // not refused, which would keep it from the cloud for good.
        let widgetEngine = try SyncEngine(container: widget, storeName: "shared", zone: "notes")
        let widgetStatus = try sync(widgetEngine, widget, cloud)
        #expect(widgetStatus.rejectedRecords == 0)
        #expect(widgetStatus.pendingRecords == 1)
        #expect(cloud.records(in: "notes").map(\.recordID) == [note.id])
        widgetEngine.releaseLease()
        // The app's engine uploads it.
        let appEngine = try SyncEngine(container: app, storeName: "shared", zone: "notes")
        #expect(try sync(appEngine, app, cloud).isUpToDate)
        #expect(try widgetEngine.status().isUpToDate)
        let phone = try Device("phone", seed: 3, models: [SyncNoteV2.self, StickerV2.self], version: Schema.Version(2, 0, 0))
        try phone.sync(cloud)
        #expect(try ModelContext(phone.container).model(StickerV2.self, id: sticker.id)?.label == "star")
    }

    @Test("a field the older process merges reaches the newer process's column; its stamp, later saves and uploads keep it")
    func olderProcessMergesIntoNewerColumns() throws {
        let cloud = InMemoryCloudDatabase()
        let app = try process(SyncNoteV2.self, directory, seed: 2, version: 2, synced: true)
        let widget = try process(SyncNote.self, directory, seed: 1, version: 1, synced: true)
        // Only the older widget syncs (it holds the store's upload lease).
        let widgetEngine = try SyncEngine(container: widget, storeName: "shared", zone: "notes")
        let phone = try Device("phone", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let note = phone.context.insert(SyncNoteV2(title: "from the phone", mood: "happy"))
        try phone.context.save()
        try phone.sync(cloud)

        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        #expect(try mood(app, note.id) == "happy")

        // The widget edits its own field and uploads the record: the newer field goes with it.
        let widgetContext = ModelContext(widget)
        var edited = try #require(try widgetContext.model(SyncNote.self, id: note.id))
        edited.title = "edited by the widget"
        widgetContext.update(edited)
        try widgetContext.save()
        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        #expect(try mood(app, note.id) == "happy")
        let fresh = try Device("fresh", seed: 4, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        try fresh.sync(cloud)
        #expect(try ModelContext(fresh.container).model(SyncNoteV2.self, id: note.id)
                == SyncNoteV2(id: note.id, title: "edited by the widget", mood: "happy"))

        // The app edits the newer field; the widget uploads it.
        let appContext = ModelContext(app)
        var mine = try #require(try appContext.model(SyncNoteV2.self, id: note.id))
        mine.mood = "sad"
        appContext.update(mine)
        try appContext.save()
        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        try phone.sync(cloud)
        #expect(try mood(phone.container, note.id) == "sad")

        // A newer remote write of the field wins over the column's stamp; an older one does not.
        var remote = try #require(try phone.context.model(SyncNoteV2.self, id: note.id))
        remote.mood = "angry"
        phone.context.update(remote)
        try phone.context.save()
        try phone.sync(cloud)
        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        #expect(try mood(app, note.id) == "angry")
        try fresh.sync(cloud)
        #expect(try mood(fresh.container, note.id) == "angry")
        // The widget's store holds no unknown field for a column it has: the values are in the row.
        let db = try rawConnection(storeURL(directory))
        #expect(try db.scalar("SELECT count(*) FROM replica_sync_record WHERE unknown IS NOT NULL") == .integer(0))
    }

    /// The app (version 2) edits `mood`, a field only it declares, and saves without syncing; the phone then writes
    /// the record later (`change`). Returns what the older widget's sync logs in the store's conflict log, as
    /// `field|kind`, and the app's `mood` after it.
    private func widgetMergesAwayTheAppsEdit(_ change: (Device, UUID) throws -> Void) throws -> (log: [String], mood: String?) {
        let cloud = InMemoryCloudDatabase()
        let app = try process(SyncNoteV2.self, directory, seed: 2, version: 2, synced: true)
        let widget = try process(SyncNote.self, directory, seed: 1, version: 1, synced: true)
        let widgetEngine = try SyncEngine(container: widget, storeName: "shared", zone: "notes")
        let phone = try Device("phone", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let note = phone.context.insert(SyncNoteV2(title: "from the phone", mood: "happy"))
        try phone.context.save()
        try phone.sync(cloud)
        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        // The app's edit, which the cloud never gets.
        let appContext = ModelContext(app)
        var mine = try #require(try appContext.model(SyncNoteV2.self, id: note.id))
        mine.mood = "sad"
        appContext.update(mine)
        try appContext.save()
        // The phone's later write (its clock well ahead of the app's).
        phone.clock.advance(by: 60_000)
        try change(phone, note.id)
        try phone.sync(cloud)
        #expect(try sync(widgetEngine, widget, cloud).isUpToDate)
        let log = try widgetEngine.conflictLog().map { "\($0.field)|\($0.kind)" }
        return (log, try mood(app, note.id))
    }

    @Test("an unsynced edit of a field only the newer app declares, which the older widget's merge replaces with a newer remote write, is logged as overwritten (issue 21, seed 34 of app-group-two-app-versions)")
    func columnFieldOverwrittenIsLogged() throws {
        let result = try widgetMergesAwayTheAppsEdit { phone, id in
            var remote = try #require(try phone.context.model(SyncNoteV2.self, id: id))
            remote.mood = "angry"
            phone.context.update(remote)
            try phone.context.save()
        }
        #expect(result.mood == "angry")
        #expect(result.log == ["mood|overwritten"])
    }

    @Test("an unsynced edit of a field only the newer app declares, which a remote delete ends as the older widget merges it, is logged as deleted")
    func columnFieldDeletedIsLogged() throws {
        let result = try widgetMergesAwayTheAppsEdit { phone, id in
            phone.context.delete(try #require(try phone.context.model(SyncNoteV2.self, id: id)))
            try phone.context.save()
        }
        #expect(result.mood == nil)
        #expect(result.log == ["mood|deleted"])
    }

    @Test("a field an older process kept beside the row before the column existed is in the column as soon as the newer version opens, offline")
    func foldedWhenTheNewerVersionOpens() throws {
        let cloud = InMemoryCloudDatabase()
        let phone = try Device("phone", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let note = phone.context.insert(SyncNoteV2(title: "from the phone", mood: "happy"))
        try phone.context.save()
        try phone.sync(cloud)
        do {
            let widget = try process(SyncNote.self, directory, seed: 1, version: 1, synced: true)
            let engine = try SyncEngine(container: widget, storeName: "shared", zone: "notes")
            #expect(try sync(engine, widget, cloud).isUpToDate)
        }
        // The app updates (adds the column) and reads the value without syncing.
        let app = try process(SyncNoteV2.self, directory, seed: 2, version: 2, synced: true)
        #expect(try mood(app, note.id) == "happy")
        // Its own later edit of the field is what it uploads (not the value once kept beside the row).
        let context = ModelContext(app)
        var mine = try #require(try context.model(SyncNoteV2.self, id: note.id))
        mine.mood = "content"
        context.update(mine)
        try context.save()
        let engine = try SyncEngine(container: app, storeName: "shared", zone: "notes")
        #expect(try sync(engine, app, cloud).isUpToDate)
        try phone.sync(cloud)
        #expect(try mood(phone.container, note.id) == "content")
        #expect(try mood(app, note.id) == "content")
    }

    @Test("an older process without encryption refuses to upload a newer version's encrypted field; with the key it uploads it sealed")
    func encryptedFieldOfTheNewerVersion() throws {
        let cloud = InMemoryCloudDatabase()
        let key = [UInt8](repeating: 7, count: 32)
        let app = try process(LetterV2.self, directory, seed: 2, version: 2, synced: true)
        let widget = try process(LetterV1.self, directory, seed: 1, version: 1, synced: true)
        let context = ModelContext(app)
        let letter = context.insert(LetterV2(title: "hello", secret: "the plaintext secret"))
        try context.save()

        let plain = try SyncEngine(container: widget, storeName: "shared", zone: "letters")
        let expected = ReplicaError.incompatibleSchema([.sharedFieldNeedsEncryption(entity: "Letter", attribute: "secret")])
        #expect(throws: expected) { try sync(plain, widget, cloud) }
        #expect(try plain.status().blockedBy == expected)
        #expect(cloud.records(in: "letters").isEmpty)
        plain.releaseLease()

        let sealing = try SyncEngine(container: widget, storeName: "shared", zone: "letters", encryption: .rawKey(key))
        #expect(try sync(sealing, widget, cloud).isUpToDate)
        #expect(leakedCount(of: [Data("the plaintext secret".utf8)], in: cloud.storedBytes(of: "letters")) == 0)
        #expect(cloud.records(in: "letters").first?.fields["secret"]?.isEncrypted == true)
        // A device of the newer version with the key reads it.
        var environment = ReplicaEnvironment.seeded(seed: 5, directory: directory.url.appendingPathComponent("reader"))
        environment.processIdentity = ProcessIdentity(bundleIdentifier: "reader", processName: "reader", processID: 5)
        let reader = try ModelContainer(for: Schema([LetterV2.self], version: Schema.Version(2, 0, 0)), configurations: [
            ModelConfiguration("letters", cloudKitDatabase: .private("iCloud.mixed")),
        ], environment: environment)
        let readerEngine = try SyncEngine(container: reader, storeName: "letters", encryption: .rawKey(key))
        #expect(try sync(readerEngine, reader, cloud).isUpToDate)
        #expect(try ModelContext(reader).model(LetterV2.self, id: letter.id)?.secret == "the plaintext secret")
    }
}
