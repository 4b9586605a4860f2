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
