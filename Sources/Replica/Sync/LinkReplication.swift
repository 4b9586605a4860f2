import Foundation

// Many-to-many links in synced stores (R17), sync side: merging link fields and materializing them after a merge.
// `LinkReplication` (documented there), its tables' DDL and the capture of a save's link changes are in
// Store/LedgerLinks.swift.
extension LinkReplication {
    // MARK: Merge

    /// Merges a remote link field into the local one (both of incarnation `incarnation`; `local` `nil`: none here).
    /// `hlc` is advanced when the join differs from both sides (its new stamp). Returns the merged field and whether
    /// the local side has something the remote lacks.
    /// - Precondition: `remote.value` decodes (``ReplicationBounds`` refuses records whose link field does not).
    static func merge(local: CloudField?, remote: CloudField, incarnation: Int64, hlc: inout HLC, wall: Int64,
                      replica: UUID) -> (field: CloudField, localNewer: Bool) {
        guard let local, let localSet = LinkSet(value: local.value), let remoteSet = LinkSet(value: remote.value) else {
            return (remote, false)
        }
        let joined = localSet.joined(with: remoteSet)
        if joined == remoteSet && remote.stamp >= local.stamp { return (remote, false) }
        if joined == localSet && local.stamp >= remote.stamp { return (local, joined != remoteSet || local.stamp != remote.stamp) }
        hlc = hlc.tick(wall: wall, replica: replica)
        return (CloudField(value: joined.value, stamp: FieldStamp(incarnation: incarnation, clock: hlc)), true)
    }

    // MARK: Materializing

    /// After a batch of merges (and the duplicate resolution that followed): puts the link sets of the records
    /// involved into the link tables, releases links waiting for records that arrived, and removes the rows of
    /// records that died. Records changed links are added to `changes` (for history and observers). Returns the
    /// owners whose sets must change because a linked record died or lost as a duplicate: stamp them as local
    /// changes (``recordLocalLinkChanges(_:store:db:hlc:)``).
    static func materializeAfterMerge(merged: [CloudRecord], tombstoned: [PersistentIdentifier], changes: inout StoreChanges,
                                      tables: [LinkTable], store: Store, db: Connection) throws -> StoreChanges {
        var owners: [(UUID, LinkTable)] = []
        var seen: Set<OwnerKey> = []
        func note(_ id: UUID, _ table: LinkTable) {
            if seen.insert(OwnerKey(owner: id, link: table.name)).inserted { owners.append((id, table)) }
        }
        var consequences = StoreChanges()
        var touched: [(UUID, String)] = merged.map { ($0.recordID, $0.recordType) }
        touched += changes.inserted.map { ($0.id, $0.entityName) }
        touched += changes.updated.map { ($0.0.id, $0.0.entityName) }
        touched += tombstoned.map { ($0.id, $0.entityName) }
        for (id, entity) in touched {
            for table in tables where table.ownerEntity == entity { note(id, table) }
        }
        // Links waiting for a record that arrived (or died, or lost as a duplicate: then they follow it).
        // (Only records of a member entity can be waited for.)
        let members = Set(tables.map(\.memberEntity))
        var arrivedOrDied: [UUID] = changes.inserted.filter { members.contains($0.entityName) }.map(\.id)
        arrivedOrDied += tombstoned.filter { members.contains($0.entityName) }.map(\.id)
        arrivedOrDied += merged.filter { $0.isAlive && members.contains($0.recordType) }.map(\.recordID)
        // Present links to a record that is deleted here (dormant) come to life when it is inserted again: another
        // device may have re-inserted it and linked it before this one learned of the re-insert.
        let alive = Set(changes.inserted.filter { members.contains($0.entityName) }.map(\.id))
            .union(merged.filter { $0.isAlive && members.contains($0.recordType) }.map(\.recordID))
        if try db.scalar(anyWaiterSQL) == .integer(0) { arrivedOrDied = [] }
        for target in arrivedOrDied {
            for row in try db.rows(waitersSQL, [target.sqliteValue]) {
                guard let owner = try? UUID(sqliteValue: row[0]), case let .text(link) = row[1],
                      let table = tables.first(where: { $0.name == link }) else { continue }
                note(owner, table)
            }
            guard alive.contains(target) else { continue }
            for row in try db.rows(dormantSQL, [target.sqliteValue]) {
                guard let owner = try? UUID(sqliteValue: row[0]), case let .text(link) = row[1],
                      let table = tables.first(where: { $0.name == link }) else { continue }
                note(owner, table)
            }
        }
        // Rows linking to a record that died: its owners drop them, and remove the link from their sets. An owner that
        // lost as a duplicate hands its links to the winner.
        var followers: [(UUID, LinkTable)] = []
        for id in tombstoned {
            for table in tables where table.ownerEntity == id.entityName {
                if let winner = try SyncLedger.liveRedirectTarget(of: id.id, store: store, db) { followers.append((winner, table)) }
            }
            for table in tables where table.memberEntity == id.entityName {
                for owner in try rowsLinking(to: id.id, table: table, db) {
                    note(owner, table)
                    followers.append((owner, table))
                }
                for row in try db.rows(waitersSQL, [id.id.sqliteValue]) where row[1] == .text(table.name) {
                    if let owner = try? UUID(sqliteValue: row[0]) { followers.append((owner, table)) }
                }
                for row in try db.rows(dormantSQL, [id.id.sqliteValue]) where row[1] == .text(table.name) {
                    if let owner = try? UUID(sqliteValue: row[0]) { followers.append((owner, table)) }
                }
            }
        }
        for (owner, table) in owners {
            try materialize(owner: owner, table: table, store: store, db: db, changes: &changes)
        }
        var stamped: Set<OwnerKey> = []
        for (owner, table) in followers where stamped.insert(OwnerKey(owner: owner, link: table.name)).inserted {
            consequences.updated.append((Snapshot(entityName: table.ownerEntity, id: owner, values: []), [table.ownerRelationship]))
        }
        return consequences
    }

    static let anyWaiterSQL = StatementKey("""
        SELECT EXISTS (SELECT 1 FROM replica_sync_link_waiting) OR EXISTS (SELECT 1 FROM replica_sync_link_dormant)
        """)
    static let dormantSQL = StatementKey("SELECT owner, link FROM replica_sync_link_dormant WHERE target = ? ORDER BY owner, link")
    static let waitersSQL = StatementKey("SELECT owner, link FROM replica_sync_link_waiting WHERE target = ? ORDER BY owner, link")

    /// The owners linking to `member` through `table`, in ID order.
    private static func rowsLinking(to member: UUID, table: LinkTable, _ db: Connection) throws -> [UUID] {
        try db.rows("SELECT \"owner\" FROM \(table.quotedName) WHERE \"member\" = ? ORDER BY \"owner\"", [member.sqliteValue])
            .compactMap { try? UUID(sqliteValue: $0[0]) }
    }

    /// SQL true for a `replica_sync_record` row whose links wait for a record not here yet (it counts as waiting for
    /// a parent in the status).
    static let waitsForLinkSQL = "id IN (SELECT owner FROM replica_sync_link_waiting)"
    /// SQL for the first record a `replica_sync_record` row's links wait for (`NULL`: none): its ledger entry is
    /// `waitingForParent` of it.
    static let linkWaitedForSQL = "(SELECT target FROM replica_sync_link_waiting WHERE owner = replica_sync_record.id ORDER BY target LIMIT 1)"
}

extension CloudRecord {
    /// The records this record links to through its many-to-many relationship `relationship` (R17): the present links
    /// of its link field, in ID byte order; `nil` when it carries no such field or the field does not hold a link set.
    /// For tools that check what devices hold against the cloud (the simulator's convergence invariant).
    @_spi(Simulation) public func linkedRecords(through relationship: String) -> [UUID]? {
        guard let field = fields[LinkReplication.fieldPrefix + relationship], let set = LinkSet(value: field.value) else { return nil }
        return set.members
    }
}
