import Foundation
import Synchronization

extension ModelContainer {
    /// A live query (SwiftData's `@Query`): the models `descriptor` selects now, then again after every committed
    /// change that can change them. See ``LiveQuery``.
    ///
    /// Changes that can change the result are those of the descriptor's entity, of the entities its predicate and
    /// sort reach through relationships, of its to-many members, and of the relationships it prefetches (and
    /// theirs). Results are compared field by field, to-many members and prefetched targets included, and an equal
    /// result is not delivered again.
    /// - Parameter descriptor: what to fetch (its `includePendingChanges` does not matter: the query reads committed
    ///   state through a context of its own).
    public func observe<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) -> LiveQuery<[Model]> {
        LiveQuery(container: self, query: ObservedQuery(
            storeIndex: storeIndex(of: Model.self),
            dependencies: { context in (Array(try context.entitiesRead(by: descriptor)).sorted(), nil) },
            fetch: { context in try context.fetch(descriptor, registeringReads: false) },
            same: { a, b in
                let entity = Model.entity
                return a.count == b.count && zip(a, b).allSatisfy { entity.sameValue($0, $1) }
            }))
    }

    /// A live count: the number of models `descriptor` selects now, then again after every committed change that can
    /// change it (the same changes as ``observe(_:)-(FetchDescriptor<Model>)``); an equal count is not delivered
    /// again. Counted in SQL.
    public func observeCount<Model: PersistentModel>(_ descriptor: FetchDescriptor<Model>) -> LiveQuery<Int> {
        LiveQuery(container: self, query: ObservedQuery(
            storeIndex: storeIndex(of: Model.self),
            dependencies: { context in (Array(try context.entitiesRead(by: descriptor)).sorted(), nil) },
            fetch: { context in try context.fetchCount(descriptor, registeringReads: false) },
            same: { $0 == $1 }))
    }

    /// One live model: the record `id` of `type` now (`nil` while there is none), then again after every committed
    /// change of that record or of the records of its to-many relationships; an equal value is not delivered again.
    public func observe<Model: PersistentModel>(_ type: Model.Type, id: UUID) -> LiveQuery<Model?> {
        let identifier = PersistentIdentifier(entityName: Model.entity.name, id: id)
        return LiveQuery(container: self, query: ObservedQuery(
            storeIndex: storeIndex(of: Model.self),
            dependencies: { context in (Array(context.entitiesRead(byIdentifierOf: Model.entity.schemaEntity)).sorted(), identifier) },
            fetch: { context in try context.model(Model.self, id: id, registeringReads: false) },
            same: { a, b in sameCarriedTarget(a, b) }))
    }

    /// The store of `Model`; traps for a model type not in the schema (a programming error, as in ``ModelContext``).
    func storeIndex<Model: PersistentModel>(of type: Model.Type) -> Int {
        guard let index = storeIndexByEntity[Model.entity.name] else {
            preconditionFailure("Replica: \(Model.self) (entity '\(Model.entity.name)') is not in the container's schema")
        }
        return index
    }
}

/// What a live query reads and how its values compare. Internal.
struct ObservedQuery<Value: Sendable>: Sendable {
    let storeIndex: Int
    /// The entities whose changes can change the value and, for one observed record, its identifier (changes of its
    /// own entity concern it only when they are of that record).
    let dependencies: @Sendable (ModelContext) throws -> (entities: [String], identifier: PersistentIdentifier?)
    let fetch: @Sendable (ModelContext) throws -> Value
    let same: @Sendable (Value, Value) -> Bool
}

/// A live query: an `AsyncSequence` of values — the current value first, then a new one after each committed change
/// that can change it. Made by ``ModelContainer/observe(_:)-(FetchDescriptor<Model>)``,
/// ``ModelContainer/observeCount(_:)`` and ``ModelContainer/observe(_:id:)``.
///
/// - **Every source of change.** A view of the container's change stream (``ModelContainer/changes``): saves of any
///   context of this container, sync imports, other processes' commits to a shared store file.
/// - **Where it runs.** The sequence is `Sendable`; iterate it from any task or actor — `@MainActor` included — and
///   each fetch runs there, on that actor, through a context the iterator owns (opened when iteration starts).
///   Models are `Sendable` values: references in them load their targets through that context while the iteration
///   lives (see ``Reference``).
/// - **Coalesced, never a duplicate.** A commit marks the query stale; the next fetch happens when the consumer asks
///   for the next value, so a burst of commits while the consumer is busy costs one fetch. A fetch whose result
///   equals the last one delivered is not delivered. Each value reflects every commit before its fetch began, so
///   values follow commit order.
/// - **Cancellation.** Cancelling the iterating task (or dropping the iterator) ends the sequence and frees the
///   subscription and the context's connections. A fetch error ends the sequence with that error.
public struct LiveQuery<Value: Sendable>: AsyncSequence, Sendable {
    public typealias Element = Value
    public typealias Failure = any Error

    let container: ModelContainer
    let query: ObservedQuery<Value>

    public func makeAsyncIterator() -> Iterator { Iterator(container: container, query: query) }

    /// Iterates a live query (see ``LiveQuery``). Not `Sendable`: it stays with the task that iterates.
    public struct Iterator: AsyncIteratorProtocol {
        let container: ModelContainer
        let query: ObservedQuery<Value>
        var core: LiveQueryCore<Value>?
        var finished = false

        init(container: ModelContainer, query: ObservedQuery<Value>) {
            self.container = container
            self.query = query
        }

        /// The current value on the first call; afterwards, the next value that differs from the last one, waiting
        /// for a change that concerns the query. `nil` once the iterating task is cancelled.
        /// - Throws: the error of a failed fetch, or ``ReplicaError/observationFailed(store:underlying:)``.
        public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async throws -> Value? {
            guard !finished else { return nil }
            do {
                guard let core else {
                    let core = try LiveQueryCore(container: container, query: query, context: ModelContext(container), watchesOtherProcesses: true)
                    self.core = core
                    return try core.fetchFirst()
                }
                while true {
                    switch await core.signal.wait() {
                    case .cancelled:
                        end()
                        return nil
                    case let .failed(error):
                        throw error
                    case .changed:
                        if let value = try core.refetch() { return value }
                    }
                }
            } catch {
                end()
                throw error
            }
        }

        public mutating func next() async throws -> Value? {
            try await next(isolation: nil)
        }

        private mutating func end() {
            finished = true
            core = nil
        }
    }
}

/// The state of one live query: its context, subscription and last value. Used from one isolation domain (the
/// iterating task, or a synchronous observer's thread). Internal.
final class LiveQueryCore<Value: Sendable> {
    let container: ModelContainer
    let query: ObservedQuery<Value>
    let context: ModelContext
    let signal: LiveQuerySignal
    private var subscriptionID: Int?
    private(set) var last: Value?
    /// Values delivered so far.
    private(set) var emissions = 0
    /// Fetches run so far (the first included).
    private(set) var fetches = 0

    /// Subscribes (before the first fetch, so that no commit after it is missed).
    init(container: ModelContainer, query: ObservedQuery<Value>, context: ModelContext, watchesOtherProcesses: Bool) throws {
        self.container = container
        self.query = query
        self.context = context
        let (entities, identifier) = try query.dependencies(context)
        signal = LiveQuerySignal(entities: Set(entities), identifier: identifier)
        let connection = ConnectionReference(try context.connection(for: query.storeIndex))
        subscriptionID = try container.changeHub.subscribe(signal, stores: [query.storeIndex], entities: [query.storeIndex: entities],
                                                           watchesOtherProcesses: watchesOtherProcesses,
                                                           connections: [query.storeIndex: connection])
    }

    deinit {
        if let subscriptionID { container.changeHub.unsubscribe(subscriptionID) }
    }

    /// The first value (always delivered).
    func fetchFirst() throws -> Value {
        _ = signal.takeChange()
        let value = try fetch()
        last = value
        emissions += 1
        return value
    }

    /// Fetches again; returns the value when it differs from the last one delivered.
    func refetch() throws -> Value? {
        let value = try fetch()
        if let last, query.same(last, value) { return nil }
        last = value
        emissions += 1
        return value
    }

    /// One fetch in one read transaction (one snapshot for the main query and its relationships' queries).
    private func fetch() throws -> Value {
        fetches += 1
        let db = try context.connection(for: query.storeIndex)
        return try db.transaction(.deferred) { try query.fetch(context) }
    }
}

/// Marks a live query stale when a committed change concerns it, and wakes its iterator. Internal.
///
/// Marking is the hot path (every commit of an entity marks every query of it): two atomic operations while the
/// query is already marked or nobody waits; the lock only to wake a waiting iterator. `changed` and `waiting` are
/// sequentially consistent, so a mark and a wait that race either see each other's flag (no wake is lost).
final class LiveQuerySignal: ChangeSubscriber {
    enum Wake: Sendable {
        case changed
        case failed(ReplicaError)
        case cancelled
    }

    private struct State {
        var failure: ReplicaError?
        var cancelled = false
        var waiter: CheckedContinuation<Wake, Never>?
    }

    private let state = Mutex(State())
    /// A change concerned the query since the last fetch began.
    private let changed = Atomic<Bool>(false)
    /// An iterator waits (or is about to): a mark must take the lock and wake it.
    private let waiting = Atomic<Bool>(false)
    private let entities: Set<String>
    /// For one observed record: changes of its own entity concern it only when they are of this record.
    private let identifier: PersistentIdentifier?

    init(entities: Set<String>, identifier: PersistentIdentifier?) {
        self.entities = entities
        self.identifier = identifier
    }

    private func concerns(_ change: StoreChange) -> Bool {
        guard let identifier else { return true }
        return change.changes.contains { item in
            let id = item.changedPersistentIdentifier
            return entities.contains(id.entityName) && (id.entityName != identifier.entityName || id == identifier)
        }
    }

    func receive(_ change: StoreChange) {
        guard concerns(change) else { return }
        mark()
    }

    func receiveGap(_ dropped: DroppedChanges) { mark() }

    private func mark() {
        changed.store(true, ordering: .sequentiallyConsistent)
        guard waiting.load(ordering: .sequentiallyConsistent) else { return }
        state.withLock { state in
            guard let waiter = state.waiter, changed.exchange(false, ordering: .sequentiallyConsistent) else { return }
            state.waiter = nil
            waiting.store(false, ordering: .sequentiallyConsistent)
            waiter.resume(returning: .changed)
        }
    }

    func fail(_ error: ReplicaError) {
        state.withLock { state in
            state.failure = error
            if let waiter = state.waiter {
                state.waiter = nil
                waiting.store(false, ordering: .sequentiallyConsistent)
                waiter.resume(returning: .failed(error))
            }
        }
    }

    /// Whether a change arrived since the last call (and clears it): what a synchronous observer polls.
    func takeChange() -> Bool {
        changed.exchange(false, ordering: .sequentiallyConsistent)
    }

    /// The failure that ended the subscription, if any.
    var failure: ReplicaError? { state.withLock { $0.failure } }

    /// Waits until a change concerns the query (clearing the mark), the subscription fails, or the task is cancelled.
    func wait() async -> Wake {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Wake, Never>) in
                state.withLock { state in
                    if let failure = state.failure {
                        continuation.resume(returning: .failed(failure))
                        return
                    }
                    if state.cancelled || Task.isCancelled {
                        continuation.resume(returning: .cancelled)
                        return
                    }
                    // Announce the wait before looking at the mark (see the type's documentation).
                    waiting.store(true, ordering: .sequentiallyConsistent)
                    if changed.exchange(false, ordering: .sequentiallyConsistent) {
                        waiting.store(false, ordering: .sequentiallyConsistent)
                        continuation.resume(returning: .changed)
                    } else {
                        state.waiter = continuation
                    }
                }
            }
        } onCancel: {
            state.withLock { state in
                state.cancelled = true
                if let waiter = state.waiter {
                    state.waiter = nil
                    waiting.store(false, ordering: .sequentiallyConsistent)
                    waiter.resume(returning: .cancelled)
                }
            }
        }
    }
}

/// For single-threaded drivers (the simulator): a live query checked synchronously, through a context the caller
/// owns. ``refresh()`` reads what other processes and containers committed to the store (on the context's connection),
/// then fetches again when a change concerned the query, exactly as the asynchronous iterator would, and keeps the
/// value. No task, no watcher: deterministic.
@_spi(Simulation) public final class SynchronousLiveQuery<Value: Sendable> {
    private let core: LiveQueryCore<Value>

    /// Subscribes and fetches the first value.
    /// - Parameters:
    ///   - query: what to observe (``ModelContainer/observe(_:)-(FetchDescriptor<Model>)`` and its siblings).
    ///   - context: a context of the query's container, used for every fetch and read; use it from this thread only.
    /// - Throws: the first fetch's error, ``ReplicaError/observationFailed(store:underlying:)``.
    public init(_ query: LiveQuery<Value>, context: ModelContext) throws {
        precondition(context.container === query.container, "Replica: the context given to SynchronousLiveQuery belongs to another container")
        core = try LiveQueryCore(container: query.container, query: query.query, context: context, watchesOtherProcesses: false)
        _ = try core.fetchFirst()
    }

    /// The last value delivered.
    public var value: Value { core.last! }
    /// Values delivered so far (the first included).
    public var emissions: Int { core.emissions }
    /// Fetches run so far (the first included).
    public var fetches: Int { core.fetches }

    /// Catches up with the store's commits and, when one concerned the query, fetches again.
    /// - Returns: `true` when a new value (different from the last one) was delivered.
    /// - Throws: the fetch's error, ``ReplicaError/observationFailed(store:underlying:)``.
    @discardableResult
    public func refresh() throws -> Bool {
        core.container.changeHub.catchUp(store: core.query.storeIndex, reading: try core.context.connection(for: core.query.storeIndex))
        if let failure = core.signal.failure { throw failure }
        guard core.signal.takeChange() else { return false }
        return try core.refetch() != nil
    }
}
