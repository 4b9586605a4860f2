import Foundation

/// What one save did to one store: the input of history, sync bookkeeping and save notifications.
struct StoreChanges {
    var inserted: [Snapshot] = []
    /// Updated records with the names of the fields that changed. Records changed by a delete rule (nullify) carry
    /// only their ID and the changed field's name.
    var updated: [(Snapshot, [String])] = []
    var deleted: [DeletedRecord] = []
    /// For a local save (``StoreWriter/apply(_:)-([PendingChanges.Entry])``), which applies every delete before any
    /// insert: how many of the first `updated` entries its deletes made (delete rules, removed links). `nil` for the
    /// changes of an import, which merges records (inserts, updates, deletes) and then applies the delete rules of
    /// the records it deleted.
    var updatesBeforeDeletes: Int?
    /// For updates of a save whose writer captured them (a context with an undo manager): the row each replaced,
    /// every field in storage order, by position in ``updated``.
    var previousValues: [Int: [SQLiteValue]] = [:]
    /// For updates that changed many-to-many links in such a save: the record's members before it, by position in
    /// ``updated`` (``Snapshot/toManyMembers`` order).
    var previousLinks: [Int: [[UUID]]] = [:]

    /// A part of the changes: the inserts, the updates the deletes made (the first ``updatesBeforeDeletes``), the
    /// other updates, or the deletes.
    enum Part {
        case inserted, updatesOfDeletes, otherUpdates, deleted
    }

    /// The parts in the order they were applied, so that a record deleted and inserted again by one save (a new
    /// incarnation) is recorded as deleted, then inserted: for a local save the deletes (with the updates their
    /// delete rules made) come first, then the inserts and the other updates; for an import, inserts, updates,
    /// deletes. (Constant arrays: nothing is allocated per save.)
    var partsInOrder: [Part] { updatesBeforeDeletes == nil ? Self.importOrder : Self.localSaveOrder }
    private static let localSaveOrder: [Part] = [.updatesOfDeletes, .deleted, .inserted, .otherUpdates]
    private static let importOrder: [Part] = [.inserted, .otherUpdates, .deleted]

    /// Whether the save changed nothing in the store.
    var isEmpty: Bool { inserted.isEmpty && updated.isEmpty && deleted.isEmpty }

    /// The indices in `updated` of the updates of `part` (empty for the other parts).
    func updates(of part: Part) -> Range<Int> {
        let split = updatesBeforeDeletes ?? 0
        switch part {
        case .updatesOfDeletes: return 0..<split
        case .otherUpdates: return split..<updated.count
        case .inserted, .deleted: return 0..<0
        }
    }
}

/// A deleted record and the values of its attributes marked ``Schema/Attribute/Options/preserveValueOnDeletion``.
struct DeletedRecord {
    let id: PersistentIdentifier
    let preservedValues: [(String, SQLiteValue)]
    /// `true` when a delete rule (cascade) deleted it rather than the app.
    var viaCascade = false
    /// Every field value of the deleted row (storage order), where the deleting code had it; empty otherwise. The sync
    /// ledger keeps them locally for records with unique keys (R15).
    var values: [SQLiteValue] = []
    /// The record's many-to-many members when it was deleted (``Snapshot/toManyMembers`` order), where the deleting
    /// writer captured them for undo; empty otherwise.
    var links: [[UUID]] = []
}
