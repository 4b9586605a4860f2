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
    /// Set when the record's bookkeeping could not be read: a column that does not decode (the values above then
    /// hold placeholders), or a row rebuilt and marked corrupt that awaits repair (see ``LedgerState/corrupt(_:)``).
    public let corruption: BookkeepingCorruption?

    /// `true` while the record is alive (odd causal length).
    public var isAlive: Bool { causalLength % 2 == 1 }
}

extension SyncEngine {
    /// The replication metadata of record `id`, or `nil` when the store has none for it. Reads only: a row whose
    /// bookkeeping cannot be read is reported with its ``ReplicationState/corruption`` (and placeholders), not rebuilt.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func replicationState(of id: UUID) throws -> ReplicationState? {
        try SyncLedger.loadAsStored(id, db).map { ReplicationState($0, storeName: storeName) }
    }

    /// The replication metadata of every record the store knows, in record ID order (as ``replicationState(of:)``).
    /// - Complexity: one scan of the ledger.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func replicationStates() throws -> [ReplicationState] {
        try SyncLedger.loadAll(db).map { ReplicationState($0, storeName: storeName) }
    }

    /// Reads the bookkeeping of every record of the store and marks each whose bookkeeping cannot be read as corrupt
    /// (``LedgerState/corrupt(_:)``), rebuilding it without losing local values, so that the next sync repairs it from
    /// the cloud (a full read of the zone). The engine does this once before its first request; call it again, e.g.
    /// after restoring a store file from a backup, to find damage in records nothing touches.
    /// - Returns: the number of records marked corrupt (found now or before, not yet repaired).
    /// - Complexity: one scan of the ledger, one write per damaged record.
    /// - Throws: ``SQLiteError`` when the store cannot be read or written.
    @discardableResult
    public func verifyBookkeeping() throws -> Int {
        let count = try SyncLedger.verifyBookkeeping(store: store, db: db)
        bookkeepingVerified = true
        return count
    }

    /// The records of types this store's schema does not know, kept whole, in record ID order.
    /// - Throws: ``SQLiteError`` when the store cannot be read.
    public func unknownTypeRecords() throws -> [CloudRecord] {
        try db.rows("SELECT record FROM replica_sync_unknown_record ORDER BY id").compactMap { row in
            guard case let .text(json) = row[0] else { return nil }
            return ReplicaJSON.decode(CloudRecord.self, json)
        }
    }
}

extension ReplicationState {
    init(_ state: SyncLedger.RecordState, storeName: String) {
        self.init(id: PersistentIdentifier(entityName: state.entity, id: state.id), causalLength: state.causalLength,
                  created: state.created, stamps: state.stamps, unknownFields: state.unknown, tombstone: state.tombstone,
                  redirect: state.redirect, changeTag: state.changeTag, isPending: state.pending,
                  corruption: state.corruption.map { BookkeepingCorruption(store: storeName, recordID: state.id, column: $0) })
    }
}

extension SyncEngine {
    private static let outboxStateSQL = StatementKey("SELECT causal_length, pending, stamps FROM replica_sync_record WHERE id = ?")

    /// The causal length, pending flag and field stamps of record `id` — exactly the `causalLength`, `isPending`
    /// and `stamps` of ``replicationState(of:)`` — or `nil` when the store has none for it. For the simulator's
    /// checks after each acknowledged write and upload, which need only these, without decoding the rest of the row.
    /// - Throws: ``ReplicaError/corruptBookkeeping(_:)`` when the stamps column cannot be read (never read as "no
    ///   stamps"; a write to the record rebuilds it first, so this follows only damage nothing has touched yet);
    ///   ``SQLiteError`` when the store cannot be read.
    @_spi(Simulation) public func replicationStamps(of id: UUID) throws
        -> (causalLength: Int64, isPending: Bool, stamps: [String: FieldStamp])? {
        let statement = try db.cachedStatement(Self.outboxStateSQL)
        defer { statement.reset() }
        try statement.bind(id, at: 0)
        guard try statement.step() else { return nil }
        guard let stamps = SyncLedger.readStamps(statement, 2) else {
            throw ReplicaError.corruptBookkeeping(BookkeepingCorruption(store: storeName, recordID: id, column: "stamps"))
        }
        return (statement.int64(0), statement.int64(1) != 0, stamps)
    }
}
