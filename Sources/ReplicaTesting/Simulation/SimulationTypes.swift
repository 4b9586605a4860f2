// Public results of simulations, and the simulated world's parts: devices, processes, engines, messages, events.

import Foundation
import Replica
import Synchronization

/// The invariants a simulation checks, in the order they are checked. A run stops at the first one that fails.
public enum Invariant: String, CaseIterable, Sendable, Codable {
    /// The library threw an error a correct system never throws (a SQLite error, a partial save, a blocked schema…).
    case unexpectedError = "no-unexpected-errors"
    /// Every workload save leaves what the local API promises (checked after each save, see LocalSaves.swift): the
    /// rows (changes applied in registration order; an update writes only the fields the app changed relative to the
    /// copy it read), one history transaction listing each record's changes in order, and in a synced store each
    /// touched record's causal length (delete and re-insert in one save: +2, odd), outbox flag and stamps.
    case localSaves = "local-saves"
    /// A store's clock never goes back (each acknowledged write's stamp follows the store's earlier ones, whatever its
    /// bookkeeping or the cloud held), and no remote record drags it more than a day ahead of the latest wall clock any
    /// device has had (checked at each acknowledged write).
    case clockBounds = "clock-bounds"
    /// Bookkeeping the simulator corrupted is never read as a default: while the garbage is in place the store's status
    /// is not up to date, and a corrupted record is never uploaded without fields its ledger held before.
    case unreadableBookkeeping = "unreadable-bookkeeping"
    /// App versions whose schemas disagree on what the cloud holds for an attribute (cloud encryption, external
    /// storage) never both sync one zone: the schema gate refuses one (checked at the end, when the scenario's schema
    /// changes an attribute's options across versions).
    case schemaGate = "schema-gate"
    /// Every store file passes `PRAGMA integrity_check`, and each synced store's ledger agrees with its rows (alive
    /// in the ledger exactly when a row exists), after crashes and restarts.
    case crashConsistency = "crash-consistency"
    /// After heal, every store converges (nothing left to send or read) within a bounded virtual time.
    case liveness
    /// No record is alive at a causal length that no acknowledged insert produced (a deleted record only comes back
    /// through an explicit re-insert).
    case noResurrection = "no-resurrection"
    /// Every device holds exactly what the cloud holds: the same records, alive or deleted, with the same values and
    /// stamps (restricted to what each device's schema knows; unknown fields and record types kept unchanged).
    case convergence
    /// No acknowledged write is lost: every cloud save contains everything the version it replaces contained; a write
    /// made after its device saw another write orders after it; the final state contains every acknowledged write.
    case noLostWrites = "no-lost-writes"
    /// The final state equals the reference model: the join of the acknowledged writes (highest causal length; per
    /// attribute, the acknowledged write with the highest stamp in that incarnation, else the default). Local stores
    /// equal the replay of their acknowledged operations.
    case referenceModel = "reference-model"
    /// Every reference with a delete rule points at a live record of the same store; nothing waits for a parent.
    case referentialIntegrity = "referential-integrity"
    /// Unique keys are resolved identically on every device (and, once deduplication exists and the scenario expects
    /// it, at most one live record per key); local stores never hold a duplicate.
    case uniqueKeys = "unique-keys"
    /// Each store's history is monotonic and gap-free (tokens 1, 2, 3, … and never going back), and replaying its
    /// inserts and deletes gives exactly the records the store holds.
    case history
    /// Nothing written to a local-only store ever reaches the cloud.
    case localOnly = "local-only-stays-local"
    /// No plaintext of an attribute marked for cloud encryption is anywhere in the cloud (checked when the scenario
    /// expects a configured cipher).
    case noPlaintext = "no-plaintext-in-cloud"
    /// Reading the whole zone again (an expired change token) changes nothing: no upload, no row, stamp or history.
    case idempotence
    /// Every local write that lost to a merge before the cloud held it is in its store's conflict log (R16): an
    /// acknowledged attribute write that no cloud version ever carried, that its own device did not replace or delete
    /// later, is gone from the converged state, so a remote write, delete or cascade discarded it, and the device's log
    /// must name the record with the write's stamp (or the record's loss as a duplicate). Only this direction is
    /// checked; that nothing else is logged is the conflict log property test's (ConflictLogTests).
    case conflictLog = "conflict-log"
    /// Every process's live queries (one per entity of each store, observed from the process's start) equal a fresh
    /// fetch at every quiescent point (see `ObserverAgreement.swift`). Checked as the run settles, not in the check
    /// phase.
    case observersAgree = "observers-agree"
    /// A store that erased its synced data because its zone was deleted (policy `ZoneDeletionResponse/eraseLocalData`)
    /// holds nothing of the zone right after: every entity and many-to-many link table, the ledger, unknown, rejected,
    /// held and waiting records, upload marks and ended redirects are empty, the change token and resync marks gone
    /// (checked at each erase, through a connection of the simulator's own).
    case zoneDeletionErase = "zone-deletion-erase"
    /// Every acknowledged row of a local store is transformed by each custom migration stage exactly once (not zero
    /// times, not twice) and none is lost, whichever process of the new build opened the store first and how (checked
    /// after every open through the scenario's migration plan, see MigrationPlans.swift).
    case migratedOnce = "migrated-once"
    /// A bounded `syncNow(timeoutMilliseconds:)` of a simulated runtime returns within its bound in true time: no
    /// request is sent for it, or while it waits for a pass under way, after the bound (the request in flight at the
    /// bound may finish); and it tries at once — unless a delay the server asked for or another process's upload lease
    /// is waited out, its pass starts with a request, not with the engine's own backoff (P7; scenarios with a runtime,
    /// checked as the run goes).
    case syncNowBound = "sync-now-bound"
    /// The state a simulated runtime reports is true: never idle or syncing while its engine backs off with no request
    /// in flight, never idle after a pass that left records to send; and once `stop()` was called it sends nothing but
    /// the request it had in flight (P7; scenarios with a runtime, checked as the run goes).
    case runtimeState = "runtime-state"

    /// The invariants the check phase evaluates over the quiesced world (the others are checked as the run goes:
    /// after each save, each upload, at each quiescent point): the count the trace's `checked` line reports.
    public static var checkedAtEnd: [Invariant] {
        allCases.filter {
            $0 != .localSaves && $0 != .clockBounds && $0 != .unreadableBookkeeping && $0 != .schemaGate && $0 != .observersAgree
                && $0 != .zoneDeletionErase && $0 != .migratedOnce && $0 != .syncNowBound && $0 != .runtimeState
        }
    }

    /// One line describing the invariant.
    public var summary: String {
        switch self {
        case .unexpectedError: return "the library never throws an unexpected error"
        case .localSaves: return "local saves agree with the reference model"
        case .clockBounds: return "a store's clock never goes back or far ahead"
        case .unreadableBookkeeping: return "unreadable bookkeeping is never up to date or uploaded short"
        case .schemaGate: return "app versions that disagree on what the cloud holds never both sync"
        case .crashConsistency: return "integrity_check passes; ledger agrees with rows after crashes"
        case .liveness: return "converged within the liveness bound after heal"
        case .noResurrection: return "deleted records come back only through a re-insert"
        case .convergence: return "every device equals the cloud"
        case .noLostWrites: return "no acknowledged write is lost; causally later writes win"
        case .referenceModel: return "final state equals the join of acknowledged writes"
        case .referentialIntegrity: return "references point at live records; nothing waits for a parent"
        case .uniqueKeys: return "unique keys resolved identically everywhere"
        case .history: return "history monotonic, gap-free, and explains the rows"
        case .localOnly: return "local-only data never leaves its device"
        case .noPlaintext: return "no plaintext of encrypted fields in the cloud"
        case .idempotence: return "a full re-read changes nothing"
        case .conflictLog: return "every local write a merge discarded unsynced is in the conflict log"
        case .observersAgree: return "live queries equal a fresh fetch at every quiescent point"
        case .zoneDeletionErase: return "nothing of a deleted zone is left in a store that erased it"
        case .migratedOnce: return "each migration stage transforms every acknowledged row exactly once"
        case .syncNowBound: return "a bounded syncNow returns within its bound and tries at once"
        case .runtimeState: return "the runtime's state is true; a stopped runtime sends nothing"
        }
    }
}

/// A failed invariant, with a message that never contains values of encrypted attributes.
public struct InvariantViolation: Error, CustomStringConvertible, Sendable, Hashable {
    public var invariant: Invariant
    public var message: String

    public init(_ invariant: Invariant, _ message: String) {
        self.invariant = invariant
        self.message = message
    }

    public var description: String { "\(invariant.rawValue): \(message)" }
}

/// Options of one simulation run.
public struct SimulationOptions: Sendable, Hashable {
    /// Deliberate bugs to switch on in every device (see `Canary`).
    public var canaries: Set<Canary> = []
    /// Overrides the scenario's number of chaos steps.
    public var steps: Int?
    /// Records the NDJSON trace (otherwise only the verdict is computed: faster).
    public var recordsTrace = true

    public init(canaries: Set<Canary> = [], steps: Int? = nil, recordsTrace: Bool = true) {
        self.canaries = canaries
        self.steps = steps
        self.recordsTrace = recordsTrace
    }

    /// Canary names, sorted.
    var canaryNames: [String] { canaries.map(\.rawValue).sorted() }
}

/// Counters of one run.
public struct SimulationStats: Sendable, Hashable {
    /// Workload operations executed on devices (each one local save attempt).
    public var workloadOperations = 0
    /// Workload saves that committed.
    public var acknowledgedSaves = 0
    /// Workload saves refused by validation (e.g. a unique key already present on the device).
    public var rejectedSaves = 0
    /// Requests the devices' sync engines emitted.
    public var syncRequests = 0
    /// Responses (and abandoned requests) the devices' sync engines handled.
    public var syncResponses = 0
    /// Records the devices built from their stores for uploads.
    public var recordsUploaded = 0
    /// Records the devices merged into their stores (fetched, or returned by a save conflict).
    public var recordsMerged = 0
    /// Requests the cloud performed.
    public var cloudRequests = 0
    /// Records the cloud saved.
    public var cloudSaves = 0
    public var crashes = 0
    public var faults = 0
    /// Stores that erased their synced data because their zone was deleted (fault `zoneDelete`, policy erase).
    public var erasedStores = 0
    /// Virtual time the run covered, in milliseconds.
    public var virtualMilliseconds: Int64 = 0
    /// Checks skipped because the scenario does not expect the feature they need (e.g. a configured cipher).
    public var skippedChecks: [String] = []

    /// Device operations: record-level work a device does on its store — a workload operation, a record built for an
    /// upload, or a record merged from the cloud.
    public var deviceOperations: Int { workloadOperations + recordsUploaded + recordsMerged }
}

/// The outcome of one run.
public struct SimulationResult: Sendable {
    public var scenario: String
    public var seed: UInt64?
    /// Every choice the run drew; replaying it reproduces the run.
    public var tape: ChoiceTape
    /// Chaos steps executed.
    public var steps: Int
    /// The first failed invariant, or `nil` when every invariant held.
    public var violation: InvariantViolation?
    /// The NDJSON trace (empty when not recorded).
    public var trace: [String]
    public var stats: SimulationStats
    /// One line per chaos step (the witness of a failure).
    public var witness: [String]

    /// `"pass"` or `"fail"`.
    public var verdict: String { violation == nil ? "pass" : "fail" }
    /// BLAKE2b-256 of the trace bytes (nil when no trace was recorded).
    public var traceDigest: String? { trace.isEmpty ? nil : TraceFormat.digest(trace) }
    /// The trace as file contents.
    public var traceText: String { trace.map { $0 + "\n" }.joined() }
}

// MARK: - World

/// A crash the simulator injected through the environment's fault hook.
struct SimulatedCrash: Error {
    let point: String
}

/// Where a process will crash next (armed by a chaos step, fired by the fault hook).
final class FaultSwitch: Sendable {
    enum Armed: Int { case none, commit, importBatch }
    private let armed = Mutex(Armed.none)

    func arm(_ point: Armed) { armed.withLock { $0 = point } }
    func disarm() { armed.withLock { $0 = .none } }

    /// Throws ``SimulatedCrash`` when armed for `point` (once).
    func fire(_ point: FaultPoint) throws {
        let fired = armed.withLock { armed -> String? in
            switch (armed, point) {
            case (.commit, .beforeCommit):
                armed = .none
                return "before commit"
            case (.importBatch, .beforeImport):
                armed = .none
                return "before import"
            default:
                return nil
            }
        }
        if let fired { throw SimulatedCrash(point: fired) }
    }
}

final class SimDevice {
    let index: Int
    let spec: Scenario.Device
    let clock: ManualClock
    /// Device clock minus true (virtual) time.
    var offset: Int64
    var offlineUntil: Int64 = -1
    var partitionedUntil: Int64 = -1
    var processes: [SimProcess] = []
    /// The schema of the device's app version, with its per-entity facts (replaced by an app update during the run).
    var view: SchemaView
    /// The schema version the device's app runs now (``Scenario/Upgrade/fromVersion`` until its update).
    var schemaVersion: Int
    let directory: URL

    init(index: Int, spec: Scenario.Device, offset: Int64, schema: Schema, directory: URL) {
        self.index = index
        self.spec = spec
        self.offset = offset
        self.clock = ManualClock(milliseconds: SimulationRun.epoch + offset)
        self.view = SchemaView(schema)
        self.schemaVersion = spec.upgrade?.fromVersion ?? spec.schemaVersion
        self.directory = directory
    }

    /// The Replica schema of the device's app version.
    var schema: Schema { view.schema }

    /// The cached facts about `entity` (an entity of the device's schema).
    func info(_ entity: Schema.Entity) -> SimEntity { view.info(entity) }

    /// The entities of `store` in the device's schema, in the store's order.
    func entities(of store: Scenario.Store) -> [Schema.Entity] { view.entities(of: store) }

    var name: String { spec.name }
    func isOffline(_ now: Int64) -> Bool { now < offlineUntil }
    func isPartitioned(_ now: Int64) -> Bool { now < partitionedUntil }
}

/// One app version's schema, with what the simulator derives from it made on first use: a device's (its app's), or
/// an app-group extension's that runs another version.
final class SchemaView {
    let schema: Schema
    /// Per-entity facts, made on first use (see ``SimEntity``).
    private var entityCache: [String: SimEntity] = [:]
    /// The entities of each store (by store name), made on first use.
    private var storeEntityCache: [String: [Schema.Entity]] = [:]

    init(_ schema: Schema) { self.schema = schema }

    /// The cached facts about `entity` (an entity of this schema).
    func info(_ entity: Schema.Entity) -> SimEntity {
        if let cached = entityCache[entity.name] { return cached }
        let made = SimEntity(entity, in: schema.entities)
        entityCache[entity.name] = made
        return made
    }

    /// The entities of `store` in this schema, in the store's order.
    func entities(of store: Scenario.Store) -> [Schema.Entity] {
        if let cached = storeEntityCache[store.name] { return cached }
        let made = store.entities.compactMap { schema.entity(named: $0) }
        storeEntityCache[store.name] = made
        return made
    }
}

/// What the simulator derives from one entity of a device's schema, computed once instead of on every use: the field
/// names (a computed property of `Schema.Entity`), the attribute of each field, the default a field takes when a
/// record has no write of it, and the dynamic accessor (looking it up builds the shape's key text).
final class SimEntity {
    let entity: Schema.Entity
    let fieldNames: [String]
    /// The attribute at each field position (nil for a to-one relationship).
    let attributes: [Schema.Attribute?]
    /// Each field's declared default, or null.
    let defaults: [SQLiteValue]
    let access: any DynamicEntityAccess

    init(_ entity: Schema.Entity, in entities: [Schema.Entity] = []) {
        self.entity = entity
        let names = entity.fieldNames
        fieldNames = names
        attributes = names.map { entity.attribute(named: $0) }
        defaults = attributes.map { $0?.defaultValue ?? .null }
        access = EntityShapeRegistry.shared.accessor(for: entity, in: entities)
    }
}

final class SimProcess {
    unowned let device: SimDevice
    let index: Int
    /// The stores this process opens (the app: every store of the device; the extension: the app-group stores).
    let stores: [Scenario.Store]
    /// The schema of the app version this process runs (the device's, unless its extension runs another; replaced by
    /// an app update during the run).
    var view: SchemaView
    var environment: ReplicaEnvironment
    let faults: FaultSwitch
    var container: ModelContainer?
    var context: ModelContext?
    /// The current engine of each synced store (by store name).
    var engines: [String: SimEngine] = [:]
    var isUp = false
    /// The file of each file-backed store this process opened (for the corruption faults).
    var storeURLs: [String: URL] = [:]
    /// Restart delay drawn when an armed crash was set up.
    var pendingRestartDelay: Int64 = 1
    /// The (store, entity) pairs each workload operation can apply to here, by operation (made on first use: the
    /// process's stores and its device's schema never change).
    var workloadTargets: [[(Scenario.Store, Schema.Entity)]?] = Array(repeating: nil, count: WorkloadOperation.allCases.count)
    /// A context that only reads, for the local-save checks (made on first use; gone with the container or a crash).
    var observer: ModelContext?
    /// A copy of a record kept to be saved at a later step (the stale-copy operation); gone with the context.
    var keptCopy: KeptCopy?
    /// The undo and redo stacks of the context's undo manager as the simulator models them (WorkloadUndo.swift): per
    /// group, the records it moves, or `nil` for a group the model does not follow. Gone with the context.
    var undoStack: [[UndoRecord]?] = []
    var redoStack: [[UndoRecord]?] = []
    /// Synced stores this process opens local-only for now (the reopen operation).
    var syncOff = Set<String>()
    /// Stores without encrypted attributes whose engines this process gives the field key anyway (the reopen operation).
    var encryptionOn = Set<String>()
    /// Writes to stores while their sync was off, by store and record, and the records in first-write order.
    var offSyncWrites: [String: [UUID: OffSyncWrite]] = [:]
    var offSyncOrder: [String: [UUID]] = [:]
    /// The next open is without the migration plan (scenarios with one; see MigrationPlans.swift).
    var noPlanOpen: NoPlanOpen?
    /// The container is open without the plan.
    var openedWithoutPlan: NoPlanOpen?

    init(device: SimDevice, index: Int, stores: [Scenario.Store], view: SchemaView, environment: ReplicaEnvironment, faults: FaultSwitch) {
        self.device = device
        self.index = index
        self.stores = stores
        self.view = view
        self.environment = environment
        self.faults = faults
    }

    var label: String { index == 0 ? "\(device.name)/app" : "\(device.name)/ext" }
}

final class SimEngine {
    let serial: Int
    let store: String
    let engine: SyncEngine
    unowned let process: SimProcess
    var queued = false
    var wakeAt: Int64?
    var pushPending = false
    /// The engine threw a typed error about bookkeeping the simulator corrupted: it is not pumped again.
    var isBroken = false
    /// The request this engine waits for, as far as the simulator knows.
    var outstanding: UInt64?
    /// Recent fetch results, replayed as stale answers.
    var recentFetches: [ZoneChangeBatch] = []
    /// What the engine's zone deletion policy decided (see ZoneDeletionFaults.swift).
    let decisions: ZoneDeletionDecisions
    /// The sync runtime that drives the engine (scenarios with a runtime; see SimulatedRuntime.swift).
    var runtime: SimRuntime?

    init(serial: Int, store: String, engine: SyncEngine, process: SimProcess, decisions: ZoneDeletionDecisions) {
        self.serial = serial
        self.store = store
        self.engine = engine
        self.process = process
        self.decisions = decisions
    }
}

/// What happens to one request on its way.
enum MessageFate: Int, CaseIterable {
    case normal, dropRequest, dropResponse, duplicateRequest, duplicateResponse, delay, staleFetch

    var name: String {
        switch self {
        case .normal: return "normal"
        case .dropRequest: return "drop-request"
        case .dropResponse: return "drop-response"
        case .duplicateRequest: return "duplicate-request"
        case .duplicateResponse: return "duplicate-response"
        case .delay: return "delay"
        case .staleFetch: return "stale-fetch"
        }
    }
}

/// A pre-drawn fate: its kind (0: benign) and a raw parameter (delays, retry-after, indices are taken modulo).
struct FateSlot {
    var kind: Int
    var parameter: Int
}

struct Message {
    let id: Int
    let engine: Int
    let device: Int
    let process: Int
    let store: String
    let request: SyncRequest
    var fate: MessageFate = .normal
    var extraDelay: Int64 = 0
    var staleIndex = 0
    /// How many times the request's zone had been reset when the cloud performed it.
    var zoneResets = 0
}

enum SimEvent {
    case arrive(Message)
    case respond(Message, Result<CloudOperationResult, CloudError>)
    case timeout(Message)
    case wake(Int)
    case push(Int)
    case restart(device: Int, process: Int)
    case online(Int)
    case partitionEnd(Int)
    /// A runtime's wake-up (its engine's serial), armed for virtual time `at` (moot once another is armed).
    case runtimeWake(Int, at: Int64)
    /// A paused runtime is resumed.
    case runtimeResume(Int)
    /// The app starts sync again after stopping its runtime.
    case runtimeStart(Int)
    /// The app cancels the task awaiting a `syncNow` call (the runtime's engine serial, the call's serial).
    case runtimeCancel(Int, call: Int)
}

/// A min-heap of events ordered by (time, insertion order): deterministic. The heap holds only the ordering keys
/// and a slot number; the events (whose payloads carry whole records) stay in their slot, so sifting moves no
/// payload and touches no reference count.
struct EventQueue {
    private var heap: [(time: Int64, seq: Int, slot: Int)] = []
    private var events: [SimEvent?] = []
    /// Slots of `events` free for reuse.
    private var freeSlots: [Int] = []
    private var nextSeq = 0

    /// How many of the queued events are runtime wake-ups (see SimulatedRuntime.swift).
    private(set) var runtimeWakes = 0

    var isEmpty: Bool { heap.isEmpty }
    /// The queued events in time order (for messages).
    var ordered: [(time: Int64, event: SimEvent)] {
        heap.sorted { $0.time != $1.time ? $0.time < $1.time : $0.seq < $1.seq }.map { ($0.time, events[$0.slot]!) }
    }
    var count: Int { heap.count }
    var nextTime: Int64? { heap.first?.time }
    var peek: (time: Int64, event: SimEvent)? { heap.first.map { ($0.time, events[$0.slot]!) } }

    private func less(_ a: Int, _ b: Int) -> Bool {
        heap[a].time != heap[b].time ? heap[a].time < heap[b].time : heap[a].seq < heap[b].seq
    }

    mutating func push(_ time: Int64, _ event: SimEvent) {
        let slot: Int
        if let free = freeSlots.popLast() {
            slot = free
            events[slot] = event
        } else {
            slot = events.count
            events.append(event)
        }
        if case .runtimeWake = event { runtimeWakes += 1 }
        heap.append((time, nextSeq, slot))
        nextSeq += 1
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard less(child, parent) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    mutating func pop() -> (time: Int64, event: SimEvent)? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let top = heap.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < heap.count && less(left, smallest) { smallest = left }
            if right < heap.count && less(right, smallest) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
        let event = events[top.slot].take()!
        freeSlots.append(top.slot)
        if case .runtimeWake = event { runtimeWakes -= 1 }
        return (top.time, event)
    }
}
