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
    public struct Workload: Codable, Hashable, Sendable {
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
        /// Attributes one update changes, at most.
        public var maxFieldsPerUpdate = 2
        /// Size of the pool of unique-key values (smaller: more collisions).
        public var uniqueKeys = 4
        /// Percentage of optional attribute writes that write null.
        public var nullPercent = 10
        public init() {}

        var weights: [Int] { [insert, update, delete, reinsert, relationshipEdit, uniqueCollision, encryptedEdit] }
    }

    /// Fault rates: per chaos step, per message, per cloud request.
    public struct Faults: Codable, Hashable, Sendable {
        // Per chaos step (the rest of the steps are workload operations).
        public var crash = 0.02
        public var offline = 0.02
        public var partition = 0.01
        public var clockJump = 0.01
        public var expireTokens = 0.005
        public var resetZone = 0.002
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

        var stepRates: [Double] { [crash, offline, partition, clockJump, expireTokens, resetZone] }
        var messageRates: [Double] { [dropRequest, dropResponse, duplicateRequest, duplicateResponse, delay, staleFetch] }
        var cloudRates: [Double] { [rateLimit, quota, zoneBusy, conflict, partialFailure] }
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

    /// The store called `name`.
    public func store(named name: String) -> Store? { stores.first { $0.name == name } }

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

// MARK: - Parsing

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
        let allowed = text.unicodeScalars.allSatisfy { ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "-" || $0 == "_" }
        guard !text.isEmpty, text.utf8.count <= 48, allowed else {
            throw fail(path, "'\(text)' is not a valid name (1 to 48 letters, digits, '-' or '_')")
        }
        return text
    }

    mutating func scenario(_ root: Any, defaultName: String) throws(ScenarioError) -> Scenario {
        let object = try self.object(root, "", allowed: ["name", "description", "schema", "stores", "devices", "storage",
                                                          "workload", "faults", "timing", "expect", "steps"])
        let name = try object["name"].map { v throws(ScenarioError) in try self.name(v, "name") } ?? defaultName
        let description = try object["description"].map { v throws(ScenarioError) in try string(v, "description") } ?? ""
        guard let schemaValue = object["schema"] else { throw fail("schema", "missing (a seed schema name, a list of them, or an inline schema)") }
        let (seeds, schema) = try self.schema(schemaValue, "schema")
        let stores = try self.stores(object["stores"], schema: schema)
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
        let steps = try int(stepsValue, "steps", in: 1...100_000)
        return Scenario(name: name, description: description, schemaSeeds: seeds, schema: schema, stores: stores, devices: devices,
                        storage: storage, workload: workload, faults: faults, timing: timing, expect: expect, steps: steps)
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
        let version = try object["version"].map { v throws(ScenarioError) in try int(v, join(path, "version"), in: 1...1000) } ?? 1
        var entities: [SimulationSchema.Entity] = []
        for (index, item) in try array(object["entities"], join(path, "entities")).enumerated() {
            entities.append(try entity(item, "\(join(path, "entities"))[\(index)]", version: version))
        }
        let schema = SimulationSchema(version: version, entities: entities)
        try checkSchema(schema, path)
        return ([], schema)
    }

    func entity(_ value: Any, _ path: String, version: Int) throws(ScenarioError) -> SimulationSchema.Entity {
        let object = try self.object(value, path, allowed: ["name", "attributes", "relationships", "since"])
        let name = try identifier(object["name"], join(path, "name"))
        let since = try object["since"].map { v throws(ScenarioError) in try int(v, join(path, "since"), in: 1...version) } ?? 1
        var attributes: [SimulationSchema.Attribute] = []
        for (index, item) in try array(object["attributes"], join(path, "attributes")).enumerated() {
            attributes.append(try attribute(item, "\(join(path, "attributes"))[\(index)]", version: version, entitySince: since))
        }
        var relationships: [SimulationSchema.Relationship] = []
        if let list = object["relationships"] {
            for (index, item) in try array(list, join(path, "relationships"), nonEmpty: false).enumerated() {
                relationships.append(try relationship(item, "\(join(path, "relationships"))[\(index)]", version: version, entitySince: since))
            }
        }
        return SimulationSchema.Entity(name, attributes: attributes, relationships: relationships, since: since)
    }

    func identifier(_ value: Any?, _ path: String) throws(ScenarioError) -> String {
        let text = try string(value, path)
        guard let first = text.unicodeScalars.first, text.utf8.count <= 64,
              (first >= "a" && first <= "z") || (first >= "A" && first <= "Z") || first == "_",
              text.unicodeScalars.allSatisfy({ ($0 >= "a" && $0 <= "z") || ($0 >= "A" && $0 <= "Z") || ($0 >= "0" && $0 <= "9") || $0 == "_" }),
              !text.lowercased().hasPrefix("replica_"), text != "id" else {
            throw fail(path, "'\(text)' is not a valid identifier (a letter or '_', then letters, digits or '_'; not 'id' or 'replica_…')")
        }
        return text
    }

    func attribute(_ value: Any, _ path: String, version: Int, entitySince: Int) throws(ScenarioError) -> SimulationSchema.Attribute {
        let object = try self.object(value, path, allowed: ["name", "type", "optional", "default", "options", "since"])
        let name = try identifier(object["name"], join(path, "name"))
        let typeText = try string(object["type"], join(path, "type"))
        let allowedTypes: [Schema.AttributeType] = [.string, .integer, .double, .bool, .date, .data]
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
        let since = try object["since"].map { v throws(ScenarioError) in try int(v, join(path, "since"), in: entitySince...version) } ?? entitySince
        return SimulationSchema.Attribute(name, type, optional: optional, default: defaultValue, options: options, since: since)
    }

    func relationship(_ value: Any, _ path: String, version: Int, entitySince: Int) throws(ScenarioError) -> SimulationSchema.Relationship {
        let object = try self.object(value, path, allowed: ["name", "destination", "inverse", "toMany", "deleteRule", "since"])
        let name = try identifier(object["name"], join(path, "name"))
        let destination = try identifier(object["destination"], join(path, "destination"))
        let inverse = try object["inverse"].map { v throws(ScenarioError) in try identifier(v, join(path, "inverse")) }
        let toMany = try object["toMany"].map { v throws(ScenarioError) in try bool(v, join(path, "toMany")) } ?? false
        var rule = Schema.DeleteRule.nullify
        if let raw = object["deleteRule"] {
            let text = try string(raw, join(path, "deleteRule"))
            let allowed: [Schema.DeleteRule] = [.nullify, .cascade, .noAction]
            guard let parsed = Schema.DeleteRule(rawValue: text), allowed.contains(parsed) else {
                throw fail(join(path, "deleteRule"), "'\(text)' is not one of: nullify, cascade, noAction (deny cannot sync)")
            }
            rule = parsed
        }
        if toMany && inverse == nil { throw fail(join(path, "inverse"), "a to-many relationship needs the name of its to-one inverse") }
        let since = try object["since"].map { v throws(ScenarioError) in try int(v, join(path, "since"), in: entitySince...version) } ?? entitySince
        return SimulationSchema.Relationship(name, to: destination, inverse: inverse, toMany: toMany, deleteRule: rule, since: since)
    }

    func checkSchema(_ schema: SimulationSchema, _ path: String) throws(ScenarioError) {
        var seen: [String] = []
        for (index, entity) in schema.entities.enumerated() {
            let entityPath = "\(path).entities[\(index)]"
            if seen.contains(entity.name) { throw fail("\(entityPath).name", "entity '\(entity.name)' is declared twice") }
            seen.append(entity.name)
            var members: [String] = []
            for (i, attribute) in entity.attributes.enumerated() {
                if members.contains(attribute.name) { throw fail("\(entityPath).attributes[\(i)].name", "'\(attribute.name)' is declared twice") }
                members.append(attribute.name)
            }
            for (i, relationship) in entity.relationships.enumerated() {
                let relationshipPath = "\(entityPath).relationships[\(i)]"
                if members.contains(relationship.name) { throw fail("\(relationshipPath).name", "'\(relationship.name)' is declared twice") }
                members.append(relationship.name)
                guard let destination = schema.entity(named: relationship.destination) else {
                    throw fail("\(relationshipPath).destination", "no entity '\(relationship.destination)' in the schema")
                }
                if let inverse = relationship.inverse {
                    guard let back = destination.relationships.first(where: { $0.name == inverse }), back.destination == entity.name,
                          back.inverse == relationship.name else {
                        throw fail("\(relationshipPath).inverse", "'\(destination.name).\(inverse)' does not exist or does not point back")
                    }
                    if back.toMany && relationship.toMany { throw fail("\(relationshipPath).toMany", "many-to-many relationships are not supported") }
                }
            }
        }
        do {
            try schema.schema().validate()
        } catch {
            throw fail(path, "\(error)")
        }
    }

    // MARK: Stores and devices

    func stores(_ value: Any?, schema: SimulationSchema) throws(ScenarioError) -> [Scenario.Store] {
        var result: [Scenario.Store] = []
        var owner: [String: String] = [:]
        for (index, item) in try array(value, "stores").enumerated() {
            let path = "stores[\(index)]"
            let object = try self.object(item, path, allowed: ["name", "kind", "entities", "synced"])
            let name = try self.name(object["name"], "\(path).name")
            if result.contains(where: { $0.name == name }) { throw fail("\(path).name", "store '\(name)' is declared twice") }
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
                let entityPath = "\(path).entities[\(i)]"
                let entityName = try string(entry, entityPath)
                guard let entity = schema.entity(named: entityName) else {
                    throw fail(entityPath, "no entity '\(entityName)' in the schema (known: \(schema.entities.map(\.name).joined(separator: ", ")))")
                }
                if let other = owner[entityName] { throw fail(entityPath, "entity '\(entityName)' is already in store '\(other)'") }
                owner[entityName] = name
                entities.append(entityName)
                if kind == .synced || (kind == .appGroup && synced) {
                    for attribute in entity.attributes where !attribute.optional && attribute.defaultValue == nil {
                        throw fail(entityPath, "\(entityName).\(attribute.name) is synced, so it must be optional or have a default")
                    }
                }
            }
            result.append(Scenario.Store(name: name, kind: kind, entities: entities, synced: kind == .appGroup ? synced : kind == .synced))
        }
        for (index, store) in result.enumerated() {
            for entityName in store.entities {
                for relationship in schema.entity(named: entityName)?.relationships ?? [] where owner[relationship.destination] != store.name {
                    throw fail("stores[\(index)].entities", "\(entityName).\(relationship.name) points to '\(relationship.destination)', which is not in store '\(store.name)' (relationships stay within one store)")
                }
            }
        }
        return result
    }

    func devices(_ value: Any?, stores: [Scenario.Store], schema: SimulationSchema) throws(ScenarioError) -> [Scenario.Device] {
        var result: [Scenario.Device] = []
        let list = try array(value, "devices")
        guard list.count <= 16 else { throw fail("devices", "at most 16 devices") }
        for (index, item) in list.enumerated() {
            let path = "devices[\(index)]"
            let object = try self.object(item, path, allowed: ["name", "stores", "schemaVersion"])
            let name = try self.name(object["name"], "\(path).name")
            if result.contains(where: { $0.name == name }) { throw fail("\(path).name", "device '\(name)' is declared twice") }
            let version = try object["schemaVersion"].map { v throws(ScenarioError) in
                try int(v, "\(path).schemaVersion", in: 1...schema.version)
            } ?? schema.version
            var names: [String] = []
            let storeList = try object["stores"].map { v throws(ScenarioError) in try array(v, "\(path).stores") } ?? stores.map { $0.name as Any }
            for (i, entry) in storeList.enumerated() {
                let storePath = "\(path).stores[\(i)]"
                let storeName = try string(entry, storePath)
                guard let store = stores.first(where: { $0.name == storeName }) else {
                    throw fail(storePath, "no store '\(storeName)' (declared: \(stores.map(\.name).joined(separator: ", ")))")
                }
                if names.contains(storeName) { throw fail(storePath, "store '\(storeName)' is listed twice") }
                let present = store.entities.filter { (schema.entity(named: $0)?.since ?? 1) <= version }
                if present.isEmpty {
                    throw fail(storePath, "store '\(storeName)' has no entity in schema version \(version)")
                }
                names.append(storeName)
            }
            result.append(Scenario.Device(name: name, stores: names, schemaVersion: version))
        }
        return result
    }

    // MARK: Workload, faults, timing

    func workload(_ value: Any?) throws(ScenarioError) -> Scenario.Workload {
        var workload = Scenario.Workload()
        guard let value else { return workload }
        let keys = ["insert", "update", "delete", "reinsert", "relationshipEdit", "uniqueCollision", "encryptedEdit",
                    "maxFieldsPerUpdate", "uniqueKeys", "nullPercent"]
        let object = try self.object(value, "workload", allowed: keys)
        func read(_ key: String, _ range: ClosedRange<Int>, _ target: inout Int) throws(ScenarioError) {
            if let raw = object[key] { target = try int(raw, "workload.\(key)", in: range) }
        }
        try read("insert", 0...10_000, &workload.insert)
        try read("update", 0...10_000, &workload.update)
        try read("delete", 0...10_000, &workload.delete)
        try read("reinsert", 0...10_000, &workload.reinsert)
        try read("relationshipEdit", 0...10_000, &workload.relationshipEdit)
        try read("uniqueCollision", 0...10_000, &workload.uniqueCollision)
        try read("encryptedEdit", 0...10_000, &workload.encryptedEdit)
        try read("maxFieldsPerUpdate", 1...16, &workload.maxFieldsPerUpdate)
        try read("uniqueKeys", 1...1_000, &workload.uniqueKeys)
        try read("nullPercent", 0...100, &workload.nullPercent)
        if workload.insert == 0 { throw fail("workload.insert", "must be positive (nothing else can happen without inserts)") }
        return workload
    }

    func faults(_ value: Any?) throws(ScenarioError) -> Scenario.Faults {
        var faults = Scenario.Faults()
        guard let value else { return faults }
        let rateKeys = ["crash", "offline", "partition", "clockJump", "expireTokens", "resetZone", "dropRequest", "dropResponse",
                        "duplicateRequest", "duplicateResponse", "delay", "staleFetch", "rateLimit", "quota", "zoneBusy", "conflict",
                        "partialFailure"]
        let object = try self.object(value, "faults", allowed: rateKeys + ["maxClockSkewMs", "maxClockJumpMs", "none"])
        if let raw = object["none"], try bool(raw, "faults.none") {
            faults = Scenario.Faults.none
        }
        let paths: [String: WritableKeyPath<Scenario.Faults, Double>] = [
            "crash": \.crash, "offline": \.offline, "partition": \.partition, "clockJump": \.clockJump,
            "expireTokens": \.expireTokens, "resetZone": \.resetZone, "dropRequest": \.dropRequest,
            "dropResponse": \.dropResponse, "duplicateRequest": \.duplicateRequest, "duplicateResponse": \.duplicateResponse,
            "delay": \.delay, "staleFetch": \.staleFetch, "rateLimit": \.rateLimit, "quota": \.quota, "zoneBusy": \.zoneBusy,
            "conflict": \.conflict, "partialFailure": \.partialFailure,
        ]
        for key in rateKeys {
            if let raw = object[key] { faults[keyPath: paths[key]!] = try double(raw, "faults.\(key)", in: 0...1) }
        }
        if let raw = object["maxClockSkewMs"] { faults.maxClockSkewMs = try int(raw, "faults.maxClockSkewMs", in: 0...86_400_000) }
        if let raw = object["maxClockJumpMs"] { faults.maxClockJumpMs = try int(raw, "faults.maxClockJumpMs", in: 0...86_400_000) }
        if faults.stepRates.reduce(0, +) > 0.9 { throw fail("faults", "the per-step fault rates (crash … resetZone) add up to more than 0.9") }
        if faults.messageRates.reduce(0, +) > 0.9 { throw fail("faults", "the per-message fault rates (dropRequest … staleFetch) add up to more than 0.9") }
        if faults.cloudRates.reduce(0, +) > 0.9 { throw fail("faults", "the per-request cloud fault rates (rateLimit … partialFailure) add up to more than 0.9") }
        return faults
    }

    func timing(_ value: Any?) throws(ScenarioError) -> Scenario.Timing {
        var timing = Scenario.Timing()
        guard let value else { return timing }
        let paths: [(String, WritableKeyPath<Scenario.Timing, Int>, ClosedRange<Int>)] = [
            ("thinkTimeMs", \.thinkTimeMs, 0...3_600_000), ("latencyMs", \.latencyMs, 1...60_000),
            ("maxDelayMs", \.maxDelayMs, 0...3_600_000), ("timeoutMs", \.timeoutMs, 100...3_600_000),
            ("outageMs", \.outageMs, 1...86_400_000), ("restartMs", \.restartMs, 1...86_400_000),
            ("pushLatencyMs", \.pushLatencyMs, 1...60_000), ("livenessBoundMs", \.livenessBoundMs, 60_000...86_400_000),
            ("digestEvery", \.digestEvery, 1...100_000),
        ]
        let object = try self.object(value, "timing", allowed: paths.map(\.0))
        for (key, path, range) in paths {
            if let raw = object[key] { timing[keyPath: path] = try int(raw, "timing.\(key)", in: range) }
        }
        return timing
    }
}

extension Scenario.Faults {
    /// No faults at all.
    public static var none: Scenario.Faults {
        var faults = Scenario.Faults()
        for path: WritableKeyPath<Scenario.Faults, Double> in [
            \.crash, \.offline, \.partition, \.clockJump, \.expireTokens, \.resetZone, \.dropRequest, \.dropResponse,
            \.duplicateRequest, \.duplicateResponse, \.delay, \.staleFetch, \.rateLimit, \.quota, \.zoneBusy, \.conflict,
            \.partialFailure,
        ] { faults[keyPath: path] = 0 }
        faults.maxClockSkewMs = 0
        faults.maxClockJumpMs = 0
        return faults
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
