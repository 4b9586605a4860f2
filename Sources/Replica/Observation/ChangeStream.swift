import Foundation
import Synchronization

extension ModelContainer {
    /// Every change committed to any store of this container, from the moment iteration starts: see ``ChangeStream``.
    public var changes: ChangeStream {
        ChangeStream(container: self, stores: Array(stores.indices), after: [:], bufferLimit: ChangeStream.defaultBufferLimit)
    }

    /// The changes committed to the stores named `storeNames` (configuration names), from the moment iteration
    /// starts: see ``ChangeStream``.
    /// - Parameters:
    ///   - storeNames: the stores to announce.
    ///   - tokens: per store, announce its transactions after this token first (read from its history), then go on
    ///     live; stores without a token start at the moment iteration starts. A token older than pruned history
    ///     announces the pruned part as ``ChangeEvent/overflow(_:)``.
    ///   - bufferLimit: events held for a consumer that falls behind before they are replaced by one
    ///     ``ChangeEvent/overflow(_:)`` (at least 1; default ``ChangeStream/defaultBufferLimit``).
    /// - Throws: ``ReplicaError/unknownStore(_:)`` for a name the container lacks,
    ///   ``ReplicaError/historyTokenFromAnotherStore(_:)`` for a token of no store named here.
    public func changes(in storeNames: [String], after tokens: [HistoryToken] = [],
                        bufferLimit: Int = ChangeStream.defaultBufferLimit) throws(ReplicaError) -> ChangeStream {
        var indices: [Int] = []
        for name in storeNames {
            guard let index = stores.firstIndex(where: { $0.configuration.name == name }) else { throw .unknownStore(name) }
            if !indices.contains(index) { indices.append(index) }
        }
        var after: [Int: Int64] = [:]
        for token in tokens {
            guard let index = indices.first(where: { stores[$0].identity == token.storeIdentity }) else {
                throw .historyTokenFromAnotherStore(token)
            }
            after[index] = token.value
        }
        return ChangeStream(container: self, stores: indices, after: after, bufferLimit: max(1, bufferLimit))
    }
}

/// The change stream of a container (Principle 10 of DESIGN.md: one way to hear about change): every transaction
/// committed to its stores — saves of any ``ModelContext`` of this container, changes a ``SyncEngine`` imported from
/// the cloud, and commits of other processes to a shared (app-group) store file — as ``ChangeEvent``s.
///
/// Each ``StoreChange`` is read back from the store's history log by token (the one source of truth) and says which
/// store, which token, who (``ChangeOrigin``, author, process identity) and what: inserted, updated (with the changed
/// attributes) and deleted identifiers. A store that does not track history announces its context saves from the
/// save itself (no token). Transactions of one store arrive in commit order; a rollback or a failed save announces
/// nothing. Live queries (``ModelContainer/observe(_:)``) and `ModelContext.didSave` are views of the same
/// mechanism, and so is a sync runtime that wants to hear of local saves and other processes' commits
/// (filter on ``StoreChange/origin``).
///
/// **Iteration.** Each iterator is one subscription, starting when it is made (`for try await` makes it when the
/// loop starts); it ends when the iterating task is cancelled or the iterator is dropped, which frees the
/// subscription. It throws ``ReplicaError/observationFailed(store:underlying:)`` when a store's history cannot be
/// read. A stream may be iterated from any task or actor.
///
/// **A slow consumer never blocks saves.** Committers hand each event to a buffer of the subscription and return.
/// Up to `bufferLimit` events wait; past that, one ``ChangeEvent/overflow(_:)`` takes the place of everything that
/// follows until the consumer reads it, naming per store the last token delivered before the gap: re-read from there
/// (``ModelContext/fetchHistory(_:)``). Memory per subscription is bounded by the buffer.
///
/// **Other processes.** Their commits are read when the container notices them (see
/// ``ReplicaEnvironment/otherProcessCommits``: inotify on Linux, else `PRAGMA data_version` polling), and when this
/// container next commits to the same store. Commits by other processes arrive in token order with the rest.
public struct ChangeStream: AsyncSequence, Sendable {
    public typealias Element = ChangeEvent
    public typealias Failure = ReplicaError

    /// Events buffered per subscription before an overflow replaces the rest.
    public static let defaultBufferLimit = 1_000

    let container: ModelContainer
    let stores: [Int]
    let after: [Int: Int64]
    let bufferLimit: Int

    public func makeAsyncIterator() -> Iterator {
        let subscription = StreamSubscription(limit: bufferLimit)
        do {
            let id = try container.changeHub.subscribe(subscription, stores: stores, entities: nil, after: after, watchesOtherProcesses: true)
            return Iterator(handle: SubscriptionHandle(container: container, id: id, subscription: subscription))
        } catch {
            subscription.fail(error)
            return Iterator(handle: SubscriptionHandle(container: container, id: nil, subscription: subscription))
        }
    }

    /// Iterates one subscription (see ``ChangeStream``). `Sendable`: an iterator made on one task may be handed to
    /// another (the subscription starts when it is made).
    public struct Iterator: AsyncIteratorProtocol, Sendable {
        let handle: SubscriptionHandle

        /// The next event, waiting for one; `nil` once the iterating task is cancelled.
        /// - Throws: ``ReplicaError/observationFailed(store:underlying:)`` after the events buffered before the failure.
        public mutating func next() async throws(ReplicaError) -> ChangeEvent? {
            try await handle.subscription.next()
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(ReplicaError) -> ChangeEvent? {
            try await handle.subscription.next()
        }
    }
}

/// Keeps a subscription registered while its iterator lives, and removes it when the iterator goes. Internal.
final class SubscriptionHandle: Sendable {
    let container: ModelContainer
    let id: Int?
    let subscription: StreamSubscription

    init(container: ModelContainer, id: Int?, subscription: StreamSubscription) {
        self.container = container
        self.id = id
        self.subscription = subscription
    }

    deinit {
        if let id { container.changeHub.unsubscribe(id) }
    }
}

/// The buffer of one change-stream subscription. Internal.
final class StreamSubscription: ChangeSubscriber {
    private struct State {
        var buffer: [ChangeEvent] = []
        var head = 0
        var waiter: CheckedContinuation<Result<ChangeEvent?, ReplicaError>, Never>?
        var failure: ReplicaError?
        var finished = false
        /// Per store, the token of the last transaction buffered (what an overflow names as `after`).
        var lastBuffered: [String: HistoryToken?] = [:]

        var count: Int { buffer.count - head }

        mutating func pop() -> ChangeEvent? {
            guard head < buffer.count else { return nil }
            let event = buffer[head]
            head += 1
            if head == buffer.count {
                buffer.removeAll(keepingCapacity: true)
                head = 0
            } else if head > 64 && head * 2 > buffer.count {
                buffer.removeFirst(head)
                head = 0
            }
            return event
        }
    }

    private let state = Mutex(State())
    private let limit: Int

    init(limit: Int) { self.limit = limit }

    func receive(_ change: StoreChange) {
        state.withLock { state in
            guard !state.finished else { return }
            if let waiter = state.waiter {
                state.waiter = nil
                state.lastBuffered[change.storeName] = change.token
                waiter.resume(returning: .success(.committed(change)))
                return
            }
            if case let .overflow(dropped)? = state.buffer.last, state.count > 0 {
                state.buffer[state.buffer.count - 1] = .overflow(Self.adding(change, to: dropped, state.lastBuffered))
            } else if state.count >= limit {
                state.buffer.append(.overflow(Self.adding(change, to: [], state.lastBuffered)))
            } else {
                state.buffer.append(.committed(change))
                state.lastBuffered[change.storeName] = change.token
            }
        }
    }

    private static func adding(_ change: StoreChange, to dropped: [DroppedChanges], _ last: [String: HistoryToken?]) -> [DroppedChanges] {
        var dropped = dropped
        if let index = dropped.firstIndex(where: { $0.storeName == change.storeName }) {
            let entry = dropped[index]
            dropped[index] = DroppedChanges(storeName: entry.storeName, after: entry.after, through: change.token ?? entry.through,
                                            count: entry.count + 1)
        } else {
            dropped.append(DroppedChanges(storeName: change.storeName, after: last[change.storeName] ?? nil, through: change.token, count: 1))
        }
        return dropped
    }

    func receiveGap(_ gap: DroppedChanges) {
        state.withLock { state in
            guard !state.finished else { return }
            if let waiter = state.waiter {
                state.waiter = nil
                waiter.resume(returning: .success(.overflow([gap])))
            } else if case let .overflow(dropped)? = state.buffer.last, state.count > 0 {
                state.buffer[state.buffer.count - 1] = .overflow(dropped + [gap])
            } else {
                state.buffer.append(.overflow([gap]))
            }
            state.lastBuffered[gap.storeName] = gap.through
        }
    }

    func fail(_ error: ReplicaError) {
        state.withLock { state in
            guard !state.finished, state.failure == nil else { return }
            state.failure = error
            if let waiter = state.waiter {
                state.waiter = nil
                state.finished = true
                waiter.resume(returning: .failure(error))
            }
        }
    }

    /// The next buffered event, or waits for one; `nil` once cancelled.
    func next() async throws(ReplicaError) -> ChangeEvent? {
        let result: Result<ChangeEvent?, ReplicaError> = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<ChangeEvent?, ReplicaError>, Never>) in
                state.withLock { state in
                    if let event = state.pop() {
                        continuation.resume(returning: .success(event))
                    } else if let failure = state.failure, !state.finished {
                        state.finished = true
                        continuation.resume(returning: .failure(failure))
                    } else if state.finished || Task.isCancelled {
                        state.finished = true
                        continuation.resume(returning: .success(nil))
                    } else {
                        state.waiter = continuation
                    }
                }
            }
        } onCancel: {
            state.withLock { state in
                state.finished = true
                if let waiter = state.waiter {
                    state.waiter = nil
                    waiter.resume(returning: .success(nil))
                }
            }
        }
        return try result.get()
    }
}
