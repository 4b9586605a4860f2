import Foundation
import Testing
@_spi(Simulation) @testable import Replica

/// A vault entry whose scan is an encrypted asset (`.externalStorage` and `.allowsCloudEncryption`).
struct VaultEntry: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var scan: Data?
    static let entity = ModelEntity<VaultEntry>([
        .attribute("title", \.title, default: ""),
        .attribute("scan", \.scan, options: [.externalStorage, .allowsCloudEncryption]),
    ])
}

/// 64-byte windows of `data` at several offsets (start, around each chunk boundary, the end), and its SHA-256 as hex
/// and raw bytes: what would show if any plaintext, or a plaintext hash, were stored.
func assetLeakProbes(_ data: Data) -> [Data] {
    var offsets = [0, max(0, data.count - 64), data.count / 2]
    var boundary = CloudAssetReference.chunkSize - 40
    while boundary + 64 <= data.count {
        offsets.append(boundary)
        boundary += CloudAssetReference.chunkSize
    }
    var probes = offsets.map { data.subdata(in: $0..<min(data.count, $0 + 64)) }
    let hash = CloudAssetReference(of: data).hash
    probes.append(Data(hash.utf8))
    var raw = Data()
    var index = hash.startIndex
    while index < hash.endIndex {
        let next = hash.index(index, offsetBy: 2)
        raw.append(UInt8(hash[index..<next], radix: 16)!)
        index = next
    }
    probes.append(raw)
    return probes
}

@Suite("Encrypted assets")
struct EncryptedAssetTests {
    static let key = [UInt8](repeating: 7, count: 32)
    static func device(_ name: String, seed: UInt64) throws -> CryptoDevice {
        try CryptoDevice(name, seed: seed, encryption: try FieldEncryption.rawKey(key), models: [VaultEntry.self])
    }

    static func entries(_ device: CryptoDevice) throws -> [VaultEntry] {
        try ModelContext(device.container).fetch(VaultEntry.self).sorted { $0.title < $1.title }
    }

    @Test("a sealed asset round-trips; the record holds a sealed reference; no plaintext and no plaintext hash in any byte the in-memory cloud holds")
    func roundTripInMemoryCloud() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Self.device("a", seed: 1), b = try Self.device("b", seed: 2)
        let scan = assetBytes(CloudAssetReference.chunkSize * 5 / 2, seed: 21)
        let id = a.context.insert(VaultEntry(title: "passport", scan: scan)).id
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        let field = try #require(cloud.records(in: "notes").first?.fields["scan"])
        guard case let .text(text) = field.value, let sealed = SealedAssetReference(fieldValue: text) else {
            Issue.record("the field does not hold a sealed reference"); return
        }
        #expect(field.isEncrypted)
        #expect(sealed.sealed.size == AssetSealing.sealedSize(plainSize: Int64(scan.count)))
        #expect(cloud.assets(in: "notes").map(\.asset) == [sealed.sealed])
        #expect(sealed.sealed.chunkCount == 3)
        let stored = cloud.storedBytes(of: "notes")
        #expect(leakedCount(of: assetLeakProbes(scan), in: stored) == 0)
        // The scan finds what is there: the sealed bytes are stored, and the plaintext is in A's own file.
        #expect(stored.range(of: Data(sealed.sealed.hash.utf8)) != nil)
        #expect(leakedCount(of: assetLeakProbes(scan), in: try Data(contentsOf: URL(fileURLWithPath: try #require(a.container.url(of: "notes")).path
            + "-assets/" + CloudAssetReference(of: scan).hash))) > 0)

        #expect(try b.sync(cloud).isUpToDate)
        let onB = try Self.entries(b)
        #expect(onB.map(\.id) == [id])
        expectSame(onB.first?.scan, scan)
        // B keeps the plaintext in its asset file, named by the plaintext's hash (which only devices learn).
        let files = try FileManager.default.contentsOfDirectory(atPath: try #require(b.container.url(of: "notes")).path + "-assets")
        #expect(files == [CloudAssetReference(of: scan).hash])
    }

    @Test("no plaintext and no plaintext hash of a sealed asset in the SQLite cloud file or its WAL")
    func noPlaintextInSQLiteCloud() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-cloud-\(UUID().uuidString).sqlite")
        let cloud = try SQLiteCloudDatabase(url: url)
        let a = try Self.device("a", seed: 1), b = try Self.device("b", seed: 2)
        let scan = assetBytes(CloudAssetReference.chunkSize + 333, seed: 22)
        a.context.insert(VaultEntry(title: "deed", scan: scan))
        try a.context.save()
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try b.sync(cloud).isUpToDate)
        expectSame(try Self.entries(b).first?.scan, scan)
        #expect(leakedCount(of: assetLeakProbes(scan), in: try filesBytes(prefix: url)) == 0)
    }

    @Test("sealing is deterministic: another device's edit of another field, and a restart, upload no byte of the asset again")
    func deterministicReupload() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Self.device("a", seed: 1), b = try Self.device("b", seed: 2)
        let scan = assetBytes(3_000, seed: 23)
        a.context.insert(VaultEntry(title: "will", scan: scan))
        try a.context.save()
        try a.sync(cloud)
        try b.sync(cloud)
        b.sent = []
        var entry = try #require(try Self.entries(b).first)
        entry.title = "last will"
        b.context.update(entry)
        try b.context.save()
        #expect(try b.sync(cloud).isUpToDate)
        #expect(!b.sent.contains("uploadAssetChunk"))
        #expect(cloud.assets(in: "notes").count == 1)
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try Self.entries(a).map(\.title) == ["last will"])
    }

    @Test("a sealed asset prepared under a key set that a zone reset replaced is sealed again under the new keys, not sent for ever under a hash no stream makes any more")
    func sealedAssetAfterKeySetReplaced() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Self.device("a", seed: 1), b = try Self.device("b", seed: 2)
        try a.sync(cloud)
        let scan = assetBytes(3_000, seed: 24)
        let id = a.context.insert(VaultEntry(title: "deed", scan: scan)).id
        try a.context.save()
        // A seals the scan under the zone's key set (version 1) to learn its reference, and asks the zone for it...
        a.engine.setNeedsFetch()
        let prepare = try #require(try EncryptedSyncTests.requests(of: a, through: cloud, until: "prepareAssetUpload"))
        // ...which was reset meanwhile: A re-creates the zone with a new key set (version 1 too, other key material).
        cloud.resetZone("notes")
        try a.engine.handle(prepare.id, cloud.performNow(prepare.operation))
        let status = try a.sync(cloud, maxSteps: 200)
        #expect(status.isUpToDate)
        #expect(status.lastError == nil)
        let field = try #require(cloud.records(in: "notes").first { $0.recordID == id }?.fields["scan"])
        guard case let .text(text) = field.value, let sealed = SealedAssetReference(fieldValue: text) else {
            Issue.record("the field does not hold a sealed reference"); return
        }
        #expect(cloud.assets(in: "notes").filter(\.isComplete).map(\.asset) == [sealed.sealed])
        #expect(try b.sync(cloud).isUpToDate)
        expectSame(try Self.entries(b).first?.scan, scan)
    }

    @Test("a sealed asset moved to another record, or tampered with under a new reference, does not open: the record is kept and reported undecryptable")
    func movedOrTampered() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Self.device("a", seed: 1)
        let first = assetBytes(2_000, seed: 24), second = assetBytes(2_500, seed: 25), third = assetBytes(1_500, seed: 26)
        let x = a.context.insert(VaultEntry(title: "x", scan: first)).id
        let y = a.context.insert(VaultEntry(title: "y", scan: second)).id
        let z = a.context.insert(VaultEntry(title: "z", scan: third)).id
        try a.context.save()
        try a.sync(cloud)
        let records = cloud.records(in: "notes")
        let recordX = try #require(records.first { $0.recordID == x })
        var recordY = try #require(records.first { $0.recordID == y })
        var recordZ = try #require(records.first { $0.recordID == z })
        // The cloud moves X's sealed scan into Y (reference and stamp alike).
        recordY.fields["scan"] = recordX.fields["scan"]
        // And replaces Z's with sealed bytes it tampered with, under their own (consistent) hash and size.
        guard case let .text(text)? = recordZ.fields["scan"]?.value, let sealed = SealedAssetReference(fieldValue: text) else {
            Issue.record("no sealed reference"); return
        }
        var bytes = try CloudDatabaseTests.downloadNow(sealed.sealed, from: cloud, zone: "notes")
        bytes[AssetSealing.headerLength + 5] ^= 1
        let forged = CloudAssetReference(of: bytes)
        _ = try cloud.uploadAssetChunk(forged, index: 0, bytes: bytes, in: "notes")
        recordZ.fields["scan"]!.value = .text(SealedAssetReference(keyVersion: sealed.keyVersion, sealed: forged).fieldValue)
        _ = try cloud.modifyRecords([recordY, recordZ], in: "notes")

        let c = try Self.device("c", seed: 3)
        let status = try c.sync(cloud)
        #expect(status.undecryptableRecords == 2)
        #expect(status.waitingForAsset == 0)
        #expect(try Self.entries(c).map(\.id) == [x])
        expectSame(try Self.entries(c).first?.scan, first)
        let undecryptable = try c.engine.undecryptableRecords()
        let undecryptableIDs: Set<UUID> = Set(undecryptable.map(\.recordID))
        let expectedIDs: Set<UUID> = [y, z]
        #expect(undecryptableIDs == expectedIDs)
        #expect(undecryptable.allSatisfy { $0.reason.contains("scan") && $0.reason.contains("authentication") }, "\(undecryptable.map(\.reason))")
        // A still has its values, untouched, and can put them back.
        #expect(try Self.entries(a).count == 3)
    }

    @Test("the seal stream opens with libsodium's own pull, chunk by chunk, and only with the same associated data")
    func sealStreamInterop() throws {
        let key = [UInt8](repeating: 9, count: 32), headerKey = [UInt8](repeating: 3, count: 32)
        let plain = assetBytes(CloudAssetReference.chunkSize * 2 + 10, seed: 27)
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: UUID(uuidString: "018f0000-0000-7000-8000-000000000001")!))
        let ad = AssetSealing.associatedData(zone: "z", recordType: "T", recordID: UUID(uuidString: "018f0000-0000-7000-8000-000000000002")!,
                                             field: "f", stamp: stamp, keyVersion: 1)
        let messages = AssetSealing.messageCount(plainSize: Int64(plain.count))
        func seal() -> [Data] {
            key.withUnsafeBytes { streamKey in
                headerKey.withUnsafeBytes { hk in
                    let stream = AssetSealStream(streamKey: streamKey, header: AssetSealing.header(headerKey: hk, associatedData: ad, plainHash: CloudAssetReference(of: plain).hash),
                                                 associatedData: ad, messages: messages)
                    return (0..<messages).map { stream.seal(plain.subdata(in: Int(AssetSealing.plainRange($0, plainSize: Int64(plain.count)).lowerBound)..<Int(AssetSealing.plainRange($0, plainSize: Int64(plain.count)).upperBound))) }
                }
            }
        }
        let chunks = seal()
        #expect(chunks == seal())  // deterministic
        #expect(chunks.dropLast().allSatisfy { $0.count == CloudAssetReference.chunkSize })
        #expect(Int64(chunks.reduce(0) { $0 + $1.count }) == AssetSealing.sealedSize(plainSize: Int64(plain.count)))
        func open(_ ad: [UInt8]) -> Data? {
            key.withUnsafeBytes { streamKey in
                guard let stream = AssetOpenStream(streamKey: streamKey, first: chunks[0], associatedData: ad, messages: messages) else { return nil }
                var out = Data()
                for chunk in chunks {
                    guard let part = stream.open(chunk) else { return nil }
                    out.append(part)
                }
                return out
            }
        }
        expectSame(open(ad), plain)
        var other = ad
        other[other.count - 1] ^= 1  // another key version
        #expect(open(other) == nil)
    }
}

extension CloudDatabaseTests {
    /// Downloads a whole asset from an in-memory cloud (synchronously).
    static func downloadNow(_ asset: CloudAssetReference, from cloud: InMemoryCloudDatabase, zone: String) throws -> Data {
        var data = Data()
        for index in 0..<asset.chunkCount { data.append(try cloud.downloadAssetChunk(asset, index: index, in: zone)) }
        return data
    }
}
