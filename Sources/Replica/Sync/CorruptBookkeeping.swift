import Foundation

// Corrupt ledger rows, engine side: releasing them after a full read, and verifying every row. How a row is rebuilt
// and marked, and `BookkeepingCorruption`: Store/LedgerRepair.swift.

extension SyncLedger {
    /// Whether any ledger row is marked corrupt (one probe of the partial index `replica_sync_record_corrupt`).
    static let anyCorruptSQL = StatementKey("SELECT EXISTS (SELECT 1 FROM replica_sync_record WHERE state = 'corrupt')")

    /// Releases every row still marked corrupt (its cloud copy never came, or could not be applied) with its rebuilt
    /// bookkeeping into the outbox: called when a full read of the zone completes, and when the zone was reset.
    static func releaseCorrupt(_ db: Connection) throws {
        guard try db.scalar(anyCorruptSQL) == .integer(1) else { return }
        try db.run("""
            UPDATE replica_sync_record SET state = 'pending', reason = NULL, pending = 1, local_version = local_version + 1
            WHERE state = 'corrupt'
            """)
    }

    /// Reads every ledger row and rebuilds and marks each whose bookkeeping cannot be read (in one write transaction,
    /// taken only when there is one). Returns how many rows are marked corrupt afterwards.
    static func verifyBookkeeping(store: Store, db: Connection) throws -> Int {
        let damaged = try db.transaction(.deferred) { try loadAll(db).filter { !$0.corruptColumns.isEmpty }.map(\.id) }
        if !damaged.isEmpty {
            // (Read again inside the write transaction: another process may have written a row meanwhile.)
            try db.transaction(.immediate) { for id in damaged { _ = try load(id, store: store, db) } }
        }
        if case let .integer(count)? = try db.scalar("SELECT count(*) FROM replica_sync_record WHERE state = 'corrupt'") { return Int(count) }
        return 0
    }
}
