// replica-device: one device as an OS process, syncing a store of notes and folders through a PostgreSQL cloud — the
// device of `replica-sim soak` and of the tests that crash servers, connections and devices.
//
//   replica-device run --store DIR --cloud URL --name NAME --journal FILE [--owner OWNER] [--seed S] [--generation G]
//                      [--duration SECONDS] [--writes N] [--offline-percent P] [--pause MS] [--origin UNIXTIME]
//                      [--canary NAME[,NAME…]]
//       a random workload: writes (each journaled as intent, then ack with its stamps, in FILE), sync rounds and
//       offline spells, for SECONDS or N writes; one log line per event on standard output
//   replica-device heal --store DIR --cloud URL --name NAME [--owner OWNER] [--timeout SECONDS]
//       sync until up to date; prints {"device", "upToDate", "saved", "requests", "lastError"}; exit 0 when up to date
//   replica-device dump --store DIR --cloud URL --name NAME [--owner OWNER]
//       the store's live rows and ledger as JSON (SoakDeviceDump)
//   replica-device cloud-dump --cloud URL [--owner OWNER] [--zone ZONE]
//       every byte the cloud keeps for the zone (default "notes"): record bodies and metadata, as JSON (SoakCloudDump)
//   replica-device terminate --cloud URL --application NAME
//       ends every other session whose application_name is NAME (pg_terminate_backend); prints how many
//
// OWNER: the user an app-backend role acts for (omit it for a role of the user's own). Every device of one soak uses
// the same field key. Exit status: 0 done, 1 failed, 2 wrong usage. The connection string is never printed.
import Foundation
import Replica
import ReplicaPostgres
import ReplicaTesting

func fail(_ message: String, status: Int32 = 1) -> Never {
    FileHandle.standardError.write(Data("replica-device: \(message)\n".utf8))
    exit(status)
}

let command = CommandLine.arguments.dropFirst().first ?? ""
let options: [String: String] = {
    let arguments = Array(CommandLine.arguments.dropFirst(2))
    var options: [String: String] = [:]
    var index = 0
    while index < arguments.count {
        let name = arguments[index]
        guard name.hasPrefix("--"), index + 1 < arguments.count else { fail("expected --option VALUE, got '\(name)'", status: 2) }
        options[String(name.dropFirst(2))] = arguments[index + 1]
        index += 2
    }
    return options
}()

func required(_ name: String) -> String {
    guard let value = options[name], !value.isEmpty else { fail("\(command) needs --\(name)", status: 2) }
    return value
}

func number(_ name: String, default fallback: Double) -> Double {
    guard let text = options[name] else { return fallback }
    guard let value = Double(text), value >= 0, value.isFinite else { fail("--\(name) needs a number ≥ 0", status: 2) }
    return value
}

/// `--canary NAME[,NAME…]`: bugs planted in the engine, for tests that the soak's check catches them.
let canaries: Set<Canary> = Set((options["canary"] ?? "").split(separator: ",").map { name in
    guard let canary = Canary(rawValue: String(name)) else { fail("unknown canary '\(name)'", status: 2) }
    return canary
})

func openDevice() -> DeviceStore {
    do {
        return try DeviceStore(name: required("name"), directory: URL(fileURLWithPath: required("store"), isDirectory: true),
                               cloudURL: required("cloud"), owner: options["owner"], key: defaultFieldKey, canaries: canaries)
    } catch {
        fail("cannot open the device: \(error)")
    }
}

func printJSON<T: Encodable>(_ value: T) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    guard let data = try? encoder.encode(value) else { fail("cannot encode the output") }
    print(String(decoding: data, as: UTF8.self))
    fflush(nil)
}

// Before anything opens a database: SQLite's memory statistics off (no global mutex per allocation).
SQLiteTuning.disableMemoryStatistics()

switch command {
case "run":
    let device = openDevice()
    let seed = options["seed"].flatMap { UInt64($0) } ?? 1
    let settings = DeviceWorkload.Settings(seed: seed, generation: Int(number("generation", default: 0)),
                                           duration: number("duration", default: 10),
                                           writes: options["writes"].map { _ in Int(number("writes", default: 0)) },
                                           offlinePercent: Int(number("offline-percent", default: 1)),
                                           pauseMilliseconds: Int(number("pause", default: 20)),
                                           origin: options["origin"].flatMap(Double.init))
    do {
        let workload = try DeviceWorkload(device: device, settings: settings, journal: URL(fileURLWithPath: required("journal")))
        workload.log("started (generation \(settings.generation), seed \(seed))")
        try await workload.run()
        device.engine.releaseLease()
    } catch {
        fail("\(device.name): \(error)")
    }
case "heal":
    let device = openDevice()
    let counting = CountingCloud(device.cloud)
    let deadline = ContinuousClock.now + .milliseconds(Int64(number("timeout", default: 60) * 1_000))
    var status: SyncStatus?
    do {
        while true {
            status = try await SyncDriver.syncUntilIdle(device.engine, with: counting, maxRequests: 2_000)
            if status?.isUpToDate == true || ContinuousClock.now > deadline { break }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
    } catch {
        fail("\(device.name): \(error)")
    }
    device.engine.releaseLease()
    struct Healed: Encodable {
        var device: String
        var upToDate: Bool
        var saved: Int
        var requests: Int
        var lastError: String?
    }
    let upToDate = status?.isUpToDate == true
    printJSON(Healed(device: device.name, upToDate: upToDate, saved: counting.saved, requests: counting.requests,
                     lastError: status?.lastError.map { "\($0)" }))
    exit(upToDate ? 0 : 1)
case "dump":
    let device = openDevice()
    do {
        printJSON(try device.dump())
    } catch {
        fail("\(device.name): \(error)")
    }
    device.engine.releaseLease()
case "cloud-dump":
    do {
        let connection = try RawPostgres(required("cloud"))
        let owner = options["owner"]
        let zone = options["zone"] ?? "notes"
        try connection.rows("BEGIN")
        // An app-backend role sees the owner's rows once it names the owner; a role of the user's own is the owner; a
        // superuser sees every row, and the query names the owner.
        if let owner { try connection.rows("SELECT pg_catalog.set_config('replica.owner', $1, true)", [owner]) }
        let records = try connection.rows("""
            SELECT r.id::text, r.change_tag, pg_catalog.translate(pg_catalog.encode(r.body, 'base64'), E'\\n', '')
            FROM replica.record r JOIN replica.zone z ON z.id = r.zone_id
            WHERE z.owner = COALESCE($1, current_user::text) AND z.name = $2 ORDER BY r.sequence
            """, [owner, zone])
        let metadata = try connection.rows("""
            SELECT pg_catalog.translate(pg_catalog.encode(m.value, 'base64'), E'\\n', '')
            FROM replica.zone_metadata m JOIN replica.zone z ON z.id = m.zone_id
            WHERE z.owner = COALESCE($1, current_user::text) AND z.name = $2 ORDER BY m.key
            """, [owner, zone])
        try connection.rows("COMMIT")
        let dump = SoakCloudDump(
            records: records.compactMap { row in
                guard let id = row[0].flatMap(UUID.init(uuidString:)), let tag = row[1], let body = row[2].flatMap({ Data(base64Encoded: $0) })
                else { return nil }
                return SoakCloudDump.Record(id: id, changeTag: tag, body: body)
            },
            metadata: metadata.compactMap { $0[0].flatMap { Data(base64Encoded: $0) } })
        guard dump.records.count == records.count else { fail("the cloud returned a malformed record row") }
        printJSON(dump)
    } catch {
        fail("cloud-dump: \(error)")
    }
case "terminate":
    do {
        let connection = try RawPostgres(required("cloud"))
        let rows = try connection.rows("""
            SELECT pg_catalog.count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity
            WHERE application_name = $1 AND pid <> pg_catalog.pg_backend_pid()
            """, [required("application")])
        print(rows.first?.first.flatMap { $0 } ?? "0")
    } catch {
        fail("terminate: \(error)")
    }
default:
    fail("unknown command '\(command)' (run, heal, dump, cloud-dump, terminate)", status: 2)
}
