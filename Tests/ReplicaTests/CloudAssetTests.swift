import Foundation
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// Bytes that differ from chunk to chunk (so a chunk stored at the wrong index changes the hash).
func assetBytes(_ count: Int, seed: UInt8 = 1) -> Data {
    var state = UInt32(seed) &* 2_654_435_761 | 1
    return Data((0..<count).map { _ in
        state ^= state << 13; state ^= state >> 17; state ^= state << 5
        return UInt8(truncatingIfNeeded: state)
    })
}

/// Chunk `index` of `data` as the asset protocol cuts it.
func assetChunk(_ data: Data, _ index: Int) -> Data {
    let range = CloudAssetReference(of: data).chunkRange(index)
    return data.subdata(in: Int(range.lowerBound)..<Int(range.upperBound))
}

/// The asset cases of the cloud contract (suite "Cloud databases"): the same tests against the in-memory cloud, the
/// SQLite file and PostgreSQL.
extension CloudDatabaseTests {
    /// Uploads `data` whole, chunk by chunk, to `zone`.
    static func upload(_ data: Data, to db: any CloudDatabase, zone: String = "z") async throws -> CloudAssetUploadState {
        let asset = CloudAssetReference(of: data)
        var state = try await db.prepareAssetUpload(asset, in: zone)
        for index in state.missingChunks { state = try await db.uploadAssetChunk(asset, index: index, bytes: assetChunk(data, index), in: zone) }
        return state
    }

    /// Downloads the whole asset, chunk by chunk.
    static func download(_ asset: CloudAssetReference, from db: any CloudDatabase, zone: String = "z") async throws -> Data {
        var data = Data()
        for index in 0..<asset.chunkCount { data.append(try await db.downloadAssetChunk(asset, index: index, in: zone)) }
        return data
    }

    @Test("assets: chunked upload and download, round trip of 0, 1 and 2.5 chunks", arguments: kinds)
    func assetRoundTrip(kind: Kind) async throws {
        let db = try Self.make(kind)
        let data = assetBytes(CloudAssetReference.chunkSize * 5 / 2)
        let asset = CloudAssetReference(of: data)
        await #expect(throws: CloudError.zoneNotFound) { try await db.prepareAssetUpload(asset, in: "z") }
        try await db.createZone("z")
        #expect(asset.chunkCount == 3)
        let fresh = try await db.prepareAssetUpload(asset, in: "z")
        #expect(fresh == CloudAssetUploadState(asset: asset, receivedChunks: [], isComplete: false))
        #expect(fresh.missingChunks == [0, 1, 2])
        // Not downloadable until complete.
        await #expect(throws: CloudError.assetNotFound(hash: asset.hash)) { try await db.downloadAssetChunk(asset, index: 0, in: "z") }
        let state = try await Self.upload(data, to: db)
        #expect(state.isComplete)
        #expect(state.receivedChunks == [0, 1, 2])
        #expect(try await Self.download(asset, from: db) == data)
        #expect(try await db.downloadAssetChunk(asset, index: 2, in: "z").count == CloudAssetReference.chunkSize / 2)

        // An empty asset is complete at once; one byte is one chunk.
        let empty = CloudAssetReference(of: Data())
        #expect(try await db.prepareAssetUpload(empty, in: "z").isComplete)
        let one = Data([42])
        #expect(try await Self.upload(one, to: db).isComplete)
        #expect(try await Self.download(CloudAssetReference(of: one), from: db) == one)
    }

    @Test("assets: an interrupted upload resumes with the chunks the cloud lacks; a second upload of the same bytes finds them (dedup)", arguments: kinds)
    func assetResumeAndDedup(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let data = assetBytes(CloudAssetReference.chunkSize * 3 + 10, seed: 7)
        let asset = CloudAssetReference(of: data)
        // Chunks 0 and 2 arrive; then the upload stops (the device went offline).
        _ = try await db.uploadAssetChunk(asset, index: 0, bytes: assetChunk(data, 0), in: "z")
        _ = try await db.uploadAssetChunk(asset, index: 2, bytes: assetChunk(data, 2), in: "z")
        // Sending a chunk again is harmless.
        _ = try await db.uploadAssetChunk(asset, index: 2, bytes: assetChunk(data, 2), in: "z")
        let resumed = try await db.prepareAssetUpload(asset, in: "z")
        #expect(resumed.receivedChunks == [0, 2])
        #expect(resumed.missingChunks == [1, 3])
        var state = resumed
        for index in resumed.missingChunks { state = try await db.uploadAssetChunk(asset, index: index, bytes: assetChunk(data, index), in: "z") }
        #expect(state.isComplete)
        // Another device with the same bytes sends nothing.
        let again = try await db.prepareAssetUpload(asset, in: "z")
        #expect(again.isComplete)
        #expect(again.missingChunks.isEmpty)
        // A chunk sent to a complete asset changes nothing.
        #expect(try await db.uploadAssetChunk(asset, index: 0, bytes: Data(count: CloudAssetReference.chunkSize), in: "z").isComplete)
        #expect(try await Self.download(asset, from: db) == data)
        // Assets belong to their zone: another zone does not have it.
        try await db.createZone("other")
        #expect(try await db.prepareAssetUpload(asset, in: "other").isComplete == false)
        await #expect(throws: CloudError.assetNotFound(hash: asset.hash)) { try await db.downloadAssetChunk(asset, index: 0, in: "other") }
    }

    @Test("assets: chunks that do not hash to the name are dropped (hash mismatch); wrong indices and lengths are refused", arguments: kinds)
    func assetHashMismatch(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let data = assetBytes(CloudAssetReference.chunkSize + 100, seed: 3)
        let asset = CloudAssetReference(of: data)
        _ = try await db.uploadAssetChunk(asset, index: 0, bytes: assetChunk(data, 0), in: "z")
        var forged = assetChunk(data, 1)
        forged[0] ^= 1
        await #expect(throws: CloudError.assetHashMismatch(hash: asset.hash)) {
            try await db.uploadAssetChunk(asset, index: 1, bytes: forged, in: "z")
        }
        // Everything was dropped: the upload starts over, and the right bytes then complete it.
        #expect(try await db.prepareAssetUpload(asset, in: "z").receivedChunks.isEmpty)
        await #expect(throws: CloudError.assetNotFound(hash: asset.hash)) { try await db.downloadAssetChunk(asset, index: 0, in: "z") }
        #expect(try await Self.upload(data, to: db).isComplete)

        // An empty asset must have the hash of no bytes.
        let fakeEmpty = CloudAssetReference(hash: asset.hash, size: 0)!
        await #expect(throws: CloudError.assetHashMismatch(hash: asset.hash)) { try await db.prepareAssetUpload(fakeEmpty, in: "z") }

        // Indices outside the asset and chunks of the wrong length.
        let other = assetBytes(300, seed: 9)
        let small = CloudAssetReference(of: other)
        for (index, bytes) in [(1, other), (-1, other), (0, other.prefix(299))] {
            do {
                _ = try await db.uploadAssetChunk(small, index: index, bytes: Data(bytes), in: "z")
                Issue.record("chunk \(index) of \(bytes.count) bytes was taken")
            } catch {
                guard case .invalidAsset = error else { Issue.record("\(error)"); continue }
            }
        }
        _ = try await Self.upload(other, to: db)
        do {
            _ = try await db.downloadAssetChunk(small, index: 1, in: "z")
            Issue.record("chunk 1 of a one-chunk asset was served")
        } catch {
            guard case .invalidAsset = error else { Issue.record("\(error)"); return }
        }
        // The same hash with another size is not that asset.
        await #expect(throws: CloudError.assetNotFound(hash: small.hash)) {
            try await db.downloadAssetChunk(CloudAssetReference(hash: small.hash, size: 301)!, index: 0, in: "z")
        }
    }

    @Test("assets: larger than the limit per asset is refused before any byte moves", arguments: kinds)
    func assetTooLarge(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let limit = CloudAssetReference.defaultMaximumSize
        let huge = CloudAssetReference(hash: String(repeating: "ab", count: 32), size: limit + 1)!
        await #expect(throws: CloudError.assetTooLarge(size: limit + 1, limit: limit)) { try await db.prepareAssetUpload(huge, in: "z") }
        await #expect(throws: CloudError.assetTooLarge(size: limit + 1, limit: limit)) {
            try await db.uploadAssetChunk(huge, index: 0, bytes: Data(count: CloudAssetReference.chunkSize), in: "z")
        }
        #expect(!CloudError.assetTooLarge(size: 1, limit: 0).isTransient)
        #expect(!CloudError.assetNotFound(hash: huge.hash).isTransient)
    }

    @Test("assets: deleting the zone deletes its assets; a zone created again has none", arguments: kinds)
    func assetZoneDeletion(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let data = assetBytes(5_000, seed: 5)
        let asset = CloudAssetReference(of: data)
        _ = try await Self.upload(data, to: db)
        try await db.deleteZone("z")
        await #expect(throws: CloudError.zoneDeleted(reason: .deleted)) { try await db.downloadAssetChunk(asset, index: 0, in: "z") }
        await #expect(throws: CloudError.zoneDeleted(reason: .deleted)) { try await db.prepareAssetUpload(asset, in: "z") }
        try await db.createZone("z")
        await #expect(throws: CloudError.assetNotFound(hash: asset.hash)) { try await db.downloadAssetChunk(asset, index: 0, in: "z") }
        #expect(try await db.prepareAssetUpload(asset, in: "z").receivedChunks.isEmpty)
    }

    @Test("assets: a live record that references an asset the zone does not hold complete is refused on its own (assetNotFound), plain or sealed; a tombstone, the empty asset and a held asset are not", arguments: kinds)
    func recordsReferenceOnlyHeldAssets(kind: Kind) async throws {
        let db = try Self.make(kind)
        try await db.createZone("z")
        let held = assetBytes(3_000, seed: 11), unfinished = assetBytes(CloudAssetReference.chunkSize + 10, seed: 12)
        let missing = CloudAssetReference(of: assetBytes(500, seed: 13))
        _ = try await Self.upload(held, to: db)
        let partial = CloudAssetReference(of: unfinished)
        _ = try await db.prepareAssetUpload(partial, in: "z")
        _ = try await db.uploadAssetChunk(partial, index: 0, bytes: assetChunk(unfinished, 0), in: "z")
        func referencing(_ n: Int, _ text: String, alive: Bool = true) -> CloudRecord {
            var record = Self.record(n)
            record.fields["image"] = CloudField(value: .text(text), stamp: record.created)
            if !alive { record.causalLength = 2 }
            return record
        }
        let sealedMissing = SealedAssetReference(keyVersion: 1, sealed: missing).fieldValue
        let batch = [referencing(1, CloudAssetReference(of: held).fieldValue), referencing(2, missing.fieldValue),
                     referencing(3, partial.fieldValue), referencing(4, sealedMissing),
                     referencing(5, missing.fieldValue, alive: false), referencing(6, CloudAssetReference(of: Data()).fieldValue),
                     referencing(7, "replica-asset: not a reference")]
        let results = try await db.modifyRecords(batch, in: "z")
        #expect(Self.tags(results).map { $0 != nil } == [true, false, false, false, true, true, true])
        #expect(results[1] == .failed(recordID: batch[1].recordID, error: .assetNotFound(hash: missing.hash)))
        #expect(results[2] == .failed(recordID: batch[2].recordID, error: .assetNotFound(hash: partial.hash)))
        #expect(results[3] == .failed(recordID: batch[3].recordID, error: .assetNotFound(hash: missing.hash)))
        #expect(try await db.fetchZoneChanges("z", since: nil, limit: 100).records.map(\.recordID) == [1, 5, 6, 7].map { batch[$0 - 1].recordID })
        // Once the zone holds it, the same record saves.
        _ = try await db.uploadAssetChunk(partial, index: 1, bytes: assetChunk(unfinished, 1), in: "z")
        #expect(Self.tags(try await db.modifyRecords([batch[2]], in: "z")).first! != nil)
    }

    @Test("asset references: the field text round-trips; malformed ones are refused")
    func assetReferenceText() {
        let asset = CloudAssetReference(of: Data("hello".utf8))
        #expect(asset.fieldValue == "replica-asset:sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824:5")
        #expect(CloudAssetReference(fieldValue: asset.fieldValue) == asset)
        for bad in ["", "replica-asset:sha256:", "replica-asset:sha256:\(asset.hash):", "replica-asset:sha256:\(asset.hash):-5",
                    "replica-asset:sha256:\(asset.hash.uppercased()):5", "replica-asset:sha256:\(asset.hash):5x",
                    "replica-asset:sha256:\(asset.hash.dropLast()):5", "replica-asset:sha256:\(asset.hash):99999999999999999999"] {
            #expect(CloudAssetReference(fieldValue: bad) == nil, "\(bad)")
        }
        #expect(CloudAssetReference(hash: asset.hash, size: -1) == nil)
        #expect(CloudAssetReference(of: Data()).chunkCount == 0)
        #expect(CloudAssetReference(of: Data(count: CloudAssetReference.chunkSize)).chunkCount == 1)
        #expect(CloudAssetReference(of: Data(count: CloudAssetReference.chunkSize + 1)).chunkCount == 2)
    }

    @Test("assets: the in-memory and SQLite clouds take a limit of their own")
    func assetLimitConfigured() async throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("replica-cloud-\(UUID().uuidString).sqlite")
        for db: any CloudDatabase in [InMemoryCloudDatabase(maximumAssetSize: 1_000), try SQLiteCloudDatabase(url: url, maximumAssetSize: 1_000)] {
            try await db.createZone("z")
            #expect(try await Self.upload(assetBytes(1_000), to: db).isComplete)
            let bigger = assetBytes(1_001)
            await #expect(throws: CloudError.assetTooLarge(size: 1_001, limit: 1_000)) {
                try await db.prepareAssetUpload(CloudAssetReference(of: bigger), in: "z")
            }
        }
    }
}

/// The PostgreSQL cloud's assets beyond the contract: isolation between users, the limit, status and pruning.
@Suite("PostgreSQL assets", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresAssetTests {
    @Test("two users: one never reads, completes or learns of another's asset, through the cloud or hand-written SQL")
    func isolation() async throws {
        let server = try PostgresTestServer.get()
        let alice = try server.makeUser("alice"), bob = try server.makeUser("bob")
        let aliceCloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: alice.name))
        let bobCloud = try PostgresCloudDatabase(connectionString: server.connectionString(role: bob.name))
        try await aliceCloud.createZone("notes")
        let data = assetBytes(CloudAssetReference.chunkSize + 7, seed: 11)
        let asset = CloudAssetReference(of: data)
        #expect(try await CloudDatabaseTests.upload(data, to: aliceCloud, zone: "notes").isComplete)

        // Bob: no zone "notes" of his; his own zone of that name has no such asset, and uploading it there is his own.
        await #expect(throws: CloudError.zoneNotFound) { try await bobCloud.downloadAssetChunk(asset, index: 0, in: "notes") }
        await #expect(throws: CloudError.zoneNotFound) { try await bobCloud.prepareAssetUpload(asset, in: "notes") }
        try await bobCloud.createZone("notes")
        await #expect(throws: CloudError.assetNotFound(hash: asset.hash)) { try await bobCloud.downloadAssetChunk(asset, index: 0, in: "notes") }
        #expect(try await bobCloud.prepareAssetUpload(asset, in: "notes").receivedChunks.isEmpty)
        _ = try await bobCloud.uploadAssetChunk(asset, index: 0, bytes: Data(count: CloudAssetReference.chunkSize), in: "notes")

        // Hand-written SQL as Bob sees none of Alice's rows and changes none.
        let raw = try server.rawConnection(role: bob.name)
        for table in ["asset", "asset_chunk"] {
            #expect(try raw.integer("SELECT pg_catalog.count(*) FROM replica.\(table) WHERE owner = $1", [.text(alice.name)]) == 0)
            _ = try raw.query("UPDATE replica.\(table) SET owner = owner WHERE owner = $1", [.text(alice.name)], prepare: false)
        }
        _ = try raw.query("DELETE FROM replica.asset_chunk WHERE owner = $1", [.text(alice.name)], prepare: false)
        do {
            _ = try raw.query("INSERT INTO replica.asset (zone_id, owner, hash, size) SELECT zone_id, $1, $2, 1 FROM replica.asset LIMIT 1",
                              [.text(alice.name), .text(String(repeating: "0", count: 64))], prepare: false)
        } catch {
            #expect(error.sqlState == "42501", "\(error)")
        }
        // Alice's asset is whole.
        #expect(try await CloudDatabaseTests.download(asset, from: aliceCloud, zone: "notes") == data)
    }

    @Test("the limit per asset is the server's, set by replica-cloud asset-limit; status counts assets; prune drops the unreferenced")
    func limitStatusAndPrune() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        let admin = try server.administration(database: database)
        #expect(try admin.maximumAssetSize() == CloudAssetReference.defaultMaximumSize)
        try admin.setMaximumAssetSize(2_000)
        #expect(try admin.maximumAssetSize() == 2_000)
        #expect(throws: PostgresCloudAdministration.Failure.self) { try admin.setMaximumAssetSize(-1) }
        let cloud = try server.cloud(owner: "assets", database: database)
        try await cloud.createZone("z")
        await #expect(throws: CloudError.assetTooLarge(size: 2_001, limit: 2_000)) {
            try await cloud.prepareAssetUpload(CloudAssetReference(of: assetBytes(2_001)), in: "z")
        }
        let kept = assetBytes(1_500, seed: 1), loose = assetBytes(1_000, seed: 2), unfinished = assetBytes(2_000, seed: 3)
        _ = try await CloudDatabaseTests.upload(kept, to: cloud)
        _ = try await CloudDatabaseTests.upload(loose, to: cloud)
        _ = try await cloud.prepareAssetUpload(CloudAssetReference(of: unfinished), in: "z")
        var record = CloudDatabaseTests.record(1)
        record.fields["attachment"] = CloudField(value: .text(CloudAssetReference(of: kept).fieldValue), stamp: record.created)
        _ = try await cloud.modifyRecords([record], in: "z")
        let status = try admin.status().zones[0]
        #expect([status.assets, status.assetBytes, status.unfinishedAssets] == [2, 2_500, 1])
        // Touched within the last hour: prune keeps every asset, whatever --keep says.
        #expect(try admin.prune(keepingDays: 0).isEmpty)
        try server.superuserSQL("UPDATE replica.asset SET touched_at = now() - interval '2 days'", database: database)
        #expect(try admin.prune(keepingDays: 3).isEmpty)
        let pruned = try admin.prune(keepingDays: 1)
        #expect(pruned.map { [$0.assetsDropped, $0.assetBytesDropped, $0.tombstonesDropped] } == [[2, 1_000, 0]])
        let after = try admin.status().zones[0]
        #expect([after.assets, after.assetBytes, after.unfinishedAssets] == [1, 1_500, 0])
        #expect(try await CloudDatabaseTests.download(CloudAssetReference(of: kept), from: cloud) == kept)
        await #expect(throws: CloudError.assetNotFound(hash: CloudAssetReference(of: loose).hash)) {
            try await cloud.downloadAssetChunk(CloudAssetReference(of: loose), index: 0, in: "z")
        }
    }

    @Test("a client from before schema step 7 saves through the six-argument modify_records, without the asset check")
    func olderClientSavesWithoutAssetCheck() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        let cloud = try server.cloud(owner: "older", database: database)
        try await cloud.createZone("z")
        let raw = try server.rawConnection(role: "postgres", database: database)
        #expect(try raw.integer("""
            SELECT pg_catalog.count(*) FROM replica.modify_records('older', 'z', ARRAY['00000000-0000-7000-8000-000000000001'::uuid],
                ARRAY[NULL::text], ARRAY[true], ARRAY['\\x00'::bytea]) WHERE out_saved
            """) == 1)
        // The seven-argument form refuses a malformed asset entry.
        #expect(throws: (any Error).self) {
            _ = try raw.integer("""
                SELECT pg_catalog.count(*) FROM replica.modify_records('older', 'z', ARRAY['00000000-0000-7000-8000-000000000002'::uuid],
                    ARRAY[NULL::text], ARRAY[true], ARRAY['\\x00'::bytea], ARRAY['not-a-hash:1'])
                """)
        }
    }

    @Test("a database at schema step 4 upgrades to assets with replica-cloud init")
    func upgrade() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase(installing: false)
        let admin = try server.administration(database: database)
        try admin.install(upTo: 4)
        let report = try admin.install()
        #expect(report.previousVersion == 4)
        #expect(report.stepsRun.count == report.version - 4)
        #expect(report.stepsRun.contains { $0.hasPrefix("6: assets") })
        let cloud = try server.cloud(owner: "upgraded", database: database)
        try await cloud.createZone("z")
        #expect(try await CloudDatabaseTests.upload(assetBytes(10), to: cloud).isComplete)
    }
}

/// The digest that names every asset (its file, its reference, the cloud's deduplication) is SHA-256 (FIPS 180-4),
/// whichever library computes it: moving from libsodium to OpenSSL's EVP digest must not rename a single file.
@Suite("Asset hashes")
struct AssetHashTests {
    @Test("SHA256Hasher gives FIPS 180-4's digests, in one piece and in chunks across chunk boundaries")
    func knownDigests() {
        #expect(CloudAssetReference.sha256Hex(Data()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(CloudAssetReference.sha256Hex(Data("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        let twoBlocks = Data("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)
        #expect(CloudAssetReference.sha256Hex(twoBlocks) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        let million = Data(repeating: UInt8(ascii: "a"), count: 1_000_000)
        let expected = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        #expect(CloudAssetReference.sha256Hex(million) == expected)
        for chunk in [1, 63, 64, 65, 4_096, 333_333] {
            var hasher = SHA256Hasher()
            var offset = 0
            while offset < million.count {
                let end = min(offset + chunk, million.count)
                hasher.update(million[offset..<end])
                offset = end
            }
            #expect(hasher.finalizeHex() == expected, "chunks of \(chunk)")
        }
    }
}
