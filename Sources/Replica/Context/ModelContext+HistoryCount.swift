import Foundation

extension ModelContext {
    private static let historyCountSQL = StatementKey("SELECT count(*) FROM replica_history_transaction")

    /// The number of history transactions store `storeName` holds now (pruned ones excluded).
    ///
    /// For the simulator's idempotence check, which compares it with an earlier full read of the history to learn,
    /// without reading every transaction again, whether any transaction went missing.
    ///
    /// - Parameter storeName: The name of one of the container's configurations.
    /// - Returns: The count, 0 for a store without history.
    /// - Throws: `ReplicaError.unknownStore` for a name no configuration has; SQLite errors of the read.
    /// - Complexity: O(n) in the store's transactions (SQLite counts the table's B-tree entries).
    @_spi(Simulation) public func historyTransactionCount(storeName: String) throws -> Int {
        guard let index = container.stores.firstIndex(where: { $0.configuration.name == storeName }) else {
            throw ReplicaError.unknownStore(storeName)
        }
        guard case let .integer(count)? = try connection(for: index).scalar(Self.historyCountSQL) else { return 0 }
        return Int(count)
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
