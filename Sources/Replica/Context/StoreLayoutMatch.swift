import Foundation

/// Which schema of a migration plan a store's tables are at, when its recorded version cannot be trusted to say so:
/// there is none (a store created before versions were recorded, or by a container from a schema that is no
/// versioned schema's), or the store lacks tables or columns of the recorded schema (renamed away or dropped, which
/// only a stage does: the value was set back by hand). A recorded version whose every table and column the store
/// still has is where the plan starts, even when it has tables and columns of later schemas too: those are what a
/// container of a later schema without the plan (a widget, an app extension) adds, and its stages' code has not run
/// (R2; the canary `layout-outranks-recorded-version` lets the tables decide there). Internal.
///
/// Running a stage on a store past the stage's old schema runs its code on tables it was not written for: the old
/// schema's open adds its columns back empty, `willMigrate` reads those, and a non-idempotent `didMigrate` (a unit
/// conversion, an append) applies twice. So the tables are checked first, by the entities this configuration holds
/// in each schema of the plan:
/// - a store is past schema `c` when it has a table or column that first appears in a later schema (no schema
///   before that one declares it), or lacks a column (or table) of schema `c` that a later schema renames away
///   (through an original name);
/// - a store past `c` is at the earliest later schema `k` whose every table and column it has, and none of a
///   schema after `k`; matching none, it is a load issue.
/// A store that is not past `c` is at `c`, as before (a genuine legacy store of the plan's first schema migrates from
/// there). When the tables decide and other schemas of the plan have the same tables and columns as the one found,
/// with a custom stage between them (a values-only stage), it is a load issue naming them: running that stage on a
/// store already past it would apply its code twice (R3); unless the configuration's tables hold no row: an empty
/// store is at the latest of them, as if the plan's container had created it. Complexity: O(schemas² × fields) lookups, one read of the store's table list and of each table's columns.
enum StoreLayoutMatch {
    /// The index into `plan.schemas` of the schema the store on `db` is at, given the one its recorded version (or,
    /// without one, the plan's first schema) says: `claimed`.
    /// - Throws: ``StoreLayoutError`` for tables past `claimed` that match no later schema; `SQLiteError`.
    static func start(_ db: Connection, plan: CheckedMigrationPlan, entityNames: (Schema) -> [String], claimed: Int,
                      recorded: Schema.Version?, canaries: Set<Canary> = []) throws -> Int {
        let schemas = plan.schemas
        guard claimed < schemas.count - 1 else { return claimed }
        let tables = Set(try db.rows("SELECT name FROM sqlite_master WHERE type = 'table'", cache: false).compactMap { row -> String? in
            if case let .text(name) = row[0] { return name } else { return nil }
        })
        var columnCache: [String: Set<String>] = [:]
        func columns(_ table: String) throws -> Set<String> {
            if let known = columnCache[table] { return known }
            let names = Set(try db.rows("SELECT name FROM pragma_table_info(?)", [.text(table)], cache: false).compactMap { row -> String? in
                if case let .text(name) = row[0] { return name } else { return nil }
            })
            columnCache[table] = names
            return names
        }
        let held = schemas.map { Set(entityNames($0)) }
        func entities(_ index: Int) -> [Schema.Entity] { schemas[index].entities.filter { held[index].contains($0.name) } }

        /// What the store has of schema `j` that no schema before it declares.
        func introduced(_ j: Int) throws -> [String] {
            var found: [String] = []
            for entity in entities(j) {
                let earlier = (0..<j).compactMap { schemas[$0].entity(named: entity.name) }
                guard tables.contains(entity.name) else { continue }
                if earlier.isEmpty {
                    found.append("table \(entity.name) of \(schemas[j].version)")
                    continue
                }
                let present = try columns(entity.name)
                for field in entity.fieldNames where present.contains(field) && !earlier.contains(where: { $0.fieldNames.contains(field) }) {
                    found.append("column \(entity.name).\(field) of \(schemas[j].version)")
                }
            }
            return found
        }
        /// What schema `c` declares, a later schema renames away, and the store lacks.
        func renamedAway(_ c: Int) throws -> [String] {
            var found: [String] = []
            for entity in entities(c) {
                // The entity's names in the later schemas, followed through original names.
                var name = entity.name
                for later in (c + 1)..<schemas.count {
                    guard let next = schemas[later].entities.first(where: { $0.name == name || $0.originalName == name }) else { break }
                    if next.name != name {
                        if !tables.contains(entity.name) && tables.contains(next.name) {
                            found.append("no table \(entity.name), which \(schemas[later].version) renames \(next.name)")
                        }
                        break
                    }
                    guard tables.contains(entity.name) else { break }
                    let present = try columns(entity.name)
                    for attribute in next.attributes {
                        if let original = attribute.originalName, original != attribute.name, entity.attribute(named: original) != nil,
                           !present.contains(original), present.contains(attribute.name) {
                            found.append("no column \(entity.name).\(original), which \(schemas[later].version) renames \(attribute.name)")
                        }
                    }
                    name = next.name
                }
            }
            return found
        }
        /// Whether the store has every table and column of schema `k`.
        func hasLayout(_ k: Int) throws -> Bool {
            for entity in entities(k) {
                guard tables.contains(entity.name) else { return false }
                let present = try columns(entity.name)
                guard entity.fieldNames.allSatisfy(present.contains) else { return false }
            }
            return true
        }

        /// The schema the tables are at, starting from `claimed` (see the type's description).
        func layoutStart() throws -> Int {
            var evidence = try renamedAway(claimed)
            var latestIntroduced = [Int: [String]]()
            for j in (claimed + 1)..<schemas.count {
                let found = try introduced(j)
                if !found.isEmpty { latestIntroduced[j] = found }
                evidence += found
            }
            guard !evidence.isEmpty else { return claimed }
            let newestEvidence = latestIntroduced.keys.max() ?? claimed
            for k in (claimed + 1)..<schemas.count where k >= newestEvidence {
                if try hasLayout(k) { return k }
            }
            let shown = evidence.prefix(3).joined(separator: "; ") + (evidence.count > 3 ? "; …" : "")
            let claim = recorded.map { "its recorded schema version is \($0)" } ?? "it records no schema version (taken to be at \(schemas[claimed].version))"
            throw StoreLayoutError(reason: "\(claim), but its tables are past that schema (\(shown)) and have the layout of no later schema of the migration plan (\(schemas[(claimed + 1)...].map(\.version.description).joined(separator: ", "))); running the stages from \(schemas[claimed].version) would run their code on tables they were not written for — restore the store file from a backup, or set its 'schema_version' in replica_metadata to the version its tables are at")
        }

        /// The start the tables decide, `decided`, unless other schemas of the plan have the same tables and columns
        /// and a stage between them runs code: which of them the store is at is then unknown, and running that code on
        /// a store already past it applies it twice (a values-only stage, R3) — refused, unless this configuration's
        /// tables hold no row. An empty store is at the latest of those schemas: no stage's code has rows to transform,
        /// as in a store the plan's container creates (a widget's container without the plan created it and saved
        /// nothing yet).
        func resolveAmbiguity(_ decided: Int) throws -> Int {
            func layout(_ index: Int) -> [String: Set<String>] {
                Dictionary(entities(index).map { ($0.name, Set($0.fieldNames)) }, uniquingKeysWith: { first, _ in first })
            }
            let shape = layout(decided)
            guard !shape.isEmpty else { return decided }
            let candidates = (claimed..<schemas.count).filter { layout($0) == shape }
            guard let first = candidates.first, let last = candidates.last, first < last,
                  plan.stages[first..<last].contains(where: { $0.willMigrate != nil || $0.didMigrate != nil }) else { return decided }
            var holdsRows = canaries.contains(.emptyAmbiguousStoreRefused)
            for table in shape.keys.sorted() where try db.scalar("SELECT EXISTS (SELECT 1 FROM \(quoted(table)))") == .integer(1) {
                holdsRows = true
                break
            }
            if !holdsRows { return last }
            let versions = candidates.map { schemas[$0].version.description }.joined(separator: ", ")
            let claim = recorded.map { "its recorded schema version \($0) does not match its tables" } ?? "it records no schema version"
            throw StoreLayoutError(reason: "\(claim), and its tables have the layout of several schemas of the migration plan (\(versions)), with a custom stage between them: which one the store is at is unknown, and running that stage's code on a store already past it would apply it twice; nothing was changed — set its 'schema_version' in replica_metadata to the version it is at, and open the store from a versioned schema (Schema(versionedSchema:)) in every process that opens it (widgets, extensions, model actors): a store created that way records its version")
        }

        // A recorded version whose every table and column the store still has is where the plan starts: tables and
        // columns of later schemas beside them are what an additive open (a container of a later schema without the
        // plan) adds, and they do not mean the stages ran (R2). Only a store lacking some of them (renamed away or
        // dropped, which only a stage does) has tables clearly past its recorded version.
        if recorded != nil, !canaries.contains(.layoutOutranksRecordedVersion), try hasLayout(claimed) { return claimed }
        let decided = try layoutStart()
        if recorded != nil && decided == claimed { return claimed }
        return try resolveAmbiguity(decided)
    }
}
