import CLibpq
import Foundation
import Replica
import ReplicaPostgres
import Synchronization

// B13 and B14 — the PostgreSQL cloud. They need a server: REPLICA_BENCH_POSTGRES_URL (a database with the replica
// schema, or one the role may install it in; the role must act for owners: an app backend or a superuser), else a
// throwaway cluster that Scripts/postgres-cluster.sh starts (run from the package directory; commits durable, fsync
// off) and removes at exit.
//
// Clocks: the client's work runs on several threads (the connection pool's queues, Swift's cooperative pool), so these
// trials measure themselves: `cpu` is this process's CPU time (every thread: the client, never the server), `wall` the
// elapsed time (client and server).

/// The server of the PostgreSQL workloads.
final class BenchServer: @unchecked Sendable {
    /// The connection string the workloads use (an app-backend role; each trial acts for owners of its own).
    let url: String
    /// What the table notes say about the server.
    let summary: String
    /// The throwaway cluster's directory, when this process started one.
    let cluster: URL?

    private init(url: String, summary: String, cluster: URL?) {
        self.url = url
        self.summary = summary
        self.cluster = cluster
    }

    nonisolated(unsafe) static var started: URL?

    static let shared: Result<BenchServer, CheckFailed> = {
        if let url = ProcessInfo.processInfo.environment["REPLICA_BENCH_POSTGRES_URL"], !url.isEmpty {
            do {
                let admin = try PostgresCloudAdministration(connectionString: url)
                // Installs or upgrades when the role may; a role that may not uses the schema as it is.
                do { try admin.install() } catch { if try admin.schemaVersion() == nil { throw error } }
            } catch {
                return .failure(CheckFailed("REPLICA_BENCH_POSTGRES_URL: \(error)"))
            }
            return .success(BenchServer(url: url, summary: "server from REPLICA_BENCH_POSTGRES_URL", cluster: nil))
        }
        let script = ProcessInfo.processInfo.environment["REPLICA_POSTGRES_CLUSTER"]
            ?? FileManager.default.currentDirectoryPath + "/Scripts/postgres-cluster.sh"
        guard FileManager.default.fileExists(atPath: script) else {
            return .failure(CheckFailed("no server: set REPLICA_BENCH_POSTGRES_URL, or run from the package directory (Scripts/postgres-cluster.sh)"))
        }
        let directory = URL(fileURLWithPath: "/tmp/rpg-bench-\(getpid())")
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/bash")
            process.arguments = [script, "start", directory.appendingPathComponent("cluster").path, "--durable"]
            let output = Pipe()
            process.standardOutput = output
            try process.run()
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            started = directory
            atexit {
                guard let directory = BenchServer.started else { return }
                let stop = Process()
                stop.executableURL = URL(fileURLWithPath: "/bin/bash")
                stop.arguments = [ProcessInfo.processInfo.environment["REPLICA_POSTGRES_CLUSTER"]
                    ?? FileManager.default.currentDirectoryPath + "/Scripts/postgres-cluster.sh", "remove", directory.appendingPathComponent("cluster").path]
                try? stop.run()
                stop.waitUntilExit()
                try? FileManager.default.removeItem(at: directory)
            }
            guard process.terminationStatus == 0,
                  let port = text.split(separator: "\n").first(where: { $0.hasPrefix("PORT=") })?.dropFirst(5) else {
                return .failure(CheckFailed("the throwaway cluster did not start"))
            }
            let host = directory.appendingPathComponent("cluster").path
            let superuser = "host=\(host) port=\(port) dbname=postgres user=postgres"
            let setup = try PostgresCloudAdministration(connectionString: superuser)
            _ = setup  // (connects: the cluster is up)
            guard let create = PQconnectdb(superuser) else { return .failure(CheckFailed("libpq")) }
            PQclear(PQexec(create, "CREATE DATABASE replica_bench"))
            PQfinish(create)
            let admin = try PostgresCloudAdministration(connectionString: "host=\(host) port=\(port) dbname=replica_bench user=postgres")
            try admin.install()
            try admin.addUser("bench_backend", password: "bench-\(getpid())", group: .app)
            return .success(BenchServer(url: "host=\(host) port=\(port) dbname=replica_bench user=bench_backend",
                                        summary: "throwaway PostgreSQL 15 cluster on a Unix socket, synchronous_commit on, fsync off",
                                        cluster: directory))
        } catch {
            return .failure(CheckFailed("the throwaway cluster: \(error)"))
        }
    }()

    static func get() throws -> BenchServer { try shared.get() }

    /// CPU seconds the throwaway cluster's processes have used so far: the postmaster's own and its reaped children's
    /// (`utime + stime + cutime + cstime` in `/proc/PID/stat`) plus each live child's; `nil` for a server this process
    /// did not start (or when `/proc` cannot be read). Differences of two readings are the server's share of a trial.
    func serverCPUSeconds() -> Double? {
        guard let cluster,
              let pidFile = try? String(contentsOfFile: cluster.appendingPathComponent("cluster/data/postmaster.pid").path, encoding: .utf8),
              let postmaster = pidFile.split(separator: "\n").first.flatMap({ Int($0) }) else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        /// Fields after the command name (which may hold spaces, so it is skipped up to its closing parenthesis).
        func stat(_ pid: Int) -> [Substring]? {
            guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let close = text.lastIndex(of: ")") else { return nil }
            return text[text.index(after: close)...].split(separator: " ")
        }
        // After ")": state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
        guard let own = stat(postmaster), own.count > 14 else { return nil }
        var total = [11, 12, 13, 14].reduce(0.0) { $0 + (Double(own[$1]) ?? 0) }
        let processes = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        for name in processes {
            guard let pid = Int(name), pid != postmaster, let fields = stat(pid), fields.count > 12,
                  Int(fields[1]) == postmaster else { continue }
            total += (Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0)
        }
        return total / ticks
    }

    nonisolated(unsafe) private static var owners = 0

    /// An owner no other trial uses.
    static func freshOwner(_ prefix: String) -> String {
        owners += 1
        return "\(prefix)-\(getpid())-\(owners)"
    }
}

/// Runs `body` to its end from synchronous code (the harness is synchronous; the cloud is async).
func blocking<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let outcome = Mutex<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task {
        do {
            let value = try await body()
            outcome.withLock { $0 = .success(value) }
        } catch {
            outcome.withLock { $0 = .failure(error) }
        }
        done.signal()
    }
    done.wait()
    return try outcome.withLock { $0! }.get()
}

/// This process's CPU time (every thread), in seconds.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(Int32(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
}

/// Measures `body`: process CPU and wall time.
func measureProcess(_ body: () throws -> Void) rethrows -> Sample {
    let c0 = processCPUSeconds(), w0 = monotonicNow()
    try body()
    return Sample(cpu: processCPUSeconds() - c0, wall: monotonicNow() - w0)
}

// MARK: - B13: upload 10k records and fetch them on a second device

/// The records of B13: B9's remote batch (10 fields each), without change tags (new records). Made once per size, so
/// that every repetition of either side does the same work outside its timed region (whole-process instruction
/// counts, `--side`, take differences of runs).
func uploadBatch(_ n: Int) -> [CloudRecord] {
    if let made = uploadBatches[n] { return made }
    let made = batch(n).map { record in
        var record = record
        record.changeTag = nil
        return record
    }
    uploadBatches[n] = made
    return made
}

nonisolated(unsafe) private var uploadBatches: [Int: [CloudRecord]] = [:]

/// The binary bodies of ``uploadBatch(_:)`` as `PostgresCloudDatabase` sends them (no change tag), made once per size.
func uploadBodies(_ n: Int) throws -> [Data] {
    if let made = uploadBodyLists[n] { return made }
    let made = try uploadBatch(n).map { try CloudRecordBody.encode($0, includingChangeTag: false) }
    uploadBodyLists[n] = made
    return made
}

nonisolated(unsafe) private var uploadBodyLists: [Int: [Data]] = [:]

let b13BatchSize = 200
let b13PageSize = 500

/// Replica: one `PostgresCloudDatabase` uploads in batches of 200, a second one (the other device) fetches in pages of
/// 500 until it has every record. Connections are open and statements prepared before timing.
func postgresUploadFetchTrial(_ n: Int) throws -> Trial {
    let server = try BenchServer.get()
    let records = uploadBatch(n)
    let owner = BenchServer.freshOwner("b13")
    let upload = try PostgresCloudDatabase(connectionString: server.url, owner: owner, maximumConnections: 1)
    let download = try PostgresCloudDatabase(connectionString: server.url, owner: owner, maximumConnections: 1)
    try blocking {
        try await upload.createZone("bench")
        _ = try await upload.modifyRecords([], in: "bench")
        _ = try await download.fetchZoneChanges("bench", since: nil, limit: 1)
    }
    let received = Mutex(0)
    return Trial(run: {}, check: {
        try require(received.withLock { $0 } == n, "B13: the second device received \(received.withLock { $0 }) of \(n) records")
    }, measured: {
        let sample = try measureProcess {
            try blocking {
                var start = 0
                while start < records.count {
                    let results = try await upload.modifyRecords(Array(records[start..<min(start + b13BatchSize, records.count)]), in: "bench")
                    guard results.allSatisfy({ if case .saved = $0 { true } else { false } }) else { throw CheckFailed("B13: a save did not save") }
                    start += b13BatchSize
                }
                var token: ServerChangeToken?
                var count = 0
                while true {
                    let page = try await download.fetchZoneChanges("bench", since: token, limit: b13PageSize)
                    count += page.records.count
                    token = page.token
                    if !page.moreComing { break }
                }
                received.withLock { $0 = count }
            }
        }
        return Measurement(sample: sample, peakMB: nil, items: n)
    }, note: { server.summary })
}

/// Raw libpq: the same two statements (`replica.modify_records`, `replica.fetch_changes`) with the same binary
/// parameters — the same bytes: the bodies in the binary form `PostgresCloudDatabase` sends — prepared once, on two
/// connections. `codes`: the raw side also encodes the records' bodies before uploading and decodes the fetched ones
/// (with `CloudRecordBody.encode`/`decode`, as Replica does) — B13c, isolating what the client adds besides coding;
/// without it the bodies are encoded before timing and the fetched ones only copied out (B13).
func rawUploadFetchTrial(_ n: Int, codes: Bool) throws -> Trial {
    let server = try BenchServer.get()
    let records = uploadBatch(n)
    let bodies = try uploadBodies(n)
    let owner = BenchServer.freshOwner(codes ? "b13c" : "b13raw")
    let upload = try RawPG(server.url), download = try RawPG(server.url)
    for connection in [upload, download] {
        try connection.prepare("modify", "SELECT out_saved, out_change_tag, out_body, out_missing FROM replica.modify_records($1, $2, $3, $4, $5, $6, $7)",
                               [25, 25, 2951, 1009, 1000, 1001, 1009])
        try connection.prepare("fetch", """
            SELECT out_epoch, out_zone_sequence, out_sequence, out_id, out_change_tag, out_body
            FROM replica.fetch_changes($1, $2, $3, $4, $5)
            """, [25, 25, 20, 20, 23])
    }
    try upload.simple("SELECT replica.create_zone('\(owner)', 'bench')")
    var received = 0
    return Trial(run: {}, check: {
        try require(received == n, "B13 raw: the second connection received \(received) of \(n) records")
    }, measured: {
        let sample = try measureProcess {
            var start = 0
            while start < records.count {
                let end = min(start + b13BatchSize, records.count)
                let chunk = codes ? try records[start..<end].map { try CloudRecordBody.encode($0, includingChangeTag: false) }
                    : Array(bodies[start..<end])
                let params: [[UInt8]?] = [Array(owner.utf8), Array("bench".utf8),
                                          binaryArray(records[start..<end].map { withUnsafeBytes(of: $0.recordID.uuid) { Array($0) } }, oid: 2950),
                                          binaryArray(Array(repeating: nil, count: end - start), oid: 25),
                                          binaryArray(records[start..<end].map { _ in [1] }, oid: 16),
                                          binaryArray(chunk.map { Array($0) }, oid: 17),
                                          binaryArray(Array(repeating: [], count: end - start), oid: 25)]  // no assets
                let rows = try upload.execute("modify", params)
                defer { PQclear(rows) }
                try require(Int(PQntuples(rows)) == end - start, "B13 raw: modify_records returned \(PQntuples(rows)) rows")
                for row in 0..<PQntuples(rows) {
                    try require(PQgetvalue(rows, row, 0).pointee == 1, "B13 raw: a save did not save")
                    _ = String(cString: PQgetvalue(rows, row, 1))
                }
                start = end
            }
            var epoch: Int64?, sequence: Int64?
            var count = 0
            while true {
                let rows = try download.execute("fetch", [Array(owner.utf8), Array("bench".utf8), epoch.map(bigEndian), sequence.map(bigEndian),
                                                          bigEndian(Int32(b13PageSize))])
                defer { PQclear(rows) }
                let total = Int(PQntuples(rows))
                let header = (int64(rows, 0, 0), int64(rows, 0, 1))
                var last: Int64 = header.1
                for row in 1..<Int32(total) where Int(row) <= b13PageSize {
                    last = int64(rows, row, 2)
                    let id = UUID(uuid: UnsafeRawPointer(PQgetvalue(rows, row, 3)!).loadUnaligned(as: uuid_t.self))
                    _ = String(cString: PQgetvalue(rows, row, 4))
                    let body = Data(bytes: PQgetvalue(rows, row, 5)!, count: Int(PQgetlength(rows, row, 5)))
                    if codes {
                        let record = try CloudRecordBody.decode(body)
                        try require(record.recordID == id, "B13c: a body of another record")
                    }
                    count += 1
                }
                let more = total - 1 > b13PageSize
                epoch = header.0
                sequence = more ? last : header.1
                if !more { break }
            }
            received = count
        }
        return Measurement(sample: sample, peakMB: nil, items: n)
    }, note: { server.summary })
}

/// A bare libpq connection with prepared statements and binary parameters and results.
final class RawPG {
    let handle: OpaquePointer

    init(_ connectionString: String) throws {
        guard let handle = PQconnectdb(connectionString), PQstatus(handle) == CONNECTION_OK else {
            throw CheckFailed("raw libpq: cannot connect")
        }
        self.handle = handle
    }

    deinit { PQfinish(handle) }

    func prepare(_ name: String, _ sql: String, _ types: [Oid]) throws {
        let result = PQprepare(handle, name, sql, Int32(types.count), types)
        defer { PQclear(result) }
        try require(PQresultStatus(result) == PGRES_COMMAND_OK, "raw libpq: prepare \(name) failed")
    }

    func simple(_ sql: String) throws {
        let result = PQexec(handle, sql)
        defer { PQclear(result) }
        try require(PQresultStatus(result) == PGRES_TUPLES_OK || PQresultStatus(result) == PGRES_COMMAND_OK, "raw libpq: \(sql) failed")
    }

    /// Runs prepared statement `name` with binary `parameters` (nil: NULL); binary results.
    func execute(_ name: String, _ parameters: [[UInt8]?]) throws -> OpaquePointer {
        let lengths = parameters.map { Int32($0?.count ?? 0) }
        let formats = [Int32](repeating: 1, count: parameters.count)
        var storage = parameters.map { $0.map { $0 + [0] } }
        let result: OpaquePointer? = storage.withUnsafeMutableBufferPointer { buffers in
            var pointers: [UnsafePointer<CChar>?] = []
            var keep: [UnsafeMutableBufferPointer<UInt8>] = []
            for index in buffers.indices {
                if buffers[index] == nil {
                    pointers.append(nil)
                } else {
                    let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: buffers[index]!.count)
                    _ = copy.initialize(from: buffers[index]!)
                    keep.append(copy)
                    pointers.append(UnsafeRawPointer(copy.baseAddress!).assumingMemoryBound(to: CChar.self))
                }
            }
            defer { for copy in keep { copy.deallocate() } }
            return PQexecPrepared(handle, name, Int32(pointers.count), pointers, lengths, formats, 1)
        }
        guard let result, PQresultStatus(result) == PGRES_TUPLES_OK else {
            if let result { PQclear(result) }
            throw CheckFailed("raw libpq: \(name) failed: \(String(cString: PQerrorMessage(handle)))")
        }
        return result
    }
}

func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] { withUnsafeBytes(of: value.bigEndian) { Array($0) } }

func int64(_ result: OpaquePointer, _ row: Int32, _ column: Int32) -> Int64 {
    Int64(bigEndian: UnsafeRawPointer(PQgetvalue(result, row, column)!).loadUnaligned(as: Int64.self))
}

/// A one-dimensional array in PostgreSQL's binary array format.
func binaryArray(_ elements: [[UInt8]?], oid: Oid) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(20 + elements.reduce(0) { $0 + 4 + ($1?.count ?? 0) })
    out += bigEndian(Int32(1))
    out += bigEndian(Int32(elements.contains { $0 == nil } ? 1 : 0))
    out += bigEndian(UInt32(oid))
    out += bigEndian(Int32(elements.count))
    out += bigEndian(Int32(1))
    for element in elements {
        if let element {
            out += bigEndian(Int32(element.count))
            out += element
        } else {
            out += bigEndian(Int32(-1))
        }
    }
    return out
}

// MARK: - B14: 8 devices syncing concurrently through one server

let b14Devices = 8

/// The outcome of B14's latency phase, for the table's notes.
nonisolated(unsafe) var b14Latency: (median: Double, p99: Double, samples: Int)?
/// The client's CPU seconds (all threads) in B14's timed phase.
nonisolated(unsafe) var b14CPU: Double?
/// The server's CPU seconds in B14's timed phase (a throwaway cluster only).
nonisolated(unsafe) var b14ServerCPU: Double?

/// Eight devices of one user — eight stores, eight engines, each with its own cloud connection and a listener — each
/// with `n / 8` records saved locally before timing. Timed: every device syncs concurrently (uploading its records,
/// fetching on each announcement) until every device holds all `n`. Reported: `n` per second (a record counts once it
/// reached all eight). Then, untimed for the rate, the feed's latency: one device saves one record at a time
/// through the cloud; seven listeners each fetch on the announcement; the time from the save's acknowledgement to
/// the fetch that returned it, median and 99th percentile over every (record, listener).
func concurrentDevicesTrial(_ n: Int, latencySamples: Int) throws -> Trial {
    let server = try BenchServer.get()
    let owner = BenchServer.freshOwner("b14")
    let directory = trialDirectory("B14")
    var devices: [(container: ModelContainer, cloud: PostgresCloudDatabase)] = []
    let perDevice = n / b14Devices
    for index in 0..<b14Devices {
        let container = try makeStore(directory.appendingPathComponent("device-\(index)"), [BenchRecord.self], synced: true)
        let context = ModelContext(container)
        for record in makeRecords(perDevice, seed: UInt64(100 + index)) { context.insert(record) }
        try context.save()
        devices.append((container, try PostgresCloudDatabase(connectionString: server.url, owner: owner, maximumConnections: 1)))
    }
    let expected = perDevice * b14Devices
    let finalCounts = Mutex<[Int]>([])
    let sendableDevices = UncheckedBox(devices)
    return Trial(run: {}, check: {
        try require(finalCounts.withLock { $0 } == Array(repeating: expected, count: b14Devices),
                    "B14: devices hold \(finalCounts.withLock { $0 }) records, not \(expected) each")
    }, cleanup: { try? FileManager.default.removeItem(at: directory) }, measured: {
        // Listeners up (and engines made) before timing.
        let listening = Atomic<Int>(0)
        let streams = sendableDevices.value.map { $0.cloud.zoneChanges(onListening: { listening.add(1, ordering: .relaxed) }) }
        while listening.load(ordering: .relaxed) < b14Devices { usleep(1_000) }
        let engines = try sendableDevices.value.map { device -> SyncEngine in
            var options = SyncEngine.Options()
            options.uploadBatchSize = 200
            options.fetchLimit = 500
            return try SyncEngine(container: device.container, storeName: "bench", options: options)
        }
        let work = UncheckedBox((engines, streams))
        let server0 = server.serverCPUSeconds()
        let sample = try measureProcess {
            let counts = try blocking {
                try await withThrowingTaskGroup(of: (Int, Int).self) { group in
                    for index in 0..<b14Devices {
                        group.addTask {
                            let engine = work.value.0[index]
                            let device = sendableDevices.value[index]
                            var announcements = work.value.1[index].makeAsyncIterator()
                            let context = ModelContext(device.container)
                            while true {
                                _ = try await SyncDriver.syncUntilIdle(engine, with: device.cloud)
                                let held = try context.fetchCount(FetchDescriptor<BenchRecord>())
                                if held >= expected { return (index, held) }
                                _ = await announcements.next()
                            }
                        }
                    }
                    var counts = Array(repeating: 0, count: b14Devices)
                    for try await (index, held) in group { counts[index] = held }
                    return counts
                }
            }
            finalCounts.withLock { $0 = counts }
        }
        b14ServerCPU = server.serverCPUSeconds().flatMap { end in server0.map { end - $0 } }
        b14Latency = try feedLatency(server: server, owner: owner, samples: latencySamples)
        b14CPU = sample.cpu
        // A rate per elapsed second, whichever clock the run reports (the client's CPU time is in the note).
        return Measurement(sample: Sample(cpu: sample.wall, wall: sample.wall), peakMB: nil, items: expected)
    }, note: {
        let latency = b14Latency.map { "feed latency commit→notified fetch median \(format($0.median * 1000, 2)) ms, p99 \(format($0.p99 * 1000, 2)) ms "
            + "(\($0.samples) samples)" } ?? "no latency measured"
        return "\(b14Devices) devices, one zone; client CPU \(b14CPU.map { format($0, 2) } ?? "?") s, server CPU \(b14ServerCPU.map { format($0, 2) } ?? "?") s; \(latency); \(server.summary)"
    })
}

/// Carries a value that is confined by construction (each device's engine is used by one task) across a Sendable
/// boundary.
struct UncheckedBox<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// What the latency phase's tasks record.
final class LatencyLog: Sendable {
    /// When the writer heard each save's answer.
    let acknowledged = Mutex<[UUID: Double]>([:])
    /// When each listener's fetch returned each record (a fetch may come back before the writer hears its answer).
    let fetched = Mutex<[UUID: [Double]]>([:])
    let listening = Atomic<Int>(0)
}

/// See ``concurrentDevicesTrial(_:latencySamples:)``.
func feedLatency(server: BenchServer, owner: String, samples: Int) throws -> (median: Double, p99: Double, samples: Int) {
    let writer = try PostgresCloudDatabase(connectionString: server.url, owner: owner, maximumConnections: 1)
    let listeners = try (1..<b14Devices).map { _ in try PostgresCloudDatabase(connectionString: server.url, owner: owner, maximumConnections: 1) }
    return try blocking {
        try await writer.createZone("latency")
        let log = LatencyLog()
        let streams = listeners.map { $0.zoneChanges(onListening: { log.listening.add(1, ordering: .relaxed) }) }
        while log.listening.load(ordering: .relaxed) < listeners.count { try await Task.sleep(nanoseconds: 1_000_000) }
        let tasks = listeners.indices.map { index in
            Task {
                var token = try await listeners[index].fetchZoneChanges("latency", since: nil, limit: 1_000).token
                for await zone in streams[index] where zone == "latency" {
                    let page = try await listeners[index].fetchZoneChanges("latency", since: token, limit: 1_000)
                    let now = monotonicNow()
                    token = page.token
                    log.fetched.withLock { for record in page.records { $0[record.recordID, default: []].append(now) } }
                }
            }
        }
        let environment = ReplicaEnvironment.live
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: nowMilliseconds(), logical: 0, replica: environment.makeIdentifier()))
        for index in 0..<samples {
            let id = environment.makeIdentifier()
            let record = CloudRecord(recordID: id, recordType: "BenchRecord", causalLength: 1, created: stamp,
                                     fields: ["name": CloudField(value: .text("latency \(index)"), stamp: stamp)])
            _ = try await writer.modifyRecords([record], in: "latency")
            log.acknowledged.withLock { $0[id] = monotonicNow() }
            // The next save once every listener has fetched this one (or after 2 s).
            let deadline = monotonicNow() + 2
            while log.fetched.withLock({ $0[id]?.count ?? 0 }) < listeners.count, monotonicNow() < deadline {
                try await Task.sleep(nanoseconds: 200_000)
            }
        }
        let latencies = log.acknowledged.withLock { acknowledged in
            log.fetched.withLock { fetched in
                acknowledged.flatMap { id, at in (fetched[id] ?? []).map { max(0, $0 - at) } }
            }
        }
        for task in tasks { task.cancel() }
        let sorted = latencies.sorted()
        guard !sorted.isEmpty else { throw CheckFailed("B14: no listener fetched a record") }
        return (sorted[sorted.count / 2], sorted[min(sorted.count - 1, Int(Double(sorted.count) * 0.99))], sorted.count)
    }
}
