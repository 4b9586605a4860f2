import Foundation

// Read-only inspection of a synced store's replication metadata, for tests, tools and the simulator's reference
// model (`replica-sim`). Nothing here writes; nothing here is needed to sync.

/// The replication metadata one synced store keeps for one record (see `Specs/replication-protocol.md`, §1 State).
public struct ReplicationState: Hashable, Sendable {
    /// The record.
    public let id: PersistentIdentifier
    /// Odd while alive, even while deleted.
    public let causalLength: Int64
    /// The stamp of the insert that began the current incarnation.
    public let created: FieldStamp
    /// Stamps of the fields of the current incarnation this schema knows, by field name.
    public let stamps: [String: FieldStamp]
    /// Fields this schema does not know, with their values and stamps (kept and sent back unchanged).
    public let unknownFields: [String: CloudField]
    /// The preserved fields of a deleted record.
    public let tombstone: [String: CloudField]
    /// When the record lost a unique-key tie to another record: the winner.
    public let redirect: UUID?
    /// The server version last seen or saved.
    public let changeTag: String?
    /// `true` while the cloud lacks a local change of this record.
    public let isPending: Bool

    /// `true` while the record is alive (odd causal length).
    public var isAlive: Bool { causalLength % 2 == 1 }
}

extension SyncEngine {
    /// The replication metadata of record `id`, or `nil` when the store has none for it.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func replicationState(of id: UUID) throws -> ReplicationState? {
        try SyncLedger.load(id, db).map(ReplicationState.init)
    }

    /// The replication metadata of every record the store knows, in record ID order.
    /// - Complexity: one scan of the ledger.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func replicationStates() throws -> [ReplicationState] {
        try SyncLedger.loadAll(db).map(ReplicationState.init)
    }

    /// The records of types this store's schema does not know, kept whole, in record ID order.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func unknownTypeRecords() throws -> [CloudRecord] {
        try db.rows("SELECT record FROM replica_sync_unknown_record ORDER BY id").compactMap { row in
            guard case let .text(json) = row[0] else { return nil }
            return SyncLedger.decode(CloudRecord.self, json)
        }
    }
}

extension ReplicationState {
    init(_ state: SyncLedger.RecordState) {
        self.init(id: PersistentIdentifier(entityName: state.entity, id: state.id), causalLength: state.causalLength,
                  created: state.created, stamps: state.stamps, unknownFields: state.unknown, tombstone: state.tombstone,
                  redirect: state.redirect, changeTag: state.changeTag, isPending: state.pending)
    }
}

extension SyncEngine {
    private static let outboxStateSQL = StatementKey("SELECT causal_length, pending, stamps FROM replica_sync_record WHERE id = ?")

    /// The causal length, pending flag and field stamps of record `id` — exactly the `causalLength`, `isPending`
    /// and `stamps` of ``replicationState(of:)`` — or `nil` when the store has none for it. For the simulator's
    /// checks after each acknowledged write and upload, which need only these, without decoding the rest of the row.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    @_spi(Simulation) public func replicationStamps(of id: UUID) throws
        -> (causalLength: Int64, isPending: Bool, stamps: [String: FieldStamp])? {
        let statement = try db.cachedStatement(Self.outboxStateSQL)
        defer { statement.reset() }
        try statement.bind(id, at: 0)
        guard try statement.step() else { return nil }
        // As `SyncLedger.load` reads them.
        return (statement.int64(0), statement.int64(1) != 0, SyncLedger.readStamps(statement, 2) ?? [:])
    }
}

extension ModelContext {
    private static let historySpanSQL = StatementKey("SELECT max(token), count(*) FROM replica_history_transaction")

    /// What store `storeName`'s history holds now, in brief: the store's replica identity (every token's
    /// ``HistoryToken/storeIdentity``), the token value through which history was pruned (reading after an older token
    /// throws ``ReplicaError/historyTokenExpired(_:)``), the newest transaction's token value (`nil` without any) and
    /// the number of transactions (as ``historyTransactionCount(storeName:)``).
    ///
    /// For the simulator's idempotence check, which learns from it whether the history still holds the transactions
    /// of an earlier full read, in one indexed read instead of a query of the newest transaction and a count.
    /// - Throws: `ReplicaError.unknownStore` for a name no configuration has; SQLite errors of the read.
    @_spi(Simulation) public func historySpan(storeName: String) throws
        -> (storeIdentity: UUID, prunedThrough: Int64, newest: Int64?, count: Int) {
        guard let index = container.stores.firstIndex(where: { $0.configuration.name == storeName }) else {
            throw ReplicaError.unknownStore(storeName)
        }
        let db = try connection(for: index)
        return try db.transaction(.deferred) {
            let pruned = try HistoryLog.prunedThrough(db)
            let statement = try db.cachedStatement(Self.historySpanSQL)
            defer { statement.reset() }
            guard try statement.step() else { return (container.stores[index].identity, pruned, nil, 0) }
            return (container.stores[index].identity, pruned, statement.isNull(0) ? nil : statement.int64(0), Int(statement.int64(1)))
        }
    }
}
