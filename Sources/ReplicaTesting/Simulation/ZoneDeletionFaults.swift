// Zone deletions with a reason (fault `zoneDelete`) and each device's zone deletion policy (R18).
//
// The cloud deletes a synced zone with every record in it and says why (deleted, purged or encrypted data reset,
// drawn per fault). A device's engines learn of it at their next request to the zone — unless another device created
// the zone again first: then they see an expired change token and keep their data. Each engine is given its device's
// policy (`zoneDeletionPolicy` in the scenario) wrapped in a `ZoneDeletionPolicy.deciding` closure that answers with
// the library's own `ZoneDeletionPolicy.response(to:)` — the decision is the library's — and tells the simulator what
// was decided. What must hold:
//
// - keep and upload again: nothing is lost (the store keeps its data and uploads it; convergence and the reference
//   model as usual);
// - erase: right after the answer that led to it, nothing of the deleted zone is left in the store — every entity
//   table, every many-to-many link table, the ledger, unknown, rejected, held and waiting records, upload marks, ended
//   redirects, the change token and resync marks (invariant `zone-deletion-erase`, reading every table of the store
//   through a connection of the simulator's own). The store then converges with what the other devices upload again.
//   The writes the erasing device had acknowledged until then may be lost (unless another device holds them): the
//   reference model keeps them as writes that may, but need not, survive.

import CSQLite
import Foundation
@_spi(Simulation) import Replica
import Synchronization

/// The zone deletion decisions one engine's policy made, in order (filled by the policy's closure on the engine's
/// thread, drained by the simulator after each answer it delivers).
final class ZoneDeletionDecisions: Sendable {
    private let decisions = Mutex<[(deletion: ZoneDeletion, response: ZoneDeletionResponse?)]>([])

    /// `policy`, deciding through the library's ``ZoneDeletionPolicy/response(to:)`` and noting each decision.
    func policy(wrapping policy: ZoneDeletionPolicy) -> ZoneDeletionPolicy {
        .deciding { [self] deletion in
            let response = policy.response(to: deletion)
            decisions.withLock { $0.append((deletion, response)) }
            return response ?? .keepAndReupload
        }
    }

    /// The decisions made since the last call.
    func take() -> [(deletion: ZoneDeletion, response: ZoneDeletionResponse?)] {
        decisions.withLock { list in
            defer { list.removeAll() }
            return list
        }
    }
}

/// Tables a store keeps when it erases its synced data (R18): history, the conflict log and the metadata (whose
/// sync keys are checked one by one).
private let tablesKeptByErase: Set<String> = ["replica_history_transaction", "replica_history_change", "replica_metadata", "replica_sync_conflict"]

/// `replica_metadata` keys that an erase removes.
private let metadataErased = ["server_change_token", "resync_active", "resync_generation", "zone_deletion_pending"]

extension SimulationRun {
    /// Fault `zoneDelete`: the cloud deletes a zone (every record) and will tell devices why.
    func zoneDeleteStep() throws {
        stats.faults += 1
        guard !zones.isEmpty else { return }
        let zone = zones[try dice.below(zones.count)]
        let reason = ZoneDeletionReason.allCases[try dice.below(ZoneDeletionReason.allCases.count)]
        note("delete zone \(zone) (\(reason.rawValue))")
        trace.event(now, "step") { line in
            line.add("n", step)
            line.add("action", "delete-zone")
            line.add("zone", zone)
            line.add("reason", reason.rawValue)
        }
        cloud.resetZone(zone, reason: reason)
        mirror[zone] = [:]
        zoneResets[zone, default: 0] += 1
        schedulePushes(zone: zone, except: nil)
    }

    /// After an engine handled an answer without failing: what its policy decided, carried out. An erase must have
    /// left nothing of the zone in the store; the writes the device acknowledged before it may be lost from now on.
    func noteZoneDeletionDecisions(_ engine: SimEngine) throws {
        let decisions = engine.decisions.take()
        guard !decisions.isEmpty else { return }
        let device = engine.process.device
        for (deletion, response) in decisions {
            trace.event(now, "zone-deletion") { line in
                line.add("process", engine.process.label)
                line.add("store", engine.store)
                line.add("reason", deletion.reason.rawValue)
                line.add("response", response?.rawValue ?? "ask")
            }
            guard response == .eraseLocalData else { continue }
            stats.erasedStores += 1
            try checkNothingLeftBehind(engine)
            for (id, writes) in reference.acks[engine.store] ?? [:] {
                for index in writes.indices where writes[index].device == device.name { reference.acks[engine.store]?[id]?[index].mayBeLost = true }
            }
            reference.ownCausalLength[viewKey(device, engine.store)] = nil
        }
    }

    /// Invariant `zone-deletion-erase`: every table of the store an engine erased is empty of the zone's data.
    func checkNothingLeftBehind(_ engine: SimEngine) throws {
        let label = "\(engine.process.label) store '\(engine.store)'"
        guard let container = engine.process.container, let path = container.sqliteOpenPath(of: configurationName(engine.store)) else {
            throw InvariantViolation(.zoneDeletionErase, "\(label): the erased store cannot be found")
        }
        let tables = try readOnlyRows(path, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .compactMap { row -> String? in if case let .text(name)? = row.first { name } else { nil } }
        for table in tables where !tablesKeptByErase.contains(table) {
            let quoted = "\"" + table.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            guard case let .integer(count)? = try readOnlyRows(path, "SELECT count(*) FROM \(quoted)").first?.first, count > 0 else { continue }
            throw InvariantViolation(.zoneDeletionErase, "\(label) erased its synced data after the zone was deleted, "
                + "but table \(table) still holds \(count) row\(count == 1 ? "" : "s")")
        }
        for key in metadataErased where try !readOnlyRows(path, "SELECT 1 FROM replica_metadata WHERE key = '\(key)'").isEmpty {
            throw InvariantViolation(.zoneDeletionErase, "\(label) erased its synced data after the zone was deleted, but kept its \(key)")
        }
    }

    /// Rows of `sql` over a read-only connection of the simulator's own to the database at `path` (a file path or a
    /// `memdb` URI).
    private func readOnlyRows(_ path: String, _ sql: String) throws -> [[SQLiteValue]] {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nil) == SQLITE_OK, let handle else {
            sqlite3_close_v2(handle)
            throw InvariantViolation(.zoneDeletionErase, "the erased store cannot be opened")
        }
        defer { sqlite3_close_v2(handle) }
        sqlite3_busy_timeout(handle, 5_000)
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw InvariantViolation(.zoneDeletionErase, "the erased store cannot run \(sql)")
        }
        defer { sqlite3_finalize(statement) }
        var rows: [[SQLiteValue]] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            var row: [SQLiteValue] = []
            for column in 0..<sqlite3_column_count(statement) {
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: row.append(.integer(sqlite3_column_int64(statement, column)))
                case SQLITE_TEXT: row.append(.text(String(cString: sqlite3_column_text(statement, column))))
                case SQLITE_NULL: row.append(.null)
                default: row.append(.null)
                }
            }
            rows.append(row)
        }
        return rows
    }
}
