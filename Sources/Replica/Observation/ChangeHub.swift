import Foundation
import Synchronization

/// Receives the committed changes of the stores it subscribed to. Internal.
///
/// The hub calls these under its lock, in commit order per store; implementations must not call back into the hub.
protocol ChangeSubscriber: AnyObject, Sendable {
    /// One committed transaction of a subscribed store (for a subscriber with an entity filter: one that changed a
    /// subscribed entity).
    func receive(_ change: StoreChange)
    /// Transactions of store `storeName` after `after` through `through` can no longer be read (another process
    /// pruned history before this one read it).
    func receiveGap(_ dropped: DroppedChanges)
    /// Reading the store's history failed; the subscriber ends with `error`.
    func fail(_ error: ReplicaError)
}

/// The one place a container's committed changes go through (Principle 10: one way to hear about change). Internal.
///
/// Committers — ``ModelContext/save()`` and the ``SyncEngine``'s imports — tell the hub before they commit which
/// history token they are about to commit (``willCommit(store:token:origin:)``) and after (``didCommit(store:token:reading:)``);
/// while anything subscribes to a store, the hub then reads the store's history after the last token it read,
/// on the committer's own connection and thread (so single-threaded drivers such as the simulator stay
/// deterministic), and hands each transaction to the subscribers it concerns. Commits of other processes (and other
/// containers on the same file) are read the same way when the ``CommitWatcher`` wakes, or when a synchronous
/// observer catches up. Transactions whose token a committer announced get its origin; the others come from
/// elsewhere (``ChangeOrigin/otherProcess``).
///
/// Live queries need to know which records changed, not the transaction: when only they subscribe to a store and the
/// committed token follows the hub's position (nothing else was committed in between), the hub hands them the
/// committer's own changes — those its history transaction records — and reads nothing.
///
/// Cost while nothing subscribes to a store: three uncontended locks and a dictionary insert and removal per save.
/// With subscribers: one history read per commit (one prepared statement over the token range; none for live queries
/// alone, see above), and per transaction O(subscribers of the entities it changed).
final class ChangeHub: Sendable {
    let stores: [Store]
    let environment: ReplicaEnvironment
    private let state: Mutex<State>
    /// Per store, the tokens this container is committing (or committed, not read yet), with their origin. A lock of
    /// its own, taken alone by committers inside their write transactions (never waiting for a read the hub's lock
    /// covers) and inside the hub's lock by readers (always in that order).
    private let expected: Mutex<[[Int64: ChangeOrigin]]>

    init(stores: [Store], environment: ReplicaEnvironment) {
        self.stores = stores
        self.environment = environment
        self.state = Mutex(State(stores: stores.map { _ in StoreState() }))
        self.expected = Mutex(stores.map { _ in [:] })
    }

    /// Removes and returns the origin a committer announced for `token` of store `index`.
    private func takeExpected(_ index: Int, _ token: Int64) -> ChangeOrigin? {
        expected.withLock { $0[index].removeValue(forKey: token) }
    }

    deinit {
        let watcher = state.withLock { state -> CommitWatcher? in
            defer { state.watcher = nil }
            return state.watcher
        }
        watcher?.stop()
    }

    /// A subscriber's registration.
    private struct Registration {
        let subscriber: any ChangeSubscriber
        let stores: [Int]
        /// Per store, the entities whose changes the subscriber wants (`nil`: every change of its stores).
        let entities: [Int: [String]]?
        let watchesOtherProcesses: Bool
    }

    /// A subscriber as the stores' indexes hold it (the receiver itself: handing out a change looks nothing up).
    private struct Subscriber {
        let id: Int
        let receiver: any ChangeSubscriber
    }

    private struct StoreState {
        /// The last token read, valid while ``subscribers`` > 0.
        var lastToken: Int64 = 0
        var subscribers = 0
        /// Subscribers that want every change of the store.
        var all: [Subscriber] = []
        /// Subscribers by the entities they want.
        var byEntity: [String: [Subscriber]] = [:]
        /// Subscribers that want other processes' commits noticed without delay (the watcher runs for them).
        var watching = 0
        /// The hub's own reader, for reads no caller's connection serves (the watcher's).
        var connection: ConnectionReference?
        /// `PRAGMA data_version` of ``connection`` at its last read: unchanged means no connection committed since.
        var dataVersion: SQLiteValue?
    }

    private struct State {
        var nextID = 1
        var registrations: [Int: Registration] = [:]
        var stores: [StoreState]
        var watcher: CommitWatcher?
    }

    // MARK: Subscribing

    /// Registers `subscriber` for `storeIndices`. From now on it receives every transaction committed to them (those
    /// of `entities` only, when given); with `after`, first the transactions of a store after that token value.
    /// - Parameters:
    ///   - connections: connections of the caller to the stores, for the reads this needs (else the hub's own).
    ///   - watchesOtherProcesses: start the watcher for file stores (asynchronous observers); synchronous ones catch
    ///     up with ``catchUp(store:reading:)`` instead.
    /// - Returns: the subscription's ID, for ``unsubscribe(_:)``.
    /// - Throws: ``ReplicaError/observationFailed(store:underlying:)`` when the store's history cannot be read.
    func subscribe(_ subscriber: any ChangeSubscriber, stores storeIndices: [Int], entities: [Int: [String]]?,
                   after: [Int: Int64] = [:], watchesOtherProcesses: Bool,
                   connections: [Int: ConnectionReference] = [:]) throws(ReplicaError) -> Int {
        let (id, startWatching) = try state.withLock { state throws(ReplicaError) -> (Int, [Int]) in
            // Read every store's starting point first: nothing is registered if one fails.
            var starts: [Int: Int64] = [:]
            for index in storeIndices where state.stores[index].subscribers == 0 {
                starts[index] = try read(index, &state, connections[index]) { db in try HistoryLog.latestToken(db) }
            }
            let id = state.nextID
            state.nextID += 1
            state.registrations[id] = Registration(subscriber: subscriber, stores: storeIndices, entities: entities,
                                                   watchesOtherProcesses: watchesOtherProcesses)
            var startWatching: [Int] = []
            for index in storeIndices {
                if let start = starts[index] {
                    state.stores[index].lastToken = start
                    state.stores[index].dataVersion = nil
                }
                state.stores[index].subscribers += 1
                if let names = entities?[index] {
                    for name in names { state.stores[index].byEntity[name, default: []].append(Subscriber(id: id, receiver: subscriber)) }
                } else {
                    state.stores[index].all.append(Subscriber(id: id, receiver: subscriber))
                }
                if watchesOtherProcesses, case .file = stores[index].location {
                    state.stores[index].watching += 1
                    if state.stores[index].watching == 1 { startWatching.append(index) }
                }
            }
            // Transactions before the hub's position that this subscriber asked for: to it alone.
            for index in storeIndices {
                guard let first = after[index], first < state.stores[index].lastToken else { continue }
                let last = state.stores[index].lastToken
                do throws(ReplicaError) {
                    let transactions = try read(index, &state, connections[index]) { db in
                        try Self.transactions(of: stores[index], after: first, db: db)
                    }
                    for transaction in transactions.transactions where transaction.token.value <= last {
                        subscriber.receive(change(transaction, origin: classify(transaction)))
                    }
                    if let gap = transactions.gap { subscriber.receiveGap(gap) }
                } catch {
                    subscriber.fail(error)
                }
            }
            return (id, startWatching)
        }
        if !startWatching.isEmpty { watch(startWatching) }
        return id
    }

    /// Removes a subscription; a store nobody subscribes to any more gives back the hub's connection to it.
    func unsubscribe(_ id: Int) {
        let stopWatching = state.withLock { state -> [Int] in
            guard let registration = state.registrations.removeValue(forKey: id) else { return [] }
            var stopWatching: [Int] = []
            for index in registration.stores {
                var store = state.stores[index]
                store.subscribers -= 1
                if let names = registration.entities?[index] {
                    for name in names {
                        store.byEntity[name]?.removeAll { $0.id == id }
                        if store.byEntity[name]?.isEmpty == true { store.byEntity[name] = nil }
                    }
                } else {
                    store.all.removeAll { $0.id == id }
                }
                if registration.watchesOtherProcesses, case .file = stores[index].location {
                    store.watching -= 1
                    if store.watching == 0 { stopWatching.append(index) }
                }
                if store.subscribers == 0 {
                    // The store's pool takes the connection back (its own lock; it never calls the hub).
                    if let connection = store.connection { stores[index].reuse(connection.connection) }
                    store.connection = nil
                    store.dataVersion = nil
                }
                state.stores[index] = store
            }
            return stopWatching
        }
        if !stopWatching.isEmpty { state.withLock { $0.watcher }?.unwatch(stopWatching) }
    }

    /// The number of live subscriptions (tests check that observers unsubscribe).
    var subscriptionCount: Int { state.withLock { $0.registrations.count } }

    // MARK: Committers

    /// A committer of this container is about to commit history token `token` of store `store`.
    func willCommit(store: Int, token: Int64, origin: ChangeOrigin) {
        expected.withLock { $0[store][token] = origin }
    }

    /// The commit announced with ``willCommit(store:token:origin:)`` did not happen.
    func abandon(store: Int, token: Int64) {
        _ = takeExpected(store, token)
    }

    /// The commit of `token` to `store` succeeded, writing `changes` (what its history transaction records): while
    /// anything subscribes to the store, hands out what was committed since the hub's position.
    ///
    /// Change-stream subscribers get transactions read back from the history log on `db` (the committer's connection,
    /// outside any transaction). When only live queries subscribe — they need to know which records changed, not the
    /// transaction — and nothing else was committed since the hub's position (`token` follows it), the hub hands them
    /// `changes` as the committer wrote them to the log in this transaction, and reads nothing; otherwise (another
    /// process committed in between) it reads the log.
    func didCommit(store: Int, token: Int64, reading db: Connection, changes: StoreChanges, author: String?) {
        let reader = ConnectionReference(db)
        state.withLock { state in
            guard state.stores[store].subscribers > 0 else {
                _ = takeExpected(store, token)
                return
            }
            if state.stores[store].all.isEmpty, token == state.stores[store].lastToken + 1,
               let origin = takeExpected(store, token) {
                state.stores[store].lastToken = token
                let change = StoreChange(storeName: stores[store].configuration.name, origin: origin,
                                         token: HistoryToken(storeIdentity: stores[store].identity, value: token), author: author,
                                         timestamp: environment.now(), processIdentity: environment.processIdentity,
                                         changes: Self.historyChanges(changes).describingTombstones(with: stores[store].entities, assets: stores[store].assets?.read))
                deliver(change, store: store, state)
                return
            }
            readNew(store, &state, reader)
        }
    }

    /// A save of a store that does not track history committed `changes`: announced from the save itself.
    func didCommitUntracked(store: Int, changes: StoreChanges, author: String?) {
        state.withLock { state in
            guard state.stores[store].subscribers > 0 else { return }
            let change = StoreChange(storeName: stores[store].configuration.name, origin: .localSave, token: nil, author: author,
                                     timestamp: environment.now(), processIdentity: environment.processIdentity,
                                     changes: Self.historyChanges(changes).describingTombstones(with: stores[store].entities, assets: stores[store].assets?.read))
            deliver(change, store: store, state)
        }
    }

    /// A save's changes as its history transaction lists them (``HistoryLog/record(_:author:environment:db:)``), in
    /// the order they were applied (``StoreChanges/partsInOrder``): inserts, updates with their changed fields, deletes
    /// with the preserved values — a record a save deleted and inserted again is listed deleted, then inserted.
    static func historyChanges(_ changes: StoreChanges) -> [HistoryChange] {
        var list: [HistoryChange] = []
        list.reserveCapacity(changes.inserted.count + changes.updated.count + changes.deleted.count)
        for part in changes.partsInOrder {
            switch part {
            case .inserted:
                for snapshot in changes.inserted { list.append(.insert(snapshot.persistentModelID)) }
            case .deleted:
                for record in changes.deleted {
                    let values = Dictionary(record.preservedValues, uniquingKeysWith: { first, _ in first })
                    list.append(.delete(record.id, tombstone: HistoryTombstone(values: values)))
                }
            case .updatesOfDeletes, .otherUpdates:
                for index in changes.updates(of: part) {
                    let (snapshot, fields) = changes.updated[index]
                    list.append(.update(snapshot.persistentModelID, updatedAttributes: fields))
                }
            }
        }
        return list
    }

    // MARK: Catching up

    /// Reads what was committed to `store` since the hub's position (other processes' and other containers'
    /// commits) and hands it out, on `db` (the caller's connection) or the hub's own.
    func catchUp(store: Int, reading db: Connection?) {
        let reader = db.map(ConnectionReference.init)
        state.withLock { state in
            guard state.stores[store].subscribers > 0 else { return }
            if let reader {
                readNew(store, &state, reader)
            } else {
                catchUpOnOwnConnection(store, &state)
            }
        }
    }

    /// What the watcher calls when a watched store's files changed (or its polling interval passed): every store
    /// watched for other processes is caught up on the hub's own connection, which first checks
    /// `PRAGMA data_version` (<https://www.sqlite.org/pragma.html#pragma_data_version>) so that a wake-up without a
    /// commit costs no history read.
    func catchUpWatchedStores() {
        state.withLock { state in
            for index in state.stores.indices where state.stores[index].watching > 0 {
                catchUpOnOwnConnection(index, &state)
            }
        }
    }

    private func catchUpOnOwnConnection(_ index: Int, _ state: inout State) {
        do {
            let db = try ownConnection(index, &state).connection
            let version = try db.scalar(Self.dataVersionSQL)
            if version != nil, version == state.stores[index].dataVersion { return }
            state.stores[index].dataVersion = version
        } catch let error as SQLiteError {
            failAll(index, state, .observationFailed(store: stores[index].configuration.name, underlying: error))
            return
        } catch {
            return
        }
        readNew(index, &state, nil)
    }

    private static let dataVersionSQL = StatementKey("PRAGMA data_version")

    // MARK: Reading

    /// Runs `body` on `provided` (a caller's connection to store `index`), else on the hub's own.
    private func read<T>(_ index: Int, _ state: inout State, _ provided: ConnectionReference?,
                         _ body: (Connection) throws -> T) throws(ReplicaError) -> T {
        do {
            let db = try provided ?? ownConnection(index, &state)
            return try body(db.connection)
        } catch let error as ReplicaError {
            throw error
        } catch let error as SQLiteError {
            throw .observationFailed(store: stores[index].configuration.name, underlying: error)
        } catch {
            throw .observationFailed(store: stores[index].configuration.name,
                                     underlying: SQLiteError(extendedResultCode: 1, message: "\(error)"))
        }
    }

    private func ownConnection(_ index: Int, _ state: inout State) throws -> ConnectionReference {
        if let connection = state.stores[index].connection { return connection }
        let connection = ConnectionReference(try stores[index].openConnection())
        state.stores[index].connection = connection
        return connection
    }

    /// Reads the transactions after the hub's position in `store` and hands them out, in token order; a failure ends
    /// the store's subscribers.
    private func readNew(_ index: Int, _ state: inout State, _ connection: ConnectionReference?) {
        let after = state.stores[index].lastToken
        let read: (transactions: [HistoryTransaction], gap: DroppedChanges?)
        do {
            read = try self.read(index, &state, connection) { db in try Self.transactions(of: stores[index], after: after, db: db) }
        } catch {
            failAll(index, state, error)
            return
        }
        if let gap = read.gap {
            for subscriber in subscribers(of: index, state, entities: nil) { subscriber.receiver.receiveGap(gap) }
            if let through = gap.through { state.stores[index].lastToken = max(state.stores[index].lastToken, through.value) }
        }
        for transaction in read.transactions {
            let origin = takeExpected(index, transaction.token.value) ?? classify(transaction)
            state.stores[index].lastToken = transaction.token.value
            deliver(change(transaction, origin: origin), store: index, state)
        }
        let last = state.stores[index].lastToken
        expected.withLock { expected in
            if !expected[index].isEmpty { expected[index] = expected[index].filter { $0.key > last } }
        }
    }

    /// The transactions of `store` after token value `after`, and the gap when history after it was pruned: one
    /// statement (``HistoryLog/transactions(after:storeName:identity:db:)``), plus a read of the pruning mark when
    /// the first transaction does not follow `after`.
    static func transactions(of store: Store, after: Int64, db: Connection) throws -> (transactions: [HistoryTransaction], gap: DroppedChanges?) {
        let (read, contiguous) = try HistoryLog.transactions(after: after, storeName: store.configuration.name,
                                                             identity: store.identity, db: db)
        let transactions = read.map { $0.describingTombstones(with: store.entities, assets: store.assets?.read) }
        guard !contiguous || transactions.isEmpty else { return (transactions, nil) }
        let pruned = try HistoryLog.prunedThrough(db)
        guard pruned > after else { return (transactions, nil) }
        let gap = DroppedChanges(storeName: store.configuration.name,
                                 after: after > 0 ? HistoryToken(storeIdentity: store.identity, value: after) : nil,
                                 through: HistoryToken(storeIdentity: store.identity, value: pruned), count: Int(pruned - after))
        return (transactions.filter { $0.token.value > pruned }, gap)
    }

    /// The origin of a transaction no committer of this container announced: one saved before the hub's position
    /// (asked for with `after`) is this container's own when its process identity is this environment's.
    private func classify(_ transaction: HistoryTransaction) -> ChangeOrigin {
        let me = environment.processIdentity
        guard transaction.bundleIdentifier == me.bundleIdentifier, transaction.processID == me.processID,
              transaction.processName == me.processName else { return .otherProcess }
        return transaction.author == HistoryTransaction.syncAuthor ? .syncImport : .localSave
    }

    private func change(_ transaction: HistoryTransaction, origin: ChangeOrigin) -> StoreChange {
        StoreChange(storeName: transaction.storeName, origin: origin, token: transaction.token, author: transaction.author,
                    timestamp: transaction.timestamp,
                    processIdentity: ProcessIdentity(bundleIdentifier: transaction.bundleIdentifier, processName: transaction.processName,
                                                     processID: transaction.processID),
                    changes: transaction.changes)
    }

    /// Hands `change` to the subscribers of `store` it concerns: those of every change, and those of an entity it
    /// changed (each once).
    private func deliver(_ change: StoreChange, store index: Int, _ state: State) {
        // The common case, a change of one entity: its subscribers' list as it is, no set to build.
        if change.changes.allSatisfy({ $0.changedPersistentIdentifier.entityName == change.changes[0].changedPersistentIdentifier.entityName }),
           let first = change.changes.first {
            for subscriber in state.stores[index].all { subscriber.receiver.receive(change) }
            for subscriber in state.stores[index].byEntity[first.changedPersistentIdentifier.entityName] ?? [] {
                subscriber.receiver.receive(change)
            }
            return
        }
        for subscriber in subscribers(of: index, state, entities: change.entityNames) { subscriber.receiver.receive(change) }
    }

    /// The subscribers of `store`: those of every change, then those of `entities` (all of them when `nil`), each once.
    private func subscribers(of index: Int, _ state: State, entities: [String]?) -> [Subscriber] {
        var list = state.stores[index].all
        if let entities {
            for name in entities { list += state.stores[index].byEntity[name] ?? [] }
        } else {
            for name in state.stores[index].byEntity.keys.sorted() { list += state.stores[index].byEntity[name] ?? [] }
        }
        guard list.count > 1 else { return list }
        var seen = Set<Int>()
        return list.filter { seen.insert($0.id).inserted }
    }

    private func failAll(_ index: Int, _ state: State, _ error: ReplicaError) {
        for subscriber in subscribers(of: index, state, entities: nil) { subscriber.receiver.fail(error) }
    }

    // MARK: Watching other processes

    private func watch(_ indices: [Int]) {
        let watcher = state.withLock { state -> CommitWatcher in
            if let watcher = state.watcher { return watcher }
            let watcher = CommitWatcher(hub: self, mode: environment.otherProcessCommits, sleep: environment.sleep)
            state.watcher = watcher
            return watcher
        }
        watcher.watch(indices.compactMap { index in
            if case let .file(url) = stores[index].location { return (index, url) }
            return nil
        })
    }
}

/// A connection handed to the hub for reads under its lock. `@unchecked Sendable`: a caller's connection is used only
/// during the call that hands it over, on the caller's thread; the hub's own connections are used only under its lock
/// (SQLite's multi-thread mode allows a connection on any thread, one at a time).
struct ConnectionReference: @unchecked Sendable {
    let connection: Connection
    init(_ connection: Connection) { self.connection = connection }
}
