// A store that another container or process has open is never migrated or renamed under it: the migration (which
// replaces the store file) and renames through original names (which change its tables) need the store's lock
// exclusively, and are refused with `ReplicaError.storeInUse` without changing anything; additive changes still open
// beside the others. The two-process cases are in AppGroupProcessTests.
import Foundation
import Testing
@testable import Replica

@Suite("Stores in use elsewhere are not migrated under them")
struct StoreInUseTests {
    let directory = TestDirectory()

    /// A version 1 store holding two notes.
    private func makeV1Store() throws {
        let context = ModelContext(try v1Container(seed: 1))
        for title in ["first", "second note"] { context.insert(NotesV1.Note(title: title)) }
        try context.save()
    }

    private func v1Container(seed: UInt64, allowsSave: Bool = true) throws -> ModelContainer {
        try ModelContainer(for: NotesV1.schema, migrationPlan: nil, configurations: [ModelConfiguration(allowsSave: allowsSave)],
                           environment: directory.environment(seed: seed))
    }

    private func columns() throws -> [String] {
        try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info('Note') ORDER BY cid").compactMap {
            if case let .text(name) = $0[0] { name } else { nil }
        }
    }

    private func recordedVersion() throws -> SQLiteValue? {
        try rawConnection(directory.storeURL(), readOnly: true).scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'")
    }

    /// The reason of a `storeInUse` error of configuration "default"; records an issue for any other error.
    private func inUseReason(_ open: () throws -> ModelContainer) -> String? {
        do {
            _ = try open()
            Issue.record("the store opened")
        } catch let ReplicaError.storeInUse(configuration, reason) {
            #expect(configuration == "default")
            return reason
        } catch {
            Issue.record("unexpected error: \(error)")
        }
        return nil
    }

    @Test("a migration while another container has the store open is refused and changes nothing; once it closes, the migration runs and keeps what it wrote meanwhile")
    func migrationRefusedWhileOpen() throws {
        try makeV1Store()
        var holder: ModelContainer? = try v1Container(seed: 2)
        let reason = inUseReason { try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 3)) }
        #expect(reason?.contains("from schema version 1.0.0 to 3.0.0") == true)
        #expect(reason?.contains("another process or container has it open") == true)
        #expect(try columns() == ["id", "title"])
        #expect(try recordedVersion() == .text("1.0.0"))   // as created from the versioned schema, unchanged
        // The holder goes on writing into the store, which is still the one it opened.
        do {
            let context = ModelContext(try #require(holder))
            context.insert(NotesV1.Note(title: "written meanwhile"))
            try context.save()
        }
        holder = nil
        let migrated = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 4))
        let notes = try ModelContext(migrated).fetch(NotesV3.Note.self).map { "\($0.heading)|\($0.words)" }.sorted()
        #expect(notes == ["first|1", "second note|2", "written meanwhile|2"])
        #expect(try recordedVersion() == .text("3.0.0"))
    }

    @Test("a read-only container holding the store open blocks a migration too")
    func readOnlyHolderBlocksMigration() throws {
        try makeV1Store()
        let holder = try v1Container(seed: 2, allowsSave: false)
        #expect(inUseReason { try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 3)) } != nil)
        #expect(try ModelContext(holder).fetch(NotesV1.Note.self).count == 2)
        #expect(try columns() == ["id", "title"])
    }

    @Test("a rename through an original name while another container has the store open is refused and changes nothing; it runs once that one closes")
    func renameRefusedWhileOpen() throws {
        try makeV1Store()
        // A store no plan manages (no recorded version): a container without a plan renames only those; one recorded
        // at 1.0.0 is renamed by the plan's stages (see "Migration plan starting point").
        try rawConnection(directory.storeURL()).run("DELETE FROM replica_metadata WHERE key = 'schema_version'")
        var holder: ModelContainer? = try v1Container(seed: 2)
        let reason = inUseReason { try ModelContainer(for: Schema([NotesV3.Note.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3)) }
        #expect(reason?.contains("renaming through original names") == true)
        // The rename and the columns added in the same preparing transaction were rolled back.
        #expect(try columns() == ["id", "title"])
        #expect(try ModelContext(try #require(holder)).fetch(NotesV1.Note.self).count == 2)
        holder = nil
        let renamed = try ModelContainer(for: Schema([NotesV3.Note.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 4))
        #expect(try ModelContext(renamed).fetch(NotesV3.Note.self).map(\.heading).sorted() == ["first", "second note"])
        #expect(try columns() == ["id", "heading", "words", "pinned"])
    }

    @Test("an additive change (new attributes, no rename) opens beside another container, and both keep writing")
    func additiveChangeOpensBesideOthers() throws {
        try makeV1Store()
        let old = try v1Container(seed: 2)
        // An unversioned schema: a versioned one (NotesV2.schema) without its plan refuses a store recorded at 1.0.0.
        let new = try ModelContainer(for: Schema([NotesV2.Note.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 3))
        let oldContext = ModelContext(old), newContext = ModelContext(new)
        oldContext.insert(NotesV1.Note(title: "from the old one"))
        try oldContext.save()
        newContext.insert(NotesV2.Note(title: "from the new one", words: 4, pinned: true))
        try newContext.save()
        #expect(try newContext.fetch(NotesV2.Note.self).count == 4)
        #expect(try oldContext.fetch(NotesV1.Note.self).count == 4)
    }

    @Test("while another process migrates the store (its lock held exclusively), opening it is refused; afterwards it opens")
    func openRefusedWhileMigrating() throws {
        try makeV1Store()
        var migrating: StoreFileLock? = try StoreFileLock.take(.exclusive, of: directory.storeURL())
        #expect(migrating != nil)
        #expect(inUseReason { try v1Container(seed: 2) } == Store.migratingElsewhere)
        #expect(inUseReason { try v1Container(seed: 2, allowsSave: false) } == Store.migratingElsewhere)
        migrating = nil
        #expect(try ModelContext(try v1Container(seed: 3)).fetch(NotesV1.Note.self).count == 2)
    }

    /// Forks a child that does nothing but wait for a byte on a pipe (as a child of `posix_spawn` or `Process` holds
    /// a copy of every descriptor between its start and its `exec`); returns its process ID and the pipe's writing end.
    private func forkWaitingChild() throws -> (pid: pid_t, release: Int32) {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        let child = fork()
        if child == 0 {
            var byte: UInt8 = 0
            _ = read(ends[0], &byte, 1)
            _exit(0)
        }
        close(ends[0])
        try #require(child > 0)
        return (child, ends[1])
    }

    private func finish(_ child: (pid: pid_t, release: Int32)) {
        var byte: UInt8 = 1
        _ = write(child.release, &byte, 1)
        close(child.release)
        var status: Int32 = 0
        _ = waitpid(child.pid, &status, 0)
    }

    @Test("a child process started while the store's lock is held does not keep it: once given up, the store opens and migrates (a host that starts helper processes; was refused as \"migrating right now\" under a flock lock the child shared until its exec)")
    func childProcessDoesNotInheritTheLock() throws {
        try makeV1Store()
        // A migration's exclusive lock, given up while a child started meanwhile still runs.
        var migrating: StoreFileLock? = try StoreFileLock.take(.exclusive, of: directory.storeURL())
        let first = try forkWaitingChild()
        defer { finish(first) }
        migrating = nil
        _ = migrating
        var holder: ModelContainer? = try v1Container(seed: 2)
        #expect(try ModelContext(try #require(holder)).fetch(NotesV1.Note.self).count == 2)
        // A container's shared lock, given up while a child started meanwhile still runs: the migration needs it to
        // itself.
        let second = try forkWaitingChild()
        defer { finish(second) }
        holder = nil
        let migrated = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 3))
        #expect(try ModelContext(migrated).fetch(NotesV3.Note.self).count == 2)
        #expect(try recordedVersion() == .text("3.0.0"))
    }

    @Test("a container opening with a plan while another migrates the store leaves that migration's staged copy alone")
    func concurrentMigratorKeepsTheCopy() throws {
        try makeV1Store()
        let copy = directory.url.appendingPathComponent("default.store.migrating")
        let migrating = try StoreFileLock.take(.exclusive, of: directory.storeURL())
        #expect(FileManager.default.createFile(atPath: copy.path, contents: Data("the other migration's copy".utf8)))
        for plan in [NotesPlan.self, NotesPlanToV2.self] as [any SchemaMigrationPlan.Type] {
            let schema = plan == NotesPlan.self ? NotesV3.schema : NotesV2.schema
            #expect(inUseReason { try ModelContainer(for: schema, migrationPlan: plan, environment: directory.environment(seed: 3)) } != nil)
            #expect(FileManager.default.contents(atPath: copy.path) == Data("the other migration's copy".utf8))
        }
        withExtendedLifetime(migrating) {}
    }

    @Test("a finished migration leaves the store, its lock file and nothing of the staged copy")
    func migrationLeavesNoCopy() throws {
        try makeV1Store()
        _ = try ModelContainer(for: NotesV3.schema, migrationPlan: NotesPlan.self, environment: directory.environment(seed: 3))
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.url.path).filter { $0.hasPrefix("default.store") }.sorted()
        #expect(files.allSatisfy { !$0.contains("migrating") })
        #expect(files.contains("default.store-lock"))
    }
}
