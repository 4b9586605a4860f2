import CSQLite
import CSodium
import Foundation
import Testing
@_spi(Simulation) @testable import Replica

private func linkTables(_ db: Connection) throws -> [String] {
    try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'replica_link_%' ORDER BY name").compactMap {
        if case let .text(name) = $0[0] { name } else { nil }
    }
}

private func attr(_ name: String) -> Schema.Attribute { Schema.Attribute(name: name, type: .string, isOptional: true) }

@Suite("Many-to-many refusal in synced stores", .serialized)
struct ManyToManySyncRefusalTests {
    /// `Zed.tags` (to-many) names `Alpha.notes` as its inverse; `Alpha.notes` (to-many) names none. The structural
    /// validator accepts an inverse declared on one side only, `LinkTable.of(Zed.tags)` sees a to-many inverse and
    /// creates `replica_link_Alpha_notes`, but `syncedViolations` only reports a pair from the side that sorts first
    /// ((Alpha, notes)), which has no inverse, so nothing is reported.
    @Test("a many-to-many pair whose inverse is declared only on the side sorting last is refused in a synced store")
    func oneSidedInverseManyToMany() throws {
        let schema = Schema(entities: [
            Schema.Entity(name: "Zed", attributes: [attr("name")], relationships: [
                Schema.Relationship(name: "tags", destination: "Alpha", inverse: "notes", isToMany: true),
            ]),
            Schema.Entity(name: "Alpha", attributes: [attr("label")], relationships: [
                Schema.Relationship(name: "notes", destination: "Zed", inverse: nil, isToMany: true),
            ]),
        ])
        let directory = temporaryTestDirectory("m2m")
        defer { try? FileManager.default.removeItem(at: directory) }
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: directory)
        var tables: [String] = []
        let error = #expect(throws: ReplicaError.self) {
            let container = try ModelContainer(for: schema, configurations: [
                ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test")),
            ], environment: environment)
            tables = try linkTables(try ModelContext(container).connection(for: 0))
        }
        #expect(tables.isEmpty, "synced store got link tables \(tables)")
        #expect(error?.schemaViolations.contains { if case .syncedManyToMany = $0 { true } else { false } } == true)
    }

    @Test("the mirror image (inverse declared only on the side sorting first) is refused")
    func oneSidedInverseSortingFirst() {
        let schema = Schema(entities: [
            Schema.Entity(name: "Alpha", attributes: [attr("label")], relationships: [
                Schema.Relationship(name: "notes", destination: "Zed", inverse: "tags", isToMany: true),
            ]),
            Schema.Entity(name: "Zed", attributes: [attr("name")], relationships: [
                Schema.Relationship(name: "tags", destination: "Alpha", inverse: nil, isToMany: true),
            ]),
        ])
        let directory = temporaryTestDirectory("m2m2")
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, configurations: [ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test"))],
                                   environment: .seeded(seed: 1, directory: directory))
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("synced.store").path))
    }

    @Test("self-referencing many-to-many and the catch-all configuration are refused; nothing is created on disk")
    func selfReferenceAndCatchAll() throws {
        let schema = Schema(entities: [
            Schema.Entity(name: "Person", attributes: [attr("name")], relationships: [
                Schema.Relationship(name: "friends", destination: "Person", inverse: "friends", isToMany: true),
            ]),
            Schema.Entity(name: "Other", attributes: [attr("x")]),
        ])
        let directory = temporaryTestDirectory("self")
        defer { try? FileManager.default.removeItem(at: directory) }
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: schema, configurations: [
                ModelConfiguration("local", schema: Schema(entities: [schema.entity(named: "Other")!])),
                ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test")),
            ], environment: .seeded(seed: 1, directory: directory))
        }
        #expect(error?.schemaViolations == [.syncedManyToMany(entity: "Person", relationship: "friends", inverse: "Person.friends")])
        let leftovers = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        #expect(leftovers.isEmpty, "\(leftovers)")
    }
}
