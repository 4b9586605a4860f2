import Foundation

/// Who committed a change, as the container that announces it sees it.
public enum ChangeOrigin: Sendable, Hashable {
    /// A ``ModelContext`` of this container saved it.
    case localSave
    /// A ``SyncEngine`` of this container imported it from the cloud (its author is ``HistoryTransaction/syncAuthor``).
    case syncImport
    /// Another process committed it to the store file — the widget or extension sharing an app-group store, or the
    /// app when this is the extension — or another container of this process opened on the same file. The change's
    /// ``StoreChange/processIdentity`` and ``StoreChange/author`` tell which (``HistoryTransaction/syncAuthor``
    /// for that process's sync imports).
    case otherProcess
}

/// One committed transaction of one store, as the container's change stream announces it: read back from the
/// store's history log (the one source of truth) by token, or — for a store whose configuration does not track
/// history — taken from the save itself.
public struct StoreChange: Sendable, Hashable {
    /// The store's configuration name.
    public let storeName: String
    /// Who committed it.
    public let origin: ChangeOrigin
    /// The transaction's history token; `nil` for a store that does not track history
    /// (``ModelConfiguration/tracksHistory``).
    public let token: HistoryToken?
    /// The saving context's ``ModelContext/author``; ``HistoryTransaction/syncAuthor`` for sync imports.
    public let author: String?
    /// When it was saved, from the saving process's clock (millisecond precision).
    public let timestamp: Date
    /// The saving process.
    public let processIdentity: ProcessIdentity
    /// The changes, in the order they were applied: inserts, updates with the names of the attributes whose stored
    /// values changed, deletes with their tombstones.
    public let changes: [HistoryChange]

    public init(storeName: String, origin: ChangeOrigin, token: HistoryToken?, author: String?, timestamp: Date,
                processIdentity: ProcessIdentity, changes: [HistoryChange]) {
        self.storeName = storeName
        self.origin = origin
        self.token = token
        self.author = author
        self.timestamp = timestamp
        self.processIdentity = processIdentity
        self.changes = changes
    }

    /// The identifiers of the inserted records, in change order.
    public var insertedIdentifiers: [PersistentIdentifier] {
        changes.compactMap { if case let .insert(id) = $0 { return id } else { return nil } }
    }

    /// The identifiers of the updated records with the attributes that changed, in change order.
    public var updatedIdentifiers: [(id: PersistentIdentifier, attributes: [String])] {
        changes.compactMap { if case let .update(id, attributes) = $0 { return (id, attributes) } else { return nil } }
    }

    /// The identifiers of the deleted records, in change order.
    public var deletedIdentifiers: [PersistentIdentifier] {
        changes.compactMap { if case let .delete(id, _) = $0 { return id } else { return nil } }
    }

    /// The entities the transaction changed, each once, in first-change order.
    public var entityNames: [String] {
        var names: [String] = []
        for change in changes where !names.contains(change.changedPersistentIdentifier.entityName) {
            names.append(change.changedPersistentIdentifier.entityName)
        }
        return names
    }

    /// `true` when a sync engine (of this process or another) imported the change.
    public var isSyncImport: Bool { author == HistoryTransaction.syncAuthor }

    /// The history transaction this change was read from (`nil` for a store that does not track history).
    public var historyTransaction: HistoryTransaction? {
        guard let token else { return nil }
        return HistoryTransaction(token: token, storeName: storeName, author: author, timestamp: timestamp,
                                  bundleIdentifier: processIdentity.bundleIdentifier, processName: processIdentity.processName,
                                  processID: processIdentity.processID, changes: changes)
    }
}

/// What a change stream delivers.
public enum ChangeEvent: Sendable, Hashable {
    /// One committed transaction. Transactions of one store arrive in commit (token) order.
    case committed(StoreChange)
    /// The consumer fell behind by more than the stream's buffer holds: the changes listed were dropped (the
    /// buffered ones with them). Re-read what you derive from them — ``ModelContext/fetchHistory(_:)`` after
    /// ``DroppedChanges/after`` gives the dropped transactions of a store that tracks history. Changes committed
    /// after the dropped ones follow as usual.
    case overflow([DroppedChanges])
}

/// The changes of one store that a change stream dropped (see ``ChangeEvent/overflow(_:)``).
public struct DroppedChanges: Sendable, Hashable {
    /// The store's configuration name.
    public let storeName: String
    /// The token of the last transaction delivered before the gap (`nil`: none was delivered, or the store does not
    /// track history). Read history after it to recover what was dropped.
    public let after: HistoryToken?
    /// The token of the last dropped transaction (`nil` for a store that does not track history).
    public let through: HistoryToken?
    /// How many transactions were dropped.
    public let count: Int

    public init(storeName: String, after: HistoryToken?, through: HistoryToken?, count: Int) {
        self.storeName = storeName
        self.after = after
        self.through = through
        self.count = count
    }
}
