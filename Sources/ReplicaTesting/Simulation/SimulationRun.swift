// One simulation run: set-up, then chaos -> heal -> quiesce -> check, on a single thread in virtual time.
//
// Devices, their processes and stores are real Replica containers, contexts and sync engines; the cloud is an
// `InMemoryCloudDatabase`; everything between them — the network, pushes, cloud errors, crashes, clocks — is
// simulated here, and every decision is drawn from the choice tape (see `Dice`).

import CSQLite
import Foundation
@_spi(Simulation) import Replica
import Synchronization

/// Gives every run's in-memory stores names of their own (they are process-wide in SQLite's memdb VFS), so runs in
/// parallel never share a database. Never reaches any output.
private let runNonces = Atomic<Int>(0)

final class SimulationRun {
    /// True time zero: 2026-01-01T00:00:00Z. Device clocks are this plus virtual time plus their offset.
    static let epoch: Int64 = 1_767_225_600_000

    enum Phase: String { case setup, chaos, heal, quiesce, check }

    let scenario: Scenario
    let options: SimulationOptions
    let dice: Dice
    let trace: TraceRecorder
    let reference = ReferenceModel()
    let cloud = InMemoryCloudDatabase()
    /// The cloud's current records as the simulator last saw them saved, per zone.
    var mirror: [String: [UUID: CloudRecord]] = [:]
    /// Zone resets so far, per zone.
    var zoneResets: [String: Int] = [:]
    var now: Int64 = 0
    var queue = EventQueue()
    var devices: [SimDevice] = []
    var engines: [Int: SimEngine] = [:]
    var nextEngineSerial = 1
    var nextMessageID = 1
    /// The last workload syncNow call's number (scenarios with a runtime).
    var nextCallSerial = 0
    var pumpQueue: [SimEngine] = []
    /// Crashed processes' engines, contexts (of file stores) and containers: kept alive (a crash releases nothing,
    /// e.g. the upload lease) until the run ends.
    var graveyard: [AnyObject] = []
    /// The integrity checker of each store file checked so far, by path (closed at the end of the run).
    var integrityCheckers: [String: IntegrityChecker] = [:]
    var phase = Phase.setup
    var step = 0
    var stepLimit: Int
    var witness: [String] = []
    var stats = SimulationStats()
    /// Record IDs created by the workload, per pool (synced: per store and entity; local: per device too).
    var pools: [String: [UUID]] = [:]
    var aliases: [UUID: String] = [:]
    var valueSerial = 0
    let nonce: Int
    let root: URL
    var rootCreated = false
    /// Synced store names (zones) that some device opens, in scenario order.
    let zones: [String]
    /// Synced stores with attributes marked for cloud encryption (in the newest schema): their engines get the world's
    /// field key (older devices too, so they can open and re-seal the fields they do not know).
    let encryptedStores: Set<String>
    /// Encrypted attribute names per record type (newest schema), for the no-plaintext check of every cloud save.
    let encryptedAttributes: [String: Set<String>]
    /// The raw field-encryption key every device of every world shares: 32 bytes from a seeded random source, so runs
    /// stay a function of the scenario and the tape.
    static let worldKey: [UInt8] = {
        let random = SeededRandomSource(seed: 0x5EED_C1F3_0000_0007)
        var key = [UInt8](repeating: 0, count: 32)
        key.withUnsafeMutableBytes { random.fill($0) }
        return key
    }()
    /// Last history token seen per (device, store), for the monotonicity check.
    var lastHistoryToken: [String: Int64] = [:]
    /// Each process's live queries, for the observers-agree check (`ObserverAgreement.swift`).
    var observers = ProcessObservers()
    /// Bookkeeping the simulator corrupted (see BookkeepingFaults.swift), in order.
    var corruptions: [Corruption] = []
    /// Hostile records injected into each zone.
    var hostileIDs: [String: Set<UUID>] = [:]
    var nextHostileSerial = 0
    /// Whether some attribute gains an option in a later schema version (then the schema gate must keep app versions
    /// that disagree from syncing together, and an engine it blocks may stay behind).
    let hasOptionChanges: Bool
    /// Whether every workload save is checked against the local reference model (scenarios that use the later
    /// operations); otherwise only the saves of those operations are.
    let checksEverySave: Bool
    /// Whether each process's context has an undo manager (scenarios with the undo or redo operation).
    let usesUndo: Bool
    /// The records each zone's end checks leave out (computed by the check phase).
    var exemptFromChecks: [String: Set<UUID>] = [:]
    /// Device stores ("device/store") whose engine refused to go on after a corruption (a typed error).
    var brokenStores = Set<String>()
    /// The last stamp each device store gave an acknowledged write, and the latest wall clock any device has had.
    var lastLocalStamp: [String: FieldStamp] = [:]
    var latestWallSeen: Int64 = 0
    /// Positions of the "another step?" choices (for truncation while shrinking).
    var stepFlagPositions: [Int] = []
    /// Fates for the next messages and cloud requests: each chaos step draws a fixed block of them for the window
    /// until the next step, so deleting a step while shrinking shifts only its neighbour's fates, not every later one.
    var messageSlots: [FateSlot] = []
    var cloudSlots: [FateSlot] = []
    static let slotsPerStep = 6
    /// The scenario's fate and workload weights, converted once (drawn from at every step).
    let messageWeights: [UInt64]
    let cloudWeights: [UInt64]
    let workloadWeights: [UInt64]

    init(scenario: Scenario, options: SimulationOptions, dice: Dice) {
        self.scenario = scenario
        self.options = options
        self.dice = dice
        self.trace = TraceRecorder(enabled: options.recordsTrace)
        self.stepLimit = options.steps ?? scenario.steps
        self.nonce = runNonces.wrappingAdd(1, ordering: .relaxed).newValue
        self.root = FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-sim-\(ProcessInfo.processInfo.processIdentifier)-\(nonce)", isDirectory: true)
        self.zones = scenario.stores.filter { store in
            store.isSynced && scenario.devices.contains { $0.stores.contains(store.name) }
        }.map(\.name)
        let newest = scenario.schema.schema()
        var encrypted: [String: Set<String>] = [:]
        for entity in newest.entities {
            // (An attribute encrypted only from a later version on is the schema gate's: invariant schema-gate.)
            // (Through the name the library knows: a synced attribute's cloud name, also when the app renamed it.)
            let laterOn = Set(scenario.schema.entity(named: entity.name)?.attributes.filter { $0.optionsSince?["allowsCloudEncryption"] != nil }
                .map { $0.storedName(version: scenario.schema.version, locallyRenamed: false).name } ?? [])
            let names = entity.attributes.filter { $0.options.contains(.allowsCloudEncryption) && !laterOn.contains($0.name) }.map(\.name)
            if !names.isEmpty { encrypted[entity.name] = Set(names) }
        }
        self.encryptedAttributes = encrypted
        self.hasOptionChanges = scenario.schema.entities.contains { $0.attributes.contains { !($0.optionsSince ?? [:]).isEmpty } }
        let workload = scenario.workload
        self.checksEverySave = workload.deleteReinsert + workload.copies + workload.staleCopy + workload.batchDelete + workload.reopen > 0
        self.usesUndo = workload.undo + workload.redo > 0
        self.messageWeights = weights(scenario.faults.messageRates)
        self.cloudWeights = weights(scenario.faults.cloudRates)
        self.workloadWeights = scenario.workload.weights.map { UInt64($0) }
        self.encryptedStores = Set(scenario.stores.filter { store in store.isSynced && store.entities.contains { encrypted[$0] != nil } }.map(\.name))
    }

    deinit {
        if rootCreated { try? FileManager.default.removeItem(at: root) }
    }

    // MARK: Running

    /// Runs every phase. Returns the first violated invariant, or nil.
    /// - Throws: ``ChoiceOverrun`` when the run draws more choices than allowed (the case is discarded).
    func execute() throws -> InvariantViolation? {
        defer { teardown() }
        do {
            try setUp()
            try chaos()
            try heal()
            try quiesce()
            try check()
            return nil
        } catch let violation as InvariantViolation {
            return violation
        } catch is ChoiceOverrun {
            throw ChoiceOverrun(limit: dice.source.maxChoices)
        } catch let crash as SimulatedCrash {
            return InvariantViolation(.unexpectedError, "a simulated crash (\(crash.point)) escaped the simulator")
        } catch {
            return InvariantViolation(.unexpectedError, "\(error)")
        }
    }

    private func teardown() {
        stats.virtualMilliseconds = now
        for device in devices {
            for process in device.processes {
                process.context = nil
                process.observer = nil
                process.keptCopy = nil
                process.engines = [:]
                process.container = nil
            }
        }
        pumpQueue = []
        engines = [:]
        graveyard = []
        integrityCheckers = [:]
    }

    func setNow(_ time: Int64) {
        now = time
        for device in devices { device.clock.set(milliseconds: Self.epoch + time + device.offset) }
    }

    // MARK: Set-up

    private func setUp() throws {
        let skewBound = scenario.faults.maxClockSkewMs
        var offsets: [Int64] = []
        try dice.span(.simulationSetup) {
            for _ in scenario.devices { offsets.append(Int64(try dice.signed(skewBound))) }
        }
        for (index, spec) in scenario.devices.enumerated() {
            let device = SimDevice(index: index, spec: spec, offset: offsets[index],
                                   schema: scenario.librarySchema(version: spec.upgrade?.fromVersion ?? spec.schemaVersion),
                                   directory: root.appendingPathComponent("d\(index)", isDirectory: true))
            devices.append(device)
            let stores = spec.stores.compactMap(scenario.store(named:))
            var processStores = [stores]
            let shared = stores.filter { $0.kind == .appGroup }
            if !shared.isEmpty { processStores.append(shared) }
            for (processIndex, owned) in processStores.enumerated() {
                let faults = FaultSwitch()
                let groups = device.directory.appendingPathComponent("groups", isDirectory: true)
                var environment = ReplicaEnvironment(
                    clock: device.clock,
                    random: SeededRandomSource(seed: 0x5EED_0000 &+ UInt64(index) &* 1_000_003 &+ UInt64(processIndex) &* 7_919),
                    processIdentity: ProcessIdentity(
                        bundleIdentifier: processIndex == 0 ? "com.example.sim" : "com.example.sim.extension",
                        processName: processIndex == 0 ? "app" : "extension", processID: Int32(100 + index * 10 + processIndex)),
                    appGroupDirectory: { groups.appendingPathComponent($0, isDirectory: true) },
                    defaultStoreDirectory: device.directory)
                environment.canaries = options.canaries
                environment.faultHook = { point in try faults.fire(point) }
                // An extension of an older (or newer) app version than its app shares the app-group file.
                let view = processIndex > 0 && spec.extensionSchemaVersion.map({ $0 != spec.schemaVersion }) == true
                    ? SchemaView(scenario.librarySchema(version: spec.extensionSchemaVersion!)) : device.view
                device.processes.append(SimProcess(device: device, index: processIndex, stores: owned, view: view,
                                                   environment: environment, faults: faults))
            }
        }
        setNow(0)
        for device in devices {
            trace.event(now, "device") { line in
                line.add("device", device.name)
                line.add("schema_version", device.schemaVersion)
                if let upgrade = device.spec.upgrade {
                    line.add("upgrade_to", device.spec.schemaVersion)
                    line.add("upgrade_at_step", upgrade.atStep)
                }
                line.add("clock_offset_ms", device.offset)
                line.add("stores", device.spec.stores)
                line.add("processes", device.processes.count)
            }
            // A device at the newest version whose stores a process of its build creates first, without the plan:
            // the app's own process with the versioned schema (it runs so until its next restart), or a widget's
            // container with the unversioned schema, which creates the local stores and closes them before the app
            // opens. (A store an unversioned schema created records no version: where a plan's layouts are alike
            // across a custom stage the plan cannot tell whether its code applies, so one holding rows is refused
            // (R3); an empty one is at the latest of those schemas. The widget writes nothing, so the app opens.)
            if let migration = scenario.migration, migration.noPlanOpen > 0, device.spec.upgrade == nil,
               device.schemaVersion == scenario.schema.version, try dice.chance(migration.noPlanOpen) {
                if try dice.below(2) == 0 {
                    device.processes.first?.noPlanOpen = .versioned
                } else {
                    try widgetOpen(device, kind: .unversioned)
                }
            }
            for process in device.processes { try start(process) }
        }
        for device in devices {
            for process in device.processes { for engine in orderedEngines(process) { enqueuePump(engine) } }
        }
        try runPumps()
    }

    /// The configuration name of a store in this run (unique per run, see `runNonces`).
    func configurationName(_ store: String) -> String { "\(store)-r\(nonce)" }

    /// The entities of `store` in `device`'s schema.
    func entities(of store: Scenario.Store, on device: SimDevice) -> [Schema.Entity] {
        device.entities(of: store)
    }

    func usesFile(_ store: Scenario.Store) -> Bool { scenario.storage == .file || store.kind == .appGroup }

    /// Opens a process's container, context and sync engines (at set-up, and on restart from persisted state).
    func start(_ process: SimProcess) throws {
        if process.stores.contains(where: usesFile), !rootCreated {
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            rootCreated = true
        }
        if process.container == nil {
            var configurations: [ModelConfiguration] = []
            var entities: [Schema.Entity] = []
            for store in process.stores {
                let owned = process.view.entities(of: store)
                entities += owned
                let subset = Schema(entities: owned, version: process.view.schema.version)
                let name = configurationName(store.name)
                let cloud: ModelConfiguration.CloudKitDatabase = store.isSynced && !process.syncOff.contains(store.name)
                    ? .private("iCloud.com.example.sim") : .none
                switch store.kind {
                case .local, .synced:
                    configurations.append(ModelConfiguration(name, schema: subset, isStoredInMemoryOnly: !usesFile(store),
                                                             cloudKitDatabase: cloud))
                case .appGroup:
                    configurations.append(ModelConfiguration(name, schema: subset, groupContainer: .identifier("group.com.example.sim"),
                                                             cloudKitDatabase: cloud))
                }
            }
            do {
                process.container = try openContainer(process, entities: entities, configurations: configurations)
            } catch let error as ReplicaError where updateRefused(process, error) {
                // The update was refused (a synced store's in-place stage): the device is back at its old version,
                // whose app opens and syncs as before.
                return try start(process)
            }
        }
        guard let container = process.container else { return }
        let context = ModelContext(container)
        process.context = context
        process.undoStack = []
        process.redoStack = []
        if usesUndo { context.undoManager = ModelUndoManager() }
        for store in process.stores where store.isSynced && !process.syncOff.contains(store.name) {
            let simEngine = try makeEngine(process, store, container: container, context: context)
            engines[simEngine.serial] = simEngine
            process.engines[store.name] = simEngine
        }
        for store in process.stores where usesFile(store) {
            if let url = container.url(of: configurationName(store.name)) { process.storeURLs[store.name] = url }
        }
        process.isUp = true
        try observeStores(of: process)
        if phase != .setup {
            for store in process.stores where usesFile(store) { try checkIntegrity(process, store) }
        }
        if usesPlan { try checkMigratedOnce(process) }
    }

    /// A sync engine of `store` for `process` (with its runtime, in scenarios with one).
    func makeEngine(_ process: SimProcess, _ store: Scenario.Store, container: ModelContainer, context: ModelContext) throws -> SimEngine {
        var options = SyncEngine.Options()
        options.uploadBatchSize = 10
        options.fetchLimit = 10
        let encrypted = encryptedStores.contains(store.name) || process.encryptionOn.contains(store.name)
        let encryption = encrypted ? try FieldEncryption.rawKey(Self.worldKey) : nil
        // One connection per store and process, as one thread drives the context and the engines.
        // The device's zone deletion policy, decided by the library's own function and noted for the checks.
        let decisions = ZoneDeletionDecisions()
        options.zoneDeletionPolicy = decisions.policy(wrapping: process.device.spec.deletionPolicy)
        let engine = try SyncEngine(container: container, storeName: configurationName(store.name), zone: store.name, options: options,
                                    encryption: encryption, sharingConnectionOf: context)
        let simEngine = SimEngine(serial: nextEngineSerial, store: store.name, engine: engine, process: process, decisions: decisions)
        nextEngineSerial += 1
        simEngine.runtime = makeRuntime()
        return simEngine
    }

    func orderedEngines(_ process: SimProcess) -> [SimEngine] {
        process.stores.compactMap { process.engines[$0.name] }
    }

    /// Every current engine, in device, process and store order.
    var currentEngines: [SimEngine] {
        devices.flatMap { device in device.processes.flatMap { $0.isUp ? orderedEngines($0) : [] } }
    }

    // MARK: Chaos

    private func chaos() throws {
        phase = .chaos
        trace.event(now, "phase") { $0.add("phase", "chaos") }
        // (The runtime's calls come after the faults, in scenarios with a runtime only: the others draw as before.)
        let stepRates = scenario.faults.stepRates + (scenario.runtime?.stepRates ?? [])
        let actionWeights = weights(stepRates)
        try dice.span(.collection) {
            while step < stepLimit {
                let stop = try dice.span(.step) { () throws -> Bool in
                    stepFlagPositions.append(dice.position)
                    guard try dice.chance(1.0) else { return true }
                    // Bursty: a third of the pauses are under 100 ms.
                    let pause = Int64(try dice.skewed(scenario.timing.thinkTimeMs, small: 100, probability: 0.33))
                    try advance(to: now + pause)
                    step += 1
                    try upgradeDevices(atStep: step)
                    let action = try dice.pick(actionWeights)
                    try dice.span(.simulationAction) { try perform(action: action) }
                    try runPumps()
                    try drawFateSlots()
                    return false
                }
                if stop { break }
                if step % scenario.timing.digestEvery == 0 { try digest() }
            }
        }
    }

    /// Draws the fates of the messages and cloud requests of the next window (benign fates draw no parameter).
    private func drawFateSlots() throws {
        try dice.span(.simulationFate) {
            messageSlots = try (0..<Self.slotsPerStep).map { _ in
                let kind = try dice.pick(messageWeights)
                return FateSlot(kind: kind, parameter: kind == 0 ? 0 : try dice.upTo(1_000_000))
            }
            cloudSlots = try (0..<Self.slotsPerStep).map { _ in
                let kind = try dice.pick(cloudWeights)
                return FateSlot(kind: kind, parameter: kind == 0 ? 0 : try dice.upTo(1_000_000))
            }
        }
    }

    /// Runs every event due up to `target`, then moves the clock there.
    func advance(to target: Int64) throws {
        while let next = queue.nextTime, next <= target {
            let (time, event) = queue.pop()!
            setNow(max(now, time))
            try handle(event)
            try runPumps()
        }
        setNow(max(now, target))
    }

    private func perform(action: Int) throws {
        switch action {
        case 0: try workloadStep()
        case 1: try crashStep()
        case 2: try outageStep(partition: false)
        case 3: try outageStep(partition: true)
        case 4: try clockJumpStep()
        case 5: try cloudStep(reset: false)
        case 6: try cloudStep(reset: true)
        case 7: try corruptStep(.stamps)
        case 8: try corruptStep(.unknown)
        case 9: try corruptStep(.clock)
        case 10: try corruptStep(.causalLength)
        case 11: try hostileRecordStep()
        case 12: try zoneDeleteStep()
        case 13: try syncNowStep()
        case 14: try stopRuntimeStep()
        case 15: try pauseRuntimeStep()
        default: try cancelSyncNowStep()
        }
    }

    func note(_ text: String) {
        witness.append("\(step). \(text)")
    }

    // MARK: Faults as steps

    private func crashStep() throws {
        stats.faults += 1
        let device = devices[try dice.below(devices.count)]
        let process = device.processes[try dice.below(device.processes.count)]
        let when = try dice.pick([2, 1, 1])
        let delay = Int64(1 + (try dice.upTo(scenario.timing.restartMs)))
        let kinds = ["now", "at-next-commit", "at-next-import"]
        note("crash \(process.label) \(kinds[when]) (restart after \(delay) ms)")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "crash")
            line.add("process", process.label)
            line.add("when", kinds[when])
            line.add("restart_after_ms", delay)
        }
        guard process.isUp else { return }
        switch when {
        case 0:
            crash(process, reason: "crashed", restartAfter: delay)
        case 1:
            process.pendingRestartDelay = delay
            process.faults.arm(.commit)
        default:
            process.pendingRestartDelay = delay
            process.faults.arm(.importBatch)
        }
    }

    /// Crashes a process: its engines, contexts (and, for file stores, container) are dropped without any cleanup.
    func crash(_ process: SimProcess, reason: String, restartAfter delay: Int64) {
        guard process.isUp else { return }
        stats.crashes += 1
        process.isUp = false
        process.faults.disarm()
        // Engines of in-memory stores are dropped like their contexts, marked crashed so that they leave the upload
        // lease in place; those of file stores are kept (see below).
        let keepsConnections = process.stores.contains(where: usesFile)
        for engine in orderedEngines(process) {
            if keepsConnections { graveyard.append(engine) } else { engine.engine.simulateCrash() }
            engines[engine.serial] = nil
        }
        process.engines = [:]
        // A context holds nothing a crash could leak (no lease, no open transaction): dropping it only gives its
        // connections back to in-memory stores' pools, as the process's end would close them. A file store's
        // connection is kept open instead (closing the last one would checkpoint the WAL).
        if let context = process.context, keepsConnections { graveyard.append(context) }
        if let observer = process.observer, keepsConnections { graveyard.append(observer) }
        process.context = nil
        process.observer = nil
        process.keptCopy = nil
        if process.stores.allSatisfy(usesFile), let container = process.container {
            // The kernel drops a crashed process's store locks; its connections stay open here (see above).
            container.releaseStoreLocksAsAfterCrash()
            graveyard.append(container)
            process.container = nil
        }
        trace.event(now, "crash") { line in
            line.add("process", process.label)
            line.add("reason", reason)
        }
        queue.push(now + max(1, delay), .restart(device: process.device.index, process: process.index))
    }

    func restart(_ process: SimProcess) throws {
        guard !process.isUp else { return }
        try start(process)
        trace.event(now, "restart") { $0.add("process", process.label) }
        for engine in orderedEngines(process) { enqueuePump(engine) }
    }

    private func outageStep(partition: Bool) throws {
        stats.faults += 1
        let device = devices[try dice.below(devices.count)]
        let duration = Int64(1 + (try dice.upTo(scenario.timing.outageMs)))
        let kind = partition ? "partition" : "offline"
        note("\(kind) \(device.name) for \(duration) ms")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", kind)
            line.add("device", device.name)
            line.add("duration_ms", duration)
        }
        if partition {
            device.partitionedUntil = max(device.partitionedUntil, now + duration)
            queue.push(device.partitionedUntil, .partitionEnd(device.index))
        } else {
            device.offlineUntil = max(device.offlineUntil, now + duration)
            queue.push(device.offlineUntil, .online(device.index))
        }
    }

    private func clockJumpStep() throws {
        stats.faults += 1
        let device = devices[try dice.below(devices.count)]
        let jump = Int64(try dice.signed(scenario.faults.maxClockJumpMs))
        note("clock of \(device.name) jumps \(jump) ms")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "clock-jump")
            line.add("device", device.name)
            line.add("jump_ms", jump)
        }
        latestWallSeen = max(latestWallSeen, latestWallClock())
        device.offset += jump
        if jump < 0, scenario.runtime != nil { noteBackwardClockJump(device) }
        setNow(now)
        latestWallSeen = max(latestWallSeen, latestWallClock())
    }

    private func cloudStep(reset: Bool) throws {
        stats.faults += 1
        guard !zones.isEmpty else { return }
        let zone = zones[try dice.below(zones.count)]
        note("\(reset ? "reset zone" : "expire change tokens of") \(zone)")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", reset ? "reset-zone" : "expire-tokens")
            line.add("zone", zone)
        }
        if reset {
            cloud.resetZone(zone)
            mirror[zone] = [:]
            zoneResets[zone, default: 0] += 1
            schedulePushes(zone: zone, except: nil)
        } else {
            cloud.expireChangeTokens(in: zone)
        }
    }

    // MARK: Heal and quiesce

    private func heal() throws {
        phase = .heal
        dice.isDrawing = false
        messageSlots = []
        cloudSlots = []
        trace.event(now, "phase") { $0.add("phase", "heal") }
        for device in devices {
            device.offlineUntil = -1
            device.partitionedUntil = -1
            for process in device.processes {
                process.faults.disarm()
                if !process.isUp { try restart(process) }
                // Every store syncs again (what was written while sync was off must reach the cloud now).
                if !process.syncOff.isEmpty { try reopen(process, syncOff: [], encryptionOn: process.encryptionOn) }
            }
        }
        // Simulated runtimes get no kick: they find out by themselves (their backoff, the timer, the cloud's
        // announcements) that the network is back.
        if runtimesDrive { return try healRuntimes() }
        for engine in currentEngines {
            engine.engine.setNeedsFetch()
            enqueuePump(engine)
        }
        try runPumps()
    }

    private func quiesce() throws {
        phase = .quiesce
        trace.event(now, "phase") { $0.add("phase", "quiesce") }
        let deadline = now + Int64(scenario.timing.livenessBoundMs)
        if runtimesDrive {
            try settleRuntimes(deadline: deadline)
        } else {
            try settle(deadline: deadline, what: "after heal")
        }
        trace.event(now, "quiet") { $0.add("cloud_saves", stats.cloudSaves) }
        try digest()
    }

    /// Runs until nothing is left to do and a round in which every engine read the zone saved nothing new.
    func settle(deadline: Int64, what: String) throws {
        for _ in 0..<25 {
            try runUntilIdle(deadline: deadline, what: what)
            let saves = stats.cloudSaves
            for engine in currentEngines {
                engine.engine.setNeedsFetch()
                enqueuePump(engine)
            }
            try runPumps()
            try runUntilIdle(deadline: deadline, what: what)
            if stats.cloudSaves == saves {
                for engine in currentEngines where !engine.isBroken {
                    let status = try engine.engine.status()
                    let behind = try !status.isUpToDate && !mayStayBehind(engine, status)
                    guard !behind else {
                        throw InvariantViolation(.liveness, "\(engine.process.label) store '\(engine.store)' is idle but not up to date "
                            + "(pending \(status.pendingRecords), rejected \(status.rejectedRecords), waiting \(status.waitingForParent), "
                            + "needs fetch \(status.needsFetch), last error \(status.lastError.map { "\($0)" } ?? "none")"
                            + (status.blockedBy.map { ", blocked by \($0)" } ?? "") + (status.encryptionError.map { ", encryption error \($0)" } ?? "") + ")")
                    }
                }
                try checkObservers()
                return
            }
        }
        throw InvariantViolation(.liveness, "the devices kept uploading through 25 sync rounds \(what)")
    }

    func runUntilIdle(deadline: Int64, what: String) throws {
        var processed = 0
        // Syncing n records takes a few requests per page and device; far more means the devices go round in circles.
        let records = zones.reduce(0) { $0 + (mirror[$1]?.count ?? 0) }
        let eventLimit = 3_000 + 100 * records
        while let next = queue.nextTime {
            if let (_, event) = queue.peek, isMoot(event) {
                _ = queue.pop()
                continue
            }
            if next > deadline {
                throw InvariantViolation(.liveness, "not converged \(Int64(scenario.timing.livenessBoundMs) / 1000) s (virtual) \(what): "
                    + "\(queue.count) events still pending")
            }
            let (time, event) = queue.pop()!
            setNow(max(now, time))
            try handle(event)
            try runPumps()
            processed += 1
            if processed > eventLimit {
                throw InvariantViolation(.liveness, "\(eventLimit) events (\(stats.syncRequests) requests so far) without settling \(what): "
                    + "the devices go round in circles")
            }
        }
    }

    // MARK: Digests

    /// A state-digest line: the cloud's records and each store's history position and outbox size. Checks that
    /// history tokens never go back (traced or not); the digest itself is computed only when the trace is recorded.
    func digest() throws {
        try checkObservers()
        var cloudBytes: [UInt8] = []
        if trace.isEnabled {
            for zone in zones {
                cloudBytes += Array(zone.utf8)
                for record in (mirror[zone] ?? [:]).values.sorted(by: { uuidPrecedes($0.recordID, $1.recordID) }) {
                    withUnsafeBytes(of: record.recordID.uuid) { cloudBytes += $0 }
                    cloudBytes += Array("\(record.causalLength)|\(record.changeTag ?? "")".utf8)
                }
            }
        }
        var storeBytes: [UInt8] = []
        for device in devices {
            guard let process = device.processes.first, process.isUp, let context = process.context else { continue }
            for store in process.stores {
                let token = try context.currentHistoryToken(of: configurationName(store.name)).value
                let key = "\(device.index)/\(store.name)"
                if let last = lastHistoryToken[key], token < last {
                    throw InvariantViolation(.history, "the history token of \(device.name) store '\(store.name)' went back from \(last) to \(token)")
                }
                lastHistoryToken[key] = token
                guard trace.isEnabled else { continue }
                storeBytes += Array("\(key)=\(token);".utf8)
                if let engine = process.engines[store.name] {
                    storeBytes += Array("p\(try engine.engine.status().pendingRecords);".utf8)
                }
            }
        }
        guard trace.isEnabled else { return }
        let cloudDigest = SimulationHash.fnv1a64Hex(cloudBytes)
        let storeDigest = SimulationHash.fnv1a64Hex(storeBytes)
        trace.event(now, "digest") { line in
            line.add("step", step)
            line.add("cloud", cloudDigest)
            line.add("stores", storeDigest)
        }
    }
}
