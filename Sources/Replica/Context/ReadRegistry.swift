import Foundation

/// The copies of records a context has handed out: the bases of field-level change tracking (an update writes only
/// the fields that differ from the copy the app last read). Internal.
///
/// Registering a fetch's result costs O(1): the batch shares the result array's storage, and the base of a record is
/// computed only when ``ModelContext/update(_:)`` asks for it (an index of the batch is built on first use; a batch
/// of a few models is searched instead). Saved inserts register their snapshots (a large save as one batch, like a
/// fetch), and saved updates and deletes forget the record, in the same recency order, so the base is always the
/// newest copy the context handed out or wrote.
///
/// Bounded: batches beyond ``batchLimit`` or holding more than ``modelLimit`` models in all are dropped oldest first;
/// a record whose copy was dropped has no base, and its update writes every field that differs from the stored row
/// (as for a record the context never read).
final class ReadRegistry {
    static let batchLimit = 512
    static let modelLimit = 1_000_000

    private var sequence = 0
    /// Explicit registrations (a snapshot) and forgets (`nil`), with their place in the recency order.
    private var entries: [PersistentIdentifier: (sequence: Int, snapshot: Snapshot?)] = [:]
    /// Registered fetch results, oldest first.
    private var batches: [any ReadBatch] = []
    private var batchedModels = 0

    private func next() -> Int {
        sequence += 1
        return sequence
    }

    /// Registers `snapshot` as the newest copy of its record.
    func register(_ snapshot: Snapshot) {
        entries[snapshot.persistentModelID] = (next(), snapshot)
    }

    /// Saves of at least this many inserts register them as one batch (O(1)) rather than one entry each.
    static let savedBatchMinimum = 64

    /// Registers the records a save inserted (`snapshots`, distinct IDs) as the newest copies of their records.
    /// A large save registers them as one batch in O(1) (its index is built on first use, like a fetch's);
    /// a small one, one entry each, so that many small saves do not crowd out fetched batches.
    func register(inserted snapshots: [Snapshot]) {
        if snapshots.count < Self.savedBatchMinimum {
            for snapshot in snapshots { register(snapshot) }
            return
        }
        append(SnapshotBatch(sequence: next(), snapshots: snapshots))
    }

    /// Forgets the copies of `id` handed out so far.
    func forget(_ id: PersistentIdentifier) {
        entries[id] = (next(), nil)
    }

    /// Registers the models of one fetch as the newest copies of their records. O(1).
    /// - Returns: a token for ``remove(_:)``.
    @discardableResult
    func register<Model: PersistentModel>(_ models: [Model]) -> Int {
        guard !models.isEmpty else { return 0 }
        let token = next()
        append(ModelBatch(sequence: token, models: models))
        return token
    }

    private func append(_ batch: any ReadBatch) {
        batches.append(batch)
        batchedModels += batch.count
        while batches.count > Self.batchLimit || (batchedModels > Self.modelLimit && batches.count > 1) {
            batchedModels -= batches.removeFirst().count
        }
    }

    /// Drops the batch registered under `token` (a streaming enumeration forgets each batch after its turn).
    func remove(_ token: Int) {
        guard let index = batches.lastIndex(where: { $0.sequence == token }) else { return }
        batchedModels -= batches.remove(at: index).count
    }

    /// The newest copy of `id` handed out (or written) and not forgotten since, or `nil`.
    /// Complexity: O(batches newer than the last explicit entry), plus building a batch's index on its first use.
    func base(for id: PersistentIdentifier) -> Snapshot? {
        let entry = entries[id]
        let after = entry?.sequence ?? 0
        for batch in batches.reversed() {
            if batch.sequence <= after { break }
            if let snapshot = batch.snapshot(of: id) { return snapshot }
        }
        return entry?.snapshot
    }
}

/// One registered fetch result. Internal.
private protocol ReadBatch: AnyObject {
    var sequence: Int { get }
    var count: Int { get }
    func snapshot(of id: PersistentIdentifier) -> Snapshot?
}

private final class ModelBatch<Model: PersistentModel>: ReadBatch {
    let sequence: Int
    let models: [Model]
    private var index: [UUID: Int]?

    init(sequence: Int, models: [Model]) {
        self.sequence = sequence
        self.models = models
    }

    var count: Int { models.count }

    /// Batches of at most this many models are searched rather than indexed (e.g. the one model of `model(_:id:)`).
    static var searchLimit: Int { 8 }

    func snapshot(of pid: PersistentIdentifier) -> Snapshot? {
        guard pid.entityName == Model.entityName else { return nil }
        let id = pid.id
        if models.count <= Self.searchLimit {
            // The last copy of the record in the batch, as the index below finds it.
            var position = models.count
            while position > 0 {
                position -= 1
                if models[position].id == id { return Model.entity.fieldSnapshot(of: models[position]) }
            }
            return nil
        }
        if index == nil {
            var built: [UUID: Int] = [:]
            built.reserveCapacity(models.count)
            var position = 0
            while position < models.count {
                built[models[position].id] = position
                position += 1
            }
            index = built
        }
        return index?[id].map { Model.entity.fieldSnapshot(of: models[$0]) }
    }
}

/// The records one save inserted, as saved (of any entities).
private final class SnapshotBatch: ReadBatch {
    let sequence: Int
    let snapshots: [Snapshot]
    private var index: [UUID: Int]?

    init(sequence: Int, snapshots: [Snapshot]) {
        self.sequence = sequence
        self.snapshots = snapshots
    }

    var count: Int { snapshots.count }

    func snapshot(of id: PersistentIdentifier) -> Snapshot? {
        if index == nil {
            var built: [UUID: Int] = [:]
            built.reserveCapacity(snapshots.count)
            for (position, snapshot) in snapshots.enumerated() { built[snapshot.id] = position }
            index = built
        }
        guard let position = index?[id.id], snapshots[position].entityName == id.entityName else { return nil }
        return snapshots[position]
    }
}
