// Faults in what a store keeps for sync and in what the cloud hands out:
//
// - Corrupted bookkeeping bytes (faults `corruptStamps`, `corruptUnknown`, `corruptClock`, `corruptCausalLength`): a
//   disk or a buggy older version overwrites a ledger row's `stamps` or `unknown` column, its causal length, or the
//   store's stored hybrid logical clock. Only file-backed synced stores (the simulator writes the file through a
//   connection of its own). What must hold (DESIGN.md principle 9, "unreadable is not empty"): while the garbage is in
//   place the store's status is never up to date; a corrupted record is never uploaded with fields missing that its
//   ledger held before; and a repaired record converges like any other. Invariant `unreadable-bookkeeping`.
// - Hostile remote records (fault `hostileRecord`): a record no device wrote appears in the cloud, with stamps at the
//   edges of their range (48-bit milliseconds 2^48-1, counters 0xFFFE and 0xFFFF), a clock a hundred years ahead, a
//   huge causal length, an incarnation beyond its causal length. Each device may refuse it (rejected, reported) or
//   apply it (clamped or not), but its clock must never go back and never be dragged far ahead of every wall clock
//   (invariant `clock-bounds`, checked at each acknowledged write). Hostile records have IDs of their own; the
//   checks that compare devices with the cloud leave them out.

import CSQLite
import Foundation
@_spi(Simulation) import Replica

/// One corruption the simulator wrote into a store file.
struct Corruption {
    enum Column: String {
        case stamps, unknown, clock = "hlc", causalLength = "causal_length"
    }
    let device: Int
    let store: String
    let column: Column
    /// The ledger row's record (`nil` for the clock).
    let id: UUID?
    /// Exactly what was written (the garbage is "in place" while the column still holds it).
    let written: SQLiteValue
    /// The field names (known and unknown) the ledger held for the record before, when they could be read.
    let fields: Set<String>?
    /// The record's causal length before.
    let causalLength: Int64?
    let step: Int
}

extension SimulationRun {
    /// How far ahead of the latest wall clock any device has had a store's clock may go (a rule that clamps remote
    /// stamps far ahead must clamp them closer than this): one day.
    static let clockLeadBoundMs: Int64 = 86_400_000

    // MARK: Corrupting bookkeeping

    /// Overwrites `column` of a ledger row (or the stored clock) of a file-backed synced store with garbage.
    func corruptStep(_ column: Corruption.Column) throws {
        stats.faults += 1
        let device = devices[try dice.below(devices.count)]
        let candidates = device.spec.stores.compactMap(scenario.store(named:)).filter { $0.isSynced && usesFile($0) }
        let app = device.processes[0]
        func skip(_ why: String) {
            note("corrupt \(column.rawValue) on \(device.name): \(why)")
            traceCorruption(device, store: nil, column: column, id: nil, result: why)
        }
        guard !candidates.isEmpty else { return skip("no file-backed synced store") }
        let store = candidates[try dice.below(candidates.count)]
        guard let url = app.storeURLs[store.name] else { return skip("store never opened") }
        let variant = try dice.below(4)
        let parameter = try dice.upTo(1_000_000)
        var id: UUID?
        let written: SQLiteValue
        var fields: Set<String>?
        var length: Int64?
        if column == .clock {
            let current = try rawRows(url, "SELECT value FROM replica_metadata WHERE key = 'hlc'").first?.first
            guard case let .text(text)? = current else { return skip("no stored clock yet") }
            switch variant {
            case 0: written = .text("")
            case 1: written = .text(String(repeating: "z", count: 48))
            case 2: written = .text(String(text.prefix(max(0, text.count - 1))))
            default: written = .blob(garbageBytes(parameter, count: 24))
            }
            try rawExecute(url, "UPDATE replica_metadata SET value = ? WHERE key = 'hlc'", [written])
        } else {
            let rows = try rawRows(url, "SELECT id, \(column.rawValue), causal_length FROM replica_sync_record ORDER BY id")
            guard !rows.isEmpty else { return skip("the ledger is empty") }
            let row = rows[try dice.below(rows.count)]
            guard case let .blob(bytes) = row[0], let recordID = uuid(from: bytes) else { return skip("unreadable ID") }
            id = recordID
            if case let .integer(value) = row[2] { length = value }
            if let engine = app.engines[store.name], let state = try? engine.engine.replicationState(of: recordID) {
                fields = Set(state.stamps.keys).union(state.unknownFields.keys)
            }
            switch column {
            case .stamps:
                switch variant {
                case 0: written = .blob(Data())
                case 1: written = .blob(garbageBytes(parameter, count: 12))
                case 2: written = .text("garbage")
                default:
                    let current: Data = if case let .blob(data) = row[1] { data } else { Data() }
                    written = .blob(Data(current.prefix(current.count / 2)))
                }
            case .unknown:
                written = [.text(""), .text("{\""), .text("[1,2]"), .text("{\"field\":1}")][variant]
            case .causalLength:
                written = .integer([Int64.max, Int64.max - 1, -1, 0][variant])
            case .clock:
                written = .null
            }
            try rawExecute(url, "UPDATE replica_sync_record SET \(column.rawValue) = ? WHERE id = ?", [written, recordID.sqliteValue])
        }
        corruptions.append(Corruption(device: device.index, store: store.name, column: column, id: id, written: written, fields: fields,
                                      causalLength: length, step: step))
        note("corrupt \(column.rawValue) of \(id.map(alias) ?? "the store") on \(device.name) (\(store.name)): variant \(variant)")
        traceCorruption(device, store: store.name, column: column, id: id, result: "variant \(variant)")
    }

    private func traceCorruption(_ device: SimDevice, store: String?, column: Corruption.Column, id: UUID?, result: String) {
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "corrupt-\(column.rawValue)")
            line.add("device", device.name)
            line.add("store", store)
            line.add("record", id.map(alias))
            line.add("result", result)
        }
    }

    /// `count` bytes that are a function of `seed` (never valid bookkeeping: the first byte is never a format version).
    private func garbageBytes(_ seed: Int, count: Int) -> Data {
        var state = SimulationHash.fnv1a64(Array(String(seed).utf8))
        return Data((0..<count).map { index in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return index == 0 ? 0xFF : UInt8(truncatingIfNeeded: state >> 56)
        })
    }

    /// Whether corruption `corruption` is still in place (the column holds exactly what was written).
    func isInPlace(_ corruption: Corruption) throws -> Bool {
        guard let url = devices[corruption.device].processes[0].storeURLs[corruption.store] else { return false }
        let current: SQLiteValue?
        if let id = corruption.id {
            current = try rawRows(url, "SELECT \(corruption.column.rawValue) FROM replica_sync_record WHERE id = ?", [id.sqliteValue]).first?.first
        } else {
            current = try rawRows(url, "SELECT value FROM replica_metadata WHERE key = 'hlc'").first?.first
        }
        return current == corruption.written
    }

    /// Whether bookkeeping of `store` on `device` was ever corrupted.
    func wasCorrupted(_ device: SimDevice, _ store: String) -> Bool {
        corruptions.contains { $0.device == device.index && $0.store == store }
    }

    /// An engine call threw. For a store whose bookkeeping the simulator corrupted, a typed error is a legitimate
    /// answer: the engine is set aside (not pumped again) and its store is left out of the convergence checks.
    /// Otherwise: an unexpected error.
    func engineFailed(_ engine: SimEngine, _ what: String, _ error: any Error) throws {
        let device = engine.process.device
        guard wasCorrupted(device, engine.store) else {
            throw InvariantViolation(.unexpectedError, "\(engine.process.label) store '\(engine.store)': \(what) threw \(error)")
        }
        engine.isBroken = true
        brokenStores.insert(viewKey(device, engine.store))
        trace.event(now, "engine-refused") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("what", what)
        }
    }

    /// After a save or merge: a synced record uploaded from `message`'s device after its ledger row was corrupted
    /// must carry every field the row held before (a corrupted record is reported or repaired, never uploaded with
    /// fields missing).
    func checkCorruptedUploads(_ records: [CloudRecord], zone: String, device: Int) throws {
        guard !corruptions.isEmpty else { return }
        for record in records where record.isAlive {
            for corruption in corruptions where corruption.device == device && corruption.store == zone && corruption.id == record.recordID {
                guard let fields = corruption.fields, corruption.causalLength == record.causalLength else { continue }
                let missing = fields.subtracting(record.fields.keys).sorted()
                if !missing.isEmpty {
                    throw InvariantViolation(.unreadableBookkeeping, "\(devices[device].name) uploaded \(alias(record.recordID)) without "
                        + "[\(missing.joined(separator: ", "))] after its ledger \(corruption.column.rawValue) was corrupted (step \(corruption.step))")
                }
            }
        }
    }

    /// At the end: while corrupted bytes are in place, the store's status is not up to date.
    func checkUnreadableBookkeeping() throws {
        for corruption in corruptions where try isInPlace(corruption) {
            let device = devices[corruption.device]
            for process in device.processes where process.isUp {
                guard let engine = process.engines[corruption.store], !engine.isBroken else { continue }
                if try engine.engine.status().isUpToDate {
                    let what = corruption.id.map { "the ledger \(corruption.column.rawValue) of \(alias($0))" } ?? "the stored clock"
                    throw InvariantViolation(.unreadableBookkeeping, "\(process.label) store '\(corruption.store)': \(what) holds unreadable "
                        + "bytes (written at step \(corruption.step)), but the status says up to date")
                }
            }
        }
    }

    /// The records of `zone` the end checks leave out: hostile records, records whose ledger row was corrupted (the
    /// reference model cannot know what a repair stamps), and records written by a device whose engine refused to go
    /// on after a corruption.
    func exemptRecords(_ zone: String) -> Set<UUID> {
        var exempt = hostileIDs[zone] ?? []
        for corruption in corruptions where corruption.store == zone { if let id = corruption.id { exempt.insert(id) } }
        let broken = Set(devices.filter { brokenStores.contains(viewKey($0, zone)) }.map(\.name))
        if !broken.isEmpty {
            for (id, acks) in reference.acks[zone] ?? [:] where acks.contains(where: { broken.contains($0.device) }) { exempt.insert(id) }
        }
        return exempt
    }

    /// Device stores left out of the convergence checks: engines that refused to go on, and stores whose clock is
    /// still corrupted.
    func unconvergedStores() throws -> Set<String> {
        var result = brokenStores
        for corruption in corruptions where corruption.column == .clock {
            if try isInPlace(corruption) { result.insert(viewKey(devices[corruption.device], corruption.store)) }
        }
        return result
    }

    /// Whether an idle engine that is not up to date is so legitimately: its store holds corrupted bytes, or every
    /// record it reports rejected is a hostile one.
    func mayStayBehind(_ engine: SimEngine, _ status: SyncStatus) throws -> Bool {
        if engine.isBroken { return true }
        // The schema gate refusing an app version whose schema contradicts the zone's is the right answer.
        if hasOptionChanges, case .incompatibleSchema? = status.blockedBy {
            engine.isBroken = true
            brokenStores.insert(viewKey(engine.process.device, engine.store))
            trace.event(now, "engine-refused") { line in
                line.add("process", engine.process.label)
                line.add("store", engine.store)
                line.add("what", "schema gate")
            }
            return true
        }
        let device = engine.process.device
        for corruption in corruptions where corruption.device == device.index && corruption.store == engine.store {
            if try isInPlace(corruption) { return true }
        }
        guard status.rejectedRecords > 0, let hostile = hostileIDs[engine.store], status.pendingRecords == 0, status.waitingForParent == 0,
              status.undecryptableRecords == 0, !status.needsFetch, status.blockedBy == nil, status.encryptionError == nil else { return false }
        let rejected = try engine.engine.ledgerEntries(in: .rejected)
        return rejected.count == status.rejectedRecords && rejected.allSatisfy { hostile.contains($0.id.id) }
    }

    // MARK: App versions that disagree on what the cloud holds

    /// At the end: no two engines that still sync one zone run schemas that disagree on an option that changes what
    /// the cloud holds (cloud encryption, external storage) of an attribute both know.
    func checkSchemaGate() throws {
        for zone in zones {
            var syncing: [(label: String, schema: Schema)] = []
            for device in devices {
                for process in device.processes where process.isUp {
                    guard let engine = process.engines[zone], !engine.isBroken, try engine.engine.status().blockedBy == nil else { continue }
                    syncing.append((process.label, process.view.schema))
                }
            }
            let relevant: Schema.Attribute.Options = [.allowsCloudEncryption, .externalStorage]
            for (a, first) in syncing.enumerated() {
                for second in syncing.dropFirst(a + 1) {
                    for entity in first.schema.entities {
                        guard let other = second.schema.entity(named: entity.name) else { continue }
                        for attribute in entity.attributes {
                            guard let theirs = other.attribute(named: attribute.name),
                                  attribute.options.intersection(relevant) != theirs.options.intersection(relevant) else { continue }
                            throw InvariantViolation(.schemaGate, "\(first.label) (schema v\(first.schema.version.major)) and \(second.label) "
                                + "(v\(second.schema.version.major)) both sync zone '\(zone)', but disagree on the cloud options of "
                                + "\(entity.name).\(attribute.name): the schema gate must refuse one")
                        }
                    }
                }
            }
        }
    }

    // MARK: Hostile remote records

    /// A record no device wrote appears in the cloud (see the file comment).
    func hostileRecordStep() throws {
        stats.faults += 1
        guard !zones.isEmpty else { return }
        let zone = zones[try dice.below(zones.count)]
        let newest = scenario.schema.schema()
        let types = (scenario.store(named: zone)?.entities ?? []).compactMap { newest.entity(named: $0) }
        guard !types.isEmpty else { return }
        let entity = types[try dice.below(types.count)]
        let kind = try dice.below(6)
        nextHostileSerial += 1
        let serial = UInt64(nextHostileSerial)
        let id = UUID(uuid: (0xF0, 0x0D, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, UInt8(truncatingIfNeeded: serial >> 8), UInt8(truncatingIfNeeded: serial)))
        let writer = UUID(uuid: (0xF0, 0x0D, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0xFF, 0xFF))
        let top = (Int64(1) << 48) - 1
        let wall = latestWallClock()
        let names = ["a clock a hundred years ahead", "stamps at 2^48-1 ms, counter 0xFFFE", "stamps at 2^48-1 ms, counter 0xFFFF",
                     "causal length 2^62-1", "causal length Int64.max", "an incarnation beyond its causal length"]
        var causalLength: Int64 = 1
        var clock = HLC(physical: wall, logical: 0, replica: writer)
        var incarnation: Int64 = 1
        switch kind {
        case 0: clock = HLC(physical: wall + 100 * 365 * 86_400_000, logical: 0, replica: writer)
        case 1: clock = HLC(physical: top, logical: 0xFFFE, replica: writer)
        case 2: clock = HLC(physical: top, logical: 0xFFFF, replica: writer)
        case 3: causalLength = (Int64(1) << 62) - 1; incarnation = causalLength
        case 4: causalLength = Int64.max; incarnation = causalLength
        default: incarnation = 3
        }
        let stamp = FieldStamp(incarnation: incarnation, clock: clock)
        var fields: [String: CloudField] = [:]
        for attribute in entity.attributes where !attribute.isEncrypted {
            fields[attribute.name] = CloudField(value: try newValue(attribute, store: scenario.store(named: zone)!, collide: false), stamp: stamp)
        }
        let record = CloudRecord(recordID: id, recordType: entity.name, causalLength: causalLength,
                                 created: FieldStamp(incarnation: incarnation, clock: clock), fields: fields)
        hostileIDs[zone, default: []].insert(id)
        aliases[id] = "hostile-\(entity.name)#\(nextHostileSerial - 1)"
        note("hostile \(entity.name) in zone \(zone): \(names[kind])")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "hostile-record")
            line.add("zone", zone)
            line.add("record", alias(id))
            line.add("kind", names[kind])
        }
        _ = try modify([record], zone: zone, from: nil as Message?)
    }

    /// The latest wall clock of any device now (true time plus the largest offset).
    func latestWallClock() -> Int64 {
        Self.epoch + now + (devices.map(\.offset).max() ?? 0)
    }

    /// At an acknowledged write of `store` on `device`: its stamp follows every stamp the store issued before (a
    /// store's clock never goes back, whatever its bookkeeping or the cloud held), and lies at most
    /// ``clockLeadBoundMs`` ahead of the latest wall clock any device has had, and after every stamp of a hostile
    /// record the store accepted (a store that keeps a stamp it cannot pass would let that record's writes lose).
    func checkClock(_ stamp: FieldStamp, device: SimDevice, store: String, record id: UUID, engine: SimEngine) throws {
        latestWallSeen = max(latestWallSeen, latestWallClock())
        let key = viewKey(device, store)
        if let last = lastLocalStamp[key], stamp.clock <= last.clock {
            throw InvariantViolation(.clockBounds, "\(device.name) store '\(store)' stamped a write of \(alias(id)) \(stamp.clock), "
                + "not after its earlier write stamped \(last.clock): the store's clock went back")
        }
        lastLocalStamp[key] = stamp
        if stamp.clock.physical > latestWallSeen + Self.clockLeadBoundMs {
            throw InvariantViolation(.clockBounds, "\(device.name) store '\(store)' stamped a write of \(alias(id)) at \(stamp.clock.physical) ms, "
                + "\(stamp.clock.physical - latestWallSeen) ms ahead of the latest wall clock any device has had")
        }
        for hostile in (hostileIDs[store] ?? []).sorted(by: uuidPrecedes) {
            guard let state = try engine.engine.replicationState(of: hostile) else { continue }
            let received = ([state.created] + Array(state.stamps.values)).map(\.clock).max()!
            if stamp.clock <= received {
                throw InvariantViolation(.clockBounds, "\(device.name) store '\(store)' stamped a write of \(alias(id)) \(stamp.clock), "
                    + "not after the stamp \(received) of \(alias(hostile)), which it accepted: its clock did not pass what it received")
            }
        }
    }

    // MARK: Raw access to store files

    /// Runs `sql` on the store file at `url` through a connection of the simulator's own; returns the rows.
    func rawRows(_ url: URL, _ sql: String, _ values: [SQLiteValue] = []) throws -> [[SQLiteValue]] {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(url.path, &handle, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let handle else {
            sqlite3_close_v2(handle)
            throw InvariantViolation(.crashConsistency, "the store file \(url.lastPathComponent) cannot be opened")
        }
        defer { sqlite3_close_v2(handle) }
        sqlite3_busy_timeout(handle, 5_000)
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw InvariantViolation(.crashConsistency, "the store file \(url.lastPathComponent) cannot run \(sql)")
        }
        defer { sqlite3_finalize(statement) }
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
        for (index, value) in values.enumerated() {
            let position = Int32(index + 1)
            switch value {
            case .null: sqlite3_bind_null(statement, position)
            case let .integer(v): sqlite3_bind_int64(statement, position, v)
            case let .real(v): sqlite3_bind_double(statement, position, v)
            case let .text(v): sqlite3_bind_text(statement, position, v, -1, transient)
            case let .blob(v): _ = v.withUnsafeBytes { sqlite3_bind_blob(statement, position, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(v.count), transient) }
            }
        }
        var rows: [[SQLiteValue]] = []
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { break }
            guard code == SQLITE_ROW else {
                throw InvariantViolation(.crashConsistency, "the store file \(url.lastPathComponent): \(sql) failed (\(code))")
            }
            rows.append((0..<sqlite3_column_count(statement)).map { column in
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: return .integer(sqlite3_column_int64(statement, column))
                case SQLITE_FLOAT: return .real(sqlite3_column_double(statement, column))
                case SQLITE_TEXT: return .text(String(cString: sqlite3_column_text(statement, column)))
                case SQLITE_BLOB:
                    let count = Int(sqlite3_column_bytes(statement, column))
                    guard count > 0, let bytes = sqlite3_column_blob(statement, column) else { return .blob(Data()) }
                    return .blob(Data(bytes: bytes, count: count))
                default: return .null
                }
            })
        }
        return rows
    }

    /// Runs a statement that returns no rows on the store file at `url`.
    func rawExecute(_ url: URL, _ sql: String, _ values: [SQLiteValue]) throws {
        _ = try rawRows(url, sql, values)
    }
}
