// A store reopened under another configuration than last time — sync turned off and on again, cloud encryption turned
// on for an attribute of a local store that then becomes synced — loses nothing and leaks nothing (Specs R3, E2).
import Foundation
import Testing
@testable import Replica

/// A memo with every attribute plain.
private struct Memo: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    static let entity = ModelEntity<Memo>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body),
    ])
}

/// The same memo with cloud encryption turned on for `body`.
private struct SealedMemo: PersistentModel, Codable, Equatable {
    static var entityName: String { "Memo" }
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    static let entity = ModelEntity<SealedMemo>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body, options: .allowsCloudEncryption),
    ])
}

private let key: [UInt8] = Array(repeating: 42, count: 32)

private func temporaryDirectory(_ tag: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("replica-reopen-\(tag)-\(UUID().uuidString)")
}

@Suite("Stores reopened under another configuration")
struct ReopenedConfigurationTests {
    @Test("edits, deletes and inserts made while sync was turned off upload when it is turned on again; nothing comes back")
    func syncTurnedOffThenOn() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryDirectory("sync-off")
        let kept: SyncNote, removed: SyncNote
        do {
            let a = try Device("A", seed: 1, directory: directory)
            kept = a.context.insert(SyncNote(title: "kept", rating: 1))
            removed = a.context.insert(SyncNote(title: "removed"))
            try a.context.save()
            try a.sync(cloud)
        }
        let b = try Device("B", seed: 2)
        try b.sync(cloud)
        #expect(try b.notes().count == 2)

        // The app turns sync off for a while and keeps working on the same store.
        let added: SyncNote
        do {
            let local = try ModelContainer(for: SyncNote.self, configurations: ModelConfiguration("notes"),
                                           environment: .seeded(seed: 3, directory: directory))
            let context = ModelContext(local)
            var edit = try #require(try context.model(SyncNote.self, id: kept.id))
            edit.rating = 5
            context.update(edit)
            context.delete(try #require(try context.model(SyncNote.self, id: removed.id)))
            added = context.insert(SyncNote(title: "added while local"))
            try context.save()
        }
        // Sync on again.
        let a = try Device("A again", seed: 4, directory: directory)
        #expect(try a.sync(cloud).isUpToDate)
        try b.sync(cloud)
        try a.sync(cloud)
        for device in [a, b] {
            let notes = try device.notes()
            #expect(Set(notes.map(\.id)) == [kept.id, added.id], "\(device.name)")
            #expect(notes.first { $0.id == kept.id }?.rating == 5, "\(device.name)")
        }
    }

    @Test("an attribute encrypted before a local store is first synced never reaches the cloud in plaintext")
    func encryptionTurnedOnBeforeSync() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryDirectory("local-then-synced")
        let bodies = (0..<3).map { "local plaintext body \($0)" }
        do {
            let local = try ModelContainer(for: Memo.self, configurations: ModelConfiguration("notes"),
                                           environment: .seeded(seed: 1, directory: directory))
            let context = ModelContext(local)
            for body in bodies { context.insert(Memo(title: "t", body: body)) }
            try context.save()
        }
        // Without an encryption configuration, no engine can be made (nothing would be sealed).
        let unconfigured = try ModelContainer(for: SealedMemo.self, configurations: ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
                                              environment: .seeded(seed: 2, directory: directory))
        #expect(throws: FieldEncryptionError.encryptionNotConfigured(entity: "Memo", field: "body")) {
            _ = try SyncEngine(container: unconfigured, storeName: "notes")
        }
        let synced = try CryptoDevice("synced", seed: 3, encryption: .rawKey(key), models: [SealedMemo.self], directory: directory)
        #expect(try synced.sync(cloud).isUpToDate)
        #expect(cloud.records(in: "notes").count == 3)
        #expect(leakedCount(of: bodies.map { Data($0.utf8) }, in: cloud.storedBytes(of: "notes")) == 0)
        let other = try CryptoDevice("other", seed: 4, encryption: .rawKey(key), models: [SealedMemo.self])
        #expect(try other.sync(cloud).isUpToDate)
        #expect(Set(try ModelContext(other.container).fetch(SealedMemo.self).compactMap(\.body)) == Set(bodies))
    }

    @Test("sync off, encryption turned on, sync on: refused because the zone holds the field in plaintext; the edit is kept, not uploaded")
    func encryptionTurnedOnWhileSyncWasOff() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryDirectory("off-encrypt-on")
        let id: UUID
        do {
            let v1 = try CryptoDevice("v1", seed: 1, encryption: nil, models: [Memo.self], directory: directory)
            id = v1.context.insert(Memo(title: "t", body: "old")).id
            try v1.context.save()
            try v1.sync(cloud)
        }
        do {
            let local = try ModelContainer(for: SealedMemo.self, configurations: ModelConfiguration("notes"),
                                           environment: .seeded(seed: 2, directory: directory))
            let context = ModelContext(local)
            var memo = try #require(try context.model(SealedMemo.self, id: id))
            memo.body = "written while sync was off"
            context.update(memo)
            try context.save()
        }
        let v2 = try CryptoDevice("v2", seed: 3, encryption: .rawKey(key), models: [SealedMemo.self], version: Schema.Version(2, 0, 0),
                                  directory: directory)
        #expect(throws: ReplicaError.incompatibleSchema([.attributeOptionChanged(entity: "Memo", attribute: "body", option: .allowsCloudEncryption, zone: false)])) { try v2.sync(cloud) }
        #expect(try v2.engine.ledgerEntry(for: PersistentIdentifier(entityName: "Memo", id: id))?.state == .pending)
        #expect(leakedCount(of: [Data("written while sync was off".utf8)], in: cloud.storedBytes(of: "notes")) == 0)
    }
}
