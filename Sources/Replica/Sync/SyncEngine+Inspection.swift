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
