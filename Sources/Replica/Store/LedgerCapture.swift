import Foundation

/// Stamping what a local save changed (inside the save's write transaction), and the ended incarnations it keeps.
/// Internal.
extension SyncLedger {
    /// Stamps what a local save changed: inserts stamp every field (a new incarnation if the ID has a tombstone),
    /// updates stamp only the changed fields, deletes bump the causal length and keep preserved values. Every
    /// touched record enters the outbox.
    ///
    /// The changes are stamped in the order they were applied (``StoreChanges/partsInOrder``): a save that deletes a
    /// live record (causal length c, odd) and inserts it again takes it to c + 2 — the delete ends the incarnation
    /// (c + 1, its preserved values in the tombstone), the insert begins a new one whose fields are all stamped in
    /// it; nothing of the old incarnation (stamps, unknown fields, tombstone) is kept. (R5)
    ///
    /// `ledgerBound`, when given, is the largest ID in the ledger as read earlier in the same write transaction (see
    /// ``StoreWriter/ledgerBoundRead``); otherwise it is read here at the first insert.
    static func recordLocalChanges(_ changes: StoreChanges, store: Store, db: Connection, environment: ReplicaEnvironment,
                                   ledgerBound knownBound: UUID?? = nil) throws {
        guard !changes.isEmpty else { return }
        let previous = try loadHLC(db, replica: store.identity)
        var hlc = previous.tick(wall: environment.clock.nowMilliseconds(), replica: store.identity)
        // At the very top of its range the clock saturates: a stamp equal to an earlier one would name another write.
        if hlc <= previous && !environment.canaries.contains(.lwwByWallClock) { throw ReplicaError.clockExhausted(store: store.configuration.name) }
        if environment.canaries.contains(.lwwByWallClock) {
            hlc = HLC(physical: environment.clock.nowMilliseconds(), logical: 0, replica: store.identity)
        }
        // The largest ID in the ledger, read at the first insert: an inserted ID beyond it has no ledger row yet
        // (new IDs are time-ordered), so its lookup is skipped. Kept up to date by the inserts.
        var ledgerBound: UUID?? = knownBound
        for part in changes.partsInOrder {
            switch part {
            case .inserted:
                try stampInserts(changes.inserted, store: store, db: db, hlc: hlc, ledgerBound: &ledgerBound)
            case .updatesOfDeletes, .otherUpdates:
                try stampUpdates(changes.updated[changes.updates(of: part)], store: store, db: db, hlc: hlc)
            case .deleted:
                try stampDeletes(changes.deleted, store: store, db: db, environment: environment)
            }
        }
        // Many-to-many links the save changed: the owners' link sets, stamped with the same tick (R17).
        try LinkReplication.recordLocalLinkChanges(changes, store: store, db: db, hlc: hlc)
        try saveHLC(hlc, db)
    }

    /// Inserts: a new record (causal length 1) or a new incarnation of a deleted one (even → odd), every field
    /// stamped with `hlc` in it.
    private static func stampInserts(_ inserted: [Snapshot], store: Store, db: Connection, hlc: HLC, ledgerBound: inout UUID??) throws {
        for snapshot in inserted {
            guard let entityIndex = store.entityIndex[snapshot.entityName] else { continue }
            let entity = store.entities[entityIndex], statements = store.statements[entityIndex]
            if ledgerBound == nil { ledgerBound = .some(try largestID(ledgerLargestIDSQL, db)) }
            let isNew = ledgerBound!.map { $0.bytesPrecede(snapshot.id) } ?? true
            let stored = isNew ? nil : try load(snapshot.id, store: store, db, entity: entity.name)
            var state = stored ?? RecordState(
                id: snapshot.id, entity: entity.name, causalLength: 0, created: FieldStamp(incarnation: 1, clock: hlc),
                stamps: [:], unknown: [:], tombstone: [:], redirect: nil, changeTag: nil, localVersion: 0, pending: true)
            if !state.isAlive {
                // Re-inserting a duplicate that lost: its ended incarnation still belongs to the winner (R15).
                if let winner = state.redirect {
                    try noteEndedIncarnation(id: state.id, entity: entity.name, incarnation: state.causalLength - 1, winner: winner,
                                             fields: state.tombstone, db)
                }
                try state.bumpCausalLength(in: store)
            }
            let stamp = FieldStamp(incarnation: state.causalLength, clock: hlc)
            state.created = stamp
            // Every field stamped with `stamp`: encoded by position, without building the map.
            state.stamps = [:]
            state.unknown = [:]
            state.tombstone = [:]
            state.redirect = nil
            try state.bumpLocalVersion(in: store)
            state.pending = true
            try storeLocalChange(state, db, stamps: statements.fieldNames.isEmpty ? encodeStamps([:])
                                    : encodeStamps(every: stamp, oneStampTail: statements.oneStampTail), exists: stored != nil)
            if ledgerBound!.map({ $0.bytesPrecede(snapshot.id) }) ?? true { ledgerBound = .some(snapshot.id) }
        }
    }

    /// Updates of live records: the changed fields stamped with `hlc` in the current incarnation.
    private static func stampUpdates(_ updated: ArraySlice<(Snapshot, [String])>, store: Store, db: Connection, hlc: HLC) throws {
        for (snapshot, fields) in updated {
            guard let entityIndex = store.entityIndex[snapshot.entityName] else { continue }
            let statements = store.statements[entityIndex]
            // A change of many-to-many members is not a field of this record: the owners' link sets record it
            // (``LinkReplication/recordLocalLinkChanges(_:store:db:hlc:)``).
            var fields = fields
            if fields.contains(where: { statements.fieldIndex[$0] == nil }) {
                let entity = store.entities[entityIndex]
                fields.removeAll { entity.relationship(named: $0)?.isToMany == true }
                if fields.isEmpty { continue }
            }
            // The stamps by position, when they are all of fields the entity stores and so are the changed fields (as
            // always, short of a store written by another schema): encoded by position, without building the map.
            guard let loaded = try load(snapshot.id, store: store, db, stampsBy: statements), loaded.state.isAlive else { continue }
            var state = loaded.state
            let stamp = FieldStamp(incarnation: state.causalLength, clock: hlc)
            var stamps = loaded.stamps
            var byPosition = loaded.stampCount == stamps.reduce(0) { $1 == nil ? $0 : $0 + 1 }
            if byPosition {
                for field in fields {
                    guard let index = statements.fieldIndex[field] else { byPosition = false; break }
                    stamps[index] = stamp
                }
            }
            try state.bumpLocalVersion(in: store)
            state.pending = true
            if byPosition {
                try storeLocalChange(state, db, stamps: encodeStamps(names: statements.fieldNames, order: statements.fieldsInStampOrder,
                                                                     stamps: stamps, oneStampTail: statements.oneStampTail))
            } else {
                guard let full = try load(snapshot.id, store: store, db, entity: statements.entityName) else { continue }
                state.stamps = full.stamps
                for field in fields { state.stamps[field] = stamp }
                try storeLocalChange(state, db)
            }
        }
    }

    /// Deletes of live records: the causal length made even, the preserved values kept in the tombstone.
    private static func stampDeletes(_ deleted: [DeletedRecord], store: Store, db: Connection, environment: ReplicaEnvironment) throws {
        for record in deleted {
            if record.viaCascade && environment.canaries.contains(.cascadeForgetsChildTombstones) { continue }
            guard let entity = store.entity(named: record.id.entityName),
                  var state = try load(record.id.id, store: store, db, entity: entity.name), state.isAlive else { continue }
            try state.bumpCausalLength(in: store)
            state.redirect = nil
            var tombstone: [String: CloudField] = [:]
            for (name, value) in record.preservedValues {
                if let stamp = state.stamps[name] {
                    tombstone[name] = CloudField(value: value, stamp: stamp,
                                                 isEncrypted: entity.attribute(named: name)?.options.contains(.allowsCloudEncryption) ?? false)
                }
            }
            state.tombstone = tombstone
            // A record with unique keys keeps the writes of the incarnation it ended, locally: a concurrent resolution
            // of that incarnation as a duplicate still hands them to the winner (R15).
            if !entity.uniquenessConstraints.isEmpty, record.values.count == entity.fieldNames.count {
                var fields: [String: CloudField] = [:]
                for (index, name) in entity.fieldNames.enumerated() {
                    guard let stamp = state.stamps[name] else { continue }
                    fields[name] = CloudField(value: record.values[index], stamp: stamp,
                                              isEncrypted: entity.attribute(named: name)?.options.contains(.allowsCloudEncryption) ?? false)
                }
                for (name, field) in state.unknown { fields[name] = field }
                try noteEndedIncarnation(id: state.id, entity: entity.name, incarnation: state.causalLength - 1, winner: nil, fields: fields, db)
            }
            // A deleted record carries only its causal length, creation stamp and tombstone values, as a merge stores
            // it: the stamps and unknown fields of the incarnation that ended can never matter again. (Kept, they
            // made the ledger row differ from what merging the record's own upload back would store.)
            state.stamps = [:]
            state.unknown = [:]
            try state.bumpLocalVersion(in: store)
            state.pending = true
            try storeLocalChange(state, db)
        }
    }
}

extension SyncLedger {
    // MARK: Ended incarnations

    /// An earlier incarnation of a record: one that ended as a losing duplicate (its tombstone redirected to `winner`)
    /// and was re-inserted later, or (`winner` nil, records with unique keys only) one that a plain delete ended. With
    /// the writes of that incarnation this device knows — local only: the cloud record carries the incarnations and
    /// winners, and every device hands the writes it holds to the winner.
    struct EndedIncarnation: Equatable {
        var incarnation: Int64
        var winner: UUID?
        var fields: [String: CloudField]

        var redirect: EndedRedirect? { winner.map { EndedRedirect(incarnation: incarnation, winner: $0) } }
    }

    /// The ended incarnations of record `id` kept here, in incarnation order.
    static func endedIncarnations(of id: UUID, _ db: Connection) throws -> [EndedIncarnation] {
        try db.rows("SELECT incarnation, winner, fields FROM replica_sync_ended_redirect WHERE id = ? ORDER BY incarnation", [id.sqliteValue])
            .compactMap { row in
                guard case let .integer(incarnation) = row[0] else { return nil }
                var fields: [String: CloudField] = [:]
                if case let .text(json) = row[2] { fields = ReplicaJSON.decode([String: CloudField].self, json) ?? [:] }
                return EndedIncarnation(incarnation: incarnation, winner: try? UUID(sqliteValue: row[1]), fields: fields)
            }
    }

    static func storeEndedIncarnation(id: UUID, entity: String, _ entry: EndedIncarnation, _ db: Connection) throws {
        try db.run("""
            INSERT INTO replica_sync_ended_redirect (id, incarnation, entity, winner, fields) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (id, incarnation) DO UPDATE SET winner = excluded.winner, fields = excluded.fields
            """, [id.sqliteValue, .integer(entry.incarnation), .text(entity), entry.winner?.sqliteValue ?? .null,
                  entry.fields.isEmpty ? .null : .text(try ReplicaJSON.string(entry.fields))])
    }

    /// Joins into the ended incarnation `incarnation` of record `id` a winner (the smaller ID wins a disagreement)
    /// and the fields of that incarnation (by stamp).
    static func noteEndedIncarnation(id: UUID, entity: String, incarnation: Int64, winner: UUID?, fields: [String: CloudField],
                                     _ db: Connection) throws {
        var entry = try endedIncarnations(of: id, db).first { $0.incarnation == incarnation }
            ?? EndedIncarnation(incarnation: incarnation, winner: nil, fields: [:])
        if let winner, entry.winner.map({ winner.bytesPrecede($0) }) ?? true { entry.winner = winner }
        for (name, field) in fields where field.stamp.incarnation == incarnation {
            if entry.fields[name].map({ $0.stamp < field.stamp }) ?? true { entry.fields[name] = field }
        }
        try storeEndedIncarnation(id: id, entity: entity, entry, db)
    }
}

extension SyncLedger.RecordState {
    /// Adds one to the causal length (a delete, or a re-insert).
    /// - Throws: ``ReplicaError/counterExhausted(store:recordID:counter:)`` (`causal_length`) at
    ///   ``ReplicationBounds/maxCausalLength``: never overflows (every causal length read or received is within the bound).
    mutating func bumpCausalLength(in store: Store) throws {
        guard causalLength < ReplicationBounds.maxCausalLength else {
            throw ReplicaError.counterExhausted(store: store.configuration.name, recordID: id, counter: "causal_length")
        }
        causalLength += 1
    }

    /// Adds one to the local version (a change the cloud must learn).
    /// - Throws: ``ReplicaError/counterExhausted(store:recordID:counter:)`` (`local_version`) at ``ReplicationBounds/maxLocalVersion``.
    mutating func bumpLocalVersion(in store: Store) throws {
        guard localVersion < ReplicationBounds.maxLocalVersion else {
            throw ReplicaError.counterExhausted(store: store.configuration.name, recordID: id, counter: "local_version")
        }
        localVersion += 1
    }
}
