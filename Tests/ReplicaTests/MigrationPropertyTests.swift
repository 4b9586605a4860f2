// Random schema histories (attributes added with defaults, attributes and the entity renamed through original names)
// with random data: migrating a version 1 store through every stage gives what a reference model of the history
// predicts.
import Foundation
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

@Suite("Migration property test")
struct MigrationPropertyTests {
    @Test("random add and rename histories with random data migrate to what the reference predicts", arguments: Array(1...24))
    func randomHistory(seed: UInt64) throws {
        var generator = HistoryGenerator(state: seed)
        let types: [Schema.AttributeType] = [.string, .integer, .double, .bool]
        var entityName = "Item"
        var attributes = (0...generator.below(3)).map { i in
            Schema.Attribute(name: "a\(i)", type: types[generator.below(types.count)], isOptional: true)
        }
        var schemas = [Schema(entities: [Schema.Entity(name: entityName, attributes: attributes)], version: Schema.Version(1, 0, 0))]
        // The reference: each row's values by current attribute name.
        var rows: [[String: SQLiteValue]] = (0..<generator.below(6)).map { _ in
            Dictionary(uniqueKeysWithValues: attributes.map { ($0.name, randomValue($0.type, &generator)) })
        }
        let initialRows = rows
        let initialAttributes = attributes
        var counter = 0
        for version in 2...(2 + generator.below(3)) {
            var entityOriginal: String?
            for attribute in attributes.indices { attributes[attribute].originalName = nil }
            for _ in 0..<(1 + generator.below(3)) {
                counter += 1
                switch generator.below(5) {
                case 0, 1:
                    let type = types[generator.below(types.count)]
                    let value = randomValue(type, &generator)
                    attributes.append(Schema.Attribute(name: "f\(counter)", type: type, isOptional: false, defaultValue: value))
                    for i in rows.indices { rows[i]["f\(counter)"] = value }
                case 2, 3:
                    // Rename an attribute not renamed or added in this version.
                    let previous = schemas[schemas.count - 1].entities[0]
                    let candidates = attributes.indices.filter { attributes[$0].originalName == nil && previous.attribute(named: attributes[$0].name) != nil }
                    guard let index = candidates.isEmpty ? nil : candidates[generator.below(candidates.count)] else { continue }
                    let old = attributes[index].name
                    attributes[index].name = "r\(counter)"
                    attributes[index].originalName = old
                    for i in rows.indices { rows[i]["r\(counter)"] = rows[i].removeValue(forKey: old) }
                default:
                    guard entityOriginal == nil else { continue }
                    entityOriginal = entityName
                    entityName = "Item\(counter)"
                }
            }
            schemas.append(Schema(entities: [Schema.Entity(name: entityName, attributes: attributes, originalName: entityOriginal)],
                                  version: Schema.Version(version, 0, 0)))
        }

        let directory = TestDirectory()
        let ids = initialRows.indices.map { UUID(uuid: (0, 0, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, UInt8($0 + 1))) }
        do {
            _ = try ModelContainer(for: schemas[0], configurations: [], environment: directory.environment(seed: 1))
            let db = try rawConnection(directory.storeURL())
            for (row, id) in zip(initialRows, ids) {
                let names = initialAttributes.map(\.name)
                try db.run("INSERT INTO Item (id, \(names.map(quoted).joined(separator: ", "))) VALUES (?\(String(repeating: ", ?", count: names.count)))",
                           [id.sqliteValue] + names.map { row[$0]! })
            }
        }
        let plan = try CheckedMigrationPlan(schemas: schemas, stages: Array(repeating: CheckedMigrationPlan.Stage(), count: schemas.count - 1))
        _ = try ModelContainer(plan: plan, configurations: [], environment: directory.environment(seed: 2), interruption: nil)

        let db = try rawConnection(directory.storeURL(), readOnly: true)
        let history = schemas.map { "\($0.version): \($0.entities[0].name)(\($0.entities[0].attributes.map { "\($0.originalName.map { "\($0)→" } ?? "")\($0.name):\($0.type.rawValue)" }.joined(separator: ", ")))" }
        #expect(try tableNames(in: directory.storeURL()).filter { $0 != "replica_metadata" } == [entityName], "\(history)")
        for attribute in attributes {
            let stored = try db.rows("SELECT \(quoted(attribute.name)) FROM \(quoted(entityName)) ORDER BY id").map(\.[0])
            #expect(stored == rows.map { $0[attribute.name]! }, "\(attribute.name) after \(history)")
        }
        #expect(try db.scalar("SELECT value FROM replica_metadata WHERE key = 'schema_version'") == .text(schemas[schemas.count - 1].version.description))
    }
}
