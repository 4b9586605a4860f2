import Foundation

extension ModelContainer {
    /// Announces, as they are committed, the history transactions that *other processes* save to store
    /// `storeName` — how an app learns what its widget wrote to a shared app-group store, and vice versa.
    ///
    /// Cheap while nothing happens: every `pollingInterval` milliseconds it reads `PRAGMA data_version`, which changes
    /// only when another connection commits (<https://www.sqlite.org/pragma.html#pragma_data_version>); only then does it
    /// read history after the last token it announced. Transactions whose bundle identifier and process ID equal
    /// this container's environment's ``ReplicaEnvironment/processIdentity`` are skipped.
    ///
    /// - Parameters:
    ///   - storeName: the configuration name of the store to watch.
    ///   - token: announce transactions after this token; `nil` starts from the store's newest transaction.
    ///   - pollingInterval: milliseconds between `data_version` checks (waits through ``ReplicaEnvironment/sleep``).
    /// - Returns: a stream of transactions in token order. It finishes with ``ReplicaError/unknownStore(_:)`` for an
    ///   unknown store name, with ``ReplicaError/historyTokenExpired(_:)``
    ///   if history the observer had not read yet was pruned, and ends when the consuming task is cancelled.
    public func historyTransactions(
        ofStore storeName: String, after token: HistoryToken? = nil, pollingInterval: Int64 = 100
    ) -> AsyncThrowingStream<HistoryTransaction, any Error> {
        let container = self
        let me = environment.processIdentity
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    let context = ModelContext(container)
                    guard let index = container.stores.firstIndex(where: { $0.configuration.name == storeName }) else {
                        throw ReplicaError.unknownStore(storeName)
                    }
                    let db = try context.connection(for: index)
                    var last = try token ?? context.currentHistoryToken(of: storeName)
                    var version: SQLiteValue? = nil
                    while !Task.isCancelled {
                        let now = try db.scalar("PRAGMA data_version")
                        if now != version {
                            version = now
                            for transaction in try context.fetchHistory(HistoryDescriptor(after: last)) {
                                last = transaction.token
                                if transaction.bundleIdentifier == me.bundleIdentifier && transaction.processID == me.processID { continue }
                                continuation.yield(transaction)
                            }
                        }
                        try await container.environment.sleep(pollingInterval)
                    }
                    continuation.finish()
                } catch is CancellationError {
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}
