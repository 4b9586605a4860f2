import Foundation

extension ModelContext {
    /// Posted on `NotificationCenter.default` after a successful ``save()``, with the context as the object
    /// (SwiftData's `ModelContext.didSave`), and after a ``SyncEngine`` commits changes it imported from the cloud,
    /// with the engine as the object (as SwiftData announces remote changes too; observe with `object: nil` to hear
    /// both, or with a context or engine to hear one). `userInfo` maps each ``NotificationKey`` to a
    /// `[PersistentIdentifier]` sorted by identifier. A record the save deleted and inserted again (a new incarnation)
    /// is in both the deleted and the inserted list: it was deleted, then inserted (its history transaction lists them
    /// in that order). Other processes' commits are not posted here: the container's change stream
    /// (``ModelContainer/changes``) announces every source of change.
    public static let didSave = Notification.Name("ReplicaModelContextDidSave")

    /// Keys of the ``didSave`` notification's `userInfo`.
    public enum NotificationKey: String, Sendable {
        case insertedIdentifiers, updatedIdentifiers, deletedIdentifiers
    }

    func postDidSave(_ changes: [StoreChanges]) {
        Self.postDidSave(changes, object: self)
    }

    /// Posts ``didSave`` for `changes` with `object` (a context, or the sync engine that imported them).
    static func postDidSave(_ changes: [StoreChanges], object: AnyObject) {
        // Sorted, duplicate-free lists; updated leaves out records also inserted or deleted by the save.
        // Complexity: O(n log n) comparisons without hashing (O(n) for IDs saved in creation order, the usual case).
        let inserted = Self.sortedUnique(changes.flatMap { $0.inserted.map(\.persistentModelID) })
        let deleted = Self.sortedUnique(changes.flatMap { $0.deleted.map(\.id) })
        var updated = Self.sortedUnique(changes.flatMap { $0.updated.map(\.0.persistentModelID) })
        if !updated.isEmpty && !(inserted.isEmpty && deleted.isEmpty) {
            updated.removeAll { Self.sortedContains(inserted, $0) || Self.sortedContains(deleted, $0) }
        }
        // A copy of a prebuilt dictionary with the three keys, its values replaced in place: no key is hashed per save.
        let template = Self.didSaveUserInfo
        var userInfo = template.dictionary
        userInfo.values[template.inserted] = inserted
        userInfo.values[template.updated] = updated
        userInfo.values[template.deleted] = deleted
        NotificationCenter.default.post(name: Self.didSave, object: object, userInfo: userInfo)
    }

    /// The `userInfo` of ``didSave`` with empty lists, and the positions of its three keys (valid in every copy).
    nonisolated(unsafe) private static let didSaveUserInfo: (dictionary: [AnyHashable: Any], inserted: [AnyHashable: Any].Index,
                                                              updated: [AnyHashable: Any].Index, deleted: [AnyHashable: Any].Index) = {
        let dictionary: [AnyHashable: Any] = [
            NotificationKey.insertedIdentifiers.rawValue: [PersistentIdentifier](),
            NotificationKey.updatedIdentifiers.rawValue: [PersistentIdentifier](),
            NotificationKey.deletedIdentifiers.rawValue: [PersistentIdentifier](),
        ]
        return (dictionary, dictionary.index(forKey: NotificationKey.insertedIdentifiers.rawValue)!,
                dictionary.index(forKey: NotificationKey.updatedIdentifiers.rawValue)!,
                dictionary.index(forKey: NotificationKey.deletedIdentifiers.rawValue)!)
    }()

    private static func sortedUnique(_ ids: [PersistentIdentifier]) -> [PersistentIdentifier] {
        var ids = ids
        var sorted = true
        for i in ids.indices.dropFirst() where !(ids[i - 1] < ids[i]) {
            sorted = false
            break
        }
        if sorted { return ids }
        ids.sort()
        var unique: [PersistentIdentifier] = []
        unique.reserveCapacity(ids.count)
        for id in ids where unique.last != id { unique.append(id) }
        return unique
    }

    private static func sortedContains(_ ids: [PersistentIdentifier], _ id: PersistentIdentifier) -> Bool {
        var low = 0, high = ids.count
        while low < high {
            let mid = (low + high) / 2
            if ids[mid] < id { low = mid + 1 } else { high = mid }
        }
        return low < ids.count && ids[low] == id
    }

    /// Reads history transactions (SwiftData's `fetchHistory(_:)`).
    ///
    /// With ``HistoryDescriptor/afterToken``, only the token's store is read. Otherwise every store (or those in
    /// ``HistoryDescriptor/storeNames``) is read and the results are merged in the descriptor's order
    /// (ties: store order, then token).
    ///
    /// Complexity: O(N + C) for N transactions and C changes returned (one indexed range scan per store),
    /// independent of how much history precedes the token.
    /// - Throws: ``ReplicaError/historyTokenExpired(_:)``, ``ReplicaError/historyTokenFromAnotherStore(_:)``,
    ///   ``ReplicaError/unknownStore(_:)`` for a name in ``HistoryDescriptor/storeNames`` the container lacks,
    ///   ``ReplicaError/unknownEntity(_:)`` for a name in ``HistoryDescriptor/entityNames`` the schema lacks, ``SQLiteError``.
    public func fetchHistory(_ descriptor: HistoryDescriptor = HistoryDescriptor()) throws -> [HistoryTransaction] {
        var indices = try historyStores(for: descriptor)
        for name in descriptor.storeNames ?? [] where !container.configurations.contains(where: { $0.name == name }) {
            throw ReplicaError.unknownStore(name)
        }
        for name in descriptor.entityNames ?? [] where container.schema.entity(named: name) == nil {
            throw ReplicaError.unknownEntity(name)
        }
        if let names = descriptor.storeNames {
            indices = indices.filter { names.contains(container.stores[$0].configuration.name) }
        }
        var result: [(store: Int, transaction: HistoryTransaction)] = []
        for index in indices {
            let store = container.stores[index]
            let db = try connection(for: index)
            // Read the watermark and the history in one read transaction, so pruning cannot slip in between.
            let transactions = try db.transaction(.deferred) { () throws -> [HistoryTransaction] in
                if let token = descriptor.afterToken, token.value < (try HistoryLog.prunedThrough(db)) {
                    throw ReplicaError.historyTokenExpired(token)
                }
                return try HistoryLog.fetch(descriptor, storeName: store.configuration.name, identity: store.identity, db: db)
            }
            result += transactions.map { (index, $0.describingTombstones(with: store.entities, assets: store.assets?.read)) }
        }
        guard indices.count > 1 else { return result.map(\.transaction) }
        result.sort { a, b in
            let (x, y) = descriptor.reverse ? (b, a) : (a, b)
            if descriptor.sortBy == .timestamp, x.transaction.timestamp != y.transaction.timestamp {
                return x.transaction.timestamp < y.transaction.timestamp
            }
            if x.store != y.store { return descriptor.reverse ? x.store > y.store : x.store < y.store }
            return x.transaction.token.value < y.transaction.token.value
        }
        let limited = descriptor.fetchLimit.map { Array(result.prefix(max(0, $0))) } ?? result
        return limited.map(\.transaction)
    }

    /// Deletes history up to and including `token` (SwiftData's `deleteHistory(_:)`). Later reads after a token
    /// older than `token` throw ``ReplicaError/historyTokenExpired(_:)``.
    /// - Returns: the number of transactions removed.
    /// - Throws: ``ReplicaError/historyTokenFromAnotherStore(_:)``, ``SQLiteError``.
    @discardableResult
    public func deleteHistory(through token: HistoryToken) throws -> Int {
        guard let index = container.stores.firstIndex(where: { $0.identity == token.storeIdentity }) else {
            throw ReplicaError.historyTokenFromAnotherStore(token)
        }
        let removed = try HistoryLog.prune(throughToken: token.value, before: nil, db: connection(for: index))
        // Tombstones that named external-storage files may be gone: their files with them.
        if removed > 0 { collectAssetGarbage(in: [index]) }
        return removed
    }

    /// Deletes, in every store, the history transactions saved before `date`.
    /// - Returns: the number of transactions removed.
    @discardableResult
    public func deleteHistory(before date: Date) throws -> Int {
        var removed = 0
        for index in container.stores.indices where container.stores[index].configuration.allowsSave {
            let count = try HistoryLog.prune(throughToken: nil, before: date, db: connection(for: index))
            if count > 0 { collectAssetGarbage(in: [index]) }
            removed += count
        }
        return removed
    }

    /// The newest history token of store `storeName` (a token with value 0 when the store has no history yet).
    /// - Throws: ``ReplicaError/unknownStore(_:)``, ``SQLiteError``.
    public func currentHistoryToken(of storeName: String) throws -> HistoryToken {
        guard let index = container.stores.firstIndex(where: { $0.configuration.name == storeName }) else {
            throw ReplicaError.unknownStore(storeName)
        }
        let value = try HistoryLog.latestToken(connection(for: index))
        return HistoryToken(storeIdentity: container.stores[index].identity, value: value)
    }

    private func historyStores(for descriptor: HistoryDescriptor) throws -> [Int] {
        guard let token = descriptor.afterToken else { return Array(container.stores.indices) }
        guard let index = container.stores.firstIndex(where: { $0.identity == token.storeIdentity }) else {
            throw ReplicaError.historyTokenFromAnotherStore(token)
        }
        return [index]
    }
}
