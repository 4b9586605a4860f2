import Foundation
import Replica

extension Scenario {
    /// Reads and validates the scenario file at `path`.
    /// - Throws: ``ScenarioError`` naming the file, the field and the problem.
    public static func load(path: String) throws(ScenarioError) -> Scenario {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ScenarioError(file: path, field: "(file)", problem: "cannot read the file")
        }
        let base = ((path as NSString).lastPathComponent as NSString).deletingPathExtension
        return try parse(data, file: path, defaultName: base)
    }

    /// Parses and validates scenario JSON.
    /// - Parameters:
    ///   - file: the file name used in errors.
    ///   - defaultName: the name when the file gives none.
    /// - Throws: ``ScenarioError``.
    public static func parse(_ data: Data, file: String, defaultName: String = "scenario") throws(ScenarioError) -> Scenario {
        let root: Any
        do {
            root = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
        } catch {
            let nsError = error as NSError
            var position = ""
            if let index = nsError.userInfo["NSJSONSerializationErrorIndex"] as? Int {
                let prefix = data.prefix(index)
                let line = prefix.filter { $0 == 0x0A }.count + 1
                let column = index - (prefix.lastIndex(of: 0x0A).map { $0 + 1 } ?? 0) + 1
                position = " at line \(line), column \(column)"
            }
            throw ScenarioError(file: file, field: "(file)", problem: "not valid JSON\(position)")
        }
        var reader = ScenarioReader(file: file)
        return try reader.scenario(root, defaultName: defaultName)
    }
}

/// Field-by-field reader of scenario JSON with path-precise errors.
struct ScenarioReader {
    let file: String

    func fail(_ field: String, _ problem: String) -> ScenarioError {
        ScenarioError(file: file, field: field, problem: problem)
    }

    func object(_ value: Any, _ path: String, allowed: [String]) throws(ScenarioError) -> [String: Any] {
        guard let object = value as? [String: Any] else { throw fail(path, "expected an object, found \(kind(of: value))") }
        for key in object.keys.sorted() where !allowed.contains(key) {
            throw fail(join(path, key), "unknown field (allowed here: \(allowed.joined(separator: ", ")))")
        }
        return object
    }

    func kind(of value: Any) -> String {
        switch value {
        case is NSNull: return "null"
        case let number as NSNumber: return isBool(number) ? "a boolean" : "a number"
        case is String: return "a string"
        case is [Any]: return "an array"
        case is [String: Any]: return "an object"
        default: return "\(type(of: value))"
        }
    }

    func join(_ path: String, _ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    func string(_ value: Any?, _ path: String) throws(ScenarioError) -> String {
        guard let value else { throw fail(path, "missing (expected a string)") }
        guard let string = value as? String else { throw fail(path, "expected a string, found \(kind(of: value))") }
        return string
    }

    /// JSON booleans arrive as NSNumbers of type `c` (JSON numbers never do).
    func isBool(_ value: Any) -> Bool {
        if let number = value as? NSNumber { return String(cString: number.objCType) == "c" }
        return false
    }

    func int(_ value: Any, _ path: String, in range: ClosedRange<Int>) throws(ScenarioError) -> Int {
        guard let number = value as? NSNumber, !isBool(value) else { throw fail(path, "expected an integer, found \(kind(of: value))") }
        let double = number.doubleValue
        guard double.rounded() == double, let int = Int(exactly: double) else { throw fail(path, "expected an integer, found \(number)") }
        guard range.contains(int) else { throw fail(path, "\(int) is out of range \(range.lowerBound)...\(range.upperBound)") }
        return int
    }

    func double(_ value: Any, _ path: String, in range: ClosedRange<Double>) throws(ScenarioError) -> Double {
        guard let number = value as? NSNumber, !isBool(value) else { throw fail(path, "expected a number, found \(kind(of: value))") }
        let double = number.doubleValue
        guard double.isFinite, range.contains(double) else { throw fail(path, "\(number) is out of range \(range.lowerBound)...\(range.upperBound)") }
        return double
    }

    func bool(_ value: Any, _ path: String) throws(ScenarioError) -> Bool {
        guard isBool(value), let number = value as? NSNumber else { throw fail(path, "expected true or false, found \(kind(of: value))") }
        return number.boolValue
    }

    func array(_ value: Any?, _ path: String, nonEmpty: Bool = true) throws(ScenarioError) -> [Any] {
        guard let value else { throw fail(path, "missing (expected an array)") }
        guard let array = value as? [Any] else { throw fail(path, "expected an array, found \(kind(of: value))") }
        if nonEmpty && array.isEmpty { throw fail(path, "must not be empty") }
        return array
    }

    func name(_ value: Any?, _ path: String) throws(ScenarioError) -> String {
        let text = try string(value, path)
        try ScenarioChecker(file: file, prefix: "").name(text, path)
        return text
    }

    /// An integer of any size (ranges are the validator's: ``Scenario/validate(file:fieldPrefix:)``).
    func integer(_ value: Any, _ path: String) throws(ScenarioError) -> Int {
        try int(value, path, in: Int.min...Int.max)
    }

    /// A finite number (ranges are the validator's).
    func number(_ value: Any, _ path: String) throws(ScenarioError) -> Double {
        try double(value, path, in: -Double.greatestFiniteMagnitude...Double.greatestFiniteMagnitude)
    }

    /// Reads the JSON's structure (known fields, types, names, enumerations), then runs the checks every scenario
    /// runs (``Scenario/validate(file:fieldPrefix:)``).
    mutating func scenario(_ root: Any, defaultName: String) throws(ScenarioError) -> Scenario {
        let object = try self.object(root, "", allowed: ["name", "description", "schema", "stores", "devices", "storage",
                                                          "workload", "faults", "timing", "expect", "steps", "migration",
                                                          "runtime"])
        let name = try object["name"].map { v throws(ScenarioError) in try self.name(v, "name") } ?? defaultName
        let description = try object["description"].map { v throws(ScenarioError) in try string(v, "description") } ?? ""
        guard let schemaValue = object["schema"] else { throw fail("schema", "missing (a seed schema name, a list of them, or an inline schema)") }
        let (seeds, schema) = try self.schema(schemaValue, "schema")
        let stores = try self.stores(object["stores"])
        let devices = try self.devices(object["devices"], stores: stores, schema: schema)
        var storage = Scenario.Storage.memory
        if let value = object["storage"] {
            let text = try string(value, "storage")
            guard let parsed = Scenario.Storage(rawValue: text) else { throw fail("storage", "'\(text)' is not one of: memory, file") }
            storage = parsed
        }
        let workload = try self.workload(object["workload"])
        let faults = try self.faults(object["faults"])
        let timing = try self.timing(object["timing"])
        var expect = Scenario.Expectations()
        if let value = object["expect"] {
            let fields = try self.object(value, "expect", allowed: ["uniqueKeysDeduplicated", "cloudEncryption"])
            if let v = fields["uniqueKeysDeduplicated"] { expect.uniqueKeysDeduplicated = try bool(v, "expect.uniqueKeysDeduplicated") }
            if let v = fields["cloudEncryption"] { expect.cloudEncryption = try bool(v, "expect.cloudEncryption") }
        }
        guard let stepsValue = object["steps"] else { throw fail("steps", "missing (the number of chaos steps, 1...100000)") }
        let steps = try integer(stepsValue, "steps")
        var scenario = Scenario(name: name, description: description, schemaSeeds: seeds, schema: schema, stores: stores, devices: devices,
                                storage: storage, workload: workload, faults: faults, timing: timing, expect: expect, steps: steps)
        scenario.migration = try object["migration"].map { v throws(ScenarioError) in try migration(v, "migration") }
        scenario.runtime = try object["runtime"].map { v throws(ScenarioError) in try runtime(v, "runtime") }
        try scenario.validate(file: file)
        return scenario
    }

    // MARK: Schema

    func schema(_ value: Any, _ path: String) throws(ScenarioError) -> ([String], SimulationSchema) {
        if let single = value as? String {
            guard let seed = SimulationSchema.seed(named: single) else {
                throw fail(path, "unknown seed schema '\(single)' (built in: \(SimulationSchema.seeds.map(\.name).joined(separator: ", ")))")
            }
            return ([single], seed)
        }
        if let list = value as? [Any] {
            guard !list.isEmpty else { throw fail(path, "must not be empty") }
            var names: [String] = []
            var parts: [SimulationSchema] = []
            for (index, item) in list.enumerated() {
                let itemPath = "\(path)[\(index)]"
                let text = try string(item, itemPath)
                guard let seed = SimulationSchema.seed(named: text) else {
                    throw fail(itemPath, "unknown seed schema '\(text)' (built in: \(SimulationSchema.seeds.map(\.name).joined(separator: ", ")))")
                }
                guard !names.contains(text) else { throw fail(itemPath, "seed schema '\(text)' is listed twice") }
                names.append(text)
                parts.append(seed)
            }
            return (names, SimulationSchema.merging(parts))
        }
        let object = try self.object(value, path, allowed: ["version", "entities"])
        let version = try object["version"].map { v throws(ScenarioError) in try integer(v, join(path, "version")) } ?? 1
        var entities: [SimulationSchema.Entity] = []
        for (index, item) in try array(object["entities"], join(path, "entities")).enumerated() {
            entities.append(try entity(item, "\(join(path, "entities"))[\(index)]"))
        }
        return ([], SimulationSchema(version: version, entities: entities))
    }

    func entity(_ value: Any, _ path: String) throws(ScenarioError) -> SimulationSchema.Entity {
        let object = try self.object(value, path, allowed: ["name", "attributes", "relationships", "since"])
        let name = try identifier(object["name"], join(path, "name"))
        let since = try object["since"].map { v throws(ScenarioError) in try integer(v, join(path, "since")) } ?? 1
        var attributes: [SimulationSchema.Attribute] = []
        for (index, item) in try array(object["attributes"], join(path, "attributes")).enumerated() {
            attributes.append(try attribute(item, "\(join(path, "attributes"))[\(index)]", entitySince: since))
        }
        var relationships: [SimulationSchema.Relationship] = []
        if let list = object["relationships"] {
            for (index, item) in try array(list, join(path, "relationships"), nonEmpty: false).enumerated() {
                relationships.append(try relationship(item, "\(join(path, "relationships"))[\(index)]", entitySince: since))
            }
        }
        return SimulationSchema.Entity(name, attributes: attributes, relationships: relationships, since: since)
    }

    func identifier(_ value: Any?, _ path: String) throws(ScenarioError) -> String {
        let text = try string(value, path)
        try ScenarioChecker(file: file, prefix: "").identifier(text, path)
        return text
    }

    func attribute(_ value: Any, _ path: String, entitySince: Int) throws(ScenarioError) -> SimulationSchema.Attribute {
        let object = try self.object(value, path, allowed: ["name", "type", "optional", "default", "options", "optionsSince", "since",
                                                                   "renamedFrom", "renamedSince", "droppedSince"])
        let name = try identifier(object["name"], join(path, "name"))
        let typeText = try string(object["type"], join(path, "type"))
        let allowedTypes = Scenario.Limits.attributeTypes
        guard let type = Schema.AttributeType(rawValue: typeText), allowedTypes.contains(type) else {
            throw fail(join(path, "type"), "'\(typeText)' is not one of: \(allowedTypes.map(\.rawValue).joined(separator: ", "))")
        }
        let optional = try object["optional"].map { v throws(ScenarioError) in try bool(v, join(path, "optional")) } ?? false
        var defaultValue: SQLiteValue?
        if let raw = object["default"] {
            let field = join(path, "default")
            switch type {
            case .string:
                defaultValue = .text(try string(raw, field))
            case .integer:
                defaultValue = .integer(Int64(try int(raw, field, in: Int(Int32.min)...Int(Int32.max))))
            case .bool:
                defaultValue = .integer(try bool(raw, field) ? 1 : 0)
            case .double, .date:
                defaultValue = .real(try double(raw, field, in: -1e15...1e15))
            default:
                throw fail(field, "a \(type.rawValue) attribute cannot declare a default in a scenario")
            }
        }
        var options: [String] = []
        if let list = object["options"] {
            for (index, item) in try array(list, join(path, "options"), nonEmpty: false).enumerated() {
                let text = try string(item, "\(join(path, "options"))[\(index)]")
                guard SimulationSchema.Attribute.knownOptions.contains(text) else {
                    throw fail("\(join(path, "options"))[\(index)]", "'\(text)' is not one of: \(SimulationSchema.Attribute.knownOptions.joined(separator: ", "))")
                }
                options.append(text)
            }
        }
        var optionsSince: [String: Int]?
        if let raw = object["optionsSince"] {
            let field = join(path, "optionsSince")
            let map = try self.object(raw, field, allowed: SimulationSchema.Attribute.knownOptions)
            optionsSince = [:]
            for key in map.keys.sorted() { optionsSince?[key] = try integer(map[key]!, "\(field).\(key)") }
        }
        let since = try object["since"].map { v throws(ScenarioError) in try integer(v, join(path, "since")) } ?? entitySince
        let renamedFrom = try object["renamedFrom"].map { v throws(ScenarioError) in try identifier(v, join(path, "renamedFrom")) }
        let renamedSince = try object["renamedSince"].map { v throws(ScenarioError) in try integer(v, join(path, "renamedSince")) }
        var attribute = SimulationSchema.Attribute(name, type, optional: optional, default: defaultValue, options: options, optionsSince: optionsSince,
                                                   since: since, renamedFrom: renamedFrom, renamedSince: renamedSince)
        attribute.droppedSince = try object["droppedSince"].map { v throws(ScenarioError) in try integer(v, join(path, "droppedSince")) }
        return attribute
    }

    func relationship(_ value: Any, _ path: String, entitySince: Int) throws(ScenarioError) -> SimulationSchema.Relationship {
        let object = try self.object(value, path, allowed: ["name", "destination", "inverse", "toMany", "deleteRule", "since"])
        let name = try identifier(object["name"], join(path, "name"))
        let destination = try identifier(object["destination"], join(path, "destination"))
        let inverse = try object["inverse"].map { v throws(ScenarioError) in try identifier(v, join(path, "inverse")) }
        let toMany = try object["toMany"].map { v throws(ScenarioError) in try bool(v, join(path, "toMany")) } ?? false
        var rule = Schema.DeleteRule.nullify
        if let raw = object["deleteRule"] {
            let text = try string(raw, join(path, "deleteRule"))
            guard let parsed = Schema.DeleteRule(rawValue: text), Scenario.Limits.deleteRules.contains(parsed) else {
                throw fail(join(path, "deleteRule"), "'\(text)' is not one of: nullify, cascade, noAction (deny cannot sync)")
            }
            rule = parsed
        }
        let since = try object["since"].map { v throws(ScenarioError) in try integer(v, join(path, "since")) } ?? entitySince
        return SimulationSchema.Relationship(name, to: destination, inverse: inverse, toMany: toMany, deleteRule: rule, since: since)
    }

    // MARK: Stores and devices

    func stores(_ value: Any?) throws(ScenarioError) -> [Scenario.Store] {
        var result: [Scenario.Store] = []
        for (index, item) in try array(value, "stores").enumerated() {
            let path = "stores[\(index)]"
            let object = try self.object(item, path, allowed: ["name", "kind", "entities", "synced"])
            let name = try self.name(object["name"], "\(path).name")
            let kindText = try string(object["kind"], "\(path).kind")
            guard let kind = Scenario.StoreKind(rawValue: kindText) else {
                throw fail("\(path).kind", "'\(kindText)' is not one of: local, synced, app-group")
            }
            var synced = true
            if let raw = object["synced"] {
                guard kind == .appGroup else { throw fail("\(path).synced", "only app-group stores choose whether they sync") }
                synced = try bool(raw, "\(path).synced")
            }
            var entities: [String] = []
            for (i, entry) in try array(object["entities"], "\(path).entities").enumerated() {
                entities.append(try string(entry, "\(path).entities[\(i)]"))
            }
            result.append(Scenario.Store(name: name, kind: kind, entities: entities, synced: kind == .appGroup ? synced : kind == .synced))
        }
        return result
    }

    func devices(_ value: Any?, stores: [Scenario.Store], schema: SimulationSchema) throws(ScenarioError) -> [Scenario.Device] {
        var result: [Scenario.Device] = []
        let list = try array(value, "devices")
        guard list.count <= Scenario.Limits.devices else { throw fail("devices", "at most \(Scenario.Limits.devices) devices") }
        for (index, item) in list.enumerated() {
            let path = "devices[\(index)]"
            let object = try self.object(item, path, allowed: ["name", "stores", "schemaVersion", "extensionSchemaVersion", "zoneDeletionPolicy", "upgrade"])
            let name = try self.name(object["name"], "\(path).name")
            let version = try object["schemaVersion"].map { v throws(ScenarioError) in try integer(v, "\(path).schemaVersion") } ?? schema.version
            var names: [String] = []
            let storeList = try object["stores"].map { v throws(ScenarioError) in try array(v, "\(path).stores") } ?? stores.map { $0.name as Any }
            for (i, entry) in storeList.enumerated() { names.append(try string(entry, "\(path).stores[\(i)]")) }
            let extensionVersion = try object["extensionSchemaVersion"].map { v throws(ScenarioError) in try integer(v, "\(path).extensionSchemaVersion") }
            var policy: Scenario.ZoneDeletionChoice?
            if let raw = object["zoneDeletionPolicy"] {
                let text = try string(raw, "\(path).zoneDeletionPolicy")
                guard let parsed = Scenario.ZoneDeletionChoice(rawValue: text) else {
                    throw fail("\(path).zoneDeletionPolicy", "'\(text)' is not one of: \(Scenario.ZoneDeletionChoice.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                // The default is left out, so a scenario that spells it keeps its hash.
                policy = parsed == .keepAndReupload ? nil : parsed
            }
            var upgrade: Scenario.Upgrade?
            if let raw = object["upgrade"] {
                let fields = try self.object(raw, "\(path).upgrade", allowed: ["fromVersion", "atStep"])
                func required(_ key: String) throws(ScenarioError) -> Int {
                    guard let value = fields[key] else { throw fail("\(path).upgrade.\(key)", "missing (expected an integer)") }
                    return try integer(value, "\(path).upgrade.\(key)")
                }
                upgrade = Scenario.Upgrade(fromVersion: try required("fromVersion"), atStep: try required("atStep"))
            }
            result.append(Scenario.Device(name: name, stores: names, schemaVersion: version, extensionSchemaVersion: extensionVersion,
                                          zoneDeletionPolicy: policy, upgrade: upgrade))
        }
        return result
    }

    // MARK: Workload, faults, timing

    func workload(_ value: Any?) throws(ScenarioError) -> Scenario.Workload {
        var workload = Scenario.Workload()
        guard let value else { return workload }
        let fields = Scenario.Workload.weightFields + Scenario.Workload.otherFields
        let object = try self.object(value, "workload", allowed: fields.map(\.0))
        for (key, path) in fields {
            if let raw = object[key] { workload[keyPath: path] = try integer(raw, "workload.\(key)") }
        }
        return workload
    }

    func faults(_ value: Any?) throws(ScenarioError) -> Scenario.Faults {
        var faults = Scenario.Faults()
        guard let value else { return faults }
        let rates = Scenario.Faults.rateFields, clocks = Scenario.Faults.clockFields
        let object = try self.object(value, "faults", allowed: rates.map(\.0) + clocks.map(\.0) + ["none"])
        if let raw = object["none"], try bool(raw, "faults.none") {
            faults = Scenario.Faults.none
        }
        for (key, path) in rates {
            if let raw = object[key] { faults[keyPath: path] = try number(raw, "faults.\(key)") }
        }
        for (key, path) in clocks {
            if let raw = object[key] { faults[keyPath: path] = try integer(raw, "faults.\(key)") }
        }
        return faults
    }

    func timing(_ value: Any?) throws(ScenarioError) -> Scenario.Timing {
        var timing = Scenario.Timing()
        guard let value else { return timing }
        let object = try self.object(value, "timing", allowed: Scenario.Limits.timing.map(\.0))
        for (key, path, _) in Scenario.Limits.timing {
            if let raw = object[key] { timing[keyPath: path] = try integer(raw, "timing.\(key)") }
        }
        return timing
    }
}

extension Scenario.Faults {
    /// No faults at all.
    public static var none: Scenario.Faults {
        var faults = Scenario.Faults()
        for (_, path) in rateFields { faults[keyPath: path] = 0 }
        faults.maxClockSkewMs = 0
        faults.maxClockJumpMs = 0
        return faults
    }
}
