// Attribute options that change what the cloud holds (cloud encryption, external storage) are part of the zone's
// union schema (Specs R13); and a store reopened under another configuration than last time loses nothing and leaks
// nothing (Specs E2).
import Foundation
import Testing
@testable import Replica

/// Version 1 of a memo: every attribute plain.
private struct Memo: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var attachment: Data?
    static let entity = ModelEntity<Memo>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body),
        .attribute("attachment", \.attachment),
    ])
}

/// The same memo with cloud encryption turned on for the existing attribute `body`.
private struct SealedMemo: PersistentModel, Codable, Equatable {
    static var entityName: String { "Memo" }
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var attachment: Data?
    static let entity = ModelEntity<SealedMemo>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body, options: .allowsCloudEncryption),
        .attribute("attachment", \.attachment),
    ])
}

/// The same memo with external storage turned on for the existing attribute `attachment`.
private struct ExternalMemo: PersistentModel, Codable, Equatable {
    static var entityName: String { "Memo" }
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var attachment: Data?
    static let entity = ModelEntity<ExternalMemo>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body),
        .attribute("attachment", \.attachment, options: .externalStorage),
    ])
}

/// The migration path: `body` stays as it was (no longer written), a new attribute `sealedBody` holds the text, encrypted.
private struct MemoV3: PersistentModel, Codable, Equatable {
    static var entityName: String { "Memo" }
    var id = UUID.unassigned
    var title: String = ""
    var body: String?
    var attachment: Data?
    var sealedBody: String?
    static let entity = ModelEntity<MemoV3>([
        .attribute("title", \.title, default: ""),
        .attribute("body", \.body),
        .attribute("attachment", \.attachment),
        .attribute("sealedBody", \.sealedBody, options: .allowsCloudEncryption),
    ])
}

private let key: [UInt8] = Array(repeating: 42, count: 32)

private func temporaryDirectory(_ tag: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("replica-options-\(tag)-\(UUID().uuidString)")
}

private func optionChanged(_ attribute: String, _ option: SchemaDifference.CloudOption, zone: Bool) -> ReplicaError {
    .incompatibleSchema([.attributeOptionChanged(entity: "Memo", attribute: attribute, option: option, zone: zone)])
}

@Suite("Attribute options in the zone's union schema")
struct SchemaOptionGateTests {
    @Test("turning cloud encryption on for an existing attribute is refused at the gate, before anything is fetched or uploaded")
    func encryptionTurnedOn() throws {
        let cloud = InMemoryCloudDatabase()
        let v1 = try CryptoDevice("v1", seed: 1, encryption: nil, models: [Memo.self])
        v1.context.insert(Memo(title: "plain", body: "a plaintext body"))
        try v1.context.save()
        try v1.sync(cloud)
        let before = cloud.storedBytes(of: "notes")

        let v2 = try CryptoDevice("v2", seed: 2, encryption: .rawKey(key), models: [SealedMemo.self], version: Schema.Version(2, 0, 0))
        v2.context.insert(SealedMemo(title: "sealed", body: "a body meant to be sealed"))
        try v2.context.save()
        let expected = optionChanged("body", .allowsCloudEncryption, zone: false)
        #expect(throws: expected) { try v2.sync(cloud) }
        #expect(try v2.engine.status().blockedBy == expected)
        #expect(try !v2.engine.status().isUpToDate)
        // Nothing was fetched, merged or uploaded; the zone is as it was; local data is untouched.
        #expect(!v2.sent.contains("fetchZoneChanges") && !v2.sent.contains("modifyRecords") && !v2.sent.contains("setZoneMetadata"))
        #expect(cloud.storedBytes(of: "notes") == before)
        #expect(try ModelContext(v2.container).fetch(SealedMemo.self).map(\.title) == ["sealed"])
        // The description names the entity, the attribute and the option.
        let description = expected.description
        #expect(description.contains("Memo.body") && description.contains("allowsCloudEncryption"))
        // The first version keeps syncing.
        #expect(try v1.sync(cloud).isUpToDate)
    }

    @Test("a device that uploads an attribute in plaintext where the zone seals it is refused")
    func encryptionTurnedOff() throws {
        let cloud = InMemoryCloudDatabase()
        let sealed = try CryptoDevice("sealed", seed: 1, encryption: .rawKey(key), models: [SealedMemo.self])
        sealed.context.insert(SealedMemo(title: "t", body: "sealed body"))
        try sealed.context.save()
        try sealed.sync(cloud)
        let before = cloud.storedBytes(of: "notes")
        // Even an older version (which may lack attributes) may not contradict an option of one it has.
        let plain = try CryptoDevice("plain", seed: 2, encryption: nil, models: [Memo.self], version: Schema.Version(0, 9, 0))
        plain.context.insert(Memo(title: "plain", body: "would be uploaded in plaintext"))
        try plain.context.save()
        #expect(throws: optionChanged("body", .allowsCloudEncryption, zone: true)) { try plain.sync(cloud) }
        #expect(!plain.sent.contains("modifyRecords") && !plain.sent.contains("fetchZoneChanges"))
        #expect(cloud.storedBytes(of: "notes") == before)
    }

    @Test("external storage turned on or off for an existing attribute is refused the same way")
    func externalStorageChanged() throws {
        let cloud = InMemoryCloudDatabase()
        let v1 = try CryptoDevice("v1", seed: 1, encryption: nil, models: [Memo.self])
        try v1.sync(cloud)
        let external = try CryptoDevice("external", seed: 2, encryption: nil, models: [ExternalMemo.self], version: Schema.Version(2, 0, 0))
        #expect(throws: optionChanged("attachment", .externalStorage, zone: false)) { try external.sync(cloud) }
    }

    @Test("an upgrade of the same store turning encryption on is refused; its records and outbox stay, and the cloud's plaintext is not replaced")
    func upgradedInPlace() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = temporaryDirectory("upgrade")
        let id: UUID
        do {
            let v1 = try CryptoDevice("v1", seed: 1, encryption: nil, models: [Memo.self], directory: directory)
            id = v1.context.insert(Memo(title: "t", body: "old plaintext")).id
            try v1.context.save()
            try v1.sync(cloud)
        }
        let v2 = try CryptoDevice("v2", seed: 2, encryption: .rawKey(key), models: [SealedMemo.self], version: Schema.Version(2, 0, 0),
                                  directory: directory)
        var memo = try #require(try v2.context.model(SealedMemo.self, id: id))
        memo.body = "new text meant to be sealed"
        v2.context.update(memo)
        try v2.context.save()
        #expect(throws: optionChanged("body", .allowsCloudEncryption, zone: false)) { try v2.sync(cloud) }
        #expect(try v2.engine.ledgerEntry(for: PersistentIdentifier(entityName: "Memo", id: id))?.state == .pending)
        #expect(try ModelContext(v2.container).model(SealedMemo.self, id: id)?.body == "new text meant to be sealed")
        #expect(leakedCount(of: [Data("new text meant to be sealed".utf8)], in: cloud.storedBytes(of: "notes")) == 0)
    }

    @Test("the migration path: a new encrypted attribute beside the old one; the old field is cleared, new devices get every record sealed")
    func newEncryptedAttribute() throws {
        let cloud = InMemoryCloudDatabase()
        let v1 = try CryptoDevice("v1", seed: 1, encryption: nil, models: [Memo.self])
        let ids = (0..<3).map { i in v1.context.insert(Memo(title: "memo \(i)", body: "plaintext body \(i)")).id }
        try v1.context.save()
        try v1.sync(cloud)

        let v3 = try CryptoDevice("v3", seed: 3, encryption: .rawKey(key), models: [MemoV3.self], version: Schema.Version(3, 0, 0))
        #expect(try v3.sync(cloud).isUpToDate)
        for var memo in try v3.context.fetch(MemoV3.self) {
            memo.sealedBody = memo.body
            memo.body = nil
            v3.context.update(memo)
        }
        try v3.context.save()
        #expect(try v3.sync(cloud).isUpToDate)
        let bodies = (0..<3).map { Data("plaintext body \($0)".utf8) }
        #expect(leakedCount(of: bodies, in: cloud.storedBytes(of: "notes")) == 0)

        let fresh = try CryptoDevice("fresh", seed: 4, encryption: .rawKey(key), models: [MemoV3.self], version: Schema.Version(3, 0, 0))
        #expect(try fresh.sync(cloud).isUpToDate)
        let received = try ModelContext(fresh.container).fetch(MemoV3.self)
        #expect(Set(received.map(\.id)) == Set(ids))
        #expect(received.allSatisfy { $0.body == nil && $0.sealedBody?.hasPrefix("plaintext body") == true })
        // The first version keeps syncing; it keeps the new field, sealed, as one it does not know.
        #expect(try v1.sync(cloud).isUpToDate)
        #expect(try ModelContext(v1.container).fetch(Memo.self).allSatisfy { $0.body == nil })
    }

    @Test("a union schema stored without attribute options reads as none: a plain device syncs, an encrypting one is refused, a rewrite records them")
    func unionWithoutOptions() throws {
        let cloud = InMemoryCloudDatabase()
        let first = try CryptoDevice("first", seed: 1, encryption: nil, models: [Memo.self])
        try first.sync(cloud)
        // The union as a writer that did not record options would have stored it.
        let stored = try #require(try cloud.zoneMetadata("notes")["schema"])
        var json = try #require(try JSONSerialization.jsonObject(with: stored) as? [String: Any])
        var entities = try #require(json["entities"] as? [[String: Any]])
        for e in entities.indices {
            entities[e]["attributes"] = (entities[e]["attributes"] as? [[String: Any]] ?? []).map { $0.filter { $0.key != "options" } }
        }
        json["entities"] = entities
        let withoutOptions = try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys])
        #expect(String(decoding: withoutOptions, as: UTF8.self).contains("options") == false)
        _ = try cloud.setZoneMetadata("notes", key: "schema", value: withoutOptions, ifCurrent: stored)

        let plain = try CryptoDevice("plain", seed: 2, encryption: nil, models: [Memo.self])
        #expect(try plain.sync(cloud).isUpToDate)
        #expect(try cloud.zoneMetadata("notes")["schema"] == withoutOptions)  // read, not "repaired"
        let sealed = try CryptoDevice("sealed", seed: 3, encryption: .rawKey(key), models: [SealedMemo.self], version: Schema.Version(2, 0, 0))
        #expect(throws: optionChanged("body", .allowsCloudEncryption, zone: false)) { try sealed.sync(cloud) }
        // A device that adds an attribute writes the union again, now with every attribute's options.
        let v3 = try CryptoDevice("v3", seed: 4, encryption: .rawKey(key), models: [MemoV3.self], version: Schema.Version(3, 0, 0))
        #expect(try v3.sync(cloud).isUpToDate)
        let rewritten = try #require(try cloud.zoneMetadata("notes")["schema"])
        let union = try #require(ZoneSchema.decode(rewritten))
        #expect(union.entities.first?.attribute(named: "sealedBody")?.options == .allowsCloudEncryption)
        #expect(union.entities.first?.attribute(named: "body")?.options == [])
    }
}
