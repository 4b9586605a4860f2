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

@Suite("Many-to-many in synced configurations", .serialized)
struct ManyToManySyncRefusalTests {
    /// `Zed.tags` (to-many) names `Alpha.notes` as its inverse; `Alpha.notes` (to-many) names none. The structural
    /// validator accepts an inverse declared on one side only, and `LinkTable.of(Zed.tags)` sees a to-many inverse:
    /// the pair gets `replica_link_Alpha_notes`, whose links replicate as link sets of `Alpha` records (R17).
    @Test("a many-to-many pair whose inverse is declared only on the side sorting last opens synced, with its link table")
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
        let container = try ModelContainer(for: schema, configurations: [
            ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test")),
        ], environment: environment)
        #expect(try linkTables(try ModelContext(container).connection(for: 0)) == ["replica_link_Alpha_notes"])
        #expect(LinkReplication.tables(of: container.stores[0]).map(\.name) == ["replica_link_Alpha_notes"])
    }

    @Test("the mirror image (inverse declared only on the side sorting first) opens synced too")
    func oneSidedInverseSortingFirst() throws {
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
        let container = try ModelContainer(for: schema, configurations: [ModelConfiguration("synced", cloudKitDatabase: .private("iCloud.test"))],
                                           environment: .seeded(seed: 1, directory: directory))
        #expect(try linkTables(try ModelContext(container).connection(for: 0)) == ["replica_link_Alpha_notes"])
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
        #expect(error?.description.contains("its own inverse") == true)
        let leftovers = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        #expect(leftovers.isEmpty, "\(leftovers)")
    }
}
