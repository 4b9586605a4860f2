// Migration plans in a scenario (`Scenario.Migration`): every process opens its container through a plan of the
// scenario's schema versions up to its own (a lightweight stage from each version to the next, which also drops the
// columns of attributes a version removed, `droppedSince`), except where the scenario declares a values-only custom
// stage: an integer attribute multiplied by a factor in `willMigrate` (on the old schema) or `didMigrate` (on the new).
//
// The reference model applies each stage once, to the rows the device's local store holds when the device updates
// (`upgrade(_:to:)`). Invariant `migrated-once` compares the stage's attribute of every row with it after every open
// through the plan: a row multiplied zero times or twice (a stage skipped, or run again on a store that was already
// past it) is named as such.
//
// Opens without the plan, as a widget, an intent or a `ModelActor` of the new build does:
// - `noPlanOpen` (per device update): before the updated app opens, a process of the new build opens the store with
//   the new version's versioned schema, or its unversioned `Schema` (drawn), and no plan, then closes it; and at set-up,
//   a device that starts at the newest version has its stores created that way first (drawn per device).
// - the workload operation `unversionedOpen`: a process reopens its local stores with the unversioned schema of its
//   version and no plan, and runs so until its next restart or reopen, which goes through the plan again.
// A refusal of such an open (a `ReplicaError`) is a legitimate answer and noted in the trace; a silent change is not.
//
// A stage may name an attribute of a synced store (in a scenario without local stores): changing it in place is what a
// synced store's stage must not do — every device would run it on values other devices already migrated and synced —
// so the expected answer is the library's refusal (a load issue of the updated app's container, the store unchanged).
// The update then fails: the device goes back to its old version (`updateRefused`), which keeps syncing. Invariant
// `migrated-once` holds a synced store to it: after every open through the plan, no value of a synced stage's
// attribute is an acknowledged value multiplied by the stage's factor (once or twice) that no device wrote.

import Foundation
@_spi(Simulation) import Replica

extension Scenario {
    /// An app's migration plan: the scenario's schema versions in order, with a lightweight stage between each two except
    /// those listed in ``stages``, and the rate of opens by a process of the new build without the plan.
    public struct Migration: Codable, Hashable, Sendable {
        /// A values-only custom stage (same layout for the attribute): multiplies an integer attribute by a factor.
        public struct Stage: Codable, Hashable, Sendable {
            /// The version the stage leads to (from the one before).
            public var toVersion: Int
            public var entity: String
            /// The attribute's name (it exists in both versions, not renamed between them).
            public var attribute: String
            public var factor: Int
            /// `willMigrate` (on the old schema) or `didMigrate` (on the new one).
            public var phase: String

            public init(toVersion: Int, entity: String, attribute: String, factor: Int, phase: String) {
                self.toVersion = toVersion
                self.entity = entity
                self.attribute = attribute
                self.factor = factor
                self.phase = phase
            }
        }

        public var stages: [Stage]
        /// Probability, per device update and per device at set-up that starts at the newest version, that a process of
        /// the new build opens the stores without the plan first.
        public var noPlanOpen: Double

        public init(stages: [Stage], noPlanOpen: Double = 0) {
            self.stages = stages
            self.noPlanOpen = noPlanOpen
        }
    }
}

extension ScenarioReader {
    func migration(_ value: Any, _ path: String) throws(ScenarioError) -> Scenario.Migration {
        let object = try self.object(value, path, allowed: ["stages", "noPlanOpen"])
        var stages: [Scenario.Migration.Stage] = []
        for (index, item) in try array(object["stages"] ?? [Any](), join(path, "stages"), nonEmpty: false).enumerated() {
            let stagePath = "\(join(path, "stages"))[\(index)]"
            let fields = try self.object(item, stagePath, allowed: ["toVersion", "entity", "attribute", "factor", "phase"])
            func required(_ key: String) throws(ScenarioError) -> Any {
                guard let value = fields[key] else { throw fail(join(stagePath, key), "missing") }
                return value
            }
            stages.append(Scenario.Migration.Stage(
                toVersion: try integer(try required("toVersion"), join(stagePath, "toVersion")),
                entity: try identifier(try required("entity"), join(stagePath, "entity")),
                attribute: try identifier(try required("attribute"), join(stagePath, "attribute")),
                factor: try integer(try required("factor"), join(stagePath, "factor")),
                phase: try string(fields["phase"] ?? "didMigrate", join(stagePath, "phase"))))
        }
        let rate = try object["noPlanOpen"].map { v throws(ScenarioError) in try number(v, join(path, "noPlanOpen")) } ?? 0
        return Scenario.Migration(stages: stages, noPlanOpen: rate)
    }
}

extension ScenarioChecker {
    /// A plan's custom stages lead to a version of the schema (at most one per version) and multiply an integer
    /// attribute of an entity of local-only stores that both versions declare; dropped attributes
    /// (`droppedSince`) belong to local-only stores; a plan needs file stores (its stages run when a container reopens).
    func migration(_ scenario: Scenario) throws(ScenarioError) {
        let local = scenario.localEntities
        for (e, entity) in scenario.schema.entities.enumerated() {
            for (i, attribute) in entity.attributes.enumerated() {
                guard let dropped = attribute.droppedSince else { continue }
                let path = "schema.entities[\(e)].attributes[\(i)].droppedSince"
                try range(dropped, path, (attribute.since + 1)...scenario.schema.version)
                guard local.contains(entity.name), scenario.migration != nil else {
                    throw fail(path, "only attributes of local-only stores of a scenario with a migration plan are dropped (a synced store is additive only)")
                }
                if attribute.renamedFrom != nil || attribute.options.contains("unique") {
                    throw fail(path, "a dropped attribute is neither renamed nor unique")
                }
            }
        }
        guard let migration = scenario.migration else {
            if scenario.workload.unversionedOpen > 0 {
                throw fail("workload.unversionedOpen", "the unversioned open needs a migration plan (\"migration\")")
            }
            return
        }
        try range(migration.noPlanOpen, "migration.noPlanOpen", Scenario.Limits.rate)
        if scenario.storage != .file { throw fail("migration", "a migration plan runs when a store reopens: its stores must be files (\"storage\": \"file\")") }
        var versions = Set<Int>()
        for (index, stage) in migration.stages.enumerated() {
            let path = "migration.stages[\(index)]"
            try range(stage.toVersion, "\(path).toVersion", 2...max(2, scenario.schema.version))
            if !versions.insert(stage.toVersion).inserted { throw fail("\(path).toVersion", "two stages lead to version \(stage.toVersion)") }
            guard ["willMigrate", "didMigrate"].contains(stage.phase) else {
                throw fail("\(path).phase", "'\(stage.phase)' is not one of: willMigrate, didMigrate")
            }
            try range(stage.factor, "\(path).factor", 2...1_000)
            let synced = Set(scenario.stores.filter { $0.kind == .synced }.flatMap(\.entities))
            guard let entity = scenario.schema.entity(named: stage.entity), local.contains(entity.name) || synced.contains(entity.name) else {
                throw fail("\(path).entity", "no entity '\(stage.entity)' of a local-only or synced store")
            }
            if synced.contains(entity.name), !local.isEmpty {
                throw fail("\(path).entity", "a stage of a synced store's attribute is refused, and the updated device stays at its old version: "
                    + "the scenario has no local-only stores (their migration would have gone ahead)")
            }
            guard let attribute = entity.attributes.first(where: { $0.name == stage.attribute }), attribute.type == .integer,
                  attribute.exists(in: stage.toVersion - 1), attribute.exists(in: stage.toVersion), attribute.renamedFrom == nil,
                  !attribute.options.contains("unique") else {
                throw fail("\(path).attribute", "'\(stage.attribute)' is not an integer attribute of \(entity.name) in versions \(stage.toVersion - 1) "
                    + "and \(stage.toVersion) (neither renamed nor unique)")
            }
        }
    }
}

/// How a process opens its stores next time without the plan (see MigrationPlans.swift).
enum NoPlanOpen: String {
    /// The new build's versioned schema (`ModelContainer(for: V2.schema)`).
    case versioned
    /// An unversioned schema of the same models (`ModelContainer(for: Schema([Item.self]))`).
    case unversioned
}

/// The simulator's own stage code runs on the library's stage contexts; its failures are stage errors the caller sees.
struct StageCodeError: Error, CustomStringConvertible {
    let description: String
}

extension SimulationRun {
    var usesPlan: Bool { scenario.migration != nil }

    /// The entities of `process`'s stores in schema `version` (their order in the process's stores).
    func processEntities(_ process: SimProcess, version: Int) -> [Schema.Entity] {
        let view = SchemaView(scenario.librarySchema(version: version))
        return process.stores.flatMap { view.entities(of: $0) }
    }

    /// Opens the container of `configurations` for `process`: through the plan up to the process's version, or
    /// without it (`process.noPlanOpen`, consumed here).
    func openContainer(_ process: SimProcess, entities: [Schema.Entity], configurations: [ModelConfiguration]) throws -> ModelContainer {
        let version = process.view.schema.version
        let schema = Schema(entities: entities, version: version)
        guard let migration = scenario.migration else {
            return try ModelContainer(for: schema, configurations: configurations, environment: process.environment)
        }
        if let noPlan = process.noPlanOpen {
            process.noPlanOpen = nil
            process.openedWithoutPlan = noPlan
            return try ModelContainer(for: noPlan == .versioned ? schema.asVersioned : schema, configurations: configurations,
                                      environment: process.environment)
        }
        process.openedWithoutPlan = nil
        let major = version.major
        let schemas = (1...major).map { Schema(entities: processEntities(process, version: $0), version: Schema.Version($0, 0, 0)) }
        let stages = (1..<max(1, major)).map { from in
            migration.stages.first { $0.toVersion == from + 1 }.map { stageCode($0, old: schemas[from - 1], new: schemas[from]) }
                ?? DescribedMigrationStage()
        }
        return try ModelContainer(describedPlan: schemas, stages: stages, configurations: configurations, environment: process.environment)
    }

    /// The code of a custom stage: multiplies the attribute of every record of the entity (in the stage's context,
    /// which holds one store's entities: a store without the entity has nothing to do) and saves.
    func stageCode(_ stage: Scenario.Migration.Stage, old: Schema, new: Schema) -> DescribedMigrationStage {
        let schema = stage.phase == "willMigrate" ? old : new
        guard let entity = schema.entity(named: stage.entity), let index = entity.fieldNames.firstIndex(of: stage.attribute) else {
            return DescribedMigrationStage()
        }
        let access = SimEntity(entity, in: schema.entities).access
        let factor = Int64(stage.factor)
        let code: @Sendable (ModelContext) throws -> Void = { context in
            guard context.container.schema.entity(named: entity.name) != nil else { return }
            for (id, values) in try access.all(context) {
                guard case let .integer(value) = values[index] else { continue }
                var changed = values
                changed[index] = .integer(value &* factor)
                access.update(context, id: id, values: changed, from: values)
            }
            try context.save()
        }
        return stage.phase == "willMigrate" ? DescribedMigrationStage(willMigrate: code) : DescribedMigrationStage(didMigrate: code)
    }

    /// The custom stages a store runs moving from schema `from` to `to`.
    func customStages(from: Int, to: Int) -> [Scenario.Migration.Stage] {
        (scenario.migration?.stages ?? []).filter { $0.toVersion > from && $0.toVersion <= to }
    }

    /// Applies the custom stages from `from` to `to` to a local store's model (rows in `to`'s field order).
    func applyStages(_ model: inout LocalStoreModel, view: SchemaView, from: Int, to: Int) {
        for stage in customStages(from: from, to: to) {
            guard let entity = view.schema.entity(named: stage.entity), let index = view.info(entity).fieldNames.firstIndex(of: stage.attribute),
                  let rows = model.rows[entity.name] else { continue }
            for (id, row) in rows {
                guard case let .integer(value) = row[index] else { continue }
                model.rows[entity.name]?[id]?[index] = .integer(value &* Int64(stage.factor))
            }
        }
    }

    /// Invariant `migrated-once`, after `process` opened through the plan: the attribute of every custom stage that
    /// led to its version holds, in every row of its local stores, the reference model's value (each acknowledged row
    /// transformed exactly once), and no row is lost.
    func checkMigratedOnce(_ process: SimProcess) throws {
        guard let migration = scenario.migration, !migration.stages.isEmpty, process.openedWithoutPlan == nil,
              let observer = observer(of: process) else { return }
        try checkSyncedStagesRefused(process)
        let version = process.view.schema.version.major
        for store in process.stores where !store.isSynced {
            let model = reference.localStores[viewKey(process.device, store.name)] ?? LocalStoreModel()
            for stage in migration.stages where stage.toVersion <= version {
                guard let entity = process.view.entities(of: store).first(where: { $0.name == stage.entity }) else { continue }
                let info = process.view.info(entity)
                guard let index = info.fieldNames.firstIndex(of: stage.attribute) else { continue }
                let actual = Dictionary(try info.access.all(observer).map { ($0.id, $0.values) }, uniquingKeysWith: { a, _ in a })
                for (id, expected) in (model.rows[entity.name] ?? [:]).sorted(by: { uuidPrecedes($0.key, $1.key) }) {
                    let label = "\(process.label) store '\(store.name)' at v\(version): \(alias(id)).\(stage.attribute)"
                    guard let row = actual[id] else {
                        throw InvariantViolation(.migratedOnce, "\(process.label) store '\(store.name)' at v\(version) lost \(alias(id)) across the migration")
                    }
                    guard row[index] != expected[index], case let .integer(want) = expected[index] else { continue }
                    let factor = Int64(stage.factor)
                    let how: String
                    if case let .integer(got) = row[index], want % factor == 0, got == want / factor {
                        how = "not transformed: the stage to v\(stage.toVersion) (×\(factor)) never ran on it"
                    } else if case let .integer(got) = row[index], got == want &* factor {
                        how = "transformed twice: the stage to v\(stage.toVersion) (×\(factor)) ran again on a store already past it"
                    } else {
                        how = "neither the value before nor after the stage to v\(stage.toVersion)"
                    }
                    throw InvariantViolation(.migratedOnce, "\(label) is \(show(row[index], encrypted: false)), expected "
                        + "\(show(expected[index], encrypted: false)) (\(how))")
                }
            }
        }
    }

    /// The custom stages of synced stores' attributes (their expected outcome is a refusal).
    var syncedStages: [Scenario.Migration.Stage] {
        let synced = Set(scenario.stores.filter { $0.kind == .synced }.flatMap(\.entities))
        return (scenario.migration?.stages ?? []).filter { synced.contains($0.entity) }
    }

    /// Whether `error`, from `process`'s open through the plan, is the refusal of a synced store's stage (the expected
    /// answer, see the file comment). If so, the update failed: the device goes back to the version before the first
    /// such stage it passed (the stages before it were applied and recorded; the refused one ran on a copy), with every
    /// process's schema, and the caller opens again at it.
    func updateRefused(_ process: SimProcess, _ error: ReplicaError) -> Bool {
        let device = process.device
        guard "\(error)".contains("of records in the synced store"),
              let first = syncedStages.map(\.toVersion).filter({ $0 <= device.schemaVersion }).min() else { return false }
        let from = device.schemaVersion, back = first - 1
        let view = SchemaView(scenario.librarySchema(version: back))
        device.view = view
        device.schemaVersion = back
        for process in device.processes {
            process.view = view
            process.workloadTargets = Array(repeating: nil, count: WorkloadOperation.allCases.count)
        }
        let reason = runIndependent(error)
        note("\(device.name): the update to v\(from) was refused (\(reason)); the app stays at v\(back)")
        trace.event(now, "update-refused") { line in
            line.add("device", device.name)
            line.add("to", from)
            line.add("stays", back)
            line.add("reason", reason)
        }
        return true
    }

    /// Invariant `migrated-once` for synced stores, after `process` opened through the plan: no value of a synced
    /// stage's attribute is a value no device wrote that is an acknowledged one multiplied by the stage's factor (once
    /// or twice) — the stage must have been refused, not applied to values other devices hold too.
    func checkSyncedStagesRefused(_ process: SimProcess) throws {
        let stages = syncedStages.filter { $0.toVersion <= process.view.schema.version.major }
        guard !stages.isEmpty, let observer = observer(of: process) else { return }
        for store in process.stores where store.kind == .synced {
            for stage in stages {
                guard let entity = process.view.entities(of: store).first(where: { $0.name == stage.entity }) else { continue }
                let info = process.view.info(entity)
                guard let index = info.fieldNames.firstIndex(of: stage.attribute) else { continue }
                let factor = Int64(stage.factor)
                for (id, values) in try info.access.all(observer).sorted(by: { uuidPrecedes($0.id, $1.id) }) {
                    guard case let .integer(value) = values[index], value != 0, value % factor == 0 else { continue }
                    func written(_ value: Int64) -> Bool {
                        reference.writerStamp(zone: store.name, id: id, field: stage.attribute, value: .integer(value)) != nil
                    }
                    guard !written(value) else { continue }
                    let times: Int
                    if written(value / factor) {
                        times = 1
                    } else if (value / factor) % factor == 0, written(value / factor / factor) {
                        times = 2
                    } else {
                        continue
                    }
                    throw InvariantViolation(.migratedOnce, "\(process.label) synced store '\(store.name)' at v\(process.view.schema.version.major): "
                        + "\(alias(id)).\(stage.attribute) is \(value), which no device wrote: an acknowledged value ×\(factor)"
                        + "\(times == 2 ? " twice" : "") — the stage to v\(stage.toVersion) changed a synced attribute in place instead of "
                        + "being refused (every device applies it again to values others migrated)")
                }
            }
        }
    }

    /// Before an updated device's app opens (fault `noPlanOpen`): a process of the new build opens the device's local
    /// stores without the plan (versioned or unversioned schema, drawn), then closes them. A refusal is noted.
    func noPlanOpenBeforeUpdate(_ device: SimDevice) throws {
        guard let migration = scenario.migration, migration.noPlanOpen > 0, try dice.chance(migration.noPlanOpen) else { return }
        let kind: NoPlanOpen = try dice.below(2) == 0 ? .versioned : .unversioned
        try widgetOpen(device, kind: kind)
    }

    /// A process of `device`'s build (a widget's, an intent's) opens the device's local stores with the `kind` of schema
    /// and no plan, then closes them. A refusal is noted.
    func widgetOpen(_ device: SimDevice, kind: NoPlanOpen) throws {
        guard let process = device.processes.first(where: { $0.stores.allSatisfy(usesFile) }) else { return }
        let widget = SimProcess(device: device, index: process.index, stores: process.stores.filter { $0.kind == .local }, view: device.view,
                                environment: process.environment, faults: FaultSwitch())
        guard !widget.stores.isEmpty else { return }
        widget.noPlanOpen = kind
        let entities = processEntities(widget, version: device.schemaVersion)
        let configurations = widget.stores.map { store in
            ModelConfiguration(configurationName(store.name), schema: Schema(entities: device.view.entities(of: store), version: device.view.schema.version))
        }
        var result = "opened"
        do {
            _ = try openContainer(widget, entities: entities, configurations: configurations)
        } catch let error as ReplicaError {
            result = "refused: \(runIndependent(error))"
        }
        note("\(device.name): a process of the new build opened its local stores with the \(kind.rawValue) schema and no plan first (\(result))")
        trace.event(now, "no-plan-open") { line in
            line.add("device", device.name)
            line.add("schema", kind.rawValue)
            line.add("result", result)
        }
    }

    /// `error`'s description with each store's configuration name of this run (see `configurationName(_:)`, unique
    /// per run) replaced by the scenario's store name, so that a trace that quotes it is the same in every run.
    func runIndependent(_ error: ReplicaError) -> String {
        scenario.stores.reduce("\(error)") { text, store in text.replacingOccurrences(of: configurationName(store.name), with: store.name) }
    }

    /// Workload operation `unversionedOpen`: the process reopens with the unversioned schema and no plan.
    func unversionedOpenStep(_ outcome: inout Outcome) throws {
        let process = outcome.process
        process.noPlanOpen = .unversioned
        do {
            try reopen(process, syncOff: process.syncOff, encryptionOn: process.encryptionOn)
            outcome.result = "opened without the plan"
        } catch let error as ReplicaError {
            // Refused: the app opens through its plan again.
            outcome.result = "refused: \(runIndependent(error))"
            try start(process)
        }
    }
}
