// Chains of renames through original names (`given` from `first`, `first` from `last`, `last` from `middle`) and
// cycles of more than two names: made once, with or without a migration plan, and every later open recognises the
// renamed store (never the rename clash check's load issue), keeping every value where it belongs.
import Foundation
import Testing
@testable import Replica

/// A person's names, version 1 (with a nickname version 2 drops).
private enum ChainV1: VersionedSchema {
    static let versionIdentifier = Schema.Version(1, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self, Row.self, Tri.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var first: String = ""
        var last: String = ""
        var middle: String = ""
        var nickname: String = ""
        static let entity = ModelEntity<Person>([
            .attribute("first", \.first, default: ""), .attribute("last", \.last, default: ""),
            .attribute("middle", \.middle, default: ""), .attribute("nickname", \.nickname, default: "", options: .unique),
        ])
    }

    /// Four columns a four-step chain shifts.
    struct Row: PersistentModel, Codable, Equatable {
        static var entityName: String { "Row" }
        var id = UUID.unassigned
        var w: String = ""
        var x: String = ""
        var y: String = ""
        var z: String = ""
        static let entity = ModelEntity<Row>([
            .attribute("w", \.w, default: ""), .attribute("x", \.x, default: ""), .attribute("y", \.y, default: ""),
            .attribute("z", \.z, default: ""),
        ])
    }

    /// Three columns a cycle of three renames rotates.
    struct Tri: PersistentModel, Codable, Equatable {
        static var entityName: String { "Tri" }
        var id = UUID.unassigned
        var a: String = ""
        var b: String = ""
        var c: String = ""
        static let entity = ModelEntity<Tri>([.attribute("a", \.a, default: ""), .attribute("b", \.b, default: ""), .attribute("c", \.c, default: "")])
    }
}

/// Version 2: `given` from `first`, `first` from `last`, `last` from `middle` (the nickname is dropped); `v` from `w`,
/// `w` from `x`, `x` from `y`, `y` from `z`; `a` from `b`, `b` from `c`, `c` from `a`.
private enum ChainV2: VersionedSchema {
    static let versionIdentifier = Schema.Version(2, 0, 0)
    static var models: [any PersistentModel.Type] { [Person.self, Row.self, Tri.self] }

    struct Person: PersistentModel, Codable, Equatable {
        static var entityName: String { "Person" }
        var id = UUID.unassigned
        var given: String = ""
        var first: String = ""
        var last: String = ""
        static let entity = ModelEntity<Person>([
            .attribute("given", \.given, default: "", originalName: "first"),
            .attribute("first", \.first, default: "", originalName: "last"),
            .attribute("last", \.last, default: "", originalName: "middle"),
        ])
    }

    struct Row: PersistentModel, Codable, Equatable {
        static var entityName: String { "Row" }
        var id = UUID.unassigned
        var v: String = ""
        var w: String = ""
        var x: String = ""
        var y: String = ""
        static let entity = ModelEntity<Row>([
            .attribute("v", \.v, default: "", originalName: "w"), .attribute("w", \.w, default: "", originalName: "x"),
            .attribute("x", \.x, default: "", originalName: "y"), .attribute("y", \.y, default: "", originalName: "z"),
        ])
    }

    struct Tri: PersistentModel, Codable, Equatable {
        static var entityName: String { "Tri" }
        var id = UUID.unassigned
        var a: String = ""
        var b: String = ""
        var c: String = ""
        static let entity = ModelEntity<Tri>([
            .attribute("a", \.a, default: "", originalName: "b"), .attribute("b", \.b, default: "", originalName: "c"),
            .attribute("c", \.c, default: "", originalName: "a"),
        ])
    }
}

private enum ChainPlan: SchemaMigrationPlan {
    static var schemas: [any VersionedSchema.Type] { [ChainV1.self, ChainV2.self] }
    static var stages: [MigrationStage] { [.lightweight(fromVersion: ChainV1.self, toVersion: ChainV2.self)] }
}

/// Version 1 of a two-step shift, and version 2: `b` from `a`, `c` from `b`.
private struct PairV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Pair" }
    var id = UUID.unassigned
    var a: String = ""
    var b: String = ""
    static let entity = ModelEntity<PairV1>([.attribute("a", \.a, default: ""), .attribute("b", \.b, default: "")])
}

private struct PairV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Pair" }
    var id = UUID.unassigned
    var b: String = ""
    var c: String = ""
    static let entity = ModelEntity<PairV2>([.attribute("b", \.b, default: "", originalName: "a"), .attribute("c", \.c, default: "", originalName: "b")])
}

@Suite("Rename chains")
struct RenameChainTests {
    let directory = TestDirectory()

    private func columns(_ table: String) throws -> Set<String> {
        Set(try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT name FROM pragma_table_info(?)", [.text(table)]).compactMap { row in
            if case let .text(name) = row[0] { return name } else { return nil }
        })
    }

    private func seedV1(_ schema: Schema) throws {
        let container = try ModelContainer(for: schema, migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        context.insert(ChainV1.Person(first: "Ada", last: "Lovelace", middle: "King", nickname: "ada"))
        context.insert(ChainV1.Row(w: "W", x: "X", y: "Y", z: "Z"))
        if schema.entity(named: "Tri") != nil { context.insert(ChainV1.Tri(a: "A", b: "B", c: "C")) }
        try context.save()
    }

    private func people(_ container: ModelContainer) throws -> [String] {
        try ModelContext(container).fetch(ChainV2.Person.self).map { "given=\($0.given) first=\($0.first) last=\($0.last)" }
    }

    private func rows(_ container: ModelContainer) throws -> [String] {
        try ModelContext(container).fetch(ChainV2.Row.self).map { "\($0.v) \($0.w) \($0.x) \($0.y)" }
    }

    @Test("a three-step and a four-step chain without a plan are renamed on the first open, and reopened twice keep every value (no clash)")
    func chainsWithoutPlan() throws {
        try seedV1(Schema([ChainV1.Person.self, ChainV1.Row.self]))
        for seed in UInt64(2)...4 {
            let container = try ModelContainer(for: Schema([ChainV2.Person.self, ChainV2.Row.self]), migrationPlan: nil, configurations: [],
                                               environment: directory.environment(seed: seed))
            #expect(try people(container).contains("given=Ada first=Lovelace last=King"), "open \(seed - 1)")
            #expect(try people(container).count == Int(seed) - 1, "open \(seed - 1)")
            #expect(try rows(container) == ["W X Y Z"], "open \(seed - 1)")
            let context = ModelContext(container)
            context.insert(ChainV2.Person(given: "G\(seed)", first: "F\(seed)", last: "L\(seed)"))
            try context.save()
        }
        let container = try ModelContainer(for: Schema([ChainV2.Person.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 9))
        #expect(try Set(people(container)) == ["given=Ada first=Lovelace last=King", "given=G2 first=F2 last=L2", "given=G3 first=F3 last=L3", "given=G4 first=F4 last=L4"])
        #expect(try columns("Person").isSuperset(of: ["id", "given", "first", "last"]))
        #expect(try !columns("Person").contains("middle"))
        #expect(try columns("Row") == ["id", "v", "w", "x", "y"])
    }

    @Test("chains and a cycle of three in a lightweight stage are renamed once; reopened twice with and twice without the plan they keep every value")
    func chainsAndCycleWithPlan() throws {
        try seedV1(ChainV1.schema)
        func tris(_ container: ModelContainer) throws -> [String] {
            try ModelContext(container).fetch(ChainV2.Tri.self).map { "a=\($0.a) b=\($0.b) c=\($0.c)" }
        }
        let opens: [(plan: (any SchemaMigrationPlan.Type)?, seed: UInt64)] = [(ChainPlan.self, 2), (ChainPlan.self, 3), (ChainPlan.self, 4), (nil, 5), (nil, 6)]
        for open in opens {
            let container = try ModelContainer(for: ChainV2.schema, migrationPlan: open.plan, configurations: [], environment: directory.environment(seed: open.seed))
            #expect(try people(container) == ["given=Ada first=Lovelace last=King"], "open \(open.seed - 1)")
            #expect(try rows(container) == ["W X Y Z"], "open \(open.seed - 1)")
            #expect(try tris(container) == ["a=B b=C c=A"], "open \(open.seed - 1)")
        }
        #expect(try columns("Person") == ["id", "given", "first", "last"])
        #expect(try columns("Row") == ["id", "v", "w", "x", "y"])
        #expect(try columns("Tri") == ["id", "a", "b", "c"])
        #expect(try rawConnection(directory.storeURL(), readOnly: true).rows("SELECT value FROM replica_metadata WHERE key = 'schema_version'").map(\.[0]) == [.text("2.0.0")])
    }

    @Test("a two-step shift without a plan is renamed once and reopened twice keeps its values")
    func twoStepShift() throws {
        do {
            let container = try ModelContainer(for: Schema([PairV1.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: 1))
            let context = ModelContext(container)
            context.insert(PairV1(a: "A", b: "B"))
            try context.save()
        }
        for seed in UInt64(2)...4 {
            let container = try ModelContainer(for: Schema([PairV2.self]), migrationPlan: nil, configurations: [], environment: directory.environment(seed: seed))
            #expect(try ModelContext(container).fetch(PairV2.self).map { "b=\($0.b) c=\($0.c)" } == ["b=A c=B"], "open \(seed - 1)")
        }
    }
}
