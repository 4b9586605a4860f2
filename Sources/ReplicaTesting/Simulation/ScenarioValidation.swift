// The checks every scenario passes before a run, whichever way it arrives: read from a scenario file (`Scenario.parse`
// reads the JSON's structure, then runs these) or embedded in a trace header (`TraceFormat.header` decodes it, then
// runs these). One path, so a header can never start a run that a scenario file could not: no devices, a store no
// scenario declares, a schema version below 1, negative rates or weights, a digest interval of 0.

import Foundation
import Replica

extension Scenario {
    /// The ranges of the scenario's numbers (the file reader and ``validate(file:fieldPrefix:)`` share them).
    enum Limits {
        static let weight = 0...10_000
        static let maxFieldsPerUpdate = 1...16
        static let uniqueKeys = 1...1_000
        static let nullPercent = 0...100
        static let largeAssetPercent = 0...100
        static let rate: ClosedRange<Double> = 0...1
        static let clockMs = 0...86_400_000
        static let steps = 1...100_000
        static let schemaVersion = 1...1_000
        static let devices = 16
        static let ratesSum = 0.9
        /// Timing fields with their ranges.
        static var timing: [(String, WritableKeyPath<Scenario.Timing, Int>, ClosedRange<Int>)] { [
            ("thinkTimeMs", \.thinkTimeMs, 0...3_600_000), ("latencyMs", \.latencyMs, 1...60_000),
            ("maxDelayMs", \.maxDelayMs, 0...3_600_000), ("timeoutMs", \.timeoutMs, 100...3_600_000),
            ("outageMs", \.outageMs, 1...86_400_000), ("restartMs", \.restartMs, 1...86_400_000),
            ("pushLatencyMs", \.pushLatencyMs, 1...60_000), ("livenessBoundMs", \.livenessBoundMs, 60_000...86_400_000),
            ("digestEvery", \.digestEvery, 1...100_000),
        ] }
        /// Attribute types a scenario may declare.
        static let attributeTypes: [Schema.AttributeType] = [.string, .integer, .double, .bool, .date, .data]
        /// Delete rules a scenario may declare (deny cannot sync).
        static let deleteRules: [Schema.DeleteRule] = [.nullify, .cascade, .noAction]
    }

    /// Checks everything a run relies on: names, the schema (each element's version, relationships that point back,
    /// the rules of synced stores), stores and the entities they hold, devices and the stores and schema version each
    /// opens, and every weight, rate, clock bound, timing constant and the number of steps against its range.
    /// - Parameters:
    ///   - file: the file named in errors (a scenario file or a trace).
    ///   - fieldPrefix: put before every field path (`scenario_json.` for a trace header's scenario).
    /// - Throws: ``ScenarioError`` naming the file, the first field that is wrong and the problem.
    public func validate(file: String, fieldPrefix: String = "") throws(ScenarioError) {
        let check = ScenarioChecker(file: file, prefix: fieldPrefix)
        try check.name(name, "name")
        try check.schema(schema)
        try check.stores(stores, schema: schema)
        try check.devices(devices, stores: stores, schema: schema, storage: storage, reopenWeight: workload.reopen)
        try check.workload(workload)
        try check.faults(faults)
        try check.timing(timing)
        try check.range(steps, "steps", Limits.steps)
        try check.migration(self)
        try check.runtime(self)
    }
}

/// The checks of ``Scenario/validate(file:fieldPrefix:)``, with path-precise errors.
struct ScenarioChecker {
    let file: String
    let prefix: String

    func fail(_ field: String, _ problem: String) -> ScenarioError {
        ScenarioError(file: file, field: prefix + field, problem: problem)
    }

    func range(_ value: Int, _ path: String, _ range: ClosedRange<Int>) throws(ScenarioError) {
        guard range.contains(value) else { throw fail(path, "\(value) is out of range \(range.lowerBound)...\(range.upperBound)") }
    }

    func range(_ value: Double, _ path: String, _ range: ClosedRange<Double>) throws(ScenarioError) {
        guard value.isFinite, range.contains(value) else {
            throw fail(path, "\(value) is out of range \(range.lowerBound)...\(range.upperBound)")
        }
    }

    /// A store or device name (1 to 48 letters, digits, '-' or '_').
    func name(_ text: String, _ path: String) throws(ScenarioError) {
        let allowed = text.unicodeScalars.allSatisfy { ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "-" || $0 == "_" }
        guard !text.isEmpty, text.utf8.count <= 48, allowed else {
            throw fail(path, "'\(text)' is not a valid name (1 to 48 letters, digits, '-' or '_')")
        }
    }

    /// An entity, attribute or relationship name.
    func identifier(_ text: String, _ path: String) throws(ScenarioError) {
        guard let first = text.unicodeScalars.first, text.utf8.count <= 64,
              (first >= "a" && first <= "z") || (first >= "A" && first <= "Z") || first == "_",
              text.unicodeScalars.allSatisfy({ ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "_" }),
              !text.lowercased().hasPrefix("replica_"), text != "id" else {
            throw fail(path, "'\(text)' is not a valid identifier (a letter or '_', then letters, digits or '_'; not 'id' or 'replica_…')")
        }
    }

    // MARK: Schema

    func schema(_ schema: SimulationSchema) throws(ScenarioError) {
        try range(schema.version, "schema.version", Scenario.Limits.schemaVersion)
        guard !schema.entities.isEmpty else { throw fail("schema.entities", "must not be empty") }
        var seen: [String] = []
        for (index, entity) in schema.entities.enumerated() {
            let entityPath = "schema.entities[\(index)]"
            try identifier(entity.name, "\(entityPath).name")
            if seen.contains(entity.name) { throw fail("\(entityPath).name", "entity '\(entity.name)' is declared twice") }
            seen.append(entity.name)
            try range(entity.since, "\(entityPath).since", 1...schema.version)
            guard !entity.attributes.isEmpty else { throw fail("\(entityPath).attributes", "must not be empty") }
            var members: [String] = []
            for (i, attribute) in entity.attributes.enumerated() {
                let path = "\(entityPath).attributes[\(i)]"
                try identifier(attribute.name, "\(path).name")
                if members.contains(attribute.name) { throw fail("\(path).name", "'\(attribute.name)' is declared twice") }
                members.append(attribute.name)
                guard Scenario.Limits.attributeTypes.contains(attribute.type) else {
                    throw fail("\(path).type", "'\(attribute.type.rawValue)' is not one of: \(Scenario.Limits.attributeTypes.map(\.rawValue).joined(separator: ", "))")
                }
                for (o, option) in attribute.options.enumerated() where !SimulationSchema.Attribute.knownOptions.contains(option) {
                    throw fail("\(path).options[\(o)]", "'\(option)' is not one of: \(SimulationSchema.Attribute.knownOptions.joined(separator: ", "))")
                }
                try range(attribute.since, "\(path).since", 1...schema.version)
                for option in (attribute.optionsSince ?? [:]).keys.sorted() {
                    guard SimulationSchema.Attribute.knownOptions.contains(option) else {
                        throw fail("\(path).optionsSince.\(option)", "'\(option)' is not one of: \(SimulationSchema.Attribute.knownOptions.joined(separator: ", "))")
                    }
                    try range(attribute.optionsSince![option]!, "\(path).optionsSince.\(option)", max(1, attribute.since)...schema.version)
                }
            }
            try renames(of: entity, entityPath, schema: schema)
            for (i, relationship) in entity.relationships.enumerated() {
                let path = "\(entityPath).relationships[\(i)]"
                try identifier(relationship.name, "\(path).name")
                if members.contains(relationship.name) { throw fail("\(path).name", "'\(relationship.name)' is declared twice") }
                members.append(relationship.name)
                guard Scenario.Limits.deleteRules.contains(relationship.deleteRule) else {
                    throw fail("\(path).deleteRule", "'\(relationship.deleteRule.rawValue)' is not one of: nullify, cascade, noAction (deny cannot sync)")
                }
                if relationship.toMany && relationship.inverse == nil {
                    throw fail("\(path).inverse", "a to-many relationship needs the name of its inverse")
                }
                try range(relationship.since, "\(path).since", 1...schema.version)
                guard let destination = schema.entity(named: relationship.destination) else {
                    throw fail("\(path).destination", "no entity '\(relationship.destination)' in the schema")
                }
                if let inverse = relationship.inverse {
                    guard let back = destination.relationships.first(where: { $0.name == inverse }), back.destination == entity.name,
                          back.inverse == relationship.name else {
                        throw fail("\(path).inverse", "'\(destination.name).\(inverse)' does not exist or does not point back")
                    }
                    if back.toMany && relationship.toMany && destination.name == entity.name && inverse == relationship.name {
                        throw fail("\(path).inverse", "a many-to-many relationship that is its own inverse cannot sync")
                    }
                }
            }
        }
        do {
            try schema.schema().validate()
        } catch {
            throw fail("schema", "\(error)")
        }
    }

    /// The renamed attributes of `entity` (``SimulationSchema/Attribute/renamedFrom``): both keys or neither, a rename
    /// in a version after the attribute's own and at most the schema's, and an original name that no other attribute
    /// or relationship of the entity has (in any version: so renames never chain) and that is not the new name.
    func renames(of entity: SimulationSchema.Entity, _ entityPath: String, schema: SimulationSchema) throws(ScenarioError) {
        for (i, attribute) in entity.attributes.enumerated() {
            let path = "\(entityPath).attributes[\(i)]"
            switch (attribute.renamedFrom, attribute.renamedSince) {
            case (nil, nil):
                continue
            case (nil, _?):
                throw fail("\(path).renamedSince", "renamedSince needs renamedFrom (the name '\(attribute.name)' had before)")
            case (_?, nil):
                throw fail("\(path).renamedFrom", "renamedFrom needs renamedSince (the schema version that renamed '\(attribute.name)')")
            case let (original?, since?):
                try identifier(original, "\(path).renamedFrom")
                if original == attribute.name { throw fail("\(path).renamedFrom", "'\(original)' is the attribute's own name") }
                guard attribute.since < schema.version else {
                    throw fail("\(path).renamedFrom", "'\(attribute.name)' appears in schema version \(attribute.since), the newest, so it has no "
                        + "earlier name to rename: no version calls it '\(original)'")
                }
                try range(since, "\(path).renamedSince", (attribute.since + 1)...schema.version)
                let others = entity.attributes.enumerated().filter { $0.offset != i }.flatMap { [$0.element.name] + ($0.element.renamedFrom.map { [$0] } ?? []) }
                    + entity.relationships.map(\.name)
                if others.contains(original) {
                    throw fail("\(path).renamedFrom", "'\(original)' clashes with another attribute or relationship of \(entity.name) of that name "
                        + "(in some version)")
                }
            }
        }
    }

    // MARK: Stores and devices

    func stores(_ stores: [Scenario.Store], schema: SimulationSchema) throws(ScenarioError) {
        guard !stores.isEmpty else { throw fail("stores", "must not be empty") }
        var names: [String] = []
        var owner: [String: String] = [:]
        for (index, store) in stores.enumerated() {
            let path = "stores[\(index)]"
            try name(store.name, "\(path).name")
            if names.contains(store.name) { throw fail("\(path).name", "store '\(store.name)' is declared twice") }
            names.append(store.name)
            if store.kind != .appGroup && store.synced != (store.kind == .synced) {
                throw fail("\(path).synced", "only app-group stores choose whether they sync")
            }
            guard !store.entities.isEmpty else { throw fail("\(path).entities", "must not be empty") }
            for (i, entityName) in store.entities.enumerated() {
                let entityPath = "\(path).entities[\(i)]"
                guard let entity = schema.entity(named: entityName) else {
                    throw fail(entityPath, "no entity '\(entityName)' in the schema (known: \(schema.entities.map(\.name).joined(separator: ", ")))")
                }
                if let other = owner[entityName] { throw fail(entityPath, "entity '\(entityName)' is already in store '\(other)'") }
                owner[entityName] = store.name
                if store.isSynced {
                    for attribute in entity.attributes where !attribute.optional && attribute.defaultValue == nil {
                        throw fail(entityPath, "\(entityName).\(attribute.name) is synced, so it must be optional or have a default")
                    }
                }
            }
        }
        for (index, store) in stores.enumerated() {
            for entityName in store.entities {
                for relationship in schema.entity(named: entityName)?.relationships ?? [] where owner[relationship.destination] != store.name {
                    throw fail("stores[\(index)].entities", "\(entityName).\(relationship.name) points to '\(relationship.destination)', which is not in store '\(store.name)' (relationships stay within one store)")
                }
            }
        }
    }

    func devices(_ devices: [Scenario.Device], stores: [Scenario.Store], schema: SimulationSchema, storage: Scenario.Storage = .memory,
                 reopenWeight: Int = 0) throws(ScenarioError) {
        guard !devices.isEmpty else { throw fail("devices", "must not be empty") }
        guard devices.count <= Scenario.Limits.devices else { throw fail("devices", "at most \(Scenario.Limits.devices) devices") }
        var names: [String] = []
        for (index, device) in devices.enumerated() {
            let path = "devices[\(index)]"
            try name(device.name, "\(path).name")
            if names.contains(device.name) { throw fail("\(path).name", "device '\(device.name)' is declared twice") }
            names.append(device.name)
            try range(device.schemaVersion, "\(path).schemaVersion", 1...schema.version)
            if let version = device.extensionSchemaVersion {
                try range(version, "\(path).extensionSchemaVersion", 1...schema.version)
                let shared = device.stores.compactMap { name in stores.first { $0.name == name } }.filter { $0.kind == .appGroup }
                guard !shared.isEmpty else {
                    throw fail("\(path).extensionSchemaVersion", "the device opens no app-group store (only app-group stores have an extension)")
                }
                for store in shared where !store.entities.contains(where: { (schema.entity(named: $0)?.since ?? 1) <= version }) {
                    throw fail("\(path).extensionSchemaVersion", "store '\(store.name)' has no entity in schema version \(version)")
                }
                // Two app versions on one local app-group file would declare a renamed attribute's column under two
                // names: the newer process renames it under the older one, which is not supported (SchemaEvolution).
                for store in shared where !store.isSynced {
                    for entityName in store.entities {
                        for attribute in schema.entity(named: entityName)?.attributes ?? []
                        where attribute.appName(version: version) != attribute.appName(version: device.schemaVersion) {
                            throw fail("\(path).extensionSchemaVersion", "the app (v\(device.schemaVersion)) and the extension (v\(version)) "
                                + "share the local app-group store '\(store.name)', but only one of them calls \(entityName).\(attribute.name) "
                                + "'\(attribute.name)': a column renamed while another app version has the file open is not supported")
                        }
                    }
                }
            }
            if let upgrade = device.upgrade {
                try upgradeChecks(upgrade, device: device, path, stores: stores, storage: storage, reopenWeight: reopenWeight)
            }
            guard !device.stores.isEmpty else { throw fail("\(path).stores", "must not be empty") }
            var listed: [String] = []
            for (i, storeName) in device.stores.enumerated() {
                let storePath = "\(path).stores[\(i)]"
                guard let store = stores.first(where: { $0.name == storeName }) else {
                    throw fail(storePath, "no store '\(storeName)' (declared: \(stores.map(\.name).joined(separator: ", ")))")
                }
                if listed.contains(storeName) { throw fail(storePath, "store '\(storeName)' is listed twice") }
                if !store.entities.contains(where: { (schema.entity(named: $0)?.since ?? 1) <= device.schemaVersion }) {
                    throw fail(storePath, "store '\(storeName)' has no entity in schema version \(device.schemaVersion)")
                }
                listed.append(storeName)
            }
        }
    }

    /// An app update during the run (``Scenario/Upgrade``): from an older version than the device's, at a step of the
    /// run, on a device whose stores are files (a container reopened keeps only what its files hold) and whose
    /// extension runs the app's version; not with the reopen operation (its writes while sync is off are
    /// acknowledged later in the layout they were made in).
    func upgradeChecks(_ upgrade: Scenario.Upgrade, device: Scenario.Device, _ path: String, stores: [Scenario.Store],
                       storage: Scenario.Storage, reopenWeight: Int) throws(ScenarioError) {
        try range(upgrade.fromVersion, "\(path).upgrade.fromVersion", 1...max(1, device.schemaVersion - 1))
        guard upgrade.fromVersion < device.schemaVersion else {
            throw fail("\(path).upgrade.fromVersion", "the device runs schema version \(device.schemaVersion) after the update, so it must start at an older one")
        }
        try range(upgrade.atStep, "\(path).upgrade.atStep", Scenario.Limits.steps)
        if device.extensionSchemaVersion != nil {
            throw fail("\(path).upgrade", "a device whose extension runs another version (extensionSchemaVersion) cannot be updated during the run")
        }
        for storeName in device.stores {
            guard let store = stores.first(where: { $0.name == storeName }) else { continue }
            if !(storage == .file || store.kind == .appGroup) {
                throw fail("\(path).upgrade", "store '\(storeName)' is in memory: an update reopens the container, so its stores must be files (\"storage\": \"file\")")
            }
        }
        if reopenWeight > 0 {
            throw fail("\(path).upgrade", "an update during the run cannot be combined with the reopen operation (workload.reopen)")
        }
    }

    // MARK: Workload, faults, timing

    func workload(_ workload: Scenario.Workload) throws(ScenarioError) {
        for (key, path) in Scenario.Workload.weightFields { try range(workload[keyPath: path], "workload.\(key)", Scenario.Limits.weight) }
        try range(workload.maxFieldsPerUpdate, "workload.maxFieldsPerUpdate", Scenario.Limits.maxFieldsPerUpdate)
        try range(workload.uniqueKeys, "workload.uniqueKeys", Scenario.Limits.uniqueKeys)
        try range(workload.nullPercent, "workload.nullPercent", Scenario.Limits.nullPercent)
        try range(workload.largeAssetPercent, "workload.largeAssetPercent", Scenario.Limits.largeAssetPercent)
        if workload.insert == 0 { throw fail("workload.insert", "must be positive (nothing else can happen without inserts)") }
    }

    func faults(_ faults: Scenario.Faults) throws(ScenarioError) {
        for (key, path) in Scenario.Faults.rateFields { try range(faults[keyPath: path], "faults.\(key)", Scenario.Limits.rate) }
        try range(faults.maxClockSkewMs, "faults.maxClockSkewMs", Scenario.Limits.clockMs)
        try range(faults.maxClockJumpMs, "faults.maxClockJumpMs", Scenario.Limits.clockMs)
        let limit = Scenario.Limits.ratesSum
        if faults.stepRates.reduce(0, +) > limit { throw fail("faults", "the per-step fault rates (crash … resetZone) add up to more than \(limit)") }
        if faults.messageRates.reduce(0, +) > limit { throw fail("faults", "the per-message fault rates (dropRequest … staleFetch) add up to more than \(limit)") }
        if faults.cloudRates.reduce(0, +) > limit { throw fail("faults", "the per-request cloud fault rates (rateLimit … partialFailure) add up to more than \(limit)") }
    }

    func timing(_ timing: Scenario.Timing) throws(ScenarioError) {
        for (key, path, limits) in Scenario.Limits.timing { try range(timing[keyPath: path], "timing.\(key)", limits) }
    }
}
