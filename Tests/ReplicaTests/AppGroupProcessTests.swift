import Foundation
import Testing
@testable import Replica

/// The same model the `replica-widget` helper executable declares.
private struct WidgetNote: PersistentModel, Codable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<WidgetNote>([.attribute("text", \.text, default: "")])
}

/// Runs the `replica-widget` helper (built beside the test bundle) and returns its standard output.
private func widget(_ arguments: [String]) throws -> String {
    let process = Process()
    process.executableURL = widgetExecutable()
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    try process.run()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    #expect(process.terminationStatus == 0, "replica-widget \(arguments.first ?? "") failed")
    return String(decoding: data, as: UTF8.self)
}

private func widgetExecutable() -> URL {
    // swift test puts executables of the package next to the test bundle.
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent("replica-widget").path) {
        directory = directory.deletingLastPathComponent()
    }
    return directory.appendingPathComponent("replica-widget")
}

private func appContainer(_ root: URL) throws -> ModelContainer {
    var environment = ReplicaEnvironment.seeded(seed: 42, directory: root)
    environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
    environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips", processName: "app", processID: ProcessInfo.processInfo.processIdentifier)
    return try ModelContainer(for: Schema([WidgetNote.self]),
                              configurations: [ModelConfiguration("shared", groupContainer: .identifier("group.replica.tests"))],
                              environment: environment)
}

private func temporaryRoot() -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-appgroup-\(UUID().uuidString)", isDirectory: true)
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

@Suite("App-group stores shared by two OS processes", .serialized)
struct AppGroupProcessTests {
    @Test("app and widget processes share one store, one replica identity, and see each other's changes through history")
    func appAndWidget() throws {
        let root = temporaryRoot()
        let app = try appContainer(root)
        let context = ModelContext(app)
        context.author = "app"
        let store = try #require(app.storeIdentity(of: "shared"))
        #expect(try widget(["identity", root.path]).trimmingCharacters(in: .whitespacesAndNewlines) == store.uuidString)

        // The app writes; the widget reads history after token 0 and sees exactly those changes.
        context.insert(WidgetNote(text: "from app 1"))
        context.insert(WidgetNote(text: "from app 2"))
        try context.save()
        let seen = try widget(["history", root.path, "0"]).split(separator: "\n")
        #expect(seen.count == 1)
        #expect(seen.first?.contains(#""inserted":["from app 1","from app 2"]"#) == true)
        #expect(seen.first?.contains(#""author":"app""#) == true)

        // The widget writes back; the app sees that through history after its last token.
        let appToken = try context.currentHistoryToken(of: "shared")
        let widgetToken = try widget(["write", root.path, "from widget"]).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(Int64(widgetToken) == appToken.value + 1)
        let news = try context.fetchHistory(HistoryDescriptor(after: appToken))
        #expect(news.count == 1)
        #expect(news.first?.author == "widget")
        #expect(news.first?.bundleIdentifier == "com.example.trips.widget")
        guard case let .insert(id)? = news.first?.changes.first else { Issue.record("expected an insert"); return }
        #expect(try context.model(WidgetNote.self, id: id.id)?.text == "from widget")
    }

    @Test("a writer killed with SIGKILL mid-transaction leaves the store consistent, and the other process carries on")
    func killMidTransaction() throws {
        let root = temporaryRoot()
        let app = try appContainer(root)
        let context = ModelContext(app)
        context.insert(WidgetNote(text: "before"))
        try context.save()

        let process = Process()
        process.executableURL = widgetExecutable()
        process.arguments = ["hold", root.path, "500"]
        let output = Pipe()
        let input = Pipe()
        process.standardOutput = output
        process.standardInput = input
        try process.run()
        // Wait until the widget has written 500 rows and history inside its open transaction.
        let line = output.fileHandleForReading.availableLine()
        #expect(line == "ready")
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        #expect(process.terminationReason == .uncaughtSignal)

        // The app carries on at once (the dead process's locks are gone) and sees no partial transaction.
        let reader = ModelContext(app)
        #expect(try reader.fetch(WidgetNote.self).map(\.text) == ["before"])
        #expect(try reader.fetchHistory().count == 1)
        let db = try reader.connection(for: 0)
        #expect(try db.scalar("PRAGMA integrity_check") == .text("ok"))
        context.insert(WidgetNote(text: "after"))
        try context.save()
        #expect(try reader.fetch(WidgetNote.self).map(\.text) == ["before", "after"])
        #expect(try reader.fetchHistory().map(\.token.value) == [1, 2])
    }
}

/// The widget's note at version 1, and a version 2 of the app's that adds a flag a custom stage fills.
enum WidgetNotesV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [WidgetNote.self] }
}

enum WidgetNotesV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Note.self] }

    struct Note: PersistentModel, Codable {
        static var entityName: String { "Note" }
        var id = UUID.unassigned
        var text: String = ""
        var long: Bool = false
        static let entity = ModelEntity<Note>([.attribute("text", \.text, default: ""), .attribute("long", \.long, default: false)])
    }
}

enum WidgetNotesPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [WidgetNotesV1.self, WidgetNotesV2.self] }
    static var stages: [MigrationStage] {
        [.custom(fromVersion: WidgetNotesV1.self, toVersion: WidgetNotesV2.self, willMigrate: nil, didMigrate: { context in
            for var note in try context.fetch(WidgetNotesV2.Note.self) {
                note.long = note.text.count > 10
                context.update(note)
            }
            try context.save()
        })]
    }
}

/// The app at version 2, migrating the app-group store through ``WidgetNotesPlan``.
private func migratedAppContainer(_ root: URL) throws -> ModelContainer {
    var environment = ReplicaEnvironment.seeded(seed: 43, directory: root)
    environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
    return try ModelContainer(for: WidgetNotesV2.schema, migrationPlan: WidgetNotesPlan.self,
                              configurations: [ModelConfiguration("shared", groupContainer: .identifier("group.replica.tests"))],
                              environment: environment)
}

@Suite("Migrating an app-group store beside another OS process", .serialized)
struct AppGroupMigrationProcessTests {
    /// Starts `replica-widget open-hold` with `texts` and waits until it has the store open.
    private func holdingWidget(_ root: URL, texts: [String]) throws -> (Process, Pipe) {
        let process = Process()
        process.executableURL = widgetExecutable()
        process.arguments = ["open-hold", root.path] + texts
        let output = Pipe(), input = Pipe()
        process.standardOutput = output
        process.standardInput = input
        try process.run()
        #expect(output.fileHandleForReading.availableLine() == "ready")
        return (process, input)
    }

    @Test("the app's migration is refused while the widget (an older build) has the store open; the widget's later writes are kept and migrated once it exits")
    func migrationWaitsForTheWidget() throws {
        let root = temporaryRoot()
        do {
            let context = ModelContext(try appContainer(root))
            context.insert(WidgetNote(text: "before the update"))
            try context.save()
        }
        let (widget, input) = try holdingWidget(root, texts: ["written by the widget after the refusal"])
        do {
            _ = try migratedAppContainer(root)
            Issue.record("the store was migrated while the widget had it open")
        } catch let ReplicaError.storeInUse(configuration, reason) {
            #expect(configuration == "shared")
            #expect(reason.contains("from schema version 1.0.0 to 2.0.0"))
        }
        input.fileHandleForWriting.write(Data("go\n".utf8))
        widget.waitUntilExit()
        #expect(widget.terminationStatus == 0)
        let notes = try ModelContext(try migratedAppContainer(root)).fetch(WidgetNotesV2.Note.self).map { "\($0.text)|\($0.long)" }.sorted()
        #expect(notes == ["before the update|true", "written by the widget after the refusal|true"])
    }

    @Test("a widget killed with SIGKILL while it has the store open leaves no lock behind: the migration runs")
    func killedHolderReleasesTheStore() throws {
        let root = temporaryRoot()
        do {
            let context = ModelContext(try appContainer(root))
            context.insert(WidgetNote(text: "short"))
            try context.save()
        }
        let (widget, _) = try holdingWidget(root, texts: [])
        kill(widget.processIdentifier, SIGKILL)
        widget.waitUntilExit()
        let notes = try ModelContext(try migratedAppContainer(root)).fetch(WidgetNotesV2.Note.self).map { "\($0.text)|\($0.long)" }
        #expect(notes == ["short|false"])
    }
}

private extension FileHandle {
    /// Reads bytes until a newline and returns the line without it (nil at end of file).
    func availableLine() -> String? {
        var bytes: [UInt8] = []
        while true {
            let chunk = readData(ofLength: 1)
            guard let byte = chunk.first else { return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self) }
            if byte == UInt8(ascii: "\n") { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
    }
}

@Suite("Two OS processes sync through one SQLiteCloudDatabase file")
struct SQLiteCloudProcessTests {
    @Test("a device in another process and a device in this one converge through the shared cloud file")
    func twoProcessesConverge() async throws {
        let root = temporaryRoot()
        let cloudFile = root.appendingPathComponent("cloud.sqlite")
        let other = root.appendingPathComponent("device-other").path
        #expect(try widget(["sync", other, cloudFile.path, "from the other process"]) == "[\"from the other process\"]\n")

        var environment = ReplicaEnvironment.seeded(seed: 5, directory: root.appendingPathComponent("device-here"))
        environment.sleep = { _ in await Task.yield() }
        // The other process runs on the real clock: this device's clock agrees with it, as two real devices' clocks do
        // (a record stamped further ahead than the engine's drift bound would wait for this clock to catch up).
        (environment.clock as? ManualClock)?.set(milliseconds: Int64(Date().timeIntervalSince1970 * 1000))
        let here = try ModelContainer(for: Schema([WidgetNote.self]), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.replica.tests")),
        ], environment: environment)
        let context = ModelContext(here)
        context.insert(WidgetNote(text: "from this process"))
        try context.save()
        let engine = try SyncEngine(container: here, storeName: "notes")
        let cloud = try SQLiteCloudDatabase(url: cloudFile)
        #expect(try await SyncDriver.syncUntilIdle(engine, with: cloud).isUpToDate)
        #expect(try ModelContext(here).fetch(WidgetNote.self).map(\.text).sorted() == ["from the other process", "from this process"])
        #expect(try widget(["sync", other, cloudFile.path]) == "[\"from the other process\",\"from this process\"]\n")
        #expect(try cloud.records(in: "notes").count == 2)
    }
}

@Suite("App-group synced store shared by two OS processes")
struct AppGroupSyncProcessTests {
    @Test("both processes write; one uploads at a time; the lease of a killed holder is taken over; nothing uploads twice")
    func leaseTakeover() async throws {
        let root = temporaryRoot()
        let cloudFile = root.appendingPathComponent("cloud.sqlite")
        let process = Process()
        process.executableURL = widgetExecutable()
        process.arguments = ["lease-hold", root.path, cloudFile.path, "1500"]
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = Pipe()
        try process.run()
        #expect(output.fileHandleForReading.availableLine() == "ready")
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()

        var environment = ReplicaEnvironment.live
        environment.appGroupDirectory = { root.appendingPathComponent($0, isDirectory: true) }
        environment.processIdentity = ProcessIdentity(bundleIdentifier: "com.example.trips", processName: "app", processID: ProcessInfo.processInfo.processIdentifier)
        let app = try ModelContainer(for: Schema([WidgetNote.self]), configurations: [
            ModelConfiguration("shared-synced", groupContainer: .identifier("group.replica.tests"), cloudKitDatabase: .private("iCloud.replica.tests")),
        ], environment: environment)
        let context = ModelContext(app)
        context.insert(WidgetNote(text: "written by the app"))
        try context.save()
        var options = SyncEngine.Options()
        options.leaseDurationMilliseconds = 1500
        let engine = try SyncEngine(container: app, storeName: "shared-synced", options: options)
        // The dead widget still holds the lease: this engine must wait, not upload.
        #expect(try engine.nextRequest() == nil)
        #expect(engine.wakeTime != nil)
        let cloud = try SQLiteCloudDatabase(url: cloudFile)
        let status = try await SyncDriver.syncUntilIdle(engine, with: cloud)
        #expect(status.isUpToDate)
        let records = try cloud.records(in: "shared-synced")
        #expect(records.count == 2)
        // Each record was saved exactly once: change tags are "epoch.sequence" and the zone saw two saves in all.
        #expect(Set(records.compactMap { $0.changeTag?.split(separator: ".").last.map(String.init) }) == ["1", "2"])
        #expect(try ModelContext(app).fetch(WidgetNote.self).count == 2)
    }
}
