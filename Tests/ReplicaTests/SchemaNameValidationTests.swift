// SQL names: every identifier Replica derives from a schema must name one table, column or index of its own, as SQLite
// compares identifiers (ignoring ASCII letter case), and must fit SQLite's limits — checked by `Schema.validate()`
// and by the container before any SQL runs.
import Foundation
import Testing
@testable import Replica

/// Two entities whose names differ only in case.
private struct CasedNote: PersistentModel, Codable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<CasedNote>([.attribute("text", \.text, default: "")])
}

private struct LowerNote: PersistentModel, Codable {
    static var entityName: String { "note" }
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<LowerNote>([.attribute("text", \.text, default: "")])
}

/// A model with `count` integer fields `f0`, `f1`, … stored in one array (read by position).
private struct Wide: PersistentModel {
    static let count = SchemaValidator.maximumStoredFields
    var id = UUID.unassigned
    var values = [Int](repeating: 0, count: Wide.count)
    static let entity = ModelEntity<Wide>((0..<count).map { .attribute("f\($0)", \Wide.values[$0], default: 0) })
    init() {}
    init(row: ModelRow) throws {
        id = row.id
        values = try (0..<Self.count).map { try row.decode(Int.self, at: $0) }
    }
}

private func string(_ name: String) -> Schema.Attribute { Schema.Attribute(name: name, type: .string, isOptional: true) }

private func violations(_ entities: [Schema.Entity]) -> [SchemaViolation] {
    do {
        try Schema(entities: entities).validate()
        return []
    } catch let error as SchemaValidationError {
        return error.violations
    } catch {
        Issue.record("unexpected \(error)")
        return []
    }
}

@Suite("Schema names: SQL identifiers and limits")
struct SchemaNameValidationTests {
    let directory = TestDirectory()

    @Test("entities whose names differ only in letter case are refused before any table is created (they would share one)")
    func entityNamesIgnoringCase() throws {
        #expect(violations([CasedNote.schemaEntity, LowerNote.schemaEntity]) == [.entityNameCollision(entity: "note", other: "Note")])
        let error = #expect(throws: ReplicaError.self) {
            _ = try ModelContainer(for: CasedNote.self, LowerNote.self, environment: directory.environment())
        }
        #expect(error?.schemaViolations == [.entityNameCollision(entity: "note", other: "Note")])
        // Refused before any SQL ran: no store file was created.
        #expect(!FileManager.default.fileExists(atPath: directory.storeURL().path))
        // The description names both entities and the rule.
        let description = SchemaViolation.entityNameCollision(entity: "note", other: "Note").description
        #expect(description.contains("'note'") && description.contains("'Note'") && description.contains("letter case"))
    }

    @Test("an attribute ID beside the record ID id, or two members differing in case, is refused")
    func memberNamesIgnoringCase() {
        let entity = Schema.Entity(name: "Trip", attributes: [string("ID"), string("title"), string("Title")],
                                   relationships: [Schema.Relationship(name: "TITLE", destination: "Trip", isToMany: false)])
        #expect(violations([entity]) == [
            .memberNameCollision(entity: "Trip", member: "ID", other: "id"),
            .memberNameCollision(entity: "Trip", member: "Title", other: "title"),
            .memberNameCollision(entity: "Trip", member: "TITLE", other: "title"),
        ])
        // Exact duplicates keep their own violation.
        #expect(violations([Schema.Entity(name: "Trip", attributes: [string("id"), string("a"), string("a")])]) == [
            .duplicateMember(entity: "Trip", member: "id"), .duplicateMember(entity: "Trip", member: "a"),
        ])
    }

    @Test("entity names SQLite or Replica reserve are refused: sqlite_ and replica_ in any letter case")
    func reservedPrefixes() {
        #expect(violations([Schema.Entity(name: "sqlite_stat1", attributes: [])]) == [.reservedEntityName(entity: "sqlite_stat1", prefix: "sqlite_")])
        #expect(violations([Schema.Entity(name: "SQLite_things", attributes: [])]) == [.reservedEntityName(entity: "SQLite_things", prefix: "sqlite_")])
        #expect(violations([Schema.Entity(name: "Replica_metadata", attributes: [])]) == [.invalidName("Replica_metadata")])
        #expect(violations([Schema.Entity(name: "A", attributes: [string("replica_live")])]) == [.invalidName("replica_live")])
        // A name that merely contains the prefixes is fine.
        #expect(violations([Schema.Entity(name: "my_sqlite_replica_notes", attributes: [string("sqlite_version")])]).isEmpty)
    }

    @Test("empty names, quotes, NUL bytes, spaces, non-ASCII and names over 64 bytes are refused")
    func malformedNames() {
        for name in ["", "quote\"d", "it's", "nul\0byte", "two words", "semi;colon", "Ünïcode", "1st", String(repeating: "a", count: 65)] {
            #expect(violations([Schema.Entity(name: name, attributes: [])]) == [.invalidName(name)], "\(name.debugDescription)")
            #expect(violations([Schema.Entity(name: "A", attributes: [string(name)])]) == [.invalidName(name)], "\(name.debugDescription)")
        }
        #expect(violations([Schema.Entity(name: String(repeating: "E", count: 64), attributes: [string(String(repeating: "a", count: 64))])]).isEmpty)
    }

    @Test("an index name derived from a relationship that equals one of Replica's own tables is refused")
    func derivedNameEqualsInternalTable() {
        // `replica_<Entity>_<relationship>` for entity `sync`, relationship `record` is the sync ledger's table.
        let sync = Schema.Entity(name: "sync", attributes: [], relationships: [Schema.Relationship(name: "record", destination: "sync", isToMany: false)])
        #expect(violations([sync]) == [.sqlNameCollision(entity: "sync", member: "record", name: "replica_sync_record")])
        let history = Schema.Entity(name: "History", attributes: [],
                                    relationships: [Schema.Relationship(name: "Transaction", destination: "History", isToMany: false)])
        #expect(violations([history]) == [.sqlNameCollision(entity: "History", member: "Transaction", name: "replica_History_Transaction")])
    }

    @Test("index and link-table names that two parts of a schema derive alike are refused")
    func derivedNamesCollide() {
        // Entity `A`, relationship `b_c` and entity `A_b`, relationship `c` both give the index `replica_A_b_c`.
        let a = Schema.Entity(name: "A", attributes: [], relationships: [Schema.Relationship(name: "b_c", destination: "A", isToMany: false)])
        let ab = Schema.Entity(name: "A_b", attributes: [], relationships: [Schema.Relationship(name: "c", destination: "A", isToMany: false)])
        #expect(violations([a, ab]) == [.sqlNameCollision(entity: "A_b", member: "c", name: "replica_A_b_c")])

        // A relationship named like a uniqueness constraint's index.
        let unique = Schema.Entity(name: "U", attributes: [string("key")],
                                   relationships: [Schema.Relationship(name: "unique0", destination: "U", isToMany: false)],
                                   uniquenessConstraints: [["key"]])
        #expect(violations([unique]) == [.sqlNameCollision(entity: "U", member: "key", name: "replica_U_unique0")])

        // Two many-to-many pairs whose owners derive the same link table, and an index that equals a link table.
        func manyToMany(_ entity: String, _ relationship: String, _ other: String, _ inverse: String) -> [Schema.Entity] {
            [Schema.Entity(name: entity, attributes: [], relationships: [Schema.Relationship(name: relationship, destination: other, inverse: inverse, isToMany: true)]),
             Schema.Entity(name: other, attributes: [], relationships: [Schema.Relationship(name: inverse, destination: entity, inverse: relationship, isToMany: true)])]
        }
        #expect(violations(manyToMany("A", "b_c", "X", "xs") + manyToMany("A_b", "c", "Y", "ys")) == [
            .sqlNameCollision(entity: "A_b", member: "c", name: "replica_link_A_b_c"),
            .sqlNameCollision(entity: "A_b", member: "c", name: "replica_link_A_b_c_member"),
        ])
        let link = Schema.Entity(name: "link", attributes: [], relationships: [Schema.Relationship(name: "A_b_c", destination: "link", isToMany: false)])
        #expect(violations(manyToMany("A", "b_c", "X", "xs") + [link]) == [.sqlNameCollision(entity: "A", member: "b_c", name: "replica_link_A_b_c")])
    }

    @Test("an entity with more stored fields than SQLite's column limit is refused; one at the limit stores, queries and saves")
    func columnLimit() throws {
        let limit = SchemaValidator.maximumStoredFields
        #expect(limit == 1_998)
        let tooWide = Schema.Entity(name: "TooWide", attributes: (0...limit).map { string("f\($0)") })
        #expect(violations([tooWide]) == [.tooManyColumns(entity: "TooWide", count: limit + 1, limit: limit)])
        // References count too.
        let withReference = Schema.Entity(name: "TooWide", attributes: (0..<limit).map { string("f\($0)") },
                                          relationships: [Schema.Relationship(name: "next", destination: "TooWide", isToMany: false)])
        #expect(violations([withReference]) == [.tooManyColumns(entity: "TooWide", count: limit + 1, limit: limit)])

        let container = try ModelContainer(for: Wide.self, environment: directory.environment())
        let context = ModelContext(container)
        var wide = Wide()
        wide.values[limit - 1] = 42
        let saved = context.insert(wide)
        try context.save()
        var other = Wide()
        other.values[0] = 7
        context.insert(other)
        // An unsaved insert: the fetch reads through the temporary table of pending changes (one column more).
        let both = try context.fetch(FetchDescriptor<Wide>())
        #expect(both.count == 2)
        #expect(both.first { $0.id == saved.id }?.values[limit - 1] == 42)
        try context.save()
        #expect(try ModelContext(container).fetch(Wide.self).map { $0.values[0] }.sorted() == [0, 7])
    }

    @Test("every name Replica splices into SQL is quoted: keywords and names SQLite would otherwise misread work")
    func keywordNamesAreQuoted() throws {
        struct Select: PersistentModel, Codable {
            static var entityName: String { "Order" }
            var id = UUID.unassigned
            var from: String = ""
            var group: Int = 0
            var parent: Reference<Select>?
            static let entity = ModelEntity<Select>([
                .attribute("from", \.from, default: "", options: .unique),
                .attribute("group", \.group, default: 0),
                .toOne("parent", \.parent),
            ])
        }
        let container = try ModelContainer(for: Select.self, environment: directory.environment())
        let context = ModelContext(container)
        let parent = context.insert(Select(from: "a", group: 1))
        context.insert(Select(from: "b", group: 2, parent: Reference(parent)))
        try context.save()
        let found = try context.fetch(FetchDescriptor<Select>(predicate: #Predicate { $0.group > 1 }, sortBy: [SortDescriptor(\.from)]))
        #expect(found.map(\.from) == ["b"])
        #expect(found.first?.parent?.id == parent.id)
    }
}
