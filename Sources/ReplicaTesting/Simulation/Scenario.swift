// Scenarios: what one simulation runs — schema, stores, devices, workload mix, fault rates and steps — read from
// JSON files in `Simulations/`, validated field by field.

import Foundation
import Replica

/// A simulation scenario (a JSON file in `Simulations/`). See `Simulations/README.md` for the format.
public struct Scenario: Codable, Hashable, Sendable {
    /// How a store is kept.
    public enum StoreKind: String, Codable, Sendable, CaseIterable {
        /// Local only: never leaves its device.
        case local
        /// Synced to the cloud zone named after the store.
        case synced
        /// In the device's app-group directory, opened by two processes of the device (app and extension), each
        /// with its own container (and, when synced, its own sync engine; the store's upload lease decides who
        /// talks to the cloud). Always file-backed.
        case appGroup = "app-group"
    }

    /// One store of every device that opens it.
    public struct Store: Codable, Hashable, Sendable {
        /// The store (configuration) name; synced stores sync with the zone of that name.
        public var name: String
        /// Local, synced or app-group.
        public var kind: StoreKind
        /// The entities it holds (relationships stay within one store).
        public var entities: [String]
        /// For app-group stores: whether the store is synced (default `true`).
        public var synced: Bool

        /// Whether the store replicates through the cloud.
        public var isSynced: Bool { kind == .synced || (kind == .appGroup && synced) }
    }

    /// One simulated device.
    public struct Device: Codable, Hashable, Sendable {
        /// The device name (in traces and messages).
        public var name: String
        /// The stores it opens.
        public var stores: [String]
        /// The schema version its app runs (older devices keep newer fields and record types they do not know).
        public var schemaVersion: Int
        /// The schema version its app-group extension runs, when it is not the app's (an extension updated later or
        /// earlier than its app): two app versions on one app-group store file. `nil` (the default, left out of the
        /// canonical JSON): the app's.
        public var extensionSchemaVersion: Int? = nil
        /// What the device's synced stores do when the cloud reports their zone deleted (fault `zoneDelete`): `nil`
        /// (the default, `"keepAndReupload"` in a scenario file, left out of the canonical JSON) keeps the data and
        /// uploads it again.
        public var zoneDeletionPolicy: ZoneDeletionChoice? = nil

        /// The library policy the device's engines are given.
        public var deletionPolicy: ZoneDeletionPolicy { (zoneDeletionPolicy ?? .keepAndReupload).policy }

        /// An app update during the run: the device starts at ``Upgrade/fromVersion`` and moves to `schemaVersion`
        /// at chaos step ``Upgrade/atStep``. `nil` (the default, left out of the canonical JSON): no update.
        public var upgrade: Upgrade? = nil
    }

    /// A device's zone deletion policy, as a scenario names it (`"zoneDeletionPolicy"`).
    public enum ZoneDeletionChoice: String, Codable, Sendable, CaseIterable {
        /// `ZoneDeletionPolicy.keepAndReupload`: every reason keeps the data.
        case keepAndReupload
        /// `ZoneDeletionPolicy.eraseLocalData`: a deletion or a purge erases the store's synced data; an
        /// encrypted-data reset keeps it.
        case eraseLocalData

        /// The library's policy of that name.
        public var policy: ZoneDeletionPolicy {
            switch self {
            case .keepAndReupload: return .keepAndReupload
            case .eraseLocalData: return .eraseLocalData
            }
        }
    }

    /// An app update of one device during a run: at the start of chaos step `atStep` (before its action) every
    /// process of the device closes its container gracefully and opens it again at the device's `schemaVersion`:
    /// local stores rename the columns of renamed attributes and add new ones, synced stores add columns (and resync).
    /// A process that is down then restarts at the new version.
    public struct Upgrade: Codable, Hashable, Sendable {
        /// The schema version the device runs before the update.
        public var fromVersion: Int
        /// The chaos step (1 = the first) at whose start the update happens (never, when the run is shorter).
        public var atStep: Int
    }

    /// Where stores live.
    public enum Storage: String, Codable, Sendable, CaseIterable {
        /// In-memory SQLite databases (fast); crash = the process's engine and contexts are lost, the data stays.
        case memory
        /// SQLite files (WAL); a crashed process's container is dropped and reopened, and every store file must
        /// pass `PRAGMA integrity_check`.
        case file
    }

    /// Relative weights of workload operations.
    ///
    /// The weights after `encryptedEdit` came later: each is left out of the scenario's canonical JSON while it is 0, so
    /// the traces (and hashes) of scenarios that do not use them stay byte for byte what they were.
    public struct Workload: Hashable, Sendable {
        public var insert = 30
        public var update = 35
        public var delete = 10
        /// Insert again an ID that is deleted (or not yet known) on the device.
        public var reinsert = 5
        /// Point a to-one relationship at another record (or at nothing).
        public var relationshipEdit = 10
        /// Insert a record whose unique attribute takes a value from a small shared pool.
        public var uniqueCollision = 5
        /// Update only attributes marked for cloud encryption.
        public var encryptedEdit = 5
        /// Delete a live record and insert it again (the same ID, new values) in one save: a new incarnation.
        public var deleteReinsert = 0
        /// Edit two copies of one record: both in one context and one save, or each in its own context of the process
        /// (the second saved after the first).
        public var copies = 0
        /// Save a copy read before the record changed: after the same context saved another edit of it, or at a later
        /// step (the copy kept meanwhile, while other operations and sync change the record).
        public var staleCopy = 0
        /// `delete(model:where:)` selecting some records, with inserts of the same IDs registered before or after it in
        /// the same save.
        public var batchDelete = 0
        /// Close a synced store and open it again under another configuration: sync turned off (the store is local
        /// until the next reopen turns sync on again) or on, or the same configuration.
        public var reopen = 0
        /// Add a many-to-many link of a record or remove one, from either side of the relationship.
        public var linkEdit = 0
        /// `undo()` on the process's context (which has a `ModelUndoManager` in scenarios that use this or ``redo``),
        /// sometimes with an edit left pending first (undo saves it as its own group and undoes that).
        public var undo = 0
        /// `redo()` on the process's context, sometimes with an edit left pending first (redo saves it, which clears
        /// the redo stack, so nothing is redone).
        public var redo = 0
        /// A process closes its container and opens its local stores with the unversioned `Schema` of its version and
        /// no migration plan (a widget's `ModelContainer(for: Schema([Item.self]))`), until its next restart or
        /// reopen (scenarios with a ``Scenario/migration``).
        public var unversionedOpen = 0
        /// Attributes one update changes, at most.
        public var maxFieldsPerUpdate = 2
        /// Size of the pool of unique-key values (smaller: more collisions).
        public var uniqueKeys = 4
        /// Percentage of optional attribute writes that write null.
        public var nullPercent = 10
        /// Percentage of `.externalStorage` data writes (that are not null) that write a large value: one of
        /// ``largeAssetSizes``, around and beyond one cloud chunk (`CloudAssetReference.chunkSize`), so
        /// uploads and downloads take several chunks and sealed assets several secretstream messages. The rest write
        /// 512 bytes. Came later: left out of the canonical JSON while 0.
        public var largeAssetPercent = 0
        public init() {}

        /// The sizes of large external-storage values, smallest first (a draw of 0 is the simplest), at the chunk
        /// boundaries of plain assets (chunks of `CloudAssetReference.chunkSize`, C) and of sealed ones (chunk 0 seals
        /// C − 41 plaintext bytes behind the 24-byte stream header, every later chunk C − 17): one sealed chunk exactly
        /// (C − 41), one byte into a second sealed message (C − 40), a second message of 24 bytes (C − 17), one plain
        /// chunk exactly (C), one byte into a second plain chunk (C + 1), two sealed chunks exactly (2C − 58), and three
        /// chunks either way (2C + 5).
        public static let largeAssetSizes: [Int] = {
            let chunk = CloudAssetReference.chunkSize
            return [chunk - 41, chunk - 40, chunk - 17, chunk, chunk + 1, 2 * chunk - 58, 2 * chunk + 5]
        }()

        /// Every operation weight, in `WorkloadOperation` order (index 0 is the simplest).
        var weights: [Int] {
            [insert, update, delete, reinsert, relationshipEdit, uniqueCollision, encryptedEdit, deleteReinsert, copies, staleCopy,
             batchDelete, reopen, linkEdit, undo, redo, unversionedOpen]
        }

        /// The weight fields by JSON key, in `weights` order.
        static var weightFields: [(String, WritableKeyPath<Workload, Int>)] { [
            ("insert", \.insert), ("update", \.update), ("delete", \.delete), ("reinsert", \.reinsert),
            ("relationshipEdit", \.relationshipEdit), ("uniqueCollision", \.uniqueCollision), ("encryptedEdit", \.encryptedEdit),
            ("deleteReinsert", \.deleteReinsert), ("copies", \.copies), ("staleCopy", \.staleCopy), ("batchDelete", \.batchDelete),
            ("reopen", \.reopen), ("linkEdit", \.linkEdit), ("undo", \.undo), ("redo", \.redo),
            ("unversionedOpen", \.unversionedOpen),
        ] }
        /// The numbers that are not weights, by JSON key.
        static var otherFields: [(String, WritableKeyPath<Workload, Int>)] { [
            ("maxFieldsPerUpdate", \.maxFieldsPerUpdate), ("uniqueKeys", \.uniqueKeys), ("nullPercent", \.nullPercent),
            ("largeAssetPercent", \.largeAssetPercent),
        ] }
        /// Keys written even when 0 (the fields every trace so far holds).
        static let alwaysEncoded: Set<String> = ["insert", "update", "delete", "reinsert", "relationshipEdit", "uniqueCollision",
                                                 "encryptedEdit", "maxFieldsPerUpdate", "uniqueKeys", "nullPercent"]
    }

    /// Fault rates: per chaos step, per message, per cloud request.
    ///
    /// As with ``Workload``, the rates after `resetZone` among the per-step ones came later and are left out of the
    /// canonical JSON while 0.
    public struct Faults: Hashable, Sendable {
        // Per chaos step (the rest of the steps are workload operations).
        public var crash = 0.02
        public var offline = 0.02
        public var partition = 0.01
        public var clockJump = 0.01
        public var expireTokens = 0.005
        public var resetZone = 0.002
        /// Overwrite the `stamps` bytes of a ledger row with garbage (a disk fault, a buggy older version).
        public var corruptStamps = 0.0
        /// Overwrite the `unknown` JSON of a ledger row (the fields this app version does not know) with garbage.
        public var corruptUnknown = 0.0
        /// Overwrite the store's stored hybrid logical clock with garbage.
        public var corruptClock = 0.0
        /// Overwrite a ledger row's causal length with a number at the edge of its range (up to `Int64.max`).
        public var corruptCausalLength = 0.0
        /// A record no device wrote appears in the cloud: stamps at the edges of their range, a clock far in the
        /// future, a huge causal length, an incarnation beyond the record's.
        public var hostileRecord = 0.0
        /// The cloud deletes a synced zone with every record in it and tells devices why (deleted, purged or encrypted
        /// data reset, drawn per fault): each device's `zoneDeletionPolicy` decides whether it keeps its data and
        /// uploads it again or erases it (R18).
        public var zoneDelete = 0.0
        // Per message between a device and the cloud.
        public var dropRequest = 0.01
        public var dropResponse = 0.01
        public var duplicateRequest = 0.01
        public var duplicateResponse = 0.01
        public var delay = 0.02
        public var staleFetch = 0.01
        // Per request the cloud performs.
        public var rateLimit = 0.01
        public var quota = 0.01
        public var zoneBusy = 0.01
        public var conflict = 0.01
        public var partialFailure = 0.01
        /// Device clocks start up to this far (either way) from true time.
        public var maxClockSkewMs = 300_000
        /// A clock jump moves a device clock up to this far, either way.
        public var maxClockJumpMs = 600_000
        public init() {}

        /// Per-step rates, in chaos-action order (action 0, the workload, takes what they leave).
        var stepRates: [Double] {
            [crash, offline, partition, clockJump, expireTokens, resetZone, corruptStamps, corruptUnknown, corruptClock,
             corruptCausalLength, hostileRecord, zoneDelete]
        }
        var messageRates: [Double] { [dropRequest, dropResponse, duplicateRequest, duplicateResponse, delay, staleFetch] }
        var cloudRates: [Double] { [rateLimit, quota, zoneBusy, conflict, partialFailure] }

        /// Every rate field by JSON key: per step, per message, per cloud request.
        static var rateFields: [(String, WritableKeyPath<Faults, Double>)] { [
            ("crash", \.crash), ("offline", \.offline), ("partition", \.partition), ("clockJump", \.clockJump),
            ("expireTokens", \.expireTokens), ("resetZone", \.resetZone), ("corruptStamps", \.corruptStamps),
            ("corruptUnknown", \.corruptUnknown), ("corruptClock", \.corruptClock), ("corruptCausalLength", \.corruptCausalLength),
            ("hostileRecord", \.hostileRecord), ("zoneDelete", \.zoneDelete),
            ("dropRequest", \.dropRequest), ("dropResponse", \.dropResponse), ("duplicateRequest", \.duplicateRequest),
            ("duplicateResponse", \.duplicateResponse), ("delay", \.delay), ("staleFetch", \.staleFetch),
            ("rateLimit", \.rateLimit), ("quota", \.quota), ("zoneBusy", \.zoneBusy), ("conflict", \.conflict),
            ("partialFailure", \.partialFailure),
        ] }
        /// The clock bounds, by JSON key.
        static var clockFields: [(String, WritableKeyPath<Faults, Int>)] { [
            ("maxClockSkewMs", \.maxClockSkewMs), ("maxClockJumpMs", \.maxClockJumpMs),
        ] }
        /// Rates that came later: left out of the canonical JSON while 0.
        static let optionalRates: Set<String> = ["corruptStamps", "corruptUnknown", "corruptClock", "corruptCausalLength", "hostileRecord", "zoneDelete"]
    }

    /// Virtual-time constants, in milliseconds.
    public struct Timing: Codable, Hashable, Sendable {
        /// Virtual time between two chaos steps, at most.
        public var thinkTimeMs = 1_500
        /// One-way network latency.
        public var latencyMs = 40
        /// Extra delay of a delayed message, at most (beyond the timeout: the answer comes too late).
        public var maxDelayMs = 45_000
        /// A device gives up on a request after this long.
        public var timeoutMs = 30_000
        /// Longest offline period or partition.
        public var outageMs = 90_000
        /// Longest time a crashed process stays down.
        public var restartMs = 20_000
        /// Push notification latency.
        public var pushLatencyMs = 150
        /// After heal, every store must have converged within this much virtual time (liveness).
        public var livenessBoundMs = 1_800_000
        /// A state digest line every this many chaos steps.
        public var digestEvery = 25
        public init() {}
    }

    /// Which guarantees of features that may not be built yet the checks demand.
    public struct Expectations: Codable, Hashable, Sendable {
        /// Synced unique keys are deduplicated: at most one live record per key everywhere (R15). When off, only
        /// "every device resolves keys identically" is checked.
        public var uniqueKeysDeduplicated = true
        /// No plaintext of an encrypted attribute reaches the cloud: every cloud save and, at the end, every byte the
        /// cloud holds are checked (the simulator gives every engine of a store with encrypted attributes the world's
        /// field key).
        public var cloudEncryption = true
        public init() {}
    }

    /// The scenario's name (the file name of a built-in scenario).
    public var name: String
    /// What the scenario exercises.
    public var description: String
    /// The built-in seed schemas the schema was built from (empty for an inline schema).
    public var schemaSeeds: [String]
    /// The schema every device runs (at its own version).
    public var schema: SimulationSchema
    /// The stores; each device opens some of them.
    public var stores: [Store]
    /// The devices.
    public var devices: [Device]
    /// In-memory databases or files.
    public var storage: Storage
    /// The mix of workload operations.
    public var workload: Workload
    /// Fault rates and clock bounds.
    public var faults: Faults
    /// Virtual-time constants.
    public var timing: Timing
    /// Checks of features that are not built yet.
    public var expect: Expectations
    /// Chaos steps (workload operations and faults) per run.
    public var steps: Int
    /// The app's migration plan (`nil`: containers open without one; left out of the canonical JSON).
    public var migration: Migration? = nil
    /// Simulated apps sync through the sync runtime's decisions (`CloudSyncSchedule`) instead of the simulator's own
    /// request loop (`nil`, the default, left out of the canonical JSON: the simulator's loop). See `SimulatedRuntime.swift`.
    public var runtime: Runtime? = nil

    /// The store called `name`.
    public func store(named name: String) -> Store? { stores.first { $0.name == name } }

    /// The entities of local-only stores (local, or app-group without sync): their renamed attributes
    /// (``SimulationSchema/Attribute/renamedFrom``) are renamed in the store; every other entity's keep their cloud name.
    public var localEntities: Set<String> { Set(stores.filter { !$0.isSynced }.flatMap(\.entities)) }

    /// The Replica schema the app of schema `version` (the newest when `nil`) declares to the library: renamed
    /// attributes of local-only stores under that version's name (with their original name once renamed), those of
    /// synced stores under their cloud name.
    public func librarySchema(version: Int? = nil) -> Schema { schema.schema(version: version, localEntities: localEntities) }

    /// Canonical JSON (sorted keys): what the scenario hash covers and what traces embed.
    public var canonicalJSON: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }

    /// A stable hash of the canonical JSON (16 hex digits, FNV-1a 64).
    public var hash: String { SimulationHash.fnv1a64Hex(Array(canonicalJSON.utf8)) }
}

// MARK: - Errors

/// A scenario file that cannot be used: names the file, the field and the problem.
public struct ScenarioError: Error, CustomStringConvertible, Sendable, Equatable {
    public var file: String
    /// A path such as `devices[1].stores[0]`, or `(file)` for the file as a whole.
    public var field: String
    public var problem: String

    public init(file: String, field: String, problem: String) {
        self.file = file
        self.field = field
        self.problem = problem
    }

    public var description: String { "\(file): field '\(field)': \(problem)" }
}

// MARK: - Canonical JSON of workloads and faults

/// A JSON object key named at run time.
struct ScenarioJSONKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(_ string: String) { stringValue = string }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

extension Scenario.Workload: Codable {
    /// Decodes the canonical form: every field a trace always held is required; the later weights default to 0.
    public init(from decoder: any Decoder) throws {
        self.init()
        let container = try decoder.container(keyedBy: ScenarioJSONKey.self)
        for (key, path) in Self.weightFields + Self.otherFields {
            if Self.alwaysEncoded.contains(key) {
                self[keyPath: path] = try container.decode(Int.self, forKey: ScenarioJSONKey(key))
            } else if let value = try container.decodeIfPresent(Int.self, forKey: ScenarioJSONKey(key)) {
                self[keyPath: path] = value
            }
        }
    }

    /// Encodes every field, except the later weights while they are 0 (see ``Scenario/Workload``).
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: ScenarioJSONKey.self)
        for (key, path) in Self.weightFields + Self.otherFields where Self.alwaysEncoded.contains(key) || self[keyPath: path] != 0 {
            try container.encode(self[keyPath: path], forKey: ScenarioJSONKey(key))
        }
    }
}

extension Scenario.Faults: Codable {
    /// Decodes the canonical form: every field a trace always held is required; the later rates default to 0.
    public init(from decoder: any Decoder) throws {
        self.init()
        let container = try decoder.container(keyedBy: ScenarioJSONKey.self)
        for (key, path) in Self.rateFields {
            if Self.optionalRates.contains(key) {
                if let value = try container.decodeIfPresent(Double.self, forKey: ScenarioJSONKey(key)) { self[keyPath: path] = value }
            } else {
                self[keyPath: path] = try container.decode(Double.self, forKey: ScenarioJSONKey(key))
            }
        }
        for (key, path) in Self.clockFields { self[keyPath: path] = try container.decode(Int.self, forKey: ScenarioJSONKey(key)) }
    }

    /// Encodes every field, except the later rates while they are 0 (see ``Scenario/Faults``).
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: ScenarioJSONKey.self)
        for (key, path) in Self.rateFields where !Self.optionalRates.contains(key) || self[keyPath: path] != 0 {
            try container.encode(self[keyPath: path], forKey: ScenarioJSONKey(key))
        }
        for (key, path) in Self.clockFields { try container.encode(self[keyPath: path], forKey: ScenarioJSONKey(key)) }
    }
}

// MARK: - Hashing

/// Stable hashes (never `hashValue`, which is randomised per process).
public enum SimulationHash {
    /// 64-bit FNV-1a.
    public static func fnv1a64(_ bytes: some Sequence<UInt8>, seed: UInt64 = 0xCBF2_9CE4_8422_2325) -> UInt64 {
        var hash = seed
        for byte in bytes {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01B3
        }
        return hash
    }

    /// 64-bit FNV-1a as 16 lowercase hex digits.
    public static func fnv1a64Hex(_ bytes: some Sequence<UInt8>) -> String { hex(fnv1a64(bytes)) }

    /// `value` as 16 lowercase hex digits.
    public static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
