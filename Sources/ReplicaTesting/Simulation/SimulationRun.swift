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
    var pumpQueue: [SimEngine] = []
    /// Crashed processes' engines, contexts (of file stores) and containers: kept alive (a crash releases nothing,
    /// e.g. the upload lease) until the run ends.
    var graveyard: [AnyObject] = []
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
            // A device at the newest version whose stores a widget of its build creates first, without the plan. (With
            // the versioned schema only: a store an unversioned schema created records no version, and where a plan's
            // layouts are alike across a custom stage its version is unknown — the library refuses it (R3), which is
            // what it should do, but the app then cannot open it; modelled once the simulator can expect that refusal.)
            if let migration = scenario.migration, migration.noPlanOpen > 0, device.spec.upgrade == nil,
               device.schemaVersion == scenario.schema.version, try dice.chance(migration.noPlanOpen) {
                _ = try dice.below(2)
                device.processes.first?.noPlanOpen = .versioned
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
            process.container = try openContainer(process, entities: entities, configurations: configurations)
        }
        guard let container = process.container else { return }
        let context = ModelContext(container)
        process.context = context
        process.undoStack = []
        process.redoStack = []
        if usesUndo { context.undoManager = ModelUndoManager() }
        var options = SyncEngine.Options()
        options.uploadBatchSize = 10
        options.fetchLimit = 10
        for store in process.stores where store.isSynced && !process.syncOff.contains(store.name) {
            let encrypted = encryptedStores.contains(store.name) || process.encryptionOn.contains(store.name)
            let encryption = encrypted ? try FieldEncryption.rawKey(Self.worldKey) : nil
            // One connection per store and process, as one thread drives the context and the engines.
            // The device's zone deletion policy, decided by the library's own function and noted for the checks.
            let decisions = ZoneDeletionDecisions()
            var storeOptions = options
            storeOptions.zoneDeletionPolicy = decisions.policy(wrapping: process.device.spec.deletionPolicy)
            let engine = try SyncEngine(container: container, storeName: configurationName(store.name), zone: store.name, options: storeOptions,
                                        encryption: encryption, sharingConnectionOf: context)
            let simEngine = SimEngine(serial: nextEngineSerial, store: store.name, engine: engine, process: process, decisions: decisions)
            nextEngineSerial += 1
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
        let stepRates = scenario.faults.stepRates
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
        default: try zoneDeleteStep()
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
        try settle(deadline: deadline, what: "after heal")
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

// MARK: - Network, cloud and events

extension SimulationRun {
    /// Whether an event can no longer do anything (a time-out of a request that was answered, a wake-up of an engine
    /// that crashed…): such events do not keep the world busy.
    func isMoot(_ event: SimEvent) -> Bool {
        switch event {
        case let .timeout(message):
            guard let engine = engines[message.engine] else { return true }
            return !isCurrent(engine) || engine.outstanding != message.request.id
        case let .wake(serial), let .push(serial):
            guard let engine = engines[serial] else { return true }
            return !isCurrent(engine)
        case let .respond(message, _):
            guard let engine = engines[message.engine] else { return true }
            return !isCurrent(engine)
        case let .restart(device, process):
            return devices[device].processes[process].isUp
        case let .online(device):
            return devices[device].offlineUntil < 0
        case let .partitionEnd(device):
            return devices[device].partitionedUntil < 0
        case .arrive:
            return false
        }
    }

    func enqueuePump(_ engine: SimEngine) {
        guard !engine.queued else { return }
        engine.queued = true
        pumpQueue.append(engine)
    }

    func runPumps() throws {
        var index = 0
        while index < pumpQueue.count {
            let engine = pumpQueue[index]
            index += 1
            engine.queued = false
            try pump(engine)
        }
        pumpQueue.removeAll(keepingCapacity: true)
    }

    func isCurrent(_ engine: SimEngine) -> Bool {
        engine.process.isUp && engine.process.engines[engine.store] === engine
    }

    /// Asks an engine for its next request and sends it, or schedules its wake-up.
    func pump(_ engine: SimEngine) throws {
        guard isCurrent(engine), !engine.isBroken, !engine.engine.isAwaitingResponse else { return }
        let request: SyncRequest?
        do {
            request = try engine.engine.nextRequest()
        } catch {
            return try engineFailed(engine, "nextRequest", error)
        }
        if let request {
            try send(request, from: engine)
        } else if let wake = engine.engine.wakeTime {
            let at = now + max(1, wake - engine.process.device.clock.nowMilliseconds())
            if engine.wakeAt.map({ at < $0 }) ?? true {
                engine.wakeAt = at
                queue.push(at, .wake(engine.serial))
            }
        }
    }

    func send(_ request: SyncRequest, from engine: SimEngine) throws {
        let device = engine.process.device
        var message = Message(id: nextMessageID, engine: engine.serial, device: device.index, process: engine.process.index,
                              store: engine.store, request: request)
        nextMessageID += 1
        engine.outstanding = request.id
        stats.syncRequests += 1
        let latency = Int64(scenario.timing.latencyMs)
        if device.isOffline(now) {
            traceSend(message, engine, "offline")
            queue.push(now + 1, .respond(message, .failure(.networkUnavailable)))
            return
        }
        if device.isPartitioned(now) {
            traceSend(message, engine, "partitioned")
            queue.push(now + Int64(scenario.timing.timeoutMs), .timeout(message))
            return
        }
        if !messageSlots.isEmpty {
            let slot = messageSlots.removeFirst()
            let isFetch: Bool = if case .fetchZoneChanges = request.operation { true } else { false }
            message.fate = MessageFate(rawValue: slot.kind) ?? .normal
            switch message.fate {
            case .duplicateRequest, .duplicateResponse, .delay:
                message.extraDelay = Int64(1 + slot.parameter % (scenario.timing.maxDelayMs + 1))
            case .staleFetch:
                if isFetch && !engine.recentFetches.isEmpty {
                    message.staleIndex = slot.parameter % engine.recentFetches.count
                } else {
                    message.fate = .normal
                }
            default: break
            }
        }
        if case let .modifyRecords(records, _) = request.operation { stats.recordsUploaded += records.count }
        traceSend(message, engine, message.fate.name)
        switch message.fate {
        case .dropRequest:
            break
        case .delay:
            queue.push(now + latency + message.extraDelay, .arrive(message))
        case .duplicateRequest:
            queue.push(now + latency, .arrive(message))
            var copy = message
            copy.fate = .normal
            queue.push(now + latency + message.extraDelay, .arrive(copy))
        default:
            queue.push(now + latency, .arrive(message))
        }
        queue.push(now + Int64(scenario.timing.timeoutMs), .timeout(message))
    }

    private func traceSend(_ message: Message, _ engine: SimEngine, _ fate: String) {
        trace.event(now, "send") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("req", message.request.id)
            line.add("op", message.request.operation.name)
            if case let .modifyRecords(records, _) = message.request.operation { line.add("records", records.count) }
            line.add("fate", fate)
        }
    }

    func handle(_ event: SimEvent) throws {
        switch event {
        case let .arrive(message):
            let device = devices[message.device]
            if device.isPartitioned(now) {
                trace.event(now, "lost") { $0.add("req", message.request.id); $0.add("why", "partition") }
                return
            }
            let result = try performAtCloud(message)
            if message.fate == .dropResponse { return }
            var message = message
            if case let .modifyRecords(_, zone) = message.request.operation { message.zoneResets = zoneResets[zone] ?? 0 }
            let latency = Int64(scenario.timing.latencyMs)
            queue.push(now + latency, .respond(message, result))
            if message.fate == .duplicateResponse { queue.push(now + latency + message.extraDelay, .respond(message, result)) }
        case let .respond(message, result):
            try deliver(message, result)
        case let .timeout(message):
            guard let engine = engines[message.engine], isCurrent(engine), engine.outstanding == message.request.id else { return }
            trace.event(now, "timeout") { line in
                line.add("process", engine.process.label)
                line.add("store", engine.store)
                line.add("req", message.request.id)
            }
            engine.outstanding = nil
            stats.syncResponses += 1
            do {
                try engine.engine.abandon(message.request.id)
            } catch {
                try engineFailed(engine, "abandon", error)
            }
            enqueuePump(engine)
        case let .wake(serial):
            guard let engine = engines[serial] else { return }
            engine.wakeAt = nil
            enqueuePump(engine)
        case let .push(serial):
            guard let engine = engines[serial] else { return }
            engine.pushPending = false
            let device = engine.process.device
            guard isCurrent(engine), !device.isOffline(now), !device.isPartitioned(now) else { return }
            engine.engine.setNeedsFetch()
            enqueuePump(engine)
        case let .restart(deviceIndex, processIndex):
            let process = devices[deviceIndex].processes[processIndex]
            try restart(process)
        case let .online(deviceIndex):
            let device = devices[deviceIndex]
            guard !device.isOffline(now) else { return }
            trace.event(now, "online") { $0.add("device", device.name) }
            for process in device.processes where process.isUp {
                for engine in orderedEngines(process) {
                    engine.engine.setNeedsFetch()
                    enqueuePump(engine)
                }
            }
        case let .partitionEnd(deviceIndex):
            let device = devices[deviceIndex]
            guard !device.isPartitioned(now) else { return }
            trace.event(now, "partition-healed") { $0.add("device", device.name) }
            for process in device.processes where process.isUp { for engine in orderedEngines(process) { enqueuePump(engine) } }
        }
    }

    private func deliver(_ message: Message, _ result: Result<CloudOperationResult, CloudError>) throws {
        let device = devices[message.device]
        guard let engine = engines[message.engine], isCurrent(engine), !engine.isBroken else { return }
        if device.isOffline(now) || device.isPartitioned(now) {
            if case .failure(.networkUnavailable) = result {} else {
                trace.event(now, "lost") { $0.add("req", message.request.id); $0.add("why", "device unreachable") }
                return
            }
        }
        var result = result
        if message.fate == .staleFetch, case .success(.changes) = result, !engine.recentFetches.isEmpty {
            result = .success(.changes(engine.recentFetches[message.staleIndex % engine.recentFetches.count]))
        } else if case let .success(.changes(batch)) = result {
            engine.recentFetches.append(batch)
            if engine.recentFetches.count > 4 { engine.recentFetches.removeFirst() }
        }
        trace.event(now, "deliver") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("req", message.request.id)
            line.add("result", describe(result))
        }
        // Only the answer to the request the engine has in flight is applied; a duplicate or late answer is ignored.
        let applied = engine.outstanding == message.request.id
        if applied {
            engine.outstanding = nil
            switch result {
            case let .success(.changes(batch)): stats.recordsMerged += batch.records.count
            case let .success(.modified(results)), let .failure(.partialFailure(results)):
                stats.recordsMerged += results.filter { if case .conflict = $0 { true } else { false } }.count
            default: break
            }
        }
        stats.syncResponses += 1
        do {
            try engine.engine.handle(message.request.id, result)
        } catch let simulated as SimulatedCrash {
            _ = engine.decisions.take()
            crash(engine.process, reason: simulated.point, restartAfter: engine.process.pendingRestartDelay)
            return
        } catch {
            _ = engine.decisions.take()
            return try engineFailed(engine, "handling \(message.request.operation.name)", error)
        }
        try noteZoneDeletionDecisions(engine)
        // (A zone reset between the save and this answer removed the saved records legitimately: the engine learns
        // of the reset later, and convergence checks that it uploads them again. An answer the engine ignored — a
        // duplicate of one it applied earlier — dropped nothing: what it dropped then was checked then.)
        if applied, case let .modifyRecords(records, zone) = message.request.operation, message.zoneResets == zoneResets[zone] ?? 0 {
            try checkOutbox(engine, records: records, zone: zone)
        }
        enqueuePump(engine)
    }

    /// After an upload's answer: every record the outbox no longer holds pending must be contained in the cloud's
    /// version of it (otherwise a newer local write will never be uploaded).
    private func checkOutbox(_ engine: SimEngine, records: [CloudRecord], zone: String) throws {
        for record in records {
            // (A row whose bookkeeping the simulator overwrote since is the corruption checks' concern.)
            if try hasCorruptionInPlace(engine, record.recordID) { continue }
            guard let state = try engine.engine.replicationStamps(of: record.recordID), !state.isPending else { continue }
            // (The message text is built only for a violation.)
            func label() -> String { "\(engine.process.label) dropped \(alias(record.recordID)) from its outbox" }
            guard let stored = mirror[zone]?[record.recordID] else {
                throw InvariantViolation(.noLostWrites, "\(label()), but the cloud does not have it")
            }
            if stored.causalLength < state.causalLength {
                throw InvariantViolation(.noLostWrites, "\(label()) at causal length \(state.causalLength), but the cloud has \(stored.causalLength)")
            }
            guard stored.causalLength == state.causalLength, state.causalLength % 2 == 1 else { continue }
            func lacks(_ name: String, _ stamp: FieldStamp) -> Bool { stored.fields[name].map({ $0.stamp < stamp }) ?? true }
            // Field order matters only for naming the first missing write.
            guard state.stamps.contains(where: lacks) else { continue }
            for (name, stamp) in state.stamps.sorted(by: { $0.key < $1.key }) where lacks(name, stamp) {
                throw InvariantViolation(.noLostWrites, "\(label()), but the cloud lacks its write of '\(name)' (stamp \(stamp))")
            }
        }
    }

    private func describe(_ result: Result<CloudOperationResult, CloudError>) -> String {
        switch result {
        case let .success(outcome):
            switch outcome {
            case .zoneCreated: return "zone created"
            case .zoneDeleted: return "zone deleted"
            case let .modified(results): return describe(results)
            case let .changes(batch): return "\(batch.records.count) records\(batch.moreComing ? ", more coming" : "")"
            case .metadata: return "metadata"
            case .metadataValue: return "metadata set"
            case let .assetUpload(state):
                return state.isComplete ? "asset complete" : "asset \(state.receivedChunks.count) of \(state.asset.chunkCount) chunks"
            case let .assetChunk(bytes): return "asset chunk of \(bytes.count) bytes"
            }
        case let .failure(.partialFailure(results)):
            return "partial failure: " + describe(results)
        case let .failure(error):
            return "error: \(error)"
        }
    }

    private func describe(_ results: [RecordSaveResult]) -> String {
        var saved = 0, conflicts = 0, failed = 0
        for result in results {
            switch result {
            case .saved: saved += 1
            case .conflict: conflicts += 1
            case .failed: failed += 1
            }
        }
        return "saved \(saved), conflicts \(conflicts), failed \(failed)"
    }

    /// The cloud performs a request, with an injected error drawn from the tape.
    private func performAtCloud(_ message: Message) throws -> Result<CloudOperationResult, CloudError> {
        stats.cloudRequests += 1
        let operation = message.request.operation
        var fault = 0
        var retryAfter: Int64 = 0
        var split = 0
        if !cloudSlots.isEmpty {
            let slot = cloudSlots.removeFirst()
            let records: [CloudRecord] = if case let .modifyRecords(records, _) = operation { records } else { [] }
            fault = slot.kind
            if records.isEmpty && (fault == 4 || fault == 5) { fault = 0 }
            retryAfter = Int64(100 + slot.parameter % 20_001)
            if fault == 5 { split = slot.parameter % records.count }
        }
        let faultNames = ["none", "rate-limited", "quota-exceeded", "zone-busy", "conflict", "partial-failure"]
        let result: Result<CloudOperationResult, CloudError>
        switch fault {
        case 1: result = .failure(.rateLimited(retryAfterMilliseconds: retryAfter))
        case 2: result = .failure(.quotaExceeded)
        case 3: result = .failure(.zoneBusy(retryAfterMilliseconds: retryAfter))
        case 4:
            // Another writer saves the same record (unchanged) first: the upload meets a conflict.
            if case let .modifyRecords(records, zone) = operation,
               let touched = records.first(where: { mirror[zone]?[$0.recordID] != nil }), let stored = mirror[zone]?[touched.recordID] {
                _ = try modify([stored], zone: zone, from: nil)
            }
            result = try perform(operation, from: message)
        case 5:
            guard case let .modifyRecords(records, zone) = operation else { result = try perform(operation, from: message); break }
            // Only the first `split` records are saved; the others fail with a transient error.
            let done = Array(records.prefix(split))
            let first: Result<CloudOperationResult, CloudError> = done.isEmpty ? .success(.modified([])) : try modify(done, zone: zone, from: message)
            if case let .success(.modified(results)) = first {
                result = .failure(.partialFailure(results + records.dropFirst(split).map {
                    .failed(recordID: $0.recordID, error: .zoneBusy(retryAfterMilliseconds: 1_000))
                }))
            } else {
                result = first
            }
        default:
            result = try perform(operation, from: message)
        }
        trace.event(now, "cloud") { line in
            line.add("process", "\(devices[message.device].name)/\(message.process == 0 ? "app" : "ext")")
            line.add("store", message.store)
            line.add("req", message.request.id)
            line.add("op", operation.name)
            line.add("fault", faultNames[fault])
            line.add("result", describe(result))
        }
        return result
    }

    private func perform(_ operation: CloudOperation, from message: Message) throws -> Result<CloudOperationResult, CloudError> {
        if case let .modifyRecords(records, zone) = operation { return try modify(records, zone: zone, from: message) }
        return cloud.performNow(operation)
    }

    /// Saves records in the cloud, checking first that every version that replaces one is a superset of it (the
    /// cloud never loses an acknowledged write), and keeps the mirror.
    func modify(_ records: [CloudRecord], zone: String, from message: Message?) throws -> Result<CloudOperationResult, CloudError> {
        if scenario.expect.cloudEncryption {
            // No plaintext of an encrypted attribute ever reaches the cloud, not even in a version replaced later.
            for record in records {
                for name in (encryptedAttributes[record.recordType] ?? []).sorted() {
                    guard let field = record.fields[name] else { continue }
                    // A sealed value (a BLOB), or the reference of a sealed asset (whose bytes are sealed).
                    let sealed: Bool = switch field.value {
                    case .blob: field.isEncrypted
                    case let .text(text): field.isEncrypted && SealedAssetReference(fieldValue: text) != nil
                    default: false
                    }
                    if !sealed {
                        let who = message.map { "\(devices[$0.device].name)/\($0.process == 0 ? "app" : "ext")" } ?? "the cloud"
                        throw InvariantViolation(.noPlaintext, "\(who) uploaded \(alias(record.recordID)).\(name) to zone '\(zone)' unsealed")
                    }
                }
            }
        }
        if let message { try checkCorruptedUploads(records, zone: zone, device: message.device) }
        for record in records {
            guard let old = mirror[zone]?[record.recordID], old.changeTag == record.changeTag else { continue }
            if let gap = dominanceGap(new: record, old: old) {
                let who = message.map { "\(devices[$0.device].name)/\($0.process == 0 ? "app" : "ext")" } ?? "the cloud"
                throw InvariantViolation(.noLostWrites, "\(who) overwrote \(alias(record.recordID)) in zone '\(zone)' with a version that lost data: \(gap)")
            }
        }
        let result = cloud.performNow(.modifyRecords(records, zone: zone))
        if case let .success(.modified(results)) = result {
            var saved = 0
            for (record, outcome) in zip(records, results) {
                if case let .saved(id, tag) = outcome {
                    var stored = record
                    stored.changeTag = tag
                    mirror[zone, default: [:]][id] = stored
                    reference.noteRedirect(zone: zone, stored)
                    reference.noteCloudVersion(zone: zone, stored)
                    saved += 1
                }
            }
            stats.cloudSaves += saved
            if saved > 0 { schedulePushes(zone: zone, except: message?.engine) }
        }
        return result
    }

    /// Push notifications to every engine of `zone` (but the uploader).
    func schedulePushes(zone: String, except serial: Int?) {
        // `currentEngines`' order (device, process, store), without building the list.
        for device in devices {
            for process in device.processes where process.isUp {
                for store in process.stores where store.name == zone {
                    guard let engine = process.engines[store.name], engine.serial != serial, !engine.pushPending else { continue }
                    engine.pushPending = true
                    queue.push(now + Int64(scenario.timing.pushLatencyMs), .push(engine.serial))
                }
            }
        }
    }

    /// A short, stable name for a record (`Trip#3`).
    func alias(_ id: UUID) -> String { aliases[id] ?? "record-\(id.uuidString.prefix(8).lowercased())" }

    /// Runs `PRAGMA integrity_check` on a store file.
    func checkIntegrity(_ process: SimProcess, _ store: Scenario.Store) throws {
        guard let url = process.container?.url(of: configurationName(store.name)) else { return }
        var handle: OpaquePointer?
        guard sqlite3_open_v2(url.path, &handle, SQLITE_OPEN_READONLY, nil) == SQLITE_OK, let handle else {
            sqlite3_close_v2(handle)
            throw InvariantViolation(.crashConsistency, "\(process.label) store '\(store.name)': the file cannot be opened")
        }
        defer { sqlite3_close_v2(handle) }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, "PRAGMA integrity_check", -1, &statement, nil) == SQLITE_OK else {
            throw InvariantViolation(.crashConsistency, "\(process.label) store '\(store.name)': integrity_check cannot run")
        }
        defer { sqlite3_finalize(statement) }
        var results: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            if let text = sqlite3_column_text(statement, 0) { results.append(String(cString: text)) }
        }
        guard results == ["ok"] else {
            throw InvariantViolation(.crashConsistency, "\(process.label) store '\(store.name)': integrity_check says \(results.prefix(3).joined(separator: "; "))")
        }
    }
}
