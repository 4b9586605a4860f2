import Foundation

/// The versions of records a context has handed out (fetched copies) or written (saved states): the bases of
/// field-level change tracking. ``ModelContext/update(_:)`` compares a copy with each version of its record and takes
/// as the app's changes the fields that differ from the nearest one (see there). Internal.
///
/// Registering a fetch's result costs O(1): the batch shares the result array's storage. The copies in batches are
/// found through one index of every batch, built on first use (an update or a save of a record) over the batches
/// registered since, in O(models) — once per batch, like a fetch's decoding. A record's versions are gathered into a
/// list of its own only when it is updated or saved: the copies of it in batches registered since, then each state a
/// save of it left, at most ``versionLimit`` of them (the oldest dropped first). A saved insert begins the list of a new
/// record (a large save registers its inserts as one batch, like a fetch); a delete forgets the record, so a copy read
/// before is never a version of a later incarnation.
///
/// Bounded: batches beyond ``batchLimit`` or holding more than ``modelLimit`` models in all are dropped oldest first,
/// and so are the versions of all records when their lists hold more than ``modelLimit`` in all (each list is cut to
/// its newest version first). A record without versions has no base, and its update writes every field that differs
/// from the stored row (as for a record the context never read).
final class ReadRegistry {
    static let batchLimit = 512
    static let modelLimit = 1_000_000
    /// The versions kept per record.
    static let versionLimit = 8
    /// Saves of at least this many inserts register them as one batch (O(1)) rather than one list each.
    static let savedBatchMinimum = 64

    private var sequence = 0

    /// A record's versions, oldest first, and the sequence through which the copies in batches are
    /// in the list (or were forgotten): only batches registered after it are searched.
    private struct Versions {
        var through: Int
        var snapshots: [Snapshot]
        /// The position in `snapshots` of the newest version a save of this context wrote (not a fetched copy).
        var newestWritten: Int? = nil
    }
    /// The records updated, saved or deleted: their versions, or none (forgotten).
    private var records: [PersistentIdentifier: Versions] = [:]
    /// The snapshots of every list of ``records``.
    private var listedVersions = 0

    /// Registered fetch results (and large saves), oldest first (so in increasing sequence).
    private var batches: [any ReadBatch] = []
    private var batchedModels = 0

    /// The index of batch copies: for each record ID, its newest copy in an indexed batch; each copy links to the
    /// record's next older one.
    private var newestCopy: [UUID: Int32] = [:]
    private var copies: [CopyLocation] = []
    /// The batches registered up to this sequence are indexed.
    private var indexedThrough = 0
    /// Copies in the index whose batch is gone; the index is rebuilt when they are the majority.
    private var staleCopies = 0

    private func next() -> Int {
        sequence += 1
        return sequence
    }

    // MARK: Registering

    /// Registers the models of one fetch as copies the context handed out. O(1).
    /// - Returns: a token for ``remove(_:)``.
    @discardableResult
    func register<Model: PersistentModel>(_ models: [Model]) -> Int {
        guard !models.isEmpty else { return 0 }
        let token = next()
        append(ModelBatch(sequence: token, models: models))
        return token
    }

    /// Registers the records a save inserted (`snapshots`, distinct IDs, as written) as the first versions of new
    /// records or new incarnations (forget the records a save deleted first: ``forget(_:)``). A large save registers
    /// them as one batch in O(1); a small one, one list each, so that many small saves do not crowd out fetched
    /// batches.
    func register(inserted snapshots: [Snapshot]) {
        if snapshots.count < Self.savedBatchMinimum {
            for snapshot in snapshots {
                setVersions(Versions(through: sequence, snapshots: [Self.fields(of: snapshot)], newestWritten: 0),
                            of: snapshot.persistentModelID)
            }
            return
        }
        append(SnapshotBatch(sequence: next(), snapshots: snapshots))
    }

    /// Registers the state a save of an update left (`snapshot`: every field as stored) as the newest version of its
    /// record.
    func register(saved snapshot: Snapshot) {
        let id = snapshot.persistentModelID
        var versions = gathered(id, records[id]) ?? Versions(through: sequence, snapshots: [])
        // Not compared with the versions before it (a save changed the stored row; a repeated value only takes a
        // place in the list).
        versions.snapshots.append(Self.fields(of: snapshot))
        if versions.snapshots.count > Self.versionLimit { versions.snapshots.removeFirst() }
        versions.newestWritten = versions.snapshots.count - 1
        setVersions(versions, of: id)
    }

    /// Forgets every version of `id` handed out or written so far (the record was deleted).
    func forget(_ id: PersistentIdentifier) {
        setVersions(Versions(through: next(), snapshots: []), of: id)
    }

    /// Drops the batch registered under `token` (a streaming enumeration forgets each batch after its turn).
    func remove(_ token: Int) {
        guard let index = batches.lastIndex(where: { $0.sequence == token }) else { return }
        dropBatch(at: index)
    }

    // MARK: Versions

    /// The versions of `id` handed out or written and not forgotten since, oldest first (at most ``versionLimit``,
    /// without to-many members; copies of one value fetched in turn count once); empty when there are none. Also the
    /// position among them of the newest version a save of this context wrote, if any is kept.
    /// Complexity: O(1) plus the copies of `id` in batches registered since the last call for it, plus indexing the
    /// batches registered since the last call for any record.
    func versions(of id: PersistentIdentifier) -> (snapshots: [Snapshot], newestWritten: Int?) {
        let stored = records[id]
        guard let versions = gathered(id, stored) else { return ([], nil) }
        if versions.through != stored?.through { setVersions(versions, of: id) }
        return (versions.snapshots, versions.newestWritten)
    }

    /// The list of `id` (`stored`) with the copies of batches registered since it was last gathered added (its
    /// `through` is then the current sequence), or `nil` when the record has neither a list nor copies.
    private func gathered(_ id: PersistentIdentifier, _ stored: Versions?) -> Versions? {
        var versions = stored
        let through = versions?.through ?? 0
        guard let newest = batches.last, newest.sequence > through else { return versions }
        indexNewBatches()
        // The copies newer than the list, newest first.
        var found: [Snapshot] = []
        var cursor = newestCopy[id.id] ?? -1
        while cursor >= 0 {
            let copy = copies[Int(cursor)]
            if copy.sequence <= through { break }
            if let batch = batch(withSequence: copy.sequence), let snapshot = batch.snapshot(at: Int(copy.position), entityName: id.entityName),
               !found.contains(where: { $0.values == snapshot.values }) {
                found.append(snapshot)
                if found.count == Self.versionLimit { break }
            }
            cursor = copy.older
        }
        if versions == nil && found.isEmpty { return nil }
        var list = versions?.snapshots ?? []
        var newestWritten = versions?.newestWritten
        if list.isEmpty {
            found.reverse()
            list = found
        } else {
            for snapshot in found.reversed() where list.last?.values != snapshot.values { list.append(snapshot) }
            if list.count > Self.versionLimit {
                let dropped = list.count - Self.versionLimit
                list.removeFirst(dropped)
                newestWritten = newestWritten.flatMap { $0 >= dropped ? $0 - dropped : nil }
            }
        }
        versions = Versions(through: sequence, snapshots: list, newestWritten: newestWritten)
        return versions
    }

    /// `snapshot` without its to-many members (versions compare field values only).
    private static func fields(of snapshot: Snapshot) -> Snapshot {
        snapshot.toManyMembers.isEmpty ? snapshot : Snapshot(entityName: snapshot.entityName, id: snapshot.id, values: snapshot.values)
    }

    private func setVersions(_ versions: Versions, of id: PersistentIdentifier) {
        let previous = records.updateValue(versions, forKey: id)
        listedVersions += versions.snapshots.count - (previous?.snapshots.count ?? 0)
        if listedVersions > Self.modelLimit { shrinkLists() }
    }

    /// Cuts every list to its newest version; when that is still too many, forgets everything the registry holds.
    private func shrinkLists() {
        records = records.mapValues {
            Versions(through: $0.through, snapshots: Array($0.snapshots.suffix(1)),
                     newestWritten: $0.newestWritten == $0.snapshots.count - 1 && !$0.snapshots.isEmpty ? 0 : nil)
        }
        listedVersions = records.values.reduce(0) { $0 + $1.snapshots.count }
        if listedVersions > Self.modelLimit / 2 {
            // Forgetting a list would make older batch copies versions again: drop those too.
            records.removeAll()
            listedVersions = 0
            batches.removeAll()
            batchedModels = 0
            clearIndex()
        }
    }

    // MARK: Batches and their index

    private func append(_ batch: any ReadBatch) {
        batches.append(batch)
        batchedModels += batch.count
        while batches.count > Self.batchLimit || (batchedModels > Self.modelLimit && batches.count > 1) {
            dropBatch(at: 0)
        }
    }

    private func dropBatch(at index: Int) {
        let batch = batches.remove(at: index)
        batchedModels -= batch.count
        if batch.sequence <= indexedThrough {
            staleCopies += batch.count
            if staleCopies > 4_096 && staleCopies * 2 > copies.count { clearIndex() }
        }
    }

    /// Empties the index; the next lookup indexes every batch again.
    private func clearIndex() {
        newestCopy = [:]
        copies = []
        indexedThrough = 0
        staleCopies = 0
    }

    /// Indexes the batches registered since the last call, oldest first.
    private func indexNewBatches() {
        guard let last = batches.last, last.sequence > indexedThrough else { return }
        var first = batches.count
        while first > 0 && batches[first - 1].sequence > indexedThrough { first -= 1 }
        // Int32 positions: far beyond what the bounds let the index hold.
        if copies.count + batchedModels >= Int(Int32.max) { clearIndex(); first = 0 }
        for batch in batches[first...] { batch.addCopies(to: &newestCopy, &copies) }
        indexedThrough = last.sequence
    }

    /// The batch registered under `sequence`, if it is still held. O(log batches).
    private func batch(withSequence sequence: Int) -> (any ReadBatch)? {
        var low = 0, high = batches.count
        while low < high {
            let middle = (low + high) / 2
            if batches[middle].sequence < sequence { low = middle + 1 } else { high = middle }
        }
        return low < batches.count && batches[low].sequence == sequence ? batches[low] : nil
    }
}

/// Where one copy of a record is: its batch, its position there, and the record's next older copy (-1: none).
private struct CopyLocation {
    let sequence: Int
    let position: Int32
    let older: Int32
}

/// One registered fetch result. Internal.
private protocol ReadBatch: AnyObject {
    var sequence: Int { get }
    var count: Int { get }
    /// The field values of the model at `position`, when it is of entity `entityName`.
    func snapshot(at position: Int, entityName: String) -> Snapshot?
    /// Adds the batch's models to the index of copies, in position order.
    func addCopies(to newest: inout [UUID: Int32], _ copies: inout [CopyLocation])
}

private final class ModelBatch<Model: PersistentModel>: ReadBatch {
    let sequence: Int
    let models: [Model]

    init(sequence: Int, models: [Model]) {
        self.sequence = sequence
        self.models = models
    }

    var count: Int { models.count }

    func snapshot(at position: Int, entityName: String) -> Snapshot? {
        guard entityName == Model.entityName else { return nil }
        return Model.entity.fieldSnapshot(of: models[position])
    }

    func addCopies(to newest: inout [UUID: Int32], _ copies: inout [CopyLocation]) {
        copies.reserveCapacity(copies.count + models.count)
        var position = 0
        while position < models.count {
            let older = newest.updateValue(Int32(copies.count), forKey: models[position].id) ?? -1
            copies.append(CopyLocation(sequence: sequence, position: Int32(position), older: older))
            position += 1
        }
    }
}

/// The records one save inserted, as saved (of any entities).
private final class SnapshotBatch: ReadBatch {
    let sequence: Int
    let snapshots: [Snapshot]

    init(sequence: Int, snapshots: [Snapshot]) {
        self.sequence = sequence
        self.snapshots = snapshots
    }

    var count: Int { snapshots.count }

    func snapshot(at position: Int, entityName: String) -> Snapshot? {
        let snapshot = snapshots[position]
        guard snapshot.entityName == entityName else { return nil }
        return Snapshot(entityName: snapshot.entityName, id: snapshot.id, values: snapshot.values)
    }

    func addCopies(to newest: inout [UUID: Int32], _ copies: inout [CopyLocation]) {
        copies.reserveCapacity(copies.count + snapshots.count)
        for position in snapshots.indices {
            let older = newest.updateValue(Int32(copies.count), forKey: snapshots[position].id) ?? -1
            copies.append(CopyLocation(sequence: sequence, position: Int32(position), older: older))
        }
    }
}
