import Foundation
import Testing
@testable import Replica

/// A synced model with encrypted attributes (text, blob, integer; one preserved in tombstones).
struct Diary: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var secret: String = ""
    var photo: Data?
    var mood: Int = 0
    static let entity = ModelEntity<Diary>([
        .attribute("title", \.title, default: ""),
        .attribute("secret", \.secret, default: "", options: [.allowsCloudEncryption, .preserveValueOnDeletion]),
        .attribute("photo", \.photo, options: .allowsCloudEncryption),
        .attribute("mood", \.mood, default: 0, options: .allowsCloudEncryption),
    ])
}

/// Version 2 of Diary: one more encrypted attribute, which version 1 keeps as an unknown field.
struct DiaryV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Diary" }
    var id = UUID.unassigned
    var title: String = ""
    var secret: String = ""
    var photo: Data?
    var mood: Int = 0
    var location: String = ""
    static let entity = ModelEntity<DiaryV2>([
        .attribute("title", \.title, default: ""),
        .attribute("secret", \.secret, default: "", options: [.allowsCloudEncryption, .preserveValueOnDeletion]),
        .attribute("photo", \.photo, options: .allowsCloudEncryption),
        .attribute("mood", \.mood, default: 0, options: .allowsCloudEncryption),
        .attribute("location", \.location, default: "", options: .allowsCloudEncryption),
    ])
}

/// Something that performs cloud operations synchronously.
protocol ImmediateCloud {
    func performNow(_ operation: CloudOperation) -> Result<CloudOperationResult, CloudError>
}

extension InMemoryCloudDatabase: ImmediateCloud {}

extension SQLiteCloudDatabase: ImmediateCloud {
    func performNow(_ operation: CloudOperation) -> Result<CloudOperationResult, CloudError> {
        do throws(CloudError) {
            switch operation {
            case let .createZone(zone): try createZone(zone); return .success(.zoneCreated)
            case let .deleteZone(zone): try deleteZone(zone); return .success(.zoneDeleted)
            case let .resetZone(zone, reason): try deleteZone(zone, reason: reason); return .success(.zoneDeleted)
            case let .modifyRecords(records, zone): return .success(.modified(try modifyRecords(records, in: zone)))
            case let .fetchZoneChanges(zone, token, limit): return .success(.changes(try fetchZoneChanges(zone, since: token, limit: limit)))
            case let .fetchZoneMetadata(zone): return .success(.metadata(try zoneMetadata(zone)))
            case let .setZoneMetadata(zone, key, value, expected):
                return .success(.metadataValue(try setZoneMetadata(zone, key: key, value: value, ifCurrent: expected)))
            case let .prepareAssetUpload(asset, zone): return .success(.assetUpload(try prepareAssetUpload(asset, in: zone)))
            case let .uploadAssetChunk(asset, index, bytes, zone):
                return .success(.assetUpload(try uploadAssetChunk(asset, index: index, bytes: bytes, in: zone)))
            case let .downloadAssetChunk(asset, index, zone): return .success(.assetChunk(try downloadAssetChunk(asset, index: index, in: zone)))
            }
        } catch {
            return .failure(error)
        }
    }
}

/// One simulated device with an encrypting engine (store "notes", zone configurable).
final class CryptoDevice {
    let container: ModelContainer
    let engine: SyncEngine
    let context: ModelContext
    let clock: ManualClock
    let name: String
    let directory: URL
    /// Names of the operations this device sent, in order.
    var sent: [String] = []

    init(_ name: String, seed: UInt64, encryption: FieldEncryption?, models: [any PersistentModel.Type] = [Diary.self],
         version: Schema.Version = Schema.Version(1, 0, 0), zone: String? = nil, directory: URL? = nil,
         options: SyncEngine.Options = SyncEngine.Options()) throws {
        let directory = directory ?? FileManager.default.temporaryDirectory.appendingPathComponent("replica-crypto-\(UUID().uuidString)")
        let environment = ReplicaEnvironment.seeded(seed: seed, directory: directory)
        self.name = name
        self.directory = directory
        self.clock = environment.clock as! ManualClock
        self.container = try ModelContainer(for: Schema(models, version: version), configurations: [
            ModelConfiguration("notes", cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        self.engine = try SyncEngine(container: container, storeName: "notes", zone: zone, options: options, encryption: encryption)
        self.context = ModelContext(container)
    }

    @discardableResult
    func sync(_ cloud: some ImmediateCloud, maxSteps: Int = 1_000) throws -> SyncStatus {
        engine.setNeedsFetch()
        for _ in 0..<maxSteps {
            if let request = try engine.nextRequest() {
                sent.append(request.operation.name)
                try engine.handle(request.id, cloud.performNow(request.operation))
            } else if let wake = engine.wakeTime {
                clock.set(milliseconds: wake)
            } else {
                return try engine.status()
            }
        }
        Issue.record("\(name) did not settle")
        return try engine.status()
    }

    /// Performs the engine's next request, if any; returns its name.
    @discardableResult
    func step(_ cloud: some ImmediateCloud) throws -> String? {
        guard let request = try engine.nextRequest() else { return nil }
        sent.append(request.operation.name)
        try engine.handle(request.id, cloud.performNow(request.operation))
        return request.operation.name
    }

    func diaries() throws -> [Diary] { try ModelContext(container).fetch(Diary.self) }

    /// Raw bytes of the device's store files (database, WAL, shared memory).
    func storeBytes() throws -> Data { try filesBytes(prefix: try #require(container.url(of: "notes"))) }
}

/// Every byte of a SQLite database file and its `-wal` and `-shm` companions.
func filesBytes(prefix url: URL) throws -> Data {
    var bytes = Data()
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let file = URL(fileURLWithPath: url.path + suffix)
        if FileManager.default.fileExists(atPath: file.path) { bytes.append(try Data(contentsOf: file)) }
    }
    return bytes
}

/// The forms in which `value` would show up in stored bytes: raw, lowercase hex, and base64 at each of the three
/// byte alignments (only the characters that depend on `value` alone), with and without JSON-escaped slashes.
func leakPatterns(_ value: Data) -> [Data] {
    var patterns = [value, Data(value.map { String(format: "%02x", $0) }.joined().utf8)]
    for offset in 0..<3 {
        let chars = Array((Data(repeating: 0, count: offset) + value).base64EncodedString())
        let start = offset == 0 ? 0 : 4
        let end = chars.count - 4
        guard end - start >= 16 else { continue }
        let fragment = String(chars[start..<end])
        patterns.append(Data(fragment.utf8))
        patterns.append(Data(fragment.replacingOccurrences(of: "/", with: "\\/").utf8))
    }
    return patterns
}

/// Expects `a == b` without printing either value on failure (they may be plaintexts of encrypted fields).
func expectSame<T: Equatable>(_ a: T, _ b: T, sourceLocation: SourceLocation = #_sourceLocation) {
    let same = a == b
    #expect(same, "values differ (not shown: they may be secrets)", sourceLocation: sourceLocation)
}

/// How many of `values` occur in `bytes` in any of their ``leakPatterns(_:)`` (never prints them).
func leakedCount(of values: [Data], in bytes: Data) -> Int {
    values.filter { value in leakPatterns(value).contains { bytes.range(of: $0) != nil } }.count
}

/// A 64-byte text that is unique to (`tag`, `index`), without JSON-special characters.
func secretText(_ tag: String, _ index: Int) -> String {
    let head = "\(tag)-\(index)-"
    let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    let generator = SeededRandomSource(seed: UInt64(index) &* 7919 &+ UInt64(tag.utf8.reduce(0) { $0 &* 31 &+ Int($1) }))
    return head + String((0..<(64 - head.utf8.count)).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] })
}

/// A 64-byte blob unique to `index`.
func secretBlob(_ index: Int) -> Data {
    let generator = SeededRandomSource(seed: 0xB10B &+ UInt64(index))
    return Data((0..<64).map { _ in UInt8(truncatingIfNeeded: generator.next()) })
}

enum Keys {
    static func passphrase(_ text: String, limits: PasswordHashLimits = .minimum) throws -> FieldEncryption {
        try FieldEncryption.passphrase(text, limits: limits)
    }
    static func raw(_ byte: UInt8) throws -> FieldEncryption { try FieldEncryption.rawKey([UInt8](repeating: byte, count: 32)) }
}

/// The key version a sealed field was sealed with.
func keyVersion(of field: CloudField?) -> UInt32? {
    guard let field, field.isEncrypted, case let .blob(bytes) = field.value, bytes.count > 5 else { return nil }
    return bytes[bytes.startIndex + 1 ..< bytes.startIndex + 5].reduce(0) { $0 << 8 | UInt32($1) }
}

@Suite("Encrypted fields")
struct EncryptedSyncTests {
    /// Two devices sync a workload touching every encrypted path: inserts, updates, conflicts, deletes with a
    /// preserved encrypted field, key rotation and a re-encrypt pass, a newer schema's unknown encrypted field.
    /// Returns the plaintexts written.
    static func workload(_ cloud: some ImmediateCloud, a: CryptoDevice, b: CryptoDevice) throws -> [Data] {
        var plaintexts: [Data] = []
        var inserted: [Diary] = []
        for i in 0..<20 {
            let diary = Diary(title: "title \(i)", secret: secretText("secret", i), photo: secretBlob(i), mood: i)
            plaintexts += [Data(diary.secret.utf8), diary.photo!]
            inserted.append(a.context.insert(diary))
        }
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        // Concurrent edits of the same record: a save conflict merges opened values on both sides.
        var onA = inserted[0]
        onA.secret = secretText("editedA", 0)
        a.context.update(onA)
        try a.context.save()
        var onB = try #require(try b.context.model(Diary.self, id: inserted[0].id))
        onB.photo = secretBlob(1000)
        b.context.update(onB)
        try b.context.save()
        plaintexts += [Data(onA.secret.utf8), onB.photo!]
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)
        // A delete keeps the encrypted, preserved secret in the tombstone.
        b.context.delete(try #require(try b.context.model(Diary.self, id: inserted[1].id)))
        try b.context.save()
        try b.sync(cloud)
        // Rotation, writes under the new key, and a re-encrypt pass.
        try a.engine.rotateEncryptionKey()
        var rotated = inserted[2]
        rotated.secret = secretText("rotated", 2)
        a.context.update(rotated)
        try a.context.save()
        plaintexts.append(Data(rotated.secret.utf8))
        try a.sync(cloud)
        try a.engine.reencryptAllRecords()
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)
        return plaintexts
    }

    @Test("no plaintext of an encrypted field is in any byte the in-memory cloud stores")
    func noPlaintextInMemoryCloud() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.passphrase("pass"))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.passphrase("pass"))
        let plaintexts = try Self.workload(cloud, a: a, b: b)
        expectSame(try a.diaries(), try b.diaries())
        #expect(try a.diaries().count == 19)
        let stored = cloud.storedBytes(of: "notes")
        #expect(!stored.isEmpty)
        #expect(leakedCount(of: plaintexts, in: stored) == 0)
        // The scan does find what is there: the local store keeps plaintext (as CloudKit does), and plain fields
        // are in the cloud.
        #expect(leakedCount(of: plaintexts, in: try a.storeBytes()) > 0)
        #expect(leakedCount(of: [Data("title 7".utf8)], in: stored) == 1)
        for record in cloud.records(in: "notes") {
            for name in ["secret", "photo", "mood"] where record.fields[name] != nil {
                #expect(keyVersion(of: record.fields[name]) == 2, "every encrypted field is sealed under the newest key")
            }
        }
    }

    @Test("no plaintext of an encrypted field is in the SQLiteCloudDatabase file or its WAL")
    func noPlaintextInSQLiteCloud() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-crypto-cloud-\(UUID().uuidString)/cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: url)
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(7))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(7))
        let plaintexts = try Self.workload(cloud, a: a, b: b)
        expectSame(try a.diaries(), try b.diaries())
        let stored = try filesBytes(prefix: url)
        #expect(FileManager.default.fileExists(atPath: url.path + "-wal"))
        #expect(leakedCount(of: plaintexts, in: stored) == 0)
        #expect(leakedCount(of: [Data("title 7".utf8)], in: stored) == 1)
    }

    @Test("a newer schema's encrypted field stays sealed in the cloud while an older device round-trips it")
    func unknownEncryptedFieldRoundTrip() throws {
        let cloud = InMemoryCloudDatabase()
        let v2 = try CryptoDevice("v2", seed: 1, encryption: Keys.raw(3), models: [DiaryV2.self], version: Schema.Version(2, 0, 0))
        let v1 = try CryptoDevice("v1", seed: 2, encryption: Keys.raw(3), models: [Diary.self])
        let location = secretText("location", 1)
        let note = v2.context.insert(DiaryV2(title: "t", secret: secretText("s", 1), location: location))
        try v2.context.save()
        try v2.sync(cloud); try v1.sync(cloud)
        var onV1 = try #require(try v1.context.model(Diary.self, id: note.id))
        onV1.title = "edited by v1"
        v1.context.update(onV1)
        try v1.context.save()
        try v1.sync(cloud); try v2.sync(cloud)
        let seen = try #require(try ModelContext(v2.container).model(DiaryV2.self, id: note.id))
        #expect(seen.title == "edited by v1")
        expectSame(seen.location, location)
        #expect(cloud.records(in: "notes").first?.fields["location"]?.isEncrypted == true)
        #expect(leakedCount(of: [Data(location.utf8)], in: cloud.storedBytes(of: "notes")) == 0)
    }

    @Test("the engine reads and checks the zone's keys before its first fetch or upload")
    func metadataBeforeAnything() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.passphrase("pass"))
        a.context.insert(Diary(title: "t", secret: "s"))
        try a.context.save()
        try a.sync(cloud)
        // The zone's metadata is read once (for the schema gate and the keys alike); the union schema and the new key
        // set are then written by compare-and-swap, each under its own key.
        #expect(a.sent == ["createZone", "fetchZoneMetadata", "setZoneMetadata", "setZoneMetadata", "fetchZoneChanges", "modifyRecords"])
        #expect(a.engine.encryptionKeyVersion == 1)
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.passphrase("pass"))
        try b.sync(cloud)
        #expect(b.sent == ["createZone", "fetchZoneMetadata", "fetchZoneChanges"])
        expectSame(try b.diaries().first?.secret, "s")
        // Each later sync cycle reads the metadata again (to learn rotations), once.
        try b.sync(cloud)
        #expect(b.sent.suffix(2) == ["fetchZoneMetadata", "fetchZoneChanges"])
    }

    @Test("a store with encrypted attributes refuses to sync without an encryption configuration")
    func encryptionRequired() throws {
        #expect(throws: FieldEncryptionError.encryptionNotConfigured(entity: "Diary", field: "mood")) {
            _ = try CryptoDevice("A", seed: 1, encryption: nil)
        }
    }

    @Test("a wrong passphrase is detected by the key check: nothing is fetched, merged or uploaded; the right one resumes")
    func wrongPassphrase() throws {
        let cloud = InMemoryCloudDatabase()
        // Production-like Argon2id cost in this one test (libsodium's INTERACTIVE limits).
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.passphrase("correct horse", limits: .interactive))
        let fromA = a.context.insert(Diary(title: "from A", secret: secretText("a", 1)))
        try a.context.save()
        try a.sync(cloud)
        let cloudBefore = cloud.storedBytes(of: "notes")

        let b = try CryptoDevice("B", seed: 2, encryption: Keys.passphrase("battery staple"))
        let offline = b.context.insert(Diary(title: "from B", secret: secretText("b", 1)))
        try b.context.save()
        let status = try b.sync(cloud)
        #expect(status.encryptionError == .wrongKey(zone: "notes"))
        #expect(!status.isUpToDate)
        #expect(b.sent == ["createZone", "fetchZoneMetadata"])
        #expect(cloud.storedBytes(of: "notes") == cloudBefore)
        #expect(try b.diaries().map(\.id) == [offline.id])
        #expect(b.engine.encryptionKeyVersion == nil)
        // Syncing again changes nothing until the key changes.
        try b.sync(cloud)
        #expect(b.sent == ["createZone", "fetchZoneMetadata"])

        try b.engine.setEncryptionKeyProvider(PassphraseKeyProvider(passphrase: "correct horse"))
        #expect(try b.sync(cloud).isUpToDate)
        try a.sync(cloud)
        #expect(try a.diaries().map(\.id).sorted { $0.uuidString < $1.uuidString } == [fromA.id, offline.id].sorted { $0.uuidString < $1.uuidString })
        expectSame(try a.diaries(), try b.diaries())
    }

    @Test("a wrong raw key, or a raw key for a passphrase zone, is detected before anything is decrypted")
    func wrongRawKey() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(1))
        a.context.insert(Diary(title: "t", secret: "s"))
        try a.context.save()
        try a.sync(cloud)
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(2))
        #expect(try b.sync(cloud).encryptionError == .wrongKey(zone: "notes"))
        let c = try CryptoDevice("C", seed: 3, encryption: Keys.passphrase("pass"))
        #expect(try c.sync(cloud).encryptionError == .keyProviderMismatch(zone: "notes", zoneDerivation: "raw"))
        #expect(try b.diaries().isEmpty && (try c.diaries().isEmpty))
    }

    enum Tamper: String, CaseIterable, CustomTestStringConvertible {
        case flippedBit, swappedBetweenFields, swappedBetweenRecords, swappedBetweenZones, strippedEncryption, replayedUnderNewerStamp
        var testDescription: String { rawValue }
    }

    @Test("tampered ciphertexts are rejected: the record is kept untouched, marked undecryptable, reported with a typed error",
          arguments: Tamper.allCases)
    func tampering(_ tamper: Tamper) throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(5))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(5))
        let target = a.context.insert(Diary(title: "target", secret: secretText("target", 1), photo: secretBlob(1), mood: 1))
        let other = a.context.insert(Diary(title: "other", secret: secretText("other", 2), photo: secretBlob(2), mood: 2))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        let before = try b.diaries()

        // A device syncing the same record ID to another zone with the same raw key.
        let z = try CryptoDevice("Z", seed: 3, encryption: Keys.raw(5), zone: "other")
        z.context.insert(Diary(id: target.id, title: "elsewhere", secret: secretText("elsewhere", 3)))
        try z.context.save()
        try z.sync(cloud)

        var record = try #require(cloud.records(in: "notes").first { $0.recordID == target.id })
        let donor = try #require(cloud.records(in: "notes").first { $0.recordID == other.id })
        switch tamper {
        case .flippedBit:
            guard case var .blob(bytes)? = record.fields["secret"]?.value else { Issue.record("not sealed"); return }
            bytes[bytes.count - 20] ^= 0x10
            record.fields["secret"]!.value = .blob(bytes)
        case .swappedBetweenFields:
            record.fields["photo"]!.value = record.fields["secret"]!.value
        case .swappedBetweenRecords:
            record.fields["secret"]!.value = donor.fields["secret"]!.value
        case .swappedBetweenZones:
            record.fields["secret"]!.value = try #require(cloud.records(in: "other").first?.fields["secret"]?.value)
        case .strippedEncryption:
            record.fields["secret"] = CloudField(value: .text("injected"), stamp: record.fields["secret"]!.stamp, isEncrypted: false)
        case .replayedUnderNewerStamp:
            var newer = record.fields["secret"]!.stamp
            newer.clock.physical += 60_000
            record.fields["secret"]!.stamp = newer
        }
        // Make the tampered version newer than what B has, so B would merge it if it opened.
        record.fields["title"] = CloudField(value: .text("tampered title"),
                                            stamp: FieldStamp(incarnation: 1, clock: HLC(physical: a.clock.nowMilliseconds() + 120_000, logical: 0, replica: UUID())))
        guard case .saved? = try cloud.modifyRecords([record], in: "notes").first else { Issue.record("not saved"); return }
        let newOne = a.context.insert(Diary(title: "new", secret: secretText("new", 4)))
        try a.context.save()
        try a.sync(cloud)

        let status = try b.sync(cloud)
        // Local values untouched (the plain title too: the record did not merge at all); the good record merged.
        expectSame(try b.diaries().filter { $0.id != newOne.id }, before)
        #expect(try b.diaries().contains { $0.id == newOne.id })
        #expect(status.undecryptableRecords == 1)
        #expect(!status.isUpToDate)
        let expectedField = tamper == .swappedBetweenFields ? "photo" : "secret"
        let failure: FieldEncryptionError.DecryptionFailure = tamper == .strippedEncryption ? .notSealed : .authenticationFailed
        let version: UInt32? = tamper == .strippedEncryption ? nil : 1
        #expect(status.encryptionError == .undecryptable(entity: "Diary", field: expectedField, recordID: target.id, keyVersion: version, failure: failure))
        let listed = try b.engine.undecryptableRecords()
        #expect(listed.map(\.recordID) == [target.id])
        let reason = try #require(listed.first?.reason)
        #expect(reason.contains(target.id.uuidString) && reason.contains(expectedField))
        let leaks = reason.contains("target-1") || reason.contains("injected")
        #expect(!leaks, "the reason shows no values")
        let state = try b.engine.db.scalar("SELECT state FROM replica_sync_record WHERE id = ?", [target.id.sqliteValue])
        #expect(state == .text("undecryptable"))

        // The author, who holds the values, keeps them too, and a local edit of the record is held back rather than
        // overwriting what it cannot read.
        try a.sync(cloud)
        expectSame(try a.diaries().first { $0.id == target.id }?.secret, secretText("target", 1))
        var edited = try #require(try a.context.model(Diary.self, id: target.id))
        edited.mood = 42
        a.context.update(edited)
        try a.context.save()
        #expect(try a.sync(cloud).undecryptableRecords == 1)
        #expect(cloud.records(in: "notes").first { $0.recordID == target.id }?.fields == record.fields)

        // Resolution: A replaces the unreadable cloud copy with its local version; B recovers from it.
        #expect(try a.engine.reuploadUndecryptableRecords() == 1)
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try b.sync(cloud).isUpToDate)
        expectSame(try b.diaries().first { $0.id == target.id }, try a.diaries().first { $0.id == target.id })
        #expect(try b.diaries().first { $0.id == target.id }?.mood == 42)
        #expect(try b.engine.undecryptableRecords().isEmpty)
    }

    @Test("a record sealed under a key version another device added mid-cycle is held, then opens once the new key is read")
    func unknownKeyVersionRecovers() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(5))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(5))
        try a.sync(cloud); try b.sync(cloud)
        // B starts a cycle and reads the keys (version 1 only)...
        b.engine.setNeedsFetch()
        #expect(try b.step(cloud) == "fetchZoneMetadata")
        // ...then A rotates and uploads a record under version 2, which B has never seen.
        try a.engine.rotateEncryptionKey()
        let note = a.context.insert(Diary(title: "t", secret: secretText("s", 1)))
        try a.context.save()
        try a.sync(cloud)
        #expect(try b.step(cloud) == "fetchZoneChanges")
        #expect(try b.engine.status().undecryptableRecords == 1)
        #expect(try b.engine.status().encryptionError == .undecryptable(entity: "Diary", field: "mood", recordID: note.id, keyVersion: 2, failure: .unknownKeyVersion))
        #expect(try b.diaries().isEmpty)
        // B reads the keys again right away, learns version 2, and reads the zone again.
        #expect(try b.sync(cloud).isUpToDate)
        #expect(b.sent.suffix(3) == ["fetchZoneChanges", "fetchZoneMetadata", "fetchZoneChanges"], "\(b.sent)")
        expectSame(try b.diaries().first?.secret, secretText("s", 1))
        #expect(try b.engine.undecryptableRecords().isEmpty)
        #expect(try b.engine.db.scalar("SELECT count(*) FROM replica_sync_record") == .integer(1))
    }

    @Test("rotation across devices: new writes use the new key everywhere, old versions still open, a re-encrypt pass moves every record")
    func rotationAcrossDevices() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.passphrase("pass"))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.passphrase("pass"))
        let first = a.context.insert(Diary(title: "1", secret: secretText("one", 1)))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        func version(_ id: UUID) -> UInt32? { keyVersion(of: cloud.records(in: "notes").first { $0.recordID == id }?.fields["secret"]) }
        #expect(version(first.id) == 1)

        try a.engine.rotateEncryptionKey()
        let second = a.context.insert(Diary(title: "2", secret: secretText("two", 2)))
        try a.context.save()
        try a.sync(cloud)
        #expect(a.engine.encryptionKeyVersion == 2)
        #expect(version(second.id) == 2)
        #expect(version(first.id) == 1)

        // B learns version 2 at its next cycle: reads both versions and writes with the new one.
        try b.sync(cloud)
        #expect(b.engine.encryptionKeyVersion == 2)
        expectSame(try b.diaries().map(\.secret), [secretText("one", 1), secretText("two", 2)])
        let third = b.context.insert(Diary(title: "3", secret: secretText("three", 3)))
        try b.context.save()
        try b.sync(cloud)
        #expect(version(third.id) == 2)

        // Concurrent rotations on both devices (both read version 2, both propose 3) end with one version 3.
        try a.engine.rotateEncryptionKey()
        try b.engine.rotateEncryptionKey()
        a.engine.setNeedsFetch(); b.engine.setNeedsFetch()
        #expect(try a.step(cloud) == "fetchZoneMetadata")
        #expect(try b.step(cloud) == "fetchZoneMetadata")
        #expect(try a.step(cloud) == "setZoneMetadata")
        #expect(try b.step(cloud) == "setZoneMetadata")  // loses the compare-and-swap, adopts A's version 3
        try a.sync(cloud); try b.sync(cloud); try a.sync(cloud)
        #expect(a.engine.encryptionKeyVersion == 3)
        #expect(b.engine.encryptionKeyVersion == 3)
        let newest: UInt32 = 3

        // The re-encrypt pass moves every record, including ones this device never wrote, to the newest key.
        try b.engine.reencryptAllRecords()
        try b.sync(cloud); try a.sync(cloud)
        for record in cloud.records(in: "notes") { #expect(keyVersion(of: record.fields["secret"]) == newest) }
        #expect(try b.engine.db.scalar("SELECT value FROM replica_metadata WHERE key = 'encryption_reencrypt'") == nil)
        // A new device reads everything.
        let c = try CryptoDevice("C", seed: 3, encryption: Keys.passphrase("pass"))
        try c.sync(cloud)
        expectSame(try c.diaries(), try a.diaries())
        #expect(try c.diaries().count == 3)
    }

    @Test("a reset after a lost key re-uploads local data under the new key and never deletes local data")
    func resetAfterLostKey() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.passphrase("old"))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.passphrase("old"))
        let kept = a.context.insert(Diary(title: "kept", secret: secretText("kept", 1), photo: secretBlob(1)))
        let deleted = a.context.insert(Diary(title: "deleted", secret: secretText("deleted", 2)))
        let damaged = a.context.insert(Diary(title: "damaged", secret: secretText("damaged", 3)))
        try a.context.save()
        a.context.delete(deleted)
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        // One cloud record gets damaged: A marks it undecryptable but keeps its values.
        var record = try #require(cloud.records(in: "notes").first { $0.recordID == damaged.id })
        guard case var .blob(bytes)? = record.fields["secret"]?.value else { Issue.record("not sealed"); return }
        bytes[bytes.count - 1] ^= 1
        record.fields["secret"]!.value = .blob(bytes)
        record.fields["title"]!.stamp.clock.physical += 1
        _ = try cloud.modifyRecords([record], in: "notes")
        #expect(try a.sync(cloud).undecryptableRecords == 1)
        // B writes offline.
        let offline = b.context.insert(Diary(title: "offline on B", secret: secretText("offline", 4)))
        try b.context.save()
        let aBefore = try a.diaries()

        // The passphrase is lost: A resets the zone's encryption with a new one.
        try a.engine.resetEncryption(keyProvider: PassphraseKeyProvider(passphrase: "new", limits: .minimum))
        let status = try a.sync(cloud)
        #expect(status.isUpToDate)
        #expect(a.sent.contains("resetZone"))
        expectSame(try a.diaries(), aBefore)
        let records = cloud.records(in: "notes")
        #expect(Set(records.map(\.recordID)) == [kept.id, deleted.id, damaged.id])
        #expect(records.first { $0.recordID == deleted.id }?.isAlive == false)
        #expect(records.allSatisfy { keyVersion(of: $0.fields["secret"]) == 1 })

        // B, still on the old passphrase, stops: no upload, no merge, nothing deleted.
        let bBefore = try b.diaries()
        #expect(try b.sync(cloud).encryptionError == .wrongKey(zone: "notes"))
        expectSame(try b.diaries(), bBefore)
        #expect(!cloud.records(in: "notes").contains { $0.recordID == offline.id })
        // With the new passphrase B uploads its local data again and gets A's.
        try b.engine.setEncryptionKeyProvider(PassphraseKeyProvider(passphrase: "new"))
        #expect(try b.sync(cloud).isUpToDate)
        try a.sync(cloud)
        expectSame(try a.diaries(), try b.diaries())
        #expect(Set(try a.diaries().map(\.id)) == [kept.id, damaged.id, offline.id])
        expectSame(try a.diaries().first { $0.id == damaged.id }?.secret, secretText("damaged", 3))
        #expect(leakedCount(of: [Data(secretText("offline", 4).utf8), Data(secretText("kept", 1).utf8)], in: cloud.storedBytes(of: "notes")) == 0)
    }

    @Test("a server-side zone reset re-initializes the keys and re-uploads everything, encrypted")
    func serverZoneReset() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(9))
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(9))
        let note = a.context.insert(Diary(title: "t", secret: secretText("s", 1)))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        let onlyB = b.context.insert(Diary(title: "b", secret: secretText("b", 2)))
        try b.context.save()
        cloud.resetZone("notes")
        try a.sync(cloud)
        #expect(cloud.records(in: "notes").map(\.recordID) == [note.id])
        // B notices the new key set and uploads all of its local data again.
        #expect(try b.sync(cloud).isUpToDate)
        try a.sync(cloud)
        #expect(Set(cloud.records(in: "notes").map(\.recordID)) == [note.id, onlyB.id])
        expectSame(try a.diaries(), try b.diaries())
        #expect(leakedCount(of: [Data(secretText("s", 1).utf8), Data(secretText("b", 2).utf8)], in: cloud.storedBytes(of: "notes")) == 0)
    }

    /// Runs `device`'s requests until the next one is `name`; returns it unsent.
    static func requests(of device: CryptoDevice, through cloud: some ImmediateCloud, until name: String) throws -> SyncRequest? {
        for _ in 0..<50 {
            guard let request = try device.engine.nextRequest() else { return nil }
            device.sent.append(request.operation.name)
            if request.operation.name == name { return request }
            try device.engine.handle(request.id, cloud.performNow(request.operation))
        }
        return nil
    }

    @Test("a write sealed under a key set the zone lost in a reset others re-created is sealed again by the device that holds it, and every device reads it")
    func writeSealedUnderReplacedKeySet() throws {
        let cloud = InMemoryCloudDatabase()
        let b = try CryptoDevice("B", seed: 2, encryption: Keys.raw(9))
        try b.sync(cloud)
        // A joins: it reads the zone's key set (K1) at the start of its first cycle...
        let a = try CryptoDevice("A", seed: 1, encryption: Keys.raw(9))
        let note = a.context.insert(Diary(title: "t", secret: secretText("s", 1), photo: secretBlob(1), mood: 7))
        try a.context.save()
        let fetch = try #require(try Self.requests(of: a, through: cloud, until: "fetchZoneChanges"))
        // ...then the zone is reset and B re-creates it with a new key set (K2), before A's first fetch arrives.
        cloud.resetZone("notes")
        #expect(try b.sync(cloud).isUpToDate)
        try a.engine.handle(fetch.id, cloud.performNow(fetch.operation))
        // A, still in the cycle that read K1, uploads its record sealed under K1 into the zone of K2.
        #expect(try a.step(cloud) == "modifyRecords")
        #expect(cloud.records(in: "notes").map(\.recordID) == [note.id])

        // A reads the keys at its next cycle, finds K2 and reads the zone again: its own write does not open under
        // K2, but holds nothing A lacks, so A seals it again under K2 rather than holding it as undecryptable.
        let statusA = try a.sync(cloud)
        #expect(statusA.undecryptableRecords == 0)
        #expect(statusA.isUpToDate)
        #expect(try a.engine.undecryptableRecords().isEmpty)
        let statusB = try b.sync(cloud)
        #expect(statusB.isUpToDate)
        #expect(statusB.undecryptableRecords == 0)
        expectSame(try b.diaries(), try a.diaries())
        expectSame(try b.diaries().first?.secret, secretText("s", 1))
        // A new device with the key reads everything.
        let c = try CryptoDevice("C", seed: 3, encryption: Keys.raw(9))
        #expect(try c.sync(cloud).isUpToDate)
        expectSame(try c.diaries(), try a.diaries())
    }

    @Test("with seeded environments the encrypted cloud is byte-for-byte reproducible")
    func deterministic() throws {
        func run() throws -> Data {
            let cloud = InMemoryCloudDatabase()
            let a = try CryptoDevice("A", seed: 11, encryption: Keys.passphrase("pass"))
            let b = try CryptoDevice("B", seed: 12, encryption: Keys.passphrase("pass"))
            _ = try Self.workload(cloud, a: a, b: b)
            return cloud.storedBytes(of: "notes")
        }
        #expect(try run() == (try run()))
    }
}
