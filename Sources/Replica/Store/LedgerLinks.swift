import Foundation

/// Many-to-many links in synced stores (R17). Internal.
///
/// The links of a many-to-many pair travel with the records of the pair's *owner* side (``LinkTable``: the side
/// whose (entity, relationship) sorts first), as one field per relationship named ``fieldName(_:)``
/// (`replica_links_<relationship>`, a name no attribute can have) whose value is a ``LinkSet``: linked record ID →
/// causal length. Locally that field is kept beside the row with the fields this schema does not know (the ledger's
/// `unknown` column): it is uploaded with every version of the record, belongs to the record's incarnation (a
/// re-insert starts with no links, a tombstone carries none) and is absent-not-null in a partial record. A device
/// whose schema lacks the relationship keeps it like any unknown field and sends it back unchanged.
///
/// - Merging two versions of the field joins the sets (``LinkSet/joined(with:)``); the field's stamp is the winning
///   side's when the join equals it, else a new stamp of the merging device (the join is then a local change that
///   uploads), so a writer that orders the field by stamp alone never prefers a smaller set.
/// - The link table is *materialized* from the set: a present link to a record here is a row; to a duplicate that
///   lost (R15), a row to the winner; to a deleted record, nothing; to a record not here yet, a wait
///   (`replica_sync_link_waiting`), released when the record arrives. Never dropped.
/// - A local save's link changes update the owners' sets (``recordLocalLinkChanges(_:store:db:hlc:)``): a link the
///   app added is added, one it removed is removed; a link to a record deleted or redirected is removed (and its
///   winner added), as a stamped local change — so deleting either end removes its links everywhere.
enum LinkReplication {
    static let fieldPrefix = "replica_links_"

    /// The field carrying the links of `table` in records of its owner entity.
    static func fieldName(_ table: LinkTable) -> String { fieldPrefix + table.ownerRelationship }

    /// Whether `name` names a link field (no attribute or relationship can: names never start with `replica_`).
    static func isLinkField(_ name: String) -> Bool { name.hasPrefix(fieldPrefix) }

    static let createSQL = """
        CREATE TABLE IF NOT EXISTS replica_sync_link_waiting (
            owner BLOB NOT NULL,
            link TEXT NOT NULL,
            target BLOB NOT NULL,
            PRIMARY KEY (owner, link, target)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS replica_sync_link_waiting_target ON replica_sync_link_waiting (target);
        CREATE TABLE IF NOT EXISTS replica_sync_link_dormant (
            owner BLOB NOT NULL,
            link TEXT NOT NULL,
            target BLOB NOT NULL,
            PRIMARY KEY (owner, link, target)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS replica_sync_link_dormant_target ON replica_sync_link_dormant (target);
        """

    /// The link tables of `store` that replicate: every many-to-many pair of a store that tracks sync, except a
    /// relationship that is its own inverse (refused in synced configurations, see ``SchemaViolation/syncedManyToMany(entity:relationship:inverse:)``).
    static func tables(of store: Store) -> [LinkTable] {
        guard store.tracksSync else { return [] }
        return LinkTable.all(in: store.entities).filter { !$0.isOwnInverse }
    }

    // MARK: Local changes

    /// After a local save (or the consequences of a merge) was stamped: updates the link sets of every owner whose
    /// links the save changed — inserted owners, and owners whose owner-side relationship is among an update's
    /// changed names (a save of either side names the owners it changed, see `StoreWriter+Links`). Each changed set
    /// is stamped with `hlc` and the owner enters the outbox.
    static func recordLocalLinkChanges(_ changes: StoreChanges, store: Store, db: Connection, hlc: HLC) throws {
        let tables = tables(of: store)
        guard !tables.isEmpty else { return }
        var done: Set<OwnerKey> = []
        func visit(_ id: UUID, entity: String, names: [String]?) throws {
            for table in tables where table.ownerEntity == entity && (names?.contains(table.ownerRelationship) ?? true) {
                guard done.insert(OwnerKey(owner: id, link: table.name)).inserted else { continue }
                try reconcile(owner: id, table: table, store: store, db: db, hlc: hlc)
            }
        }
        for snapshot in changes.inserted { try visit(snapshot.id, entity: snapshot.entityName, names: nil) }
        for (snapshot, names) in changes.updated { try visit(snapshot.id, entity: snapshot.entityName, names: names) }
    }

    struct OwnerKey: Hashable {
        let owner: UUID
        let link: String
    }

    /// Brings the link set of `owner` in line with its rows in the link table: rows it lacks are added; links to a
    /// record here that has no row were removed by the app; links to a deleted record (or a duplicate that lost,
    /// whose winner's row was added) are removed; links to a record not here yet stay (they wait).
    static func reconcile(owner: UUID, table: LinkTable, store: Store, db: Connection, hlc: HLC) throws {
        guard var state = try SyncLedger.load(owner, store: store, db, entity: table.ownerEntity), state.isAlive,
              state.entity == table.ownerEntity else { return }
        let name = fieldName(table)
        let existing = try linkSet(of: state, field: name, store: store)
        // The links of duplicates that lost to this record (R15) join its own; those they add are added here.
        var set = existing.joined(with: try redirectedLinks(to: owner, table: table, store: store, db: db))
        let absorbed = Set(set.members).subtracting(existing.members)
        if !absorbed.isEmpty {
            var ignored = StoreChanges()
            try materialize(owner: owner, table: table, store: store, db: db, changes: &ignored, set: set)
        }
        let present = try rows(of: owner, table: table, db)
        let presentSet = Set(present)
        var exhausted = false
        for target in present where !set.contains(target) { exhausted = !set.add(target) || exhausted }
        for target in set.members where !presentSet.contains(target) && !absorbed.contains(target) {
            if try rowExists(target, entity: table.memberEntity, store: store, db) {
                exhausted = !set.remove(target) || exhausted
            } else if let target = try SyncLedger.load(target, store: store, db), !target.isAlive {
                exhausted = !set.remove(target.id) || exhausted
            }
        }
        if exhausted { throw ReplicaError.counterExhausted(store: store.configuration.name, recordID: owner, counter: name) }
        guard set != existing else { return }
        state.unknown[name] = CloudField(value: set.value, stamp: FieldStamp(incarnation: state.causalLength, clock: hlc))
        try state.bumpLocalVersion(in: store)
        state.pending = true
        try SyncLedger.storeLocalChange(state, db)
    }

    /// The join of the link sets that the tombstones redirecting to `owner` (losing duplicates, and theirs in turn)
    /// carry for `table`.
    static func redirectedLinks(to owner: UUID, table: LinkTable, store: Store, db: Connection) throws -> LinkSet {
        var result = LinkSet()
        var visited: Set<UUID> = [owner]
        var frontier = [owner]
        while !frontier.isEmpty {  // ends: `visited` admits each record once
            var next: [UUID] = []
            for target in frontier {
                for row in try db.rows(redirectedSQL, [target.sqliteValue, .text(table.ownerEntity)]) {
                    guard let loserID = try? UUID(sqliteValue: row[0]), visited.insert(loserID).inserted,
                          let loser = try SyncLedger.load(loserID, store: store, db, entity: table.ownerEntity), !loser.isAlive else { continue }
                    next.append(loserID)
                    if let field = loser.tombstone[fieldName(table)], let set = LinkSet(value: field.value) { result = result.joined(with: set) }
                }
            }
            frontier = next
        }
        return result
    }

    static let redirectedSQL = StatementKey("SELECT id FROM replica_sync_record WHERE redirect = ? AND entity = ? ORDER BY id")

    /// The link set `field` of `state`'s current incarnation (empty when it has none).
    /// - Throws: ``ReplicaError/corruptBookkeeping(_:)`` (column `unknown`) when the kept value does not decode.
    static func linkSet(of state: SyncLedger.RecordState, field: String, store: Store) throws -> LinkSet {
        guard let kept = state.unknown[field], kept.stamp.incarnation == state.causalLength else { return LinkSet() }
        guard let set = LinkSet(value: kept.value) else {
            throw ReplicaError.corruptBookkeeping(BookkeepingCorruption(store: store.configuration.name, recordID: state.id, column: "unknown"))
        }
        return set
    }

    // MARK: Materializing

    /// Writes the link table rows of `owner` that its link set says (see the type's documentation), and its waits.
    /// `set`, when given, stands for the owner's stored link set.
    static func materialize(owner: UUID, table: LinkTable, store: Store, db: Connection, changes: inout StoreChanges,
                            set: LinkSet? = nil) throws {
        var desired: [UUID] = []
        var waiting: [UUID] = []
        var dormant: [UUID] = []
        if let state = try SyncLedger.load(owner, store: store, db, entity: table.ownerEntity), state.isAlive,
           state.entity == table.ownerEntity, try rowExists(owner, entity: table.ownerEntity, store: store, db) {
            for target in try (set ?? linkSet(of: state, field: fieldName(table), store: store)).members {
                if try rowExists(target, entity: table.memberEntity, store: store, db) {
                    desired.append(target)
                } else if let other = try SyncLedger.load(target, store: store, db) {
                    guard other.entity == table.memberEntity, !other.isAlive else { continue }
                    if let winner = try SyncLedger.liveRedirectTarget(of: target, store: store, db),
                       try rowExists(winner, entity: table.memberEntity, store: store, db) {
                        desired.append(winner)
                    } else {
                        // Deleted here, but present in the set: another device linked it after a re-insert this
                        // device has not seen yet. No row and no wait (it may never come back); applied if it does.
                        dormant.append(target)
                    }
                } else {
                    waiting.append(target)
                }
            }
        }
        try db.run("DELETE FROM replica_sync_link_waiting WHERE owner = ? AND link = ?", [owner.sqliteValue, .text(table.name)])
        for target in waiting {
            try db.run("INSERT OR IGNORE INTO replica_sync_link_waiting (owner, link, target) VALUES (?, ?, ?)",
                       [owner.sqliteValue, .text(table.name), target.sqliteValue])
        }
        try db.run("DELETE FROM replica_sync_link_dormant WHERE owner = ? AND link = ?", [owner.sqliteValue, .text(table.name)])
        for target in dormant {
            try db.run("INSERT OR IGNORE INTO replica_sync_link_dormant (owner, link, target) VALUES (?, ?, ?)",
                       [owner.sqliteValue, .text(table.name), target.sqliteValue])
        }
        let current = try rows(of: owner, table: table, db)
        let desiredSet = Set(desired), currentSet = Set(current)
        var changedMembers: [UUID] = []
        for target in current where !desiredSet.contains(target) {
            try db.run("DELETE FROM \(table.quotedName) WHERE \"owner\" = ? AND \"member\" = ?", [owner.sqliteValue, target.sqliteValue])
            changedMembers.append(target)
        }
        for target in desired where !currentSet.contains(target) && !changedMembers.contains(target) {
            try db.run("INSERT OR IGNORE INTO \(table.quotedName) (\"owner\", \"member\") VALUES (?, ?)", [owner.sqliteValue, target.sqliteValue])
            changedMembers.append(target)
        }
        guard !changedMembers.isEmpty else { return }
        changes.updated.append((Snapshot(entityName: table.ownerEntity, id: owner, values: []), [table.ownerRelationship]))
        for member in changedMembers.sorted(by: { $0.bytesPrecede($1) }) {
            changes.updated.append((Snapshot(entityName: table.memberEntity, id: member, values: []), [table.memberRelationship]))
        }
    }

    /// The records `owner` links to through `table`, in ID order.
    private static func rows(of owner: UUID, table: LinkTable, _ db: Connection) throws -> [UUID] {
        try db.rows("SELECT \"member\" FROM \(table.quotedName) WHERE \"owner\" = ? ORDER BY \"member\"", [owner.sqliteValue])
            .compactMap { try? UUID(sqliteValue: $0[0]) }
    }

    private static func rowExists(_ id: UUID, entity: String, store: Store, _ db: Connection) throws -> Bool {
        guard let statements = store.statements(for: entity) else { return false }
        return try db.scalar(statements.selectByIDKey, [id.sqliteValue]) != nil
    }
}
