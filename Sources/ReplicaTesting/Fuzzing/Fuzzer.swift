// Fuzz targets over what Replica reads from outside: cloud records (decoding, and the merge of a hostile record into
// a store that holds the same IDs), trace files (`replay`/`shrink` headers, then a short run of what they describe),
// scenario JSON (parse, validate, a short run), and store files with bytes flipped (opened by a container, read,
// written, synced). Each iteration mutates one input of the target's corpus (see Mutator.swift) and runs it; a typed
// error is a fine answer, a trap is a failure (it ends the process: `replica-sim fuzz` writes each input to a file
// before running it, so the input of a trap is left behind).

import Foundation
@_spi(Simulation) import Replica
import Synchronization

/// What a fuzz target reads.
public enum FuzzTarget: String, CaseIterable, Sendable, Codable, CustomStringConvertible {
    /// `CloudRecord` bodies — the binary form and JSON — decoded and, when they decode, merged into a synced store by
    /// a sync engine.
    case cloudRecord = "cloud-record"
    /// Trace files (NDJSON): the header is read and checked, and its scenario and tape run for a few steps.
    case trace
    /// Scenario JSON: parsed, checked and run for a few steps.
    case scenario
    /// A store file (SQLite, with sync bookkeeping) with bytes changed, opened by a container and used.
    case storeFile = "store-file"

    public var description: String { rawValue }
}

/// How one input fared.
public enum FuzzOutcome: Sendable, Hashable {
    /// Read and used (decoded, merged, parsed, run, opened).
    case accepted
    /// Refused with a typed error.
    case refused(String)
}

/// Counts of one fuzz run.
public struct FuzzReport: Sendable {
    /// The target run.
    public var target: FuzzTarget
    /// The seed of the run (each iteration's input is a function of it and the iteration).
    public var seed: UInt64
    /// Inputs run.
    public var iterations = 0
    /// Inputs read and used (decoded, merged, parsed, run, opened).
    public var accepted = 0
    /// Inputs refused with a typed error.
    public var refused = 0
    /// CPU seconds the run took.
    public var seconds = 0.0
}

/// The seeded fuzz loop (see the file comment).
public enum Fuzzer {
    /// Runs `iterations` iterations of `target`, from `first`.
    /// - Parameter beforeEach: called with each iteration's number and input before it runs (e.g. to keep the input of
    ///   a trap).
    /// - Returns: the counts. A trap ends the process; nothing else is a failure.
    public static func run(_ target: FuzzTarget, seed: UInt64, iterations: Int, first: Int = 0,
                           beforeEach: (Int, [UInt8]) -> Void = { _, _ in }) -> FuzzReport {
        var report = FuzzReport(target: target, seed: seed)
        let start = threadCPUSeconds()
        for iteration in first..<(first + max(0, iterations)) {
            let bytes = input(target, seed: seed, iteration: iteration)
            beforeEach(iteration, bytes)
            switch execute(target, bytes) {
            case .accepted: report.accepted += 1
            case .refused: report.refused += 1
            }
            report.iterations += 1
        }
        report.seconds = threadCPUSeconds() - start
        return report
    }

    /// The input of iteration `iteration` of a run of `target` seeded with `seed`: a corpus entry, mutated.
    ///
    /// For `cloud-record`, half of the iterations (drawn from a generator of their own, so the other half are the
    /// JSON inputs they always were) take the same corpus record in the binary body form (`CloudRecordBody`) and
    /// mutate its bytes (bit flips, byte changes, boundary integers written over fixed-width and varint fields, spans
    /// inserted, deleted, duplicated, truncation) instead of its JSON structure.
    public static func input(_ target: FuzzTarget, seed: UInt64, iteration: Int) -> [UInt8] {
        var random = FuzzRandom(seed: seed, iteration: iteration)
        let corpus = FuzzCorpus.entries(target)
        let pick = random.below(corpus.count)
        if target == .cloudRecord, binaryIteration(seed: seed, iteration: iteration) {
            return Mutator.mutate(FuzzCorpus.binaryCloudRecords[pick], random: &random, allowJSON: false, binary: true)
        }
        return Mutator.mutate(corpus[pick], random: &random, allowJSON: target != .storeFile)
    }

    /// Whether iteration `iteration` of a `cloud-record` run seeded with `seed` fuzzes the binary body form.
    public static func binaryIteration(seed: UInt64, iteration: Int) -> Bool {
        var form = FuzzRandom(seed: seed ^ 0xB0D1_B0D1_B0D1_B0D1, iteration: iteration)
        return form.below(2) == 1
    }

    /// Runs one input of `target`.
    public static func execute(_ target: FuzzTarget, _ bytes: [UInt8]) -> FuzzOutcome {
        do {
            switch target {
            case .cloudRecord: try FuzzHarness.cloudRecord(bytes)
            case .trace: try FuzzHarness.trace(bytes)
            case .scenario: try FuzzHarness.scenario(bytes)
            case .storeFile: try FuzzHarness.storeFile(bytes)
            }
            return .accepted
        } catch {
            return .refused(String(describing: type(of: error)))
        }
    }

    /// `bytes` as lowercase hex.
    public static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    /// The bytes of a hex string (`nil` when it is not one).
    public static func bytes(hex text: String) -> [UInt8]? {
        let digits = Array(text.utf8.filter { !($0 == 0x20 || $0 == 0x0A) })
        guard digits.count % 2 == 0 else { return nil }
        var result: [UInt8] = []
        result.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let byte = UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16) else { return nil }
            result.append(byte)
            index += 2
        }
        return result
    }
}

// MARK: - Corpus

/// The valid inputs each target's mutations start from (made once per process).
enum FuzzCorpus {
    /// The schema of every store the targets open: the trips seed schema, in one synced store.
    static let schema = SimulationSchema.trips.schema()
    static let storeName = "trips"
    /// IDs the corpus records use; the cloud-record harness's store holds live records with the first two.
    static let tripID = UUID(uuidString: "019B76DA-A800-7000-8000-000000000001")!
    static let itemID = UUID(uuidString: "019B76DA-A800-7000-8000-000000000002")!
    static let writer = UUID(uuidString: "019B76DA-A800-7000-8000-0000000000FF")!

    static func entries(_ target: FuzzTarget) -> [[UInt8]] {
        switch target {
        case .cloudRecord: return cloudRecords
        case .trace: return traces
        case .scenario: return scenarios
        case .storeFile: return storeFiles
        }
    }

    static let cloudRecords: [[UInt8]] = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        func stamp(_ incarnation: Int64, _ physical: Int64, _ logical: Int32 = 0) -> FieldStamp {
            FieldStamp(incarnation: incarnation, clock: HLC(physical: physical, logical: logical, replica: writer))
        }
        let now: Int64 = 1_767_225_700_000
        let records = [
            CloudRecord(recordID: tripID, recordType: "Trip", changeTag: "1-1", causalLength: 1, created: stamp(1, now), fields: [
                "name": CloudField(value: .text("Lisbon"), stamp: stamp(1, now)),
                "destination": CloudField(value: .text("PT"), stamp: stamp(1, now + 5)),
                "startDate": CloudField(value: .real(1_767_225_600), stamp: stamp(1, now)),
                "budget": CloudField(value: .integer(900), stamp: stamp(1, now, 3)),
            ]),
            CloudRecord(recordID: itemID, recordType: "BucketListItem", changeTag: "1-2", causalLength: 3, created: stamp(3, now), fields: [
                "title": CloudField(value: .text("Tram 28"), stamp: stamp(3, now)),
                "isDone": CloudField(value: .integer(1), stamp: stamp(3, now)),
                "trip": CloudField(value: tripID.sqliteValue, stamp: stamp(3, now)),
                "mood": CloudField(value: .text("unknown field"), stamp: stamp(3, now)),
            ]),
            CloudRecord(recordID: tripID, recordType: "Trip", changeTag: "1-3", causalLength: 2, created: stamp(1, now),
                        fields: ["name": CloudField(value: .text("Lisbon"), stamp: stamp(1, now))]),
            CloudRecord(recordID: itemID, recordType: "Accommodation", causalLength: 1, created: stamp(1, (1 << 48) - 1, 0xFFFF),
                        redirect: tripID, endedRedirects: [EndedRedirect(incarnation: 1, winner: tripID)], fields: [
                "name": CloudField(value: .blob(Data(repeating: 7, count: 16)), stamp: stamp(1, (1 << 48) - 1, 0xFFFE), isEncrypted: true),
            ]),
        ]
        return records.map { Array((try? encoder.encode($0)) ?? Data()) }
    }()

    /// The same records in the binary body form, in the same order.
    static let binaryCloudRecords: [[UInt8]] = cloudRecords.map { json in
        (try? CloudRecordBody.encode(JSONDecoder().decode(CloudRecord.self, from: Data(json)))).map { Array($0) } ?? []
    }

    static let scenarioText = """
        {"schema": ["trips", "drafts"],
         "stores": [{"name": "trips", "kind": "synced", "entities": ["Trip", "BucketListItem", "Accommodation"]},
                    {"name": "drafts", "kind": "local", "entities": ["Draft"]}],
         "devices": [{"name": "phone"}, {"name": "tablet", "schemaVersion": 1}],
         "workload": {"insert": 30, "update": 20, "delete": 5, "deleteReinsert": 2},
         "faults": {"crash": 0.05, "hostileRecord": 0.02, "resetZone": 0},
         "timing": {"digestEvery": 2},
         "steps": 4}
        """

    static let scenarios: [[UInt8]] = {
        var result = [Array(scenarioText.utf8)]
        result.append(Array("""
            {"schema": {"version": 2, "entities": [
                {"name": "Box", "attributes": [{"name": "label", "type": "string", "default": "", "options": ["unique"]},
                                               {"name": "weight", "type": "double", "optional": true, "since": 2}],
                 "relationships": [{"name": "items", "destination": "Item", "inverse": "box", "toMany": true, "deleteRule": "cascade"}]},
                {"name": "Item", "attributes": [{"name": "name", "type": "string", "default": ""}],
                 "relationships": [{"name": "box", "destination": "Box", "inverse": "items"}]}]},
             "stores": [{"name": "boxes", "kind": "app-group", "entities": ["Box", "Item"]}],
             "devices": [{"name": "old", "schemaVersion": 1}, {"name": "new"}],
             "steps": 3}
            """.utf8))
        return result
    }()

    static let traces: [[UInt8]] = {
        guard let scenario = try? Scenario.parse(Data(scenarioText.utf8), file: "fuzz.json", defaultName: "fuzz"),
              let result = try? Simulator.run(scenario, seed: 7, options: SimulationOptions(steps: 3)) else { return [[]] }
        return [Array(result.traceText.utf8)]
    }()

    /// A store file of the fuzz schema with records, their ledger rows, history and a stored clock (checkpointed, so
    /// the file holds everything).
    static let storeFiles: [[UInt8]] = {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-fuzz-corpus-\(ProcessInfo.processInfo.processIdentifier)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("trips.store")
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let container = try ModelContainer(for: schema, configurations: [
                ModelConfiguration(storeName, url: url, cloudKitDatabase: .private("iCloud.fuzz")),
            ], environment: .seeded(seed: 11, directory: directory))
            let context = ModelContext(container)
            let trip = schema.entity(named: "Trip")!, item = schema.entity(named: "BucketListItem")!
            let trips = EntityShapeRegistry.shared.accessor(for: trip), items = EntityShapeRegistry.shared.accessor(for: item)
            let first = trips.insert(context, id: .unassigned, values: [.text("Lisbon"), .text("PT"), .null, .integer(100)])
            _ = items.insert(context, id: .unassigned, values: [.text("Tram"), .integer(0), .text("n"), .integer(1), first.sqliteValue])
            try context.save()
            let cloud = InMemoryCloudDatabase()
            let engine = try SyncEngine(container: container, storeName: storeName)
            for _ in 0..<20 {
                guard let request = try engine.nextRequest() else { break }
                try engine.handle(request.id, cloud.performNow(request.operation))
            }
            context.delete(PersistentIdentifier(entityName: "BucketListItem", id: try items.all(context)[0].id))
            try context.save()
        } catch {
            return [[]]
        }
        guard let data = FileManager.default.contents(atPath: url.path) else { return [[]] }
        return [Array(data)]
    }()
}

// MARK: - Harnesses

enum FuzzHarness {
    /// A synced in-memory store holding live records with the corpus IDs (and an unsynced local change), its engine
    /// and a cloud.
    final class Store {
        let container: ModelContainer
        let context: ModelContext
        let engine: SyncEngine
        let cloud = InMemoryCloudDatabase()

        init() throws {
            let directory = FileManager.default.temporaryDirectory
            container = try ModelContainer(for: FuzzCorpus.schema, configurations: [
                ModelConfiguration(FuzzCorpus.storeName, isStoredInMemoryOnly: true, cloudKitDatabase: .private("iCloud.fuzz")),
            ], environment: .seeded(seed: 5, directory: directory))
            context = ModelContext(container)
            let schema = FuzzCorpus.schema
            let trips = EntityShapeRegistry.shared.accessor(for: schema.entity(named: "Trip")!)
            let items = EntityShapeRegistry.shared.accessor(for: schema.entity(named: "BucketListItem")!)
            _ = trips.insert(context, id: FuzzCorpus.tripID, values: [.text("Porto"), .null, .null, .integer(100)])
            _ = items.insert(context, id: FuzzCorpus.itemID, values: [.text("Bridge"), .integer(0), .null, .integer(1), FuzzCorpus.tripID.sqliteValue])
            try context.save()
            engine = try SyncEngine(container: container, storeName: FuzzCorpus.storeName, sharingConnectionOf: context)
        }

        /// Drives the engine against the cloud, answering its first zone fetch with `batch` (at most `limit` requests).
        func sync(delivering batch: [CloudRecord], limit: Int = 40) throws {
            var delivered = false
            for _ in 0..<limit {
                guard let request = try engine.nextRequest() else { return }
                if case .fetchZoneChanges = request.operation, !delivered {
                    delivered = true
                    try engine.handle(request.id, .success(.changes(ZoneChangeBatch(records: batch, token: ServerChangeToken(epoch: 1, sequence: 1),
                                                                                  moreComing: false))))
                } else {
                    try engine.handle(request.id, cloud.performNow(request.operation))
                }
            }
        }
    }

    /// Decodes a cloud record body (binary or JSON, as a cloud database reads it: `CloudRecordBody/decode(_:)`) and
    /// merges it (alone, then beside the corpus' first record) into a store holding its ID; then reads the status and
    /// ledger, edits every live record, and uploads.
    static func cloudRecord(_ bytes: [UInt8]) throws {
        let record = try CloudRecordBody.decode(Data(bytes))
        let store = try Store()
        try store.sync(delivering: [record])
        _ = try store.engine.status()
        _ = try store.engine.ledgerEntries()
        _ = try store.engine.replicationStates()
        _ = try store.engine.conflictLog()
        let schema = FuzzCorpus.schema
        for entity in schema.entities {
            let access = EntityShapeRegistry.shared.accessor(for: entity)
            // (A record with the nil ID is refused, so every live row is one the app can update.)
            for (id, values) in try access.all(store.context) {
                var edited = values
                edited[0] = .text("edited")
                access.update(store.context, id: id, values: edited)
            }
        }
        do { try store.context.save() } catch is ReplicaError { store.context.rollback() }
        store.engine.setNeedsFetch()
        try store.sync(delivering: [record])
    }

    /// Reads a trace's header (as `replay` and `shrink` do) and runs its scenario and tape for at most 3 steps.
    static func trace(_ bytes: [UInt8]) throws {
        let text = String(decoding: bytes, as: UTF8.self)
        let header = try TraceFormat.header(of: text, file: "fuzz.ndjson")
        _ = TraceFormat.failedInvariant(of: text)
        var canaries = Set<Canary>()
        for name in header.canaries { if let canary = Canary(rawValue: name) { canaries.insert(canary) } }
        _ = try Simulator.run(header.scenario, tape: Array(header.tape.choices.prefix(4_000)), seed: header.seed,
                              options: SimulationOptions(canaries: canaries, steps: min(header.scenario.steps, 3), recordsTrace: true))
    }

    /// Parses and checks scenario JSON and runs it for at most 3 steps.
    static func scenario(_ bytes: [UInt8]) throws {
        let scenario = try Scenario.parse(Data(bytes), file: "fuzz.json", defaultName: "fuzz")
        _ = scenario.canonicalJSON
        _ = try Simulator.run(scenario, seed: 1, options: SimulationOptions(steps: min(scenario.steps, 3), recordsTrace: true))
    }

    /// Opens a store file with a container (synced), reads every record, starts an engine, reads the status and
    /// ledger, saves a change and syncs it.
    static func storeFile(_ bytes: [UInt8]) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-fuzz-\(ProcessInfo.processInfo.processIdentifier)-\(storeSerial())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("trips.store")
        guard FileManager.default.createFile(atPath: url.path, contents: Data(bytes)) else { return }
        let container = try ModelContainer(for: FuzzCorpus.schema, configurations: [
            ModelConfiguration(FuzzCorpus.storeName, url: url, cloudKitDatabase: .private("iCloud.fuzz")),
        ], environment: .seeded(seed: 9, directory: directory))
        let context = ModelContext(container)
        var live: [(access: any DynamicEntityAccess, entity: String, id: UUID, values: [SQLiteValue])] = []
        for entity in FuzzCorpus.schema.entities {
            let access = EntityShapeRegistry.shared.accessor(for: entity)
            for (id, values) in try access.all(context) { live.append((access, entity.name, id, values)) }
        }
        _ = try context.fetchHistory()
        let engine = try SyncEngine(container: container, storeName: FuzzCorpus.storeName, sharingConnectionOf: context)
        _ = try engine.status()
        _ = try engine.ledgerEntries()
        _ = try engine.replicationStates()
        _ = try engine.unknownTypeRecords()
        if let first = live.first(where: { $0.id != .unassigned }) {
            var edited = first.values
            edited[0] = .text("edited")
            first.access.update(context, id: first.id, values: edited)
        }
        let trips = EntityShapeRegistry.shared.accessor(for: FuzzCorpus.schema.entity(named: "Trip")!)
        _ = trips.insert(context, id: .unassigned, values: [.text("new"), .null, .null, .integer(1)])
        if live.count > 1, let last = live.last { context.delete(PersistentIdentifier(entityName: last.entity, id: last.id)) }
        do { try context.save() } catch is ReplicaError { context.rollback() }
        let cloud = InMemoryCloudDatabase()
        for _ in 0..<30 {
            guard let request = try engine.nextRequest() else { break }
            try engine.handle(request.id, cloud.performNow(request.operation))
        }
    }

    private static let serial = Mutex(0)
    private static func storeSerial() -> Int { serial.withLock { $0 += 1; return $0 } }
}
