import CSQLite
import Foundation
import Synchronization
import Testing
@_spi(Simulation) @testable import Replica

// Adversarial tests (session 6) for three features of `perf-sim`: in-memory store recycling, the merge shortcut for
// versions the ledger already holds, and engines sharing their context's connection.
// Models of their own: retired connections wait per layout (entities), and tests run in parallel.

struct Adv6Temp: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<Adv6Temp>([.attribute("name", \.name, default: "")])
}

struct Adv6Overlay: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<Adv6Overlay>([.attribute("name", \.name, default: "")])
}

struct Adv6Conc: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    static let entity = ModelEntity<Adv6Conc>([.attribute("name", \.name, default: "")])
}

struct Adv6Synced: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var rating: Int = 0
    static let entity = ModelEntity<Adv6Synced>([
        .attribute("name", \.name, default: ""),
        .attribute("rating", \.rating, default: 0),
    ])
}

@Suite("Adversarial session 6")
struct AdversarialSession6Tests {
    // MARK: Helpers



    /// Rows of every TEMP table of the store's next connection, as "table: count".
    private func tempRows(_ container: ModelContainer) throws -> [String] {
        let store = container.stores[0]
        let db = try store.openConnection()
        defer { store.reuse(db) }
        var result: [String] = []
        for row in try db.rows("SELECT name FROM sqlite_temp_master WHERE type = 'table' ORDER BY name", cache: false) {
            guard case let .text(table) = row[0] else { continue }
            if case let .integer(count)? = try db.scalar("SELECT count(*) FROM temp.\(quoted(table))"), count > 0 {
                result.append("\(table): \(count)")
            }
        }
        return result
    }

    private func sync(_ engine: SyncEngine, _ cloud: InMemoryCloudDatabase) throws {
        engine.setNeedsFetch()
        for _ in 0..<300 {
            guard let request = try engine.nextRequest() else { return }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
        Issue.record("the engine did not settle")
    }

    // MARK: 1. Store recycling

    /// A fetch with unsaved changes fills a TEMP table with the pending rows (QueryEngine.overlay). TEMP tables are
    /// per connection and are not among the tables `takeRetired()` empties (it deletes the rows of `main` tables only),
    /// nor does `resetForReuse()` drop them: the next, unrelated in-memory store then holds the unsaved data of the
    /// store that went away on its connection. The API never reads it without first deleting it (overlay starts with
    /// `DELETE FROM temp...`), so no query result shows it — but the data outlives its store in memory, and the new
    /// store's database is not "indistinguishable from a new one" (`sqlite_temp_master` differs).
    @Test func unsavedRowsInTempOverlayTablesDoNotSurviveRecycling() throws {
        var old: ModelContainer? = try inMemoryContainer(seed: 1, synced: false, models: [Adv6Overlay.self])
        var oldHandle: OpaquePointer?
        do {
            let context = ModelContext(old!)
            _ = context.insert(Adv6Overlay(name: "unsaved secret"))
            #expect(try context.fetch(Adv6Overlay.self).map(\.name) == ["unsaved secret"], "the fetch overlays the pending insert")
            context.rollback()
        }
        // The context gave its connection back: it is the one the store hands out next (and would retire).
        oldHandle = try nextConnectionHandle(old!)
        #expect(try tempRows(old!).isEmpty == false, "the overlay's TEMP table holds the pending row")
        old = nil
        let next = try inMemoryContainer(seed: 2, synced: false, models: [Adv6Overlay.self])
        let recycled = try nextConnectionHandle(next) == oldHandle
        #expect(recycled, "the new store starts from the old one's connection")
        #expect(try ModelContext(next).fetch(Adv6Overlay.self).isEmpty)
        if recycled {
            let leftover = try tempRows(next)
            // Found in session 6 (fixed): `takeRetired()` emptied only `main` tables; TEMP tables of the connection
            // (QueryEngine's pending-change overlays) kept the old store's unsaved rows
            // (["replica_pending_Adv6Overlay_0: 1"]).
            #expect(leftover == [], "no row of the old store stays on the recycled connection")
        }
    }

    /// Stores with the same entities created, used and dropped from several threads at once: every store sees only
    /// its own rows, history and identity.
    @Test func storesMadeConcurrentlyFromSeveralThreadsStayIsolated() throws {
        let failures = Mutex<[String]>([])
        let identities = Mutex<[UUID]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            for round in 0..<25 {
                do {
                    let container = try inMemoryContainer(seed: UInt64(worker * 1000 + round), synced: true, models: [Adv6Conc.self])
                    let context = ModelContext(container)
                    let name = "w\(worker)-r\(round)"
                    let before = try context.fetch(Adv6Conc.self).map(\.name)
                    if !before.isEmpty { failures.withLock { $0.append("\(name): a new store holds \(before)") } }
                    _ = context.insert(Adv6Conc(name: name))
                    try context.save()
                    let names = try ModelContext(container).fetch(Adv6Conc.self).map(\.name)
                    let history = try context.fetchHistory()
                    let engine = try SyncEngine(container: container, storeName: "main")
                    let pending = try engine.status().pendingRecords
                    if names != [name] || history.count != 1 || pending != 1 {
                        failures.withLock { $0.append("\(name): rows \(names), history \(history.count), pending \(pending)") }
                    }
                    identities.withLock { $0.append(container.stores[0].identity) }
                } catch {
                    failures.withLock { $0.append("w\(worker)-r\(round): \(error)") }
                }
            }
        }
        #expect(failures.withLock { $0 } == [])
        let all = identities.withLock { $0 }
        #expect(Set(all).count == all.count, "every store has its own replica identity")
    }

    /// A recycled synced store used for sync with a new cloud uploads nothing of the store that went away, and its
    /// HLC is not carried over: it ends up exactly as a device with a never-used store.
    @Test func aRecycledSyncedStoreUploadsNothingOfTheOldOne() throws {
        var old: ModelContainer? = try inMemoryContainer(seed: 11, synced: true, models: [Adv6Synced.self])
        do {
            let context = ModelContext(old!)
            for i in 0..<5 { _ = context.insert(Adv6Synced(name: "old \(i)", rating: i)) }
            try context.save()
            let engine = try SyncEngine(container: old!, storeName: "main")
            try sync(engine, InMemoryCloudDatabase())
            // An unsynced edit left behind as well.
            var first = try #require(try context.fetch(Adv6Synced.self).first)
            first.rating = 99
            context.update(first)
            try context.save()
        }
        let oldHandle = try nextConnectionHandle(old!)
        old = nil

        let recycled = try inMemoryContainer(seed: 12, synced: true, models: [Adv6Synced.self])
        #expect(try nextConnectionHandle(recycled) == oldHandle, "the new store starts from the old one's connection")
        let cloud = InMemoryCloudDatabase()
        let engine = try SyncEngine(container: recycled, storeName: "main")
        #expect(try engine.status().pendingRecords == 0)
        try sync(engine, cloud)
        #expect(cloud.records(in: "main").isEmpty, "nothing of the old store reaches the cloud")
        #expect(try ModelContext(recycled).fetch(Adv6Synced.self).isEmpty)
        #expect(try ModelContext(recycled).fetchHistory().isEmpty)
    }

    /// Two in-memory containers with the same entities alive at once never share a database, even when retired
    /// connections wait.
    @Test func twoLiveContainersNeverShareADatabase() throws {
        var dropped: [ModelContainer?] = try (0..<3).map { try inMemoryContainer(seed: UInt64(20 + $0), synced: false, models: [Adv6Temp.self]) }
        for container in dropped {
            let context = ModelContext(container!)
            _ = context.insert(Adv6Temp(name: "dropped"))
            try context.save()
        }
        dropped = []
        let a = try inMemoryContainer(seed: 30, synced: false, models: [Adv6Temp.self])
        let b = try inMemoryContainer(seed: 31, synced: false, models: [Adv6Temp.self])
        #expect(a.stores[0].location != b.stores[0].location)
        let ca = ModelContext(a), cb = ModelContext(b)
        _ = ca.insert(Adv6Temp(name: "a"))
        try ca.save()
        #expect(try cb.fetch(Adv6Temp.self).isEmpty)
        #expect(try ca.fetch(Adv6Temp.self).map(\.name) == ["a"])
    }

    /// Read-only in-memory stores between writable ones: a writable store never gets a read-only connection, and a
    /// read-only store never sees a dropped store's rows.
    @Test func readOnlyInMemoryStoresAmongRecycledOnes() throws {
        func make(_ seed: UInt64, allowsSave: Bool) throws -> ModelContainer {
            let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory
                .appendingPathComponent("replica-adv6-ro-\(UUID().uuidString)"))
            return try ModelContainer(for: Schema([Adv6Synced.self]), configurations: [
                ModelConfiguration("main", isStoredInMemoryOnly: true, allowsSave: allowsSave, cloudKitDatabase: .none),
            ], environment: environment)
        }
        for round in 0..<3 {
            do {
                let writable = try make(UInt64(100 + round), allowsSave: true)
                let context = ModelContext(writable)
                _ = context.insert(Adv6Synced(name: "w\(round)"))
                try context.save()
            }
            // A read-only in-memory store cannot be opened at all ("no such table: replica_metadata": nothing creates
            // its schema) — also on first use, with no recycling involved; what matters here is the stores around it.
            if let readOnly = try? make(UInt64(200 + round), allowsSave: false) {
                #expect(try ModelContext(readOnly).fetch(Adv6Synced.self).isEmpty)
            }
            let writable = try make(UInt64(300 + round), allowsSave: true)
            let context = ModelContext(writable)
            #expect(try context.fetch(Adv6Synced.self).isEmpty)
            _ = context.insert(Adv6Synced(name: "x\(round)"))
            try context.save()
            #expect(try ModelContext(writable).fetch(Adv6Synced.self).map(\.name) == ["x\(round)"])
        }
    }

    // MARK: 2. Merge shortcut

    /// A row edited by a process that opened the file without sync (local-only configuration) after the record was
    /// synced: the ledger still says "synced, tag T". A later full re-read returns version T: skipped by the shortcut.
    /// The devices must still converge (the edit reaches the other device, or the remote version is restored).
    @Test func anEditMadeWithoutSyncThenAFullReRead() throws {
        let cloud = InMemoryCloudDatabase()
        let dirB = FileManager.default.temporaryDirectory.appendingPathComponent("replica-adv6-nosync-\(UUID().uuidString)")
        let a = try Device("a", seed: 1)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        do {
            let b = try Device("b", seed: 2, directory: dirB)
            try b.sync(cloud)
        }
        do {
            var environment = ReplicaEnvironment.seeded(seed: 4, directory: dirB)
            environment.canaries = []
            let local = try ModelContainer(for: Schema([SyncNote.self]), configurations: [
                ModelConfiguration("notes", isStoredInMemoryOnly: false, cloudKitDatabase: .none),
            ], environment: environment)
            let context = ModelContext(local)
            var edited = try #require(try context.model(SyncNote.self, id: note.id))
            edited.rating = 5
            context.update(edited)
            try context.save()
        }
        let b = try Device("b", seed: 3, directory: dirB)
        cloud.expireChangeTokens(in: "notes")
        try b.sync(cloud)
        try a.sync(cloud)
        let onA = try a.notes().map(\.rating), onB = try b.notes().map(\.rating)
        // BUG (merge shortcut): b keeps 5, a and the cloud 1, for good. Passes with the shortcut disabled (the full
        // merge of the re-read version rewrites b's row, and they converge). SyncLedger's own comment names this case
        // ("a row can predate it ... saved ... by a process that opened the file without sync"): the shortcut's premise
        // "the row is what version T says" does not hold for such rows.
        // Fixed in session 6: held versions are skipped only while no full resync is under way.
        #expect(onB == onA, "a and b converge")
    }

    /// Change tags are only unique within one cloud database. When the device's store moves to another cloud
    /// database (account switch, a rebuilt server database), a version there can carry a tag the ledger holds from
    /// the old cloud for a different version. The shortcut then skips it, and the device keeps stale data while the
    /// cloud and the other device have newer data: they diverge for good (no later fetch delivers it again).
    /// Failed with the first version of the shortcut (found in session 6); fixed: a read of another cloud database
    /// starts from no valid token, so it is a full resync, which merges every version in full.
    @Test func aTagRepeatedByAnotherCloudDatabaseIsNotMistakenForAHeldVersion() throws {
        let cloud1 = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud1)
        try b.sync(cloud1)
        #expect(try b.notes().map(\.rating) == [1])

        // Both move to a new cloud database; a edits the note and uploads it there first.
        let cloud2 = InMemoryCloudDatabase()
        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud2)
        // b reads the new cloud from scratch (its token is not valid there).
        cloud2.expireChangeTokens(in: "notes")
        try b.sync(cloud2)
        try a.sync(cloud2)
        let cloudRating = cloud2.records(in: "notes").first.flatMap { record -> Int64? in
            if case let .integer(value)? = record.fields["rating"]?.value { return value } else { return nil }
        }
        #expect(try a.notes().map(\.rating) == [2])
        #expect(try b.notes().map(\.rating) == (try a.notes().map(\.rating)), "b converges with a and the cloud (\(String(describing: cloudRating)))")
    }

    /// A device on an older schema keeps a newer device's extra field as unknown; after upgrading it must show it.
    @Test func aFieldUnknownBeforeAnUpgradeShowsAfterIt() throws {
        let cloud = InMemoryCloudDatabase()
        let dirB = FileManager.default.temporaryDirectory.appendingPathComponent("replica-adv6-b-\(UUID().uuidString)")
        let a = try Device("a", seed: 1, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        let note = a.context.insert(SyncNoteV2(title: "one", rating: 1, mood: "stormy"))
        try a.context.save()
        try a.sync(cloud)
        do {
            let b = try Device("b", seed: 2, directory: dirB)
            try b.sync(cloud)
            #expect(try b.notes().map(\.title) == ["one"])
        }
        let upgraded = try Device("b", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0), directory: dirB)
        try upgraded.sync(cloud)
        // Found in session 6 (a bug older than the session; fixed): on upgrade, a field the ledger kept as unknown
        // (R9) was not moved into the row; the upgraded device showed the default "calm" while the record says
        // "stormy". An upgrade that adds tables or columns to a synced store now starts a full resync.
        let moods = try ModelContext(upgraded.container).fetch(SyncNoteV2.self).map(\.mood)
        #expect(moods == ["stormy"])
        _ = note
    }

    private func upgradedDevice(_ cloud: InMemoryCloudDatabase) throws -> (Device, Device) {
        let dirB = FileManager.default.temporaryDirectory.appendingPathComponent("replica-adv6-b-\(UUID().uuidString)")
        let a = try Device("a", seed: 1, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        _ = a.context.insert(SyncNoteV2(title: "one", rating: 1, mood: "stormy"))
        try a.context.save()
        try a.sync(cloud)
        do {
            let b = try Device("b", seed: 2, directory: dirB)
            try b.sync(cloud)
        }
        let upgraded = try Device("b", seed: 3, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0), directory: dirB)
        return (a, upgraded)
    }

    /// As above, then a full re-read of the zone (expired token). Before the shortcut, the full resync merged the
    /// record again and the now-known field arrived. The shortcut's premise (P3: "by R10 merging it again changes
    /// nothing") does not hold across a schema upgrade: the same version merged under the new schema changes the row.
    @Test func aFullResyncAfterAnUpgradeBringsTheNowKnownField() throws {
        let cloud = InMemoryCloudDatabase()
        let (_, b) = try upgradedDevice(cloud)
        cloud.expireChangeTokens(in: "notes")
        try b.sync(cloud)
        // BUG (merge shortcut): fails with the shortcut, passes with it disabled (`if false, let local, ...` at
        // SyncLedger.swift "A version this device holds already"): the re-read version's tag is in the ledger, state
        // synced, so it is skipped although merging it under the new schema would set the field.
        let moods = try ModelContext(b.container).fetch(SyncNoteV2.self).map(\.mood)
        // Fixed in session 6: a full resync merges held versions in full, and so does a held version carrying a
        // field the ledger keeps as unknown that the schema now knows.
        #expect(moods == ["stormy"])
    }

    /// After the upgrade, the upgraded device edits another field and uploads: the newer device's value of the field
    /// the older version did not know must survive (R9: an older app version never erases what a newer one wrote).
    @Test func anUpgradedDeviceEditingAnotherFieldDoesNotEraseTheFormerlyUnknownOne() throws {
        let cloud = InMemoryCloudDatabase()
        let (a, b) = try upgradedDevice(cloud)
        try b.sync(cloud)
        var note = try #require(try ModelContext(b.container).fetch(SyncNoteV2.self).first)
        note.title = "edited on b"
        b.context.update(note)
        try b.context.save()
        try b.sync(cloud)
        try a.sync(cloud)
        let onA = try ModelContext(a.container).fetch(SyncNoteV2.self).map { "\($0.title) \($0.mood)" }
        let onB = try ModelContext(b.container).fetch(SyncNoteV2.self).map { "\($0.title) \($0.mood)" }
        #expect(onA == ["edited on b stormy"])
        // Found in session 6 (older than the session; fixed as above): b's row kept "calm" while a and the cloud
        // had "stormy" — the devices diverged for good.
        #expect(onB == onA)
    }

    /// Control for the tag-collision test: the same moves, but the new cloud gives the note a tag b never saw
    /// (another record takes the first sequence number there): b converges. The difference is the repeated tag.
    @Test func controlAnotherCloudWithFreshTagsConverges() throws {
        let cloud1 = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud1)
        try b.sync(cloud1)
        let cloud2 = InMemoryCloudDatabase()
        let c = try Device("c", seed: 3)
        c.context.insert(SyncNote(title: "from c"))
        try c.context.save()
        try c.sync(cloud2)
        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud2)
        cloud2.expireChangeTokens(in: "notes")
        try b.sync(cloud2)
        try a.sync(cloud2)
        #expect(try b.notes().map(\.rating).sorted() == (try a.notes().map(\.rating).sorted()))
        #expect(try b.notes().contains { $0.id == note.id && $0.rating == 2 })
    }

    /// A zone reset in the same cloud, then the record re-uploaded and edited: tags stay unique across resets of one
    /// InMemoryCloudDatabase (epochs outlive resets), so b converges.
    @Test func zoneResetThenReuploadConverges() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        cloud.resetZone("notes")
        var edited = try #require(try a.context.model(SyncNote.self, id: note.id))
        edited.rating = 2
        a.context.update(edited)
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        try a.sync(cloud)
        try b.sync(cloud)
        #expect(try a.notes().map(\.rating) == [2])
        #expect(try b.notes().map(\.rating) == [2])
    }

    /// A record deleted and re-inserted on one device, fetched by another that held the earlier version.
    @Test func deleteThenReinsertElsewhereConverges() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("a", seed: 1), b = try Device("b", seed: 2)
        let note = a.context.insert(SyncNote(title: "one", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        a.context.delete(try #require(try a.context.model(SyncNote.self, id: note.id)))
        try a.context.save()
        try a.sync(cloud)
        // b misses the delete: it reads from scratch later
        var again = note
        again.rating = 7
        a.context.insert(again)
        try a.context.save()
        try a.sync(cloud)
        cloud.expireChangeTokens(in: "notes")
        try b.sync(cloud)
        try a.sync(cloud)
        #expect(try b.notes().map(\.rating) == (try a.notes().map(\.rating)))
        #expect(try a.notes().map(\.rating) == [7])
    }

    // MARK: 3. Engine sharing its context's connection

    private func sharedContainer(seed: UInt64) throws -> ModelContainer {
        try inMemoryContainer(seed: seed, synced: true, models: [Trip.self, Item.self])
    }

    /// A fetch result applied while the context enumerates (same connection, a read statement in progress): the
    /// enumeration finishes without error and the merged rows are visible afterwards.
    @Test func aMergeAppliedWhileTheContextEnumeratesOnTheSameConnection() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try sharedContainer(seed: 1), b = try sharedContainer(seed: 2)
        let ca = ModelContext(a), cb = ModelContext(b)
        let ea = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        for i in 0..<5 { _ = cb.insert(Trip(name: "b\(i)")) }
        try cb.save()
        for i in 0..<5 { _ = ca.insert(Trip(name: "a\(i)")) }
        try ca.save()
        try sync(ea, cloud)
        try sync(eb, cloud)
        // b edits everything; a enumerates its trips and syncs in the middle.
        for var trip in try cb.fetch(Trip.self) { trip.rating = 9; cb.update(trip) }
        try cb.save()
        try sync(eb, cloud)
        var seen = 0
        try ca.enumerate(FetchDescriptor<Trip>(), batchSize: 2) { _ in
            seen += 1
            if seen == 3 { try sync(ea, cloud) }
        }
        #expect(seen == 10)
        #expect(try ca.fetch(Trip.self).map(\.rating) == Array(repeating: 9, count: 10))
        #expect(try ea.status().pendingRecords == 0)
    }

    /// Unsaved context edits survive a merge on the shared connection, and saving them afterwards wins over the
    /// merged (older) version; rollback afterwards leaves the merged data.
    @Test func unsavedEditsAcrossAMergeOnTheSharedConnection() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try sharedContainer(seed: 3), b = try sharedContainer(seed: 4)
        let ca = ModelContext(a), cb = ModelContext(b)
        let ea = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        let trip = ca.insert(Trip(name: "Lisbon", rating: 1))
        let other = ca.insert(Trip(name: "Porto", rating: 1))
        try ca.save()
        try sync(ea, cloud)
        try sync(eb, cloud)
        var remote = try #require(try cb.model(Trip.self, id: trip.id))
        remote.rating = 5
        cb.update(remote)
        var remoteOther = try #require(try cb.model(Trip.self, id: other.id))
        remoteOther.destination = "north"
        cb.update(remoteOther)
        try cb.save()
        try sync(eb, cloud)

        var local = try #require(try ca.model(Trip.self, id: trip.id))
        local.rating = 7
        ca.update(local)
        var localOther = try #require(try ca.model(Trip.self, id: other.id))
        localOther.rating = 3
        ca.update(localOther)
        try sync(ea, cloud) // merges b's edits while a has unsaved edits
        #expect(ca.hasChanges, "the merge does not drop the context's unsaved edits")
        try ca.save()
        try sync(ea, cloud)
        try sync(eb, cloud)
        let onA = try ca.fetch(Trip.self).map { "\($0.name) \($0.rating) \($0.destination ?? "-")" }.sorted()
        let onB = try cb.fetch(Trip.self).map { "\($0.name) \($0.rating) \($0.destination ?? "-")" }.sorted()
        #expect(onA == ["Lisbon 7 -", "Porto 3 north"], "a's later edits win, b's untouched field merges in")
        #expect(onA == onB)

        // A rollback after a merge drops only the unsaved edit.
        var x = try #require(try ca.model(Trip.self, id: trip.id))
        x.rating = 100
        ca.update(x)
        var y = try #require(try cb.model(Trip.self, id: trip.id))
        y.name = "Lisboa"
        cb.update(y)
        try cb.save()
        try sync(eb, cloud)
        try sync(ea, cloud)
        ca.rollback()
        #expect(try ca.fetch(Trip.self).map { "\($0.name) \($0.rating)" }.sorted() == ["Lisboa 7", "Porto 3"])
    }

    /// Crash-like drop: an engine goes away between taking a request and its answer (an upload in flight, a fetch
    /// in flight); the context keeps working, a new engine on the same context picks up, and both devices converge.
    @Test func anEngineDroppedWithRequestsInFlightThenANewOneOnTheSameContext() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try sharedContainer(seed: 7), b = try sharedContainer(seed: 8)
        let ca = ModelContext(a), cb = ModelContext(b)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        for i in 0..<3 { _ = cb.insert(Trip(name: "b\(i)")) }
        try cb.save()
        try sync(eb, cloud)
        do {
            let ea = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
            _ = ca.insert(Trip(name: "a0"))
            try ca.save()
            ea.setNeedsFetch()
            // Perform requests at the cloud but drop the engine before handing it the answers.
            for _ in 0..<3 {
                guard let request = try ea.nextRequest() else { break }
                _ = cloud.performNow(request.operation)
            }
        }
        _ = ca.insert(Trip(name: "a1"))
        try ca.save()
        let again = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        try sync(again, cloud)
        try sync(eb, cloud)
        try sync(again, cloud)
        #expect(try ca.fetch(Trip.self).map(\.name).sorted() == ["a0", "a1", "b0", "b1", "b2"])
        #expect(try cb.fetch(Trip.self).map(\.name).sorted() == ["a0", "a1", "b0", "b1", "b2"])
        #expect(try again.status().pendingRecords == 0)
    }

    /// Two engines created on one context (same connection, same store): both sync without corrupting each other,
    /// and a second device sees every change.
    @Test func twoEnginesSharingOneContext() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try sharedContainer(seed: 5), b = try sharedContainer(seed: 6)
        let ca = ModelContext(a), cb = ModelContext(b)
        let e1 = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let e2 = try SyncEngine(container: a, storeName: "main", sharingConnectionOf: ca)
        let eb = try SyncEngine(container: b, storeName: "main", sharingConnectionOf: cb)
        for i in 0..<4 { _ = ca.insert(Trip(name: "t\(i)")) }
        try ca.save()
        // Interleave the two engines' requests.
        e1.setNeedsFetch(); e2.setNeedsFetch()
        for _ in 0..<300 {
            let r1 = try e1.nextRequest(), r2 = try e2.nextRequest()
            if r1 == nil && r2 == nil { break }
            let res1 = r1.map { cloud.performNow($0.operation) }
            let res2 = r2.map { cloud.performNow($0.operation) }
            if let r1, let res1 { try e1.handle(r1.id, res1) }
            if let r2, let res2 { try e2.handle(r2.id, res2) }
        }
        try sync(e1, cloud)
        try sync(e2, cloud)
        try sync(eb, cloud)
        #expect(try cb.fetch(Trip.self).map(\.name).sorted() == ["t0", "t1", "t2", "t3"])
        #expect(try e1.status().pendingRecords == 0)
        #expect(try e2.status().pendingRecords == 0)
        #expect(try ca.fetch(Trip.self).count == 4)
    }
}
