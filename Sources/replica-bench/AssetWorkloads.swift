import Foundation
import Replica

// B16 — large data as assets (`.externalStorage`, Specs/external-storage.md), the three figures:
//
// - B16: the local write. 200 models, each with a distinct 1 MB value of an external-storage attribute, inserted
//   and saved once into a synced store file (each value hashed, written to its own file and synced before the
//   transaction that references it commits) ÷ `FileManager.copyItem` copying 200 files of 1 MB (the same bytes,
//   written before timing) into a new directory.
// - B16s: end-to-end sync throughput, in MB/s of wall time: one device uploads the 200 assets and their records to
//   an embedded SQLite-file cloud (`SyncDriver.syncUntilIdle`), a second device with an empty store downloads them.
//   No target: reported.
// - B16u / B16d: peak memory while syncing one 200 MB asset, upload and download, each in a fresh child process
//   (`replica-bench --child B16m up|down DIR`): the child opens the device's store and the cloud, takes its resident
//   set size as the baseline, starts a new peak, syncs, and reports the peak above the baseline (streamed: never the
//   whole asset in memory).
// - B16l: peak memory of the local path of one 200 MB value through the lazy handle, in a child process
//   (`--child B16m local DIR`): `ExternalData(contentsOf:)` hashes a 200 MB file, the save copies it into the store's
//   asset directory, a fetch in a new context returns a handle and `forEachChunk` reads the bytes back (checked
//   against the hash). Streamed: never the whole value in memory.

/// A photo whose image is kept as an asset.
struct BenchPhoto: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var image: Data?

    static let entity = ModelEntity<BenchPhoto>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
    ])

    init(id: UUID = .unassigned, title: String, image: Data?) {
        self.id = id
        self.title = title
        self.image = image
    }
}

/// `count` distinct payloads of `bytes` bytes (xorshift64 from `seed`), made once per shape.
func assetPayloads(_ count: Int, bytes: Int, seed: UInt64 = 16) -> [Data] {
    let key = "\(count)x\(bytes)/\(seed)"
    if let made = assetPayloadSets[key] { return made }
    var state = seed | 1
    let made = (0..<count).map { _ in
        var data = Data(count: bytes)
        data.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for i in words.indices {
                state ^= state << 13
                state ^= state >> 7
                state ^= state << 17
                words[i] = state
            }
        }
        return data
    }
    assetPayloadSets[key] = made
    return made
}

nonisolated(unsafe) private var assetPayloadSets: [String: [Data]] = [:]

private let megabyte = 1 << 20

/// The photos of B16 (IDs assigned, values shared with the raw side's files).
private func benchPhotos(_ payloads: [Data], seed: UInt64 = 16) -> [BenchPhoto] {
    let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory)
    return payloads.enumerated().map { BenchPhoto(id: environment.makeIdentifier(), title: "photo \($0.offset)", image: $0.element) }
}

private func assetDirectory(_ directory: URL) -> URL { URL(fileURLWithPath: storePath(directory) + "-assets") }

private func fileCount(_ directory: URL) -> Int {
    ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).filter { !$0.hasPrefix(".") }.count
}

// MARK: - B16: the local write

/// Replica: insert the photos and save once into a fresh synced store file.
func assetSaveTrial(_ n: Int) throws -> Trial {
    let photos = benchPhotos(assetPayloads(n, bytes: megabyte))
    let directory = trialDirectory("B16-replica")
    let container = try makeStore(directory, [BenchPhoto.self], synced: true)
    let context = ModelContext(container)
    _ = try context.model(BenchPhoto.self, id: .unassigned)
    return Trial(run: {
        for photo in photos { context.insert(photo) }
        try context.save()
    }, check: {
        try require(RawDB(path: storePath(directory)).count("BenchPhoto") == n, "B16: the store does not hold \(n) photos")
        try require(fileCount(assetDirectory(directory)) == n, "B16: \(fileCount(assetDirectory(directory))) asset files, not \(n)")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

/// Raw: `FileManager.copyItem` of the same bytes, written to files before timing, into a new directory.
func assetCopyTrial(_ n: Int) throws -> Trial {
    let payloads = assetPayloads(n, bytes: megabyte)
    let directory = trialDirectory("B16-raw")
    let sources = directory.appendingPathComponent("sources"), copies = directory.appendingPathComponent("copies")
    try FileManager.default.createDirectory(at: sources, withIntermediateDirectories: true)
    try FileManager.default.createDirectory(at: copies, withIntermediateDirectories: true)
    for (index, payload) in payloads.enumerated() { try payload.write(to: sources.appendingPathComponent("\(index)")) }
    return Trial(run: {
        for index in 0..<n {
            try FileManager.default.copyItem(at: sources.appendingPathComponent("\(index)"), to: copies.appendingPathComponent("\(index)"))
        }
    }, check: {
        try require(fileCount(copies) == n, "B16 raw: \(fileCount(copies)) copies, not \(n)")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) })
}

// MARK: - B16s: sync throughput

/// A device with a synced store file in `directory` and its engine.
private func assetDevice(_ directory: URL) throws -> (ModelContainer, SyncEngine) {
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let container = try makeStore(directory, [BenchPhoto.self], synced: true)
    return (container, try SyncEngine(container: container, storeName: "bench"))
}

/// One device uploads `n` photos of 1 MB to a SQLite-file cloud, a second one downloads them; MB/s of wall time.
func assetSyncTrial(_ n: Int) throws -> Trial {
    let photos = benchPhotos(assetPayloads(n, bytes: megabyte))
    let directory = trialDirectory("B16s")
    let (source, sourceEngine) = try assetDevice(directory.appendingPathComponent("a"))
    let (target, targetEngine) = try assetDevice(directory.appendingPathComponent("b"))
    let context = ModelContext(source)
    for photo in photos { context.insert(photo) }
    try context.save()
    let cloud = try SQLiteCloudDatabase(url: directory.appendingPathComponent("cloud.sqlite"))
    let engines = UncheckedBox((sourceEngine, targetEngine))
    var note: String?
    return Trial(run: {}, check: {
        try require(try ModelContext(target).fetchCount(FetchDescriptor<BenchPhoto>()) == n, "B16s: the second device does not hold \(n) photos")
        try require(fileCount(assetDirectory(directory.appendingPathComponent("b"))) == n, "B16s: the second device does not hold \(n) asset files")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) }, measured: {
        var upload = Sample(cpu: 0, wall: 0)
        let sample = try measureProcess {
            upload = try measureProcess {
                let status = try blocking { try await SyncDriver.syncUntilIdle(engines.value.0, with: cloud) }
                try require(status.pendingRecords == 0, "B16s: \(status.pendingRecords) records left to upload")
            }
            _ = try blocking { try await SyncDriver.syncUntilIdle(engines.value.1, with: cloud) }
        }
        let megabytes = Double(n)
        note = "upload \(format(megabytes / upload.wall, 1)) MB/s, download \(format(megabytes / (sample.wall - upload.wall), 1)) MB/s; "
            + "process CPU \(format(sample.cpu, 2)) s for \(format(sample.wall, 2)) s"
        // Throughput is wall time: both clocks carry it.
        return Measurement(sample: Sample(cpu: sample.wall, wall: sample.wall), peakMB: nil, items: n)
    }, note: { note })
}

// MARK: - B16u / B16d: peak memory while syncing one large asset

/// A device store holding one photo of `megabytes` MB (never synced) and a cloud that holds it (from a copy of that
/// store, synced), made once per size: the templates each child's run copies.
private func largeAssetTemplates(_ megabytes: Int) throws -> (store: URL, cloud: URL) {
    if let made = largeAssetTemplateSets[megabytes] { return made }
    let root = trialDirectory("B16m-templates-\(megabytes)")
    let store = root.appendingPathComponent("store"), uploaded = root.appendingPathComponent("uploaded")
    let cloudFile = root.appendingPathComponent("cloud.sqlite")
    do {
        let (container, _) = try assetDevice(store)
        let context = ModelContext(container)
        context.insert(benchPhotos(assetPayloads(1, bytes: megabytes * megabyte, seed: 160))[0])
        try context.save()
    }
    try FileManager.default.copyItem(at: store, to: uploaded)
    do {
        let (_, engine) = try assetDevice(uploaded)
        let cloud = try SQLiteCloudDatabase(url: cloudFile)
        let box = UncheckedBox(engine)
        let status = try blocking { try await SyncDriver.syncUntilIdle(box.value, with: cloud) }
        try require(status.pendingRecords == 0, "B16m: the template upload left \(status.pendingRecords) records")
    }
    let made = (store, cloudFile)
    largeAssetTemplateSets[megabytes] = made
    return made
}

nonisolated(unsafe) private var largeAssetTemplateSets: [Int: (store: URL, cloud: URL)] = [:]

/// One direction of B16m, measured in a child process.
func largeAssetSyncTrial(_ megabytes: Int, direction: String) throws -> Trial {
    let templates = try largeAssetTemplates(megabytes)
    let directory = trialDirectory("B16m-\(direction)")
    var report: StreamReport?
    return Trial(run: {}, check: {
        guard let report else { throw CheckFailed("B16m: the \(direction) child reported nothing") }
        try require(report.count == 1, "B16m: the \(direction) child synced \(report.count) photos")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) }, measured: {
        try? FileManager.default.removeItem(at: directory)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        if direction == "up" {
            try FileManager.default.copyItem(at: templates.store, to: directory.appendingPathComponent("device"))
        } else {
            try FileManager.default.copyItem(at: templates.cloud, to: directory.appendingPathComponent("cloud.sqlite"))
        }
        let decoded = try childReport(["--child", "B16m", direction, directory.path], label: "B16m \(direction)")
        report = decoded
        return Measurement(sample: Sample(cpu: decoded.cpu, wall: decoded.wall), peakMB: decoded.peakAboveBaselineMB, items: nil)
    }, note: {
        report.map { "child baseline \(format($0.baselineMB, 1)) MB; \(format(Double(megabytes) / $0.wall, 1)) MB/s" }
    })
}

/// The B16m child's work: open the device (its store under `DIR/device`) and the cloud (`DIR/cloud.sqlite`), take
/// the baseline, sync until idle, report the photos the device then holds. Never returns.
func largeAssetSyncChild(direction: String, directory: URL) -> Never {
    if direction == "local" { largeAssetLocalChild(directory: directory) }
    do {
        guard direction == "up" || direction == "down" else {
            FileHandle.standardError.write(Data("replica-bench --child B16m: unknown direction \(direction)\n".utf8))
            exit(2)
        }
        let deviceDirectory = directory.appendingPathComponent("device")
        let (container, engine) = try assetDevice(deviceDirectory)
        let cloud = try SQLiteCloudDatabase(url: directory.appendingPathComponent("cloud.sqlite"))
        _ = try engine.status()
        let box = UncheckedBox(engine)
        let baseline = Memory.residentBytes() ?? 0
        Memory.resetPeak()
        var status: SyncStatus?
        let sample = try measureProcess {
            status = try blocking { try await SyncDriver.syncUntilIdle(box.value, with: cloud) }
        }
        let peak = Memory.peakBytes() ?? 0
        guard let status, status.isUpToDate else { throw CheckFailed("not up to date after the sync: \(String(describing: status))") }
        let count = try ModelContext(container).fetchCount(FetchDescriptor<BenchPhoto>())
        guard fileCount(assetDirectory(deviceDirectory)) == count else { throw CheckFailed("the asset file is missing") }
        let report = StreamReport(cpu: sample.cpu, wall: sample.wall, baselineMB: Double(baseline) / 1_048_576,
                                  peakAboveBaselineMB: Double(max(0, peak - baseline)) / 1_048_576,
                                  count: count, checksum: 0)
        FileHandle.standardOutput.write(try JSONEncoder().encode(report) + Data("\n".utf8))
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("replica-bench --child B16m \(direction): \(error)\n".utf8))
        exit(1)
    }
}

// MARK: - B16l: peak memory of a 200 MB value through the lazy handle

/// `BenchPhoto`'s entity with the image read as a handle.
struct BenchLazyPhoto: PersistentModel, Codable {
    static var entityName: String { "BenchPhoto" }
    var id = UUID.unassigned
    var title: String = ""
    var image: ExternalData?

    static let entity = ModelEntity<BenchLazyPhoto>([
        .attribute("title", \.title, default: ""),
        .attribute("image", \.image, options: .externalStorage),
    ])
}

/// B16l, measured in a child process.
func largeAssetLocalTrial(_ megabytes: Int) throws -> Trial {
    let directory = trialDirectory("B16l")
    var report: StreamReport?
    return Trial(run: {}, check: {
        guard let report else { throw CheckFailed("B16l: the child reported nothing") }
        try require(report.count == megabytes * megabyte, "B16l: the child read \(report.count) bytes back")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) }, measured: {
        try? FileManager.default.removeItem(at: directory)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try writeSourceFile(directory.appendingPathComponent("source.bin"), megabytes: megabytes)
        let decoded = try childReport(["--child", "B16m", "local", directory.path], label: "B16l")
        report = decoded
        return Measurement(sample: Sample(cpu: decoded.cpu, wall: decoded.wall), peakMB: decoded.peakAboveBaselineMB, items: nil)
    }, note: {
        report.map { "child baseline \(format($0.baselineMB, 1)) MB; \(format(Double(megabytes) / $0.wall, 1)) MB/s (hash, copy with fsync, read back)" }
    })
}

/// Writes `megabytes` MB of xorshift bytes to `url`, 1 MB at a time.
private func writeSourceFile(_ url: URL, megabytes: Int) throws {
    guard FileManager.default.createFile(atPath: url.path, contents: nil) else { throw CheckFailed("B16l: cannot create \(url.path)") }
    let handle = try FileHandle(forWritingTo: url)
    defer { try? handle.close() }
    var state: UInt64 = 161
    var chunk = Data(count: megabyte)
    for _ in 0..<megabytes {
        chunk.withUnsafeMutableBytes { raw in
            for i in raw.bindMemory(to: UInt64.self).indices {
                state ^= state << 13
                state ^= state >> 7
                state ^= state << 17
                raw.bindMemory(to: UInt64.self)[i] = state
            }
        }
        try handle.write(contentsOf: chunk)
    }
}

/// The B16l child: baseline, then import `DIR/source.bin`, save, fetch in a new context and stream it back; reports
/// the bytes read back as `count`. Never returns.
func largeAssetLocalChild(directory: URL) -> Never {
    do {
        let store = directory.appendingPathComponent("device")
        try FileManager.default.createDirectory(at: store, withIntermediateDirectories: true)
        let container = try makeStore(store, [BenchLazyPhoto.self], synced: true)
        _ = try ModelContext(container).fetchCount(FetchDescriptor<BenchLazyPhoto>())
        let baseline = Memory.residentBytes() ?? 0
        Memory.resetPeak()
        var read = 0
        var checksum: UInt64 = 0
        let sample = try measureProcess {
            let context = ModelContext(container)
            let photo = BenchLazyPhoto(title: "large", image: try ExternalData(contentsOf: directory.appendingPathComponent("source.bin")))
            let id = context.insert(photo).id
            try context.save()
            guard let image = try ModelContext(container).model(BenchLazyPhoto.self, id: id)?.image, !image.isLoaded else {
                throw CheckFailed("the fetched photo holds no handle")
            }
            try image.forEachChunk { chunk in
                read += chunk.count
                checksum &+= UInt64(chunk.first ?? 0)
            }
        }
        let peak = Memory.peakBytes() ?? 0
        let report = StreamReport(cpu: sample.cpu, wall: sample.wall, baselineMB: Double(baseline) / 1_048_576,
                                  peakAboveBaselineMB: Double(max(0, peak - baseline)) / 1_048_576,
                                  count: read, checksum: Int(truncatingIfNeeded: checksum))
        FileHandle.standardOutput.write(try JSONEncoder().encode(report) + Data("\n".utf8))
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("replica-bench --child B16m local: \(error)\n".utf8))
        exit(1)
    }
}
