import Foundation

extension ModelContainer {
    /// Announces, as they are committed, the history transactions of store `storeName` that no context of this
    /// container saved: what other processes save to a shared app-group store (how an app learns what its widget
    /// wrote, and vice versa) and what this container's sync engine imports.
    ///
    /// A view of the container's change stream (``changes(in:after:bufferLimit:)``) keeping transactions whose
    /// ``StoreChange/origin`` is not ``ChangeOrigin/localSave``: other processes' commits are noticed as the
    /// environment says (``ReplicaEnvironment/otherProcessCommits``), without polling where file events work. When the
    /// consumer falls so far behind that the stream drops transactions, they are read again from history (those of
    /// this process's identity that sync did not author left out), so none is lost.
    ///
    /// - Parameters:
    ///   - storeName: the configuration name of the store to watch.
    ///   - token: announce transactions after this token; `nil` starts from the store's newest transaction.
    /// - Returns: a stream of transactions in token order. It finishes with ``ReplicaError/unknownStore(_:)`` for an
    ///   unknown store name, with ``ReplicaError/historyTokenExpired(_:)`` if history the observer had not read yet
    ///   was pruned, with ``ReplicaError/observationFailed(store:underlying:)`` when history cannot be read, and ends
    ///   when the consuming task is cancelled.
    public func historyTransactions(ofStore storeName: String, after token: HistoryToken? = nil)
        -> AsyncThrowingStream<HistoryTransaction, any Error> {
        let container = self
        // The starting point is read now, so that a save right after this call is announced.
        let start = token ?? (try? ModelContext(self).currentHistoryToken(of: storeName))
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    let stream = try container.changes(in: [storeName], after: start.map { [$0] } ?? [])
                    for try await event in stream {
                        switch event {
                        case let .committed(change):
                            guard change.origin != .localSave, let transaction = change.historyTransaction else { continue }
                            continuation.yield(transaction)
                        case let .overflow(dropped):
                            for gap in dropped {
                                for transaction in try container.rereadHistory(gap) { continuation.yield(transaction) }
                            }
                        }
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

    /// As ``historyTransactions(ofStore:after:)``; `pollingInterval` is no longer used (the environment's
    /// ``ReplicaEnvironment/otherProcessCommits`` says how other processes' commits are noticed).
    @available(*, deprecated, message: "use historyTransactions(ofStore:after:); set ReplicaEnvironment.otherProcessCommits to choose polling")
    public func historyTransactions(ofStore storeName: String, after token: HistoryToken? = nil, pollingInterval: Int64)
        -> AsyncThrowingStream<HistoryTransaction, any Error> {
        historyTransactions(ofStore: storeName, after: token)
    }

    /// The transactions a change stream dropped, read again from history: those no context of this process saved.
    /// - Throws: ``ReplicaError/historyTokenExpired(_:)`` when they were pruned meanwhile.
    private func rereadHistory(_ gap: DroppedChanges) throws -> [HistoryTransaction] {
        guard let store = stores.first(where: { $0.configuration.name == gap.storeName }) else { return [] }
        let start = gap.after ?? HistoryToken(storeIdentity: store.identity, value: 0)
        let me = environment.processIdentity
        return try ModelContext(self).fetchHistory(HistoryDescriptor(after: start)).filter { transaction in
            guard gap.through.map({ transaction.token <= $0 }) ?? true else { return false }
            let mine = transaction.bundleIdentifier == me.bundleIdentifier && transaction.processID == me.processID
                && transaction.processName == me.processName
            return !mine || transaction.author == HistoryTransaction.syncAuthor
        }
    }
}
