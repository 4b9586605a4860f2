import Foundation
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Clocks and memory

/// Seconds on one clock. CPU time of the calling thread is the default measure: every workload runs entirely on the
/// calling thread (SQLite and libsodium work synchronously), and thread CPU time does not count the time other
/// processes on a shared machine take the core away. Wall time is recorded too.
struct Sample {
    var cpu: Double
    var wall: Double

    func value(_ clock: ClockKind) -> Double { clock == .cpu ? cpu : wall }
}

enum ClockKind: String { case cpu, wall }

private func now(_ clock: clockid_t) -> Double {
    var ts = timespec()
    clock_gettime(clock, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// The timed region of Replica's side. Its own (never inlined) function so that instruction counts can be collected
/// for exactly this region: `valgrind --tool=callgrind --toggle-collect='*timedReplicaRegion*' ...` (see
/// Scripts/bench-instructions.sh).
/// (The two functions differ in shape so that the optimizer cannot merge them into one symbol.)
@inline(never)
func timedReplicaRegion(_ body: () throws -> Void) rethrows -> Sample {
    let sample = try measure(body)
    regionsTimed.replica &+= 1
    return sample
}

/// The timed region of the raw C side (see ``timedReplicaRegion(_:)``).
@inline(never)
func timedRawRegion(_ body: () throws -> Void) rethrows -> Sample {
    regionsTimed.raw &+= 1
    return try measure(body)
}

nonisolated(unsafe) var regionsTimed = (replica: 0, raw: 0)

/// Runs `body` once and returns its CPU and wall time.
func measure(_ body: () throws -> Void) rethrows -> Sample {
    let c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC)
    try body()
    let c1 = now(CLOCK_THREAD_CPUTIME_ID), w1 = now(CLOCK_MONOTONIC)
    return Sample(cpu: c1 - c0, wall: w1 - w0)
}

/// Peak resident set size of this process (Linux `VmHWM`), in bytes; `resetPeak()` starts a new peak
/// (writing 5 to `/proc/self/clear_refs`, Linux 4.0+), so each side of a workload gets its own peak.
enum Memory {
    static func residentBytes(_ field: String = "VmRSS:") -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix(field) {
            let digits = line.dropFirst(field.count).trimmingCharacters(in: .whitespaces).split(separator: " ").first
            return digits.flatMap { Int($0) }.map { $0 * 1024 }
        }
        return nil
    }

    static func peakBytes() -> Int? { residentBytes("VmHWM:") }

    /// Starts a new peak. Returns `false` when the kernel does not support it.
    @discardableResult
    static func resetPeak() -> Bool {
        guard let handle = FileHandle(forWritingAtPath: "/proc/self/clear_refs") else { return false }
        defer { try? handle.close() }
        do { try handle.write(contentsOf: Data("5".utf8)) } catch { return false }
        return true
    }
}

// MARK: - Workloads

/// One prepared run of one side of a workload: `run` is timed; `check` verifies (untimed) that it did the work;
/// `cleanup` removes its files.
struct Trial {
    var run: () throws -> Void
    var check: () throws -> Void = {}
    var cleanup: () -> Void = {}
    /// For a side that measures itself (in a child process, or CPU seconds the simulator reports per seed): called
    /// instead of timing `run`.
    var measured: (() throws -> Measurement)?
    /// A remark for the table's notes (the last repetition's is shown), e.g. where the time went.
    var note: () -> String? = { nil }
}

/// What a self-measuring trial reports.
struct Measurement {
    var sample: Sample
    /// Peak resident memory above the baseline taken just before the measured work, in MB.
    var peakMB: Double?
    /// Items processed (for `per_second`), when only the run knows them.
    var items: Int?
}

/// What a workload must reach.
enum Target {
    /// Replica's time over the raw C baseline's time.
    case ratio(Double)
    /// At least this many units per second (`units` names them).
    case perSecond(Double, units: String)
    /// Peak RSS at most this many MB above the baseline before the workload.
    case peakRSSAbove(Double)
    /// No target: a row measured for comparison with another (e.g. a stricter baseline).
    case comparison
    /// Replica's median time (a latency the trial measures itself) at most this many milliseconds.
    case atMostMilliseconds(Double)
    /// No target: units per second, reported (the issue asks for the figure, not a bound).
    case reportedPerSecond(units: String)

    var description: String {
        switch self {
        case let .ratio(r): return "ratio ≤ \(format(r, 2))"
        case let .perSecond(n, units): return "≥ \(Int(n)) \(units)"
        case let .peakRSSAbove(mb): return "peak RSS ≤ \(Int(mb)) MB above baseline"
        case .comparison: return "(for comparison)"
        case let .atMostMilliseconds(ms): return "median ≤ \(Int(ms)) ms"
        case let .reportedPerSecond(units): return "(reported, \(units))"
        }
    }
}

/// Sizes for a run: full (the issue's sizes) or quick.
struct RunSize {
    var quick: Bool
    /// `full` at full size, `full / divisor` with `--quick`.
    func scaled(_ full: Int, quickDivisor: Int = 5) -> Int { quick ? max(1, full / quickDivisor) : full }
}

/// A workload: an ID from the issue, a title, a target, and its two sides (or why it is not built yet).
struct Workload {
    var id: String
    var title: String
    var target: Target
    /// Items processed per run (rows, records, cases), for `per_second` and the table.
    var count: (RunSize) -> Int
    /// Replica's side.
    var replica: ((RunSize) throws -> Trial)?
    /// The raw C side; `nil` for absolute targets.
    var raw: ((RunSize) throws -> Trial)?
    /// Set when the feature this workload measures is not in this build.
    var notBuilt: String?
    /// Measure peak RSS of each side (costs two /proc reads per run; self-measuring trials report their own).
    var measuresMemory = false
    /// Repetitions after the warm-up (full, quick), when the default (7, 5) would take too long.
    var repetitions: (full: Int, quick: Int)?

    static func notYetBuilt(_ id: String, _ title: String, _ target: Target, _ reason: String) -> Workload {
        Workload(id: id, title: title, target: target, count: { _ in 0 }, notBuilt: reason)
    }
}

/// The outcome of one workload.
struct BenchResult {
    var workload: Workload
    var count: Int
    var replica: [Sample] = []
    var raw: [Sample] = []
    var replicaPeakMB: [Double] = []
    var rawPeakMB: [Double] = []
    var clock: ClockKind
    var error: String?
    /// The last repetition's remark (see ``Trial/note``).
    var note: String?

    func median(_ xs: [Double]) -> Double? {
        guard !xs.isEmpty else { return nil }
        let s = xs.sorted()
        return s.count % 2 == 1 ? s[s.count / 2] : (s[s.count / 2 - 1] + s[s.count / 2]) / 2
    }

    var replicaSeconds: Double? { median(replica.map { $0.value(clock) }) }
    var rawSeconds: Double? { median(raw.map { $0.value(clock) }) }
    var replicaWall: Double? { median(replica.map(\.wall)) }
    var rawWall: Double? { median(raw.map(\.wall)) }

    /// The median of the per-repetition ratios (each repetition runs both sides back to back, so a slow moment of
    /// the machine affects both sides of a pair).
    var ratio: Double? {
        guard !raw.isEmpty, raw.count == replica.count else { return nil }
        return median(zip(replica, raw).map { $0.value(clock) / $1.value(clock) })
    }

    /// Spread of the per-repetition ratios (min, max), to show how noisy the run was.
    var ratioRange: (Double, Double)? {
        guard !raw.isEmpty, raw.count == replica.count else { return nil }
        let rs = zip(replica, raw).map { $0.value(clock) / $1.value(clock) }
        return (rs.min()!, rs.max()!)
    }

    var perSecond: Double? { replicaSeconds.map { Double(count) / $0 } }
    var peakMB: Double? { median(replicaPeakMB) }

    var met: Bool {
        guard error == nil, workload.notBuilt == nil else { return false }
        switch workload.target {
        case let .ratio(limit): return ratio.map { $0 <= limit } ?? false
        case let .perSecond(n, _): return perSecond.map { $0 >= n } ?? false
        case let .peakRSSAbove(mb): return peakMB.map { $0 <= mb } ?? false
        case .comparison, .reportedPerSecond: return false
        case let .atMostMilliseconds(ms): return replicaSeconds.map { $0 * 1000 <= ms } ?? false
        }
    }
}

// MARK: - Running

struct Options {
    var quick = false
    var json = false
    var repetitions: Int?
    var warmups = 1
    var only: Set<String>?
    var clock = ClockKind.cpu
    /// Run only Replica's side (`true`) or only the raw side (`false`); `nil`: both.
    var side: Bool?
}

func run(_ workload: Workload, options: Options, log: (String) -> Void) -> BenchResult {
    let size = RunSize(quick: options.quick)
    var result = BenchResult(workload: workload, count: workload.count(size), clock: options.clock)
    guard workload.notBuilt == nil, let replicaSide = workload.replica else { return result }
    let repetitions = options.repetitions
        ?? workload.repetitions.map { options.quick ? $0.quick : $0.full } ?? (options.quick ? 5 : 7)
    do {
        for rep in 0..<(options.warmups + repetitions) {
            let warm = rep < options.warmups
            // Alternate which side goes first, so drift (caches, file system, CPU frequency) favours neither.
            var sides: [(isReplica: Bool, make: (RunSize) throws -> Trial)] = [(true, replicaSide)]
            if let raw = workload.raw { sides.append((false, raw)) }
            if rep % 2 == 1 { sides.reverse() }
            if let only = options.side { sides.removeAll { $0.isReplica != only } }
            var line = "  \(workload.id) \(warm ? "warm-up" : "rep \(rep - options.warmups + 1)/\(repetitions)"):"
            for side in sides {
                let trial = try side.make(size)
                defer { trial.cleanup() }
                var peakBefore = 0
                if workload.measuresMemory && trial.measured == nil {
                    Memory.resetPeak()
                    peakBefore = Memory.residentBytes() ?? 0
                }
                let sample: Sample
                var peak = 0.0
                if let measured = trial.measured {
                    let measurement = try measured()
                    sample = measurement.sample
                    peak = measurement.peakMB ?? 0
                    if side.isReplica, let items = measurement.items { result.count = items }
                } else {
                    sample = side.isReplica ? try timedReplicaRegion(trial.run) : try timedRawRegion(trial.run)
                    if workload.measuresMemory { peak = Double((Memory.peakBytes() ?? 0) - peakBefore) / 1_048_576 }
                }
                try trial.check()
                if side.isReplica, let note = trial.note() { result.note = note }
                line += " \(side.isReplica ? "replica" : "raw") \(format(sample.value(options.clock), 4))s"
                guard !warm else { continue }
                if side.isReplica {
                    result.replica.append(sample)
                    if workload.measuresMemory { result.replicaPeakMB.append(peak) }
                } else {
                    result.raw.append(sample)
                    if workload.measuresMemory { result.rawPeakMB.append(peak) }
                }
            }
            log(line)
        }
    } catch {
        result.error = "\(error)"
    }
    return result
}

// MARK: - Output

func format(_ value: Double, _ digits: Int) -> String {
    String(format: "%.\(digits)f", value)
}

func tableLine(_ r: BenchResult) -> String {
    let w = r.workload
    func cell(_ s: String, _ width: Int) -> String { s.count >= width ? s : s + String(repeating: " ", count: width - s.count) }
    let size = r.count > 0 ? "\(r.count)" : ""
    if let reason = w.notBuilt {
        return "| \(cell(w.id, 3)) | \(cell(w.title, 58)) | \(cell("", 7)) | \(cell("", 9)) | \(cell("", 9)) | \(cell("not yet built", 13)) | \(cell(w.target.description, 24)) | \(cell("—", 4)) | \(reason)"
    }
    if let error = r.error {
        return "| \(cell(w.id, 3)) | \(cell(w.title, 58)) | \(cell(size, 7)) | \(cell("", 9)) | \(cell("", 9)) | \(cell("error", 13)) | \(cell(w.target.description, 24)) | \(cell("no", 4)) | \(error)"
    }
    let replica = r.replicaSeconds.map { format($0, 4) } ?? ""
    let raw = r.rawSeconds.map { format($0, 4) } ?? "—"
    var outcome: String
    var note = ""
    switch w.target {
    case .ratio, .comparison:
        outcome = r.ratio.map { format($0, 2) + "x" } ?? ""
        if let (lo, hi) = r.ratioRange { note = "ratios \(format(lo, 2))–\(format(hi, 2))" }
    case .perSecond:
        outcome = r.perSecond.map { "\(Int($0.rounded()))/s" } ?? ""
    case let .reportedPerSecond(units):
        outcome = r.perSecond.map { "\(format($0, 1)) \(units)" } ?? ""
    case .peakRSSAbove:
        outcome = r.peakMB.map { format($0, 1) + " MB" } ?? ""
    case .atMostMilliseconds:
        outcome = r.replicaSeconds.map { format($0 * 1000, 1) + " ms" } ?? ""
    }
    if let peak = r.peakMB, case .ratio = w.target { note += (note.isEmpty ? "" : "; ") + "peak RSS +\(format(peak, 1)) MB" }
    if case .peakRSSAbove = w.target {
        if let ratio = r.ratio { note += "time \(format(ratio, 2))x raw" }
        if let rawPeak = r.median(r.rawPeakMB) { note += (note.isEmpty ? "" : "; ") + "raw peak +\(format(rawPeak, 1)) MB" }
    }
    if let extra = r.note { note += (note.isEmpty ? "" : "; ") + extra }
    let met: String
    switch w.target {
    case .comparison, .reportedPerSecond: met = "—"
    default: met = r.met ? "yes" : "no"
    }
    return "| \(cell(w.id, 3)) | \(cell(w.title, 58)) | \(cell(size, 7)) | \(cell(replica, 9)) | \(cell(raw, 9)) | \(cell(outcome, 13)) | \(cell(w.target.description, 24)) | \(cell(met, 4)) | \(note)"
}

func tableHeader(_ clock: ClockKind) -> String {
    """
    | ID  | Workload                                                   | Size    | Replica s | Raw C s   | Result        | Target                   | Met  | Notes
    |-----|------------------------------------------------------------|---------|-----------|-----------|---------------|--------------------------|------|------
    """
}

/// One JSON object (one line) per workload.
func jsonLine(_ r: BenchResult, options: Options) -> String {
    var fields: [(String, String)] = []
    func string(_ s: String) -> String {
        var out = "\""
        for ch in s.unicodeScalars {
            switch ch {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default:
                if ch.value < 0x20 { out += String(format: "\\u%04x", ch.value) } else { out.unicodeScalars.append(ch) }
            }
        }
        return out + "\""
    }
    func number(_ d: Double?) -> String { d.map { format($0, 6) } ?? "null" }
    let w = r.workload
    fields.append(("workload", string(w.id)))
    fields.append(("title", string(w.title)))
    fields.append(("status", string(w.notBuilt != nil ? "not yet built" : r.error != nil ? "error" : "measured")))
    fields.append(("size", "\(r.count)"))
    fields.append(("clock", string(options.clock.rawValue)))
    fields.append(("repetitions", "\(r.replica.count)"))
    fields.append(("replica_s", number(r.replicaSeconds)))
    fields.append(("raw_s", number(r.rawSeconds)))
    fields.append(("ratio", number(r.ratio)))
    fields.append(("replica_wall_s", number(r.replicaWall)))
    fields.append(("raw_wall_s", number(r.rawWall)))
    switch w.target {
    case .perSecond, .reportedPerSecond: fields.append(("per_second", number(r.perSecond)))
    default: break
    }
    if w.measuresMemory {
        fields.append(("peak_rss_mb", number(r.peakMB)))
        fields.append(("raw_peak_rss_mb", number(r.median(r.rawPeakMB))))
    }
    fields.append(("target", string(w.target.description)))
    fields.append(("met", r.met ? "true" : "false"))
    if let reason = w.notBuilt { fields.append(("reason", string(reason))) }
    if let error = r.error { fields.append(("error", string(error))) }
    if let note = r.note { fields.append(("note", string(note))) }
    return "{" + fields.map { "\"\($0.0)\": \($0.1)" }.joined(separator: ", ") + "}"
}
