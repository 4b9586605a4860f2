import Foundation

// Fields and columns across app versions sharing one store file (DESIGN.md, "App-group stores"; Specs R9).
//
// A field's register is its value and stamp. This schema's fields keep the value in the row and the stamp in the
// ledger's `stamps`; fields it does not know are kept beside the row, in the ledger's `unknown`, value and stamp
// together. Two app versions on one file see the same row through different schemas, so:
//
// - A field this schema does not know but whose column another version sharing the file added (a
//   ``StoreColumnField``) is kept like a known one: a merged value goes into the column, its stamp into `stamps`, so
//   the other version reads it at once, and this version's uploads read it back from the column (sealed when the
//   declaring version says so). Such stamps survive this version's merges and saves.
// - An entry of `unknown` whose field this schema knows (kept by an older process before the column existed, or
//   still sealed) is a register like the column's: the higher stamp wins — when merging, when uploading, and when the
//   version that added the column opens the store (``foldUnknownFieldsIntoColumns(entities:statements:_:)``).

extension SyncLedger {
    /// What the columns of other app versions mean for the merge of one record (see the file comment).
    struct StoreColumnMerge {
        /// The fields of the record's entity that other versions sharing the file declare.
        let fields: [StoreColumnField]
        /// The local stamps of those fields (any incarnation).
        let localStamps: [String: FieldStamp]
        /// Whether the local state had `unknown` entries of fields this schema knows (folded into the registers).
        let folded: Bool
        /// Whether encrypted fields of merged records are plaintext (the engine has a cipher and opened them).
        let fieldsAreOpened: Bool

        /// Folds local `unknown` entries of this schema's fields into the local registers (`localStamps` by
        /// position, `localRow`) where they are newer and can be stored, removing every such entry from `local`; and
        /// reads the local stamps of fields other versions declare (taking them out of `localStampCount`, which then
        /// counts this schema's fields and names no one declares).
        static func prepare(_ remote: CloudRecord, store: Store, entityIndex: Int, remoteFields: [CloudField?],
                            local: inout RecordState?, localStamps: inout [FieldStamp?], localStampCount: inout Int,
                            localRow: inout [SQLiteValue]?, db: Connection, batch: MergeBatch?) throws -> StoreColumnMerge {
            let statements = store.statements[entityIndex]
            let opened = batch?.fieldsAreOpened ?? false
            var folded = false
            if var state = local, !state.unknown.isEmpty {
                for (name, field) in state.unknown {
                    guard let index = statements.fieldIndex[name] else { continue }
                    state.unknown[name] = nil
                    folded = true
                    guard state.isAlive, field.stamp.incarnation == state.causalLength, localRow != nil, localStamps.count > index,
                          !field.isEncrypted, StoreColumnField(name: name, attribute: statements.attributes[index]).fits(field.value) else {
                        // Sealed, or not storable: kept while it is the newer register (uploads take the newer one).
                        let known = localStamps.count > index ? localStamps[index] : nil
                        if known.map({ field.stamp > $0 }) ?? true { state.unknown[name] = field }
                        continue
                    }
                    if let known = localStamps[index], known >= field.stamp { continue }
                    if localStamps[index] == nil { localStampCount += 1 }
                    localStamps[index] = field.stamp
                    localRow![index + 1] = field.value
                }
                local = state
            }
            let remoteHasOthers = remoteFields.reduce(0) { $1 == nil ? $0 : $0 + 1 } < remote.fields.count
            let localHasOthers = localStampCount > localStamps.reduce(0) { $1 == nil ? $0 : $0 + 1 }
            guard remoteHasOthers || localHasOthers else {
                return StoreColumnMerge(fields: [], localStamps: [:], folded: folded, fieldsAreOpened: opened)
            }
            let fields = try batch?.columnFields(of: store, db)[entityIndex] ?? store.columnFields.fields(of: store, db)[entityIndex]
            var stamps: [String: FieldStamp] = [:]
            if localHasOthers, !fields.isEmpty, let local, let full = try load(local.id, store: store, db)?.stamps {
                for field in fields { if let stamp = full[field.name] { stamps[field.name] = stamp } }
                localStampCount -= stamps.count
            }
            return StoreColumnMerge(fields: fields, localStamps: stamps, folded: folded, fieldsAreOpened: opened)
        }

        /// The registers of ``fields`` after merging `remote`: a value (remote, or kept in `unknown`) that beats the
        /// column's stamp and can be stored goes into the column and out of `unknown`; a column whose stamp wins stays,
        /// and sets `localNewer` when the remote record lacks it or has it older.
        func resolve(_ remote: CloudRecord, unknown: inout [String: CloudField], incarnation: Int64, alive: Bool,
                     localNewer: inout Bool) -> ResolvedColumns {
            guard alive, !fields.isEmpty else { return ResolvedColumns(stamps: [:], writes: [], changed: folded || !localStamps.isEmpty) }
            var stamps: [String: FieldStamp] = [:]
            var writes: [(name: String, value: SQLiteValue)] = []
            for field in fields {
                let kept = localStamps[field.name].flatMap { $0.incarnation == incarnation ? $0 : nil }
                if let candidate = unknown[field.name], kept.map({ candidate.stamp > $0 }) ?? true,
                   !candidate.isEncrypted || fieldsAreOpened, field.fits(candidate.value) {
                    stamps[field.name] = candidate.stamp
                    writes.append((field.name, candidate.value))
                    unknown[field.name] = nil
                } else if let kept {
                    stamps[field.name] = kept
                    if let candidate = unknown[field.name], candidate.stamp <= kept { unknown[field.name] = nil }
                    if remote.fields[field.name].map({ $0.stamp < kept }) ?? true { localNewer = true }
                }
            }
            return ResolvedColumns(stamps: stamps, writes: writes, changed: folded || stamps != localStamps)
        }
    }

    /// The merged registers of the fields other app versions declare (see ``StoreColumnMerge/resolve``).
    struct ResolvedColumns {
        /// Their stamps, stored in `stamps` beside this schema's.
        let stamps: [String: FieldStamp]
        /// The values that go into their columns.
        let writes: [(name: String, value: SQLiteValue)]
        /// Whether the ledger row must be written (stamps changed, or `unknown` entries were folded).
        let changed: Bool

        /// The `stamps` column holding `winners` (this schema's fields, by position) and ``stamps``, or `nil` when
        /// there are none of the latter (the caller then encodes `winners` by position).
        func encodedStamps(names: [String], winners: [FieldStamp?]) -> Data? {
            guard !stamps.isEmpty else { return nil }
            var map = stamps
            for (index, stamp) in winners.enumerated() { if let stamp { map[names[index]] = stamp } }
            return encodeStamps(map)
        }

        /// Writes ``writes`` into the row `id` of the entity of `statements` where they differ from what the row
        /// holds. Returns the names of the fields written.
        func write(_ id: UUID, _ statements: EntityStatements, _ db: Connection) throws -> [String] {
            guard !writes.isEmpty else { return [] }
            let columns = writes.map { quoted($0.name) }.joined(separator: ", ")
            guard let row = try db.rows("SELECT \(columns) FROM \(statements.table) WHERE \"id\" = ?", [id.sqliteValue]).first else { return [] }
            let changed = writes.indices.filter { !ColumnDefaults.same(row[$0], writes[$0].value) }
            guard !changed.isEmpty else { return [] }
            try db.run("UPDATE \(statements.table) SET \(changed.map { "\(quoted(writes[$0].name)) = ?" }.joined(separator: ", ")) WHERE \"id\" = ?",
                       changed.map { writes[$0].value } + [id.sqliteValue])
            return changed.map { writes[$0].name }
        }
    }

    /// Adds to `fields` (an outgoing record's) the fields of ``StoreColumnField``s that `state` stamps in its current
    /// incarnation, read from their columns, flagged encrypted as the version declaring them says.
    static func addStoreColumnFields(_ fields: inout [String: CloudField], _ state: RecordState, store: Store,
                                     entityIndex: Int, db: Connection) throws {
        let statements = store.statements[entityIndex]
        let names = state.stamps.keys.filter { statements.fieldIndex[$0] == nil && state.stamps[$0]!.incarnation == state.causalLength }
        guard !names.isEmpty else { return }
        let declared = try store.columnFields.fields(of: store, db)[entityIndex].filter { names.contains($0.name) }
        guard !declared.isEmpty,
              let row = try db.rows("SELECT \(declared.map { quoted($0.name) }.joined(separator: ", ")) FROM \(statements.table) WHERE \"id\" = ?",
                                    [state.id.sqliteValue]).first else { return }
        for (index, field) in declared.enumerated() {
            fields[field.name] = CloudField(value: row[index], stamp: state.stamps[field.name]!, isEncrypted: field.isEncrypted)
        }
    }
}

extension SyncLedger.MergeBatch {
    /// The fields other app versions sharing the store file declare, read once per batch.
    func columnFields(of store: Store, _ db: Connection) throws -> [[StoreColumnField]] {
        if let known = columnFieldsRead { return known }
        let fields = try store.columnFields.fields(of: store, db)
        columnFieldsRead = fields
        return fields
    }
}

extension SyncEngine {
    /// Without an encryption configuration, the difference naming the first field another app version sharing the
    /// store file declares encrypted (`nil` when there is none): this process could only upload such a field in
    /// plaintext, so it syncs nothing instead (E2 for fields of other versions).
    func sharedFieldsNeedingEncryption() throws -> ReplicaError? {
        guard encryption == nil else { return nil }
        for (index, fields) in try store.columnFields.fields(of: store, db).enumerated() {
            if let field = fields.first(where: \.isEncrypted) {
                return .incompatibleSchema([.sharedFieldNeedsEncryption(entity: store.entities[index].name, attribute: field.name)])
            }
        }
        return nil
    }
}

extension SyncLedger.StoreColumnMerge {
    /// The local writes to ``fields`` this merge loses (R16), as the merge logs them for this schema's fields:
    /// `deleted`, those of the local incarnation a higher causal length from elsewhere ends; `overwritten`, the
    /// pending local writes of the current incarnation a newer remote write replaces in `resolved` (logged once the
    /// column's value is known to change: see ``SyncLedger/ResolvedColumns/write(_:_:_:)``). Only writes of `replica` count.
    func losses(_ remote: CloudRecord, resolved: SyncLedger.ResolvedColumns, localPending: Bool, endsLocalIncarnation: Bool,
                localIncarnation: Int64?, incarnation: Int64, replica: UUID) -> (deleted: [ConflictRecording.Loss], overwritten: [ConflictRecording.Loss]) {
        var deleted: [ConflictRecording.Loss] = [], overwritten: [ConflictRecording.Loss] = []
        for field in fields {
            guard let local = localStamps[field.name], local.clock.replica == replica else { continue }
            if endsLocalIncarnation {
                if local.incarnation == localIncarnation {
                    deleted.append(ConflictRecording.Loss(field: field.name, local: local, winning: ConflictRecording.newestStamp(remote), kind: .deleted))
                }
            } else if localPending, local.incarnation == incarnation, let winning = resolved.stamps[field.name], local < winning {
                overwritten.append(ConflictRecording.Loss(field: field.name, local: local, winning: winning, kind: .overwritten))
            }
        }
        return (deleted, overwritten)
    }
}
