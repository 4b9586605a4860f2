import Foundation
import Replica

/// The benchmark record: an ID and ten attributes of the common types (4 text, 3 integer-like, 2 real, 1 date),
/// one of them optional. Encoded through the entity's key paths and read through a hand-written `init(row:)`:
/// Replica's typed fast path.
struct BenchRecord: PersistentModel, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var email: String = ""
    var age: Int = 0
    var score: Double = 0
    var active: Bool = false
    var created: Date = Date(timeIntervalSince1970: 0)
    var note: String?
    var count: Int = 0
    var ratio: Double = 0
    var tag: String = ""

    static let entity = ModelEntity<BenchRecord>([
        .attribute("name", \.name, default: ""),
        .attribute("email", \.email, default: ""),
        .attribute("age", \.age, default: 0),
        .attribute("score", \.score, default: 0),
        .attribute("active", \.active, default: false),
        .attribute("created", \.created, default: Date(timeIntervalSince1970: 0)),
        .attribute("note", \.note),
        .attribute("count", \.count, default: 0),
        .attribute("ratio", \.ratio, default: 0),
        .attribute("tag", \.tag, default: ""),
    ])

    init(id: UUID = .unassigned, name: String, email: String, age: Int, score: Double, active: Bool, created: Date,
         note: String?, count: Int, ratio: Double, tag: String) {
        self.id = id
        self.name = name
        self.email = email
        self.age = age
        self.score = score
        self.active = active
        self.created = created
        self.note = note
        self.count = count
        self.ratio = ratio
        self.tag = tag
    }

    /// Typed fast path: fields by position.
    init(row: ModelRow) throws {
        id = row.id
        name = try row.decode(at: 0)
        email = try row.decode(at: 1)
        age = try row.decode(at: 2)
        score = try row.decode(at: 3)
        active = try row.decode(at: 4)
        created = try row.decode(at: 5)
        note = try row.decode(at: 6)
        count = try row.decode(at: 7)
        ratio = try row.decode(at: 8)
        tag = try row.decode(at: 9)
    }

    /// Record `i` of a data set (deterministic values; every third note is nil).
    static func make(_ i: Int, id: UUID) -> BenchRecord {
        BenchRecord(id: id, name: "name \(i)", email: "user\(i)@example.com", age: i % 100, score: Double(i) * 0.5,
                    active: i % 2 == 0, created: Date(timeIntervalSince1970: 1_700_000_000 + Double(i)),
                    note: i % 3 == 0 ? nil : "note number \(i) for the benchmark", count: i, ratio: 1 / Double(i + 1),
                    tag: "tag\(i % 50)")
    }

    /// A cheap order-sensitive checksum of what a fetch returned (both sides must agree).
    static func checksum(_ records: [BenchRecord]) -> Int {
        var h = records.count
        for r in records { fold(&h, r) }
        return h
    }

    /// Folds one record into a running checksum (streaming reads check themselves with it).
    @inline(__always)
    static func fold(_ h: inout Int, _ r: BenchRecord) {
        // The ID's bytes, not its hash value: hashing is seeded per process, and B10 compares two processes.
        let (high, low) = withUnsafeBytes(of: r.id.uuid) { ($0.loadUnaligned(as: UInt64.self), $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)) }
        h = h &* 31 &+ Int(truncatingIfNeeded: high ^ (low &* 0x9E37_79B9_7F4A_7C15))
        h = h &* 31 &+ r.name.utf8.count &+ r.email.utf8.count &+ (r.note?.utf8.count ?? -1) &+ r.tag.utf8.count
        h = h &* 31 &+ r.age &+ r.count &+ (r.active ? 1 : 0) &+ Int(r.score) &+ Int(r.created.timeIntervalSince1970)
        h = h &* 31 &+ Int(r.ratio * 1e9)
    }
}

/// The column list, in Replica's field order, shared by the raw baselines (they issue the same SQL text).
enum BenchSQL {
    static let table = "\"BenchRecord\""
    static let columns = #""id", "name", "email", "age", "score", "active", "created", "note", "count", "ratio", "tag""#
    /// The text of Replica's `EntityStatements.insert` for the entity.
    static func insert(_ table: String) -> String {
        "INSERT INTO \(table) (\(columns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    }
    /// The text of Replica's fetch-all query for the entity.
    static func selectAll(_ table: String) -> String { "SELECT \(columns) FROM \(table) ORDER BY \"id\"" }

    /// The text of `HistoryLog.record`'s statements.
    static let historyTransaction = """
        INSERT INTO replica_history_transaction (timestamp, author, bundle_identifier, process_name, process_id)
        VALUES (?, ?, ?, ?, ?) RETURNING token
        """
    static let historyChange =
        "INSERT INTO replica_history_change (token, seq, entity, kind, fields, ids, tombstone) VALUES (?, ?, ?, ?, ?, ?, ?)"
}

/// A deterministic data set of `n` records with time-ordered IDs, built before timing: both sides insert the same
/// records (same IDs, same values).
func makeRecords(_ n: Int, seed: UInt64 = 1) -> [BenchRecord] {
    let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory)
    return (0..<n).map { BenchRecord.make($0, id: environment.makeIdentifier()) }
}

/// Trials made so far in this process (names each trial's directory; the root is per process).
nonisolated(unsafe) private var trialCount = 0

/// A fresh directory for one trial's files.
func trialDirectory(_ name: String) -> URL {
    trialCount += 1
    let url = benchRoot.appendingPathComponent("\(name)-\(trialCount)", isDirectory: true)
    try? FileManager.default.removeItem(at: url)  // left by an earlier process with the same ID
    try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

let benchRoot: URL = {
    let base = ProcessInfo.processInfo.environment["REPLICA_BENCH_DIR"].map { URL(fileURLWithPath: $0) }
        ?? FileManager.default.temporaryDirectory
    return base.appendingPathComponent("replica-bench-\(getpid())", isDirectory: true)
}()

/// The environment Replica's side uses: a real clock and random source, stores in `directory`.
func benchEnvironment(_ directory: URL) -> ReplicaEnvironment {
    var environment = ReplicaEnvironment.live
    environment.defaultStoreDirectory = directory
    return environment
}

/// The process identity Replica records in history (the raw side writes the same values).
let benchIdentity = ReplicaEnvironment.live.processIdentity

func nowMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

struct CheckFailed: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

func require(_ condition: Bool, _ message: @autoclosure () -> String) throws {
    if !condition { throw CheckFailed(message()) }
}

/// The same record through the Codable convenience path: encoded by the synthesized `encode(to:)` and decoded by the
/// synthesized `init(from:)` (B2). Same table as `BenchRecord`, so the raw baseline is B1's.
struct BenchCodableRecord: CodablePersistentModel, Equatable {
    static var entityName: String { "BenchRecord" }
    var id = UUID.unassigned
    var name: String = ""
    var email: String = ""
    var age: Int = 0
    var score: Double = 0
    var active: Bool = false
    var created: Date = Date(timeIntervalSince1970: 0)
    var note: String?
    var count: Int = 0
    var ratio: Double = 0
    var tag: String = ""

    static let entity = ModelEntity<BenchCodableRecord>([
        .attribute("name", \.name, default: ""),
        .attribute("email", \.email, default: ""),
        .attribute("age", \.age, default: 0),
        .attribute("score", \.score, default: 0),
        .attribute("active", \.active, default: false),
        .attribute("created", \.created, default: Date(timeIntervalSince1970: 0)),
        .attribute("note", \.note),
        .attribute("count", \.count, default: 0),
        .attribute("ratio", \.ratio, default: 0),
        .attribute("tag", \.tag, default: ""),
    ])

    init(_ r: BenchRecord) {
        id = r.id; name = r.name; email = r.email; age = r.age; score = r.score; active = r.active
        created = r.created; note = r.note; count = r.count; ratio = r.ratio; tag = r.tag
    }
}

func makeCodableRecords(_ n: Int) -> [BenchCodableRecord] { makeRecords(n).map(BenchCodableRecord.init) }

extension BenchRecord {
    init(_ r: BenchCodableRecord) {
        self.init(id: r.id, name: r.name, email: r.email, age: r.age, score: r.score, active: r.active, created: r.created,
                  note: r.note, count: r.count, ratio: r.ratio, tag: r.tag)
    }
}
