// Random schema histories (attributes added with defaults, attributes and the entity renamed through original names,
// custom stages whose code fills attributes from others and deletes records matching a predicate, before or after the
// schema change) with random data: migrating a version 1 store through every stage gives what a reference model of
// the history predicts; interrupted at every step of every stage and after every save of a stage's code (as by a crash,
// which leaves the stage's copy of the file behind), the store is exactly the reference before or after that stage,
// its recorded version says which, and the next open finishes at the final reference.
// REPLICA_PROPERTY_SCALE=N runs N times as many histories.
import Foundation
import Synchronization
import Testing
@testable import Replica

/// A small deterministic generator (SplitMix64) for the histories.
private struct HistoryGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
}

/// A value of `type` drawn from `generator`.
private func randomValue(_ type: Schema.AttributeType, _ generator: inout HistoryGenerator) -> SQLiteValue {
    switch type {
    case .integer: .integer(Int64(generator.below(1000)) - 500)
    case .double: .real(Double(generator.below(1000)) / 4)
    case .bool: .integer(Int64(generator.below(2)))
    default: .text("v\(generator.below(10_000))")
    }
}

/// One change a custom stage's code makes to every record, then saves: set `target` to a function of `source`'s value
/// (both of `type`; never idempotent but for bools, so a stage run twice shows), or delete the records whose
/// `attribute` matches a predicate.
private enum StageEdit: Sendable, CustomStringConvertible {
    case fill(target: String, source: String, type: Schema.AttributeType)
    case delete(attribute: String, type: Schema.AttributeType)

    var description: String {
        switch self {
        case let .fill(target, source, _): "\(target) = f(\(source))"
        case let .delete(attribute, _): "delete where p(\(attribute))"
        }
    }

    static func transformed(_ value: SQLiteValue, _ type: Schema.AttributeType) -> SQLiteValue {
        switch (type, value) {
        case let (.bool, .integer(flag)): .integer(1 - flag)
        case let (_, .integer(number)): .integer(number * 2 + 1)
        case let (_, .real(number)): .real(number + 0.5)
        case let (_, .text(text)): .text(text + "!")
        default: value
        }
    }

    static func matches(_ value: SQLiteValue, _ type: Schema.AttributeType) -> Bool {
        switch (type, value) {
        case let (.bool, .integer(flag)): flag == 1
        case let (_, .integer(number)): number < 0
        case let (_, .real(number)): number > 125
        case let (_, .text(text)): text.utf8.reduce(0) { $0 + Int($1) } % 3 == 0
        default: false
        }
    }

    /// Applies the edit to the reference rows (by record ID, in ID order).
    func apply(to rows: inout [(id: UUID, values: [String: SQLiteValue])]) {
        switch self {
        case let .fill(target, source, type):
            for i in rows.indices { rows[i].values[target] = Self.transformed(rows[i].values[source]!, type) }
        case let .delete(attribute, type):
            rows.removeAll { Self.matches($0.values[attribute]!, type) }
        }
    }

    /// Makes the edit through a stage's context (whose schema is the stage's old or new one), and saves.
    func run(in context: ModelContext) throws {
        let entity = context.container.schema.entities[0]
        let names = entity.fieldNames
        let rows = try context.connection(for: 0).rows(
            "SELECT id, \(names.map(quoted).joined(separator: ", ")) FROM \(quoted(entity.name)) ORDER BY id")
        for row in rows {
            let id = try UUID(sqliteValue: row[0])
            var values = Array(row.dropFirst())
            switch self {
            case let .fill(target, source, type):
                let index = names.firstIndex(of: target)!
                values[index] = Self.transformed(values[names.firstIndex(of: source)!], type)
                context.registerUpdate(Snapshot(entityName: entity.name, id: id, values: values), fields: [index])
            case let .delete(attribute, type):
                if Self.matches(values[names.firstIndex(of: attribute)!], type) {
                    context.delete(PersistentIdentifier(entityName: entity.name, id: id))
                }
            }
        }
        try context.save()
    }
}

/// Stands for a crash right after the `after`-th save (from 0) of a migration's stage code.
private final class SaveCrash: Sendable {
    let remaining: Mutex<Int>
    init(after save: Int) { remaining = Mutex(save) }
    func saved() throws {
        let crashes = remaining.withLock { count in
            defer { count -= 1 }
            return count == 0
        }
        if crashes { throw MigrationInterrupted() }
    }
}

/// A drawn history: its schemas, the code of each stage, the initial records and the reference state at each version.
private struct History {
    var schemas: [Schema]
    /// The edits of each stage's `willMigrate` and `didMigrate` (each edit saves once).
    var stages: [(will: [StageEdit], did: [StageEdit])]
    var ids: [UUID]
    /// `states[i]`: the records at `schemas[i]` (after stage `i - 1`, or the initial ones).
    var states: [[(id: UUID, values: [String: SQLiteValue])]]
    var description: String
    /// The kinds of change the history makes (for the coverage check): "add", "rename attribute", "rename entity",
    /// "will fill", "will delete", "did fill", "did delete" (a delete only when it removes a record).
    var kinds: Set<String> = []

    init(seed: UInt64) {
        var generator = HistoryGenerator(state: seed)
        let types: [Schema.AttributeType] = [.string, .integer, .double, .bool]
        var entityName = "Item"
        var attributes = (0...generator.below(3)).map { i in
            Schema.Attribute(name: "a\(i)", type: types[generator.below(types.count)], isOptional: true)
        }
        schemas = [Schema(entities: [Schema.Entity(name: entityName, attributes: attributes)], version: Schema.Version(1, 0, 0))]
        ids = (0..<(1 + generator.below(6))).map { UUID(uuid: (0, 0, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, UInt8($0 + 1))) }
        var rows = ids.map { id in (id: id, values: Dictionary(uniqueKeysWithValues: attributes.map { ($0.name, randomValue($0.type, &generator)) })) }
        states = [rows]
        stages = []
        var lines = ["1.0.0: Item(\(attributes.map { "\($0.name):\($0.type.rawValue)" }.joined(separator: ", ")))"]

        /// Up to `count` edits on `attributes`.
        func drawEdits(_ count: Int, on attributes: [Schema.Attribute]) -> [StageEdit] {
            (0..<count).map { _ in
                let target = attributes[generator.below(attributes.count)]
                if generator.below(3) == 0 { return .delete(attribute: target.name, type: target.type) }
                let sources = attributes.filter { $0.type == target.type }
                return .fill(target: target.name, source: sources[generator.below(sources.count)].name, type: target.type)
            }
        }

        var seen: Set<String> = []
        func apply(_ edit: StageEdit, _ when: String, to rows: inout [(id: UUID, values: [String: SQLiteValue])]) {
            let count = rows.count
            edit.apply(to: &rows)
            switch edit {
            case .fill: seen.insert("\(when) fill")
            case .delete: if rows.count < count { seen.insert("\(when) delete") }
            }
        }

        var counter = 0
        for version in 2...(2 + generator.below(3)) {
            let willEdits = drawEdits(generator.below(2), on: attributes)
            for edit in willEdits { apply(edit, "will", to: &rows) }
            var entityOriginal: String?
            for attribute in attributes.indices { attributes[attribute].originalName = nil }
            for _ in 0..<(1 + generator.below(3)) {
                counter += 1
                switch generator.below(5) {
                case 0, 1:
                    let type = types[generator.below(types.count)]
                    let value = randomValue(type, &generator)
                    attributes.append(Schema.Attribute(name: "f\(counter)", type: type, isOptional: false, defaultValue: value))
                    for i in rows.indices { rows[i].values["f\(counter)"] = value }
                    seen.insert("add")
                case 2, 3:
                    // Rename an attribute not renamed or added in this version.
                    let previous = schemas[schemas.count - 1].entities[0]
                    let candidates = attributes.indices.filter { attributes[$0].originalName == nil && previous.attribute(named: attributes[$0].name) != nil }
                    guard let index = candidates.isEmpty ? nil : candidates[generator.below(candidates.count)] else { continue }
                    let old = attributes[index].name
                    attributes[index].name = "r\(counter)"
                    attributes[index].originalName = old
                    for i in rows.indices { rows[i].values["r\(counter)"] = rows[i].values.removeValue(forKey: old) }
                    seen.insert("rename attribute")
                default:
                    guard entityOriginal == nil else { continue }
                    entityOriginal = entityName
                    entityName = "Item\(counter)"
                    seen.insert("rename entity")
                }
            }
            let didEdits = drawEdits(generator.below(3), on: attributes)
            for edit in didEdits { apply(edit, "did", to: &rows) }
            schemas.append(Schema(entities: [Schema.Entity(name: entityName, attributes: attributes, originalName: entityOriginal)],
                                  version: Schema.Version(version, 0, 0)))
            states.append(rows)
            stages.append((willEdits, didEdits))
            let entity = schemas[schemas.count - 1].entities[0]
            lines.append("\(version).0.0: will [\(willEdits.map(\.description).joined(separator: "; "))] "
                         + "\(entity.originalName.map { "\($0)→" } ?? "")\(entity.name)(\(entity.attributes.map { "\($0.originalName.map { "\($0)→" } ?? "")\($0.name):\($0.type.rawValue)" }.joined(separator: ", "))) "
                         + "did [\(didEdits.map(\.description).joined(separator: "; "))]")
        }
        description = lines.joined(separator: "\n")
        kinds = seen
    }

    /// A stage's code making `edits`, `nil` for none; with `crash`, it counts its saves there and throws after one.
    static func code(_ edits: [StageEdit], crash: SaveCrash?) -> (@Sendable (ModelContext) throws -> Void)? {
        guard !edits.isEmpty else { return nil }
        return { context in
            for edit in edits {
                try edit.run(in: context)
                try crash?.saved()
            }
        }
    }

    /// The plan of the history; with `crash`, its stages' code throws after the save it names.
    func plan(crash: SaveCrash? = nil) throws -> CheckedMigrationPlan {
        try CheckedMigrationPlan(schemas: schemas, stages: stages.map {
            CheckedMigrationPlan.Stage(willMigrate: Self.code($0.will, crash: crash), didMigrate: Self.code($0.did, crash: crash))
        })
    }

    /// A version 1 store holding the initial records, in `directory`.
    func makeStore(in directory: TestDirectory) throws {
        _ = try ModelContainer(for: schemas[0], configurations: [], environment: directory.environment(seed: 1))
        let db = try rawConnection(directory.storeURL())
        let names = schemas[0].entities[0].attributes.map(\.name)
        for row in states[0] {
            try db.run("INSERT INTO Item (id, \(names.map(quoted).joined(separator: ", "))) VALUES (?\(String(repeating: ", ?", count: names.count)))",
                       [row.id.sqliteValue] + names.map { row.values[$0]! })
        }
    }

    /// Checks that the store in `directory` is exactly the reference at `schemas[version]`: its recorded version (none
    /// for the first schema, as the store was created without a plan), its one entity table, its records and values.
    func expectStore(in directory: TestDirectory, at version: Int, leftoverCopy: Bool = false, _ comment: String) throws {
        let url = directory.storeURL()
        let db = try rawConnection(url, readOnly: true)
        let recorded = try db.scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'")
        #expect(recorded == (version == 0 ? nil : .text(schemas[version].version.description)), "\(comment)\n\(description)")
        let entity = schemas[version].entities[0]
        #expect(try tableNames(in: url).filter { $0 != "replica_metadata" } == [entity.name], "\(comment)\n\(description)")
        #expect(FileManager.default.fileExists(atPath: url.path + ".migrating") == leftoverCopy, "copy, \(comment)\n\(description)")
        let state = states[version]
        #expect(try db.rows("SELECT id FROM \(quoted(entity.name)) ORDER BY id").map(\.[0]) == state.map(\.id.sqliteValue),
                "records, \(comment)\n\(description)")
        for attribute in entity.attributes {
            let stored = try db.rows("SELECT \(quoted(attribute.name)) FROM \(quoted(entity.name)) ORDER BY id").map(\.[0])
            #expect(stored == state.map { $0.values[attribute.name]! }, "\(attribute.name), \(comment)\n\(description)")
        }
    }
}

/// How many histories each test draws: its default times REPLICA_PROPERTY_SCALE.
private func seeds(_ count: Int) -> [UInt64] {
    let scale = Int(ProcessInfo.processInfo.environment["REPLICA_PROPERTY_SCALE"] ?? "") ?? 1
    return Array(1...UInt64(max(1, count * scale)))
}

@Suite("Migration property test")
struct MigrationPropertyTests {
    @Test("random histories of adds, renames and custom stages with random data migrate to what the reference predicts", arguments: seeds(24))
    func randomHistory(seed: UInt64) throws {
        let history = History(seed: seed)
        let directory = TestDirectory()
        try history.makeStore(in: directory)
        _ = try ModelContainer(plan: history.plan(), configurations: [], environment: directory.environment(seed: 2), interruption: nil)
        try history.expectStore(in: directory, at: history.schemas.count - 1, "migrated")
    }

    @Test("the drawn histories make every kind of change")
    func coverage() {
        let kinds = seeds(24).reduce(into: Set<String>()) { $0.formUnion(History(seed: $1).kinds) }
            .union(seeds(4).reduce(into: Set<String>()) { $0.formUnion(History(seed: $1 + 1000).kinds) })
        #expect(kinds == ["add", "rename attribute", "rename entity", "will fill", "will delete", "did fill", "did delete"])
        let saves = seeds(4).map { History(seed: $0 + 2000).stages.reduce(0) { $0 + $1.will.count + $1.did.count } }
        #expect(saves.filter { $0 > 0 }.count * 2 >= saves.count, "saves of the stages' code in the save-crash histories: \(saves)")
    }

    @Test("a random history interrupted at every step of every stage leaves the store exactly before or after that stage, and the next open finishes it",
          arguments: seeds(4))
    func interruptedAtEveryStep(seed: UInt64) throws {
        let history = History(seed: seed + 1000)
        let plan = try history.plan()
        for stage in history.stages.indices {
            for step in MigrationStep.allCases {
                let directory = TestDirectory()
                try history.makeStore(in: directory)
                let crash = "interrupted at stage \(stage + 1), step \(step)"
                // A crash leaves the stage's copy of the store file as it is at that point: the hook keeps its files
                // aside before throwing, and puts them back after the thrown error cleaned up (but for the step
                // after the copy replaced the store, where there is none left).
                let copy = directory.storeURL().path + ".migrating", kept = directory.url.appendingPathComponent("kept").path
                let suffixes = ["", "-wal", "-shm", "-journal"]
                #expect(throws: MigrationInterrupted(), "\(crash)\n\(history.description)") {
                    _ = try ModelContainer(plan: plan, configurations: [], environment: directory.environment(seed: 2)) { _, index, at in
                        guard index == stage && at == step else { return }
                        for suffix in suffixes where FileManager.default.fileExists(atPath: copy + suffix) {
                            try FileManager.default.copyItem(atPath: copy + suffix, toPath: kept + suffix)
                        }
                        throw MigrationInterrupted()
                    }
                }
                for suffix in suffixes where FileManager.default.fileExists(atPath: kept + suffix) {
                    try FileManager.default.moveItem(atPath: kept + suffix, toPath: copy + suffix)
                }
                try history.expectStore(in: directory, at: step == .replaced ? stage + 1 : stage, leftoverCopy: step != .replaced, crash)
                _ = try ModelContainer(plan: plan, configurations: [], environment: directory.environment(seed: 3), interruption: nil)
                try history.expectStore(in: directory, at: history.schemas.count - 1, "\(crash), then reopened")
            }
        }
    }

    @Test("a random history interrupted right after each save of its stages' code leaves the store exactly before that stage, and the next open finishes it",
          arguments: seeds(4))
    func interruptedAfterEverySave(seed: UInt64) throws {
        let history = History(seed: seed + 2000)
        let plan = try history.plan()
        var save = 0
        for (stage, edits) in history.stages.enumerated() {
            for _ in 0..<(edits.will.count + edits.did.count) {
                let directory = TestDirectory()
                try history.makeStore(in: directory)
                let crash = "interrupted after save \(save) (stage \(stage + 1))"
                #expect(throws: MigrationInterrupted(), "\(crash)\n\(history.description)") {
                    _ = try ModelContainer(plan: history.plan(crash: SaveCrash(after: save)), configurations: [],
                                           environment: directory.environment(seed: 2), interruption: nil)
                }
                try history.expectStore(in: directory, at: stage, crash)
                _ = try ModelContainer(plan: plan, configurations: [], environment: directory.environment(seed: 3), interruption: nil)
                try history.expectStore(in: directory, at: history.schemas.count - 1, "\(crash), then reopened")
                save += 1
            }
        }
    }
}
