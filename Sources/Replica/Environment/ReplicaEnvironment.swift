import Foundation
import Synchronization
import CSodium

/// Every source of nondeterminism Replica uses: wall-clock time, randomness, new identifiers, process identity and
/// where app-group directories live.
///
/// Library code never calls `Date()`, `UUID()` or `.random` itself; it asks the environment. Production uses
/// ``ReplicaEnvironment/live``; tests and the simulator pass a ``ReplicaEnvironment/seeded(seed:directory:startMilliseconds:processIdentity:)``
/// environment so that a run replays byte for byte.
public struct ReplicaEnvironment: Sendable {
    /// The wall clock.
    public var clock: any WallClock
    /// The random source (nonces, identifiers).
    public var random: any RandomSource
    /// Who is writing: bundle identifier, process name and ID. Recorded in history transactions.
    public var processIdentity: ProcessIdentity
    /// Resolves an app-group identifier to the shared directory that holds its stores.
    public var appGroupDirectory: @Sendable (_ groupIdentifier: String) -> URL
    /// Where stores of configurations without an explicit URL or app group live.
    public var defaultStoreDirectory: URL
    /// Waits `milliseconds` (used only by observers: polling, and the short re-checks after a file event). Live:
    /// `Task.sleep`; seeded: advances the manual clock and yields, so no wall-clock time passes.
    public var sleep: @Sendable (_ milliseconds: Int64) async throws -> Void
    /// Waits until ``clock`` reads `deadline` (Unix milliseconds) or later: the timers of the sync runtime
    /// (``CloudSync``: debounce, periodic sync, retry after a backoff) wait through it. Throws `CancellationError`
    /// when the waiting task is cancelled.
    ///
    /// Live: sleeps on the system's timer and reads the clock again after each sleep (at most 60 s at a time, so a
    /// clock set forward ends the wait within a minute and a clock set back never stretches one sleep past that).
    /// Seeded: waits until something moves the ``ManualClock`` (a test's ``ManualClock/advance(by:)``, or a
    /// ``sleep`` elsewhere, which moves virtual time) to the deadline; no wall-clock time passes and nothing polls.
    public var sleepUntil: @Sendable (_ deadline: Int64) async throws -> Void
    /// How containers notice what other processes (and other containers of this process) commit to their store files
    /// while something observes them asynchronously (``ModelContainer/changes``, live queries). Default:
    /// ``OtherProcessCommits/fileEvents(fallbackPollingMilliseconds:)`` with 100 ms.
    public var otherProcessCommits: OtherProcessCommits = .fileEvents(fallbackPollingMilliseconds: 100)
    /// Called at named points of Replica's write paths (see ``FaultPoint``). Tests and the simulator use it to
    /// inject failures (by throwing) or to stop a process at an exact point; production leaves it `nil`.
    public var faultHook: (@Sendable (FaultPoint) throws -> Void)?
    /// Deliberate bugs switched on for simulator canary runs (see ``Canary``). Always empty in production.
    public var canaries: Set<Canary> = []
    /// The last identifier issued, so that identifiers stay strictly increasing.
    let identifierState = IdentifierState()

    public init(
        clock: any WallClock,
        random: any RandomSource,
        processIdentity: ProcessIdentity,
        appGroupDirectory: @escaping @Sendable (String) -> URL,
        defaultStoreDirectory: URL
    ) {
        self.clock = clock
        self.random = random
        self.processIdentity = processIdentity
        self.appGroupDirectory = appGroupDirectory
        self.defaultStoreDirectory = defaultStoreDirectory
        self.sleep = { try await Task.sleep(nanoseconds: UInt64(max(0, $0)) * 1_000_000) }
        if let manual = clock as? ManualClock {
            self.sleepUntil = { try await manual.sleep(until: $0) }
        } else {
            self.sleepUntil = { deadline in
                while true {
                    let remaining = deadline &- clock.nowMilliseconds()
                    if remaining <= 0 { return }
                    try await Task.sleep(nanoseconds: UInt64(min(remaining, 60_000)) * 1_000_000)
                }
            }
        }
    }

    /// The real environment: system clock, libsodium's `randombytes` (the OS CSPRNG), this process's identity,
    /// app groups under `$REPLICA_APP_GROUPS_DIR` (default `~/.local/share/replica/app-groups`) and default stores
    /// under `$REPLICA_STORE_DIR` (default `~/.local/share/replica/stores`).
    public static var live: ReplicaEnvironment {
        let variables = ProcessInfo.processInfo.environment
        let home = FileManager.default.homeDirectoryForCurrentUser
        func directory(_ variable: String, _ fallback: String) -> URL {
            if let dir = variables[variable], !dir.isEmpty { return URL(fileURLWithPath: dir, isDirectory: true) }
            return home.appendingPathComponent(fallback, isDirectory: true)
        }
        let groups = directory("REPLICA_APP_GROUPS_DIR", ".local/share/replica/app-groups")
        return ReplicaEnvironment(
            clock: SystemClock(),
            random: SodiumRandomSource(),
            processIdentity: .current,
            appGroupDirectory: { groups.appendingPathComponent($0, isDirectory: true) },
            defaultStoreDirectory: directory("REPLICA_STORE_DIR", ".local/share/replica/stores")
        )
    }

    /// A fully deterministic environment: a manual clock starting at `startMilliseconds` (Unix epoch), a seeded
    /// random source, a fixed process identity, default stores in `directory` and app groups in
    /// `directory/app-groups`.
    public static func seeded(
        seed: UInt64,
        directory: URL,
        startMilliseconds: Int64 = 1_767_225_600_000,
        processIdentity: ProcessIdentity = ProcessIdentity(bundleIdentifier: "com.example.replica", processName: "app", processID: 1)
    ) -> ReplicaEnvironment {
        let groups = directory.appendingPathComponent("app-groups", isDirectory: true)
        let clock = ManualClock(milliseconds: startMilliseconds)
        var environment = ReplicaEnvironment(
            clock: clock,
            random: SeededRandomSource(seed: seed),
            processIdentity: processIdentity,
            appGroupDirectory: { groups.appendingPathComponent($0, isDirectory: true) },
            defaultStoreDirectory: directory
        )
        environment.sleep = { milliseconds in
            clock.advance(by: milliseconds)
            await Task.yield()
            try Task.checkCancellation()
        }
        return environment
    }

    /// A new time-ordered identifier (UUID version 7, RFC 9562): 48 bits of Unix milliseconds from ``clock``,
    /// then 74 bits that start random and count up when several IDs share a millisecond (RFC 9562 §6.2, method 2).
    /// IDs made by one environment (and its copies) strictly increase, even if the clock goes backwards.
    public func makeIdentifier() -> UUID {
        let (ms, high, low) = identifierState.next(now: UInt64(max(0, clock.nowMilliseconds())), random: random)
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in 0..<6 { bytes[i] = UInt8(truncatingIfNeeded: ms >> (8 * (5 - i))) }
        bytes[6] = 0x70 | UInt8(truncatingIfNeeded: high >> 8 & 0x0F)
        bytes[7] = UInt8(truncatingIfNeeded: high)
        bytes[8] = 0x80 | UInt8(truncatingIfNeeded: low >> 56 & 0x3F)
        for i in 9..<16 { bytes[i] = UInt8(truncatingIfNeeded: low >> (8 * (15 - i))) }
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                           bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }

    /// The current time from ``clock``.
    public func now() -> Date { Date(timeIntervalSince1970: Double(clock.nowMilliseconds()) / 1000) }
}

/// The monotonic state behind ``ReplicaEnvironment/makeIdentifier()``: the last (milliseconds, 12-bit, 62-bit) triple.
final class IdentifierState: Sendable {
    private let last = Mutex<(ms: UInt64, high: UInt64, low: UInt64)>((0, 0, 0))

    func next(now: UInt64, random: any RandomSource) -> (UInt64, UInt64, UInt64) {
        last.withLock { last in
            if now > last.ms {
                // A fresh millisecond: random bits, with the top bit of the counter clear to leave room to count.
                last = (now, random.next() & 0x7FF, random.next() & 0x3FFF_FFFF_FFFF_FFFF)
            } else if last.low < 0x3FFF_FFFF_FFFF_FFFF {
                last.low += 1
            } else if last.high < 0xFFF {
                last = (last.ms, last.high + 1, 0)
            } else {
                last = (last.ms + 1, 0, 0)
            }
            return last
        }
    }
}

/// How a container notices commits that other processes make to its store files (see
/// ``ReplicaEnvironment/otherProcessCommits``). Its own contexts' saves and its sync engines' imports are announced
/// as they commit, whatever this says.
public enum OtherProcessCommits: Sendable, Hashable {
    /// Wake on file-system events for the stores' files (inotify on Linux: the store directory's events for the
    /// `-wal` file, which every commit writes), then read the new history; no polling while nothing is written.
    /// Where file events are unavailable (other systems, or inotify refused), poll `PRAGMA data_version` every
    /// `fallbackPollingMilliseconds` (waits through ``ReplicaEnvironment/sleep``).
    case fileEvents(fallbackPollingMilliseconds: Int64)
    /// Poll `PRAGMA data_version` every `milliseconds` (waits through ``ReplicaEnvironment/sleep``).
    case polling(milliseconds: Int64)
    /// Do not watch: other processes' commits are announced only when a synchronous observer catches up.
    case disabled
}

/// A point in Replica's write paths where ``ReplicaEnvironment/faultHook`` is called.
public enum FaultPoint: Sendable, Hashable {
    /// A save has applied and validated every change of store `store` inside its open write transaction and is about
    /// to commit it. Throwing here rolls the whole save back.
    case beforeCommit(store: String)
    /// Store `store`'s transaction of a save has committed.
    case afterCommit(store: String)
    /// The sync engine of store `store` is about to merge a fetched batch (and store its change token).
    case beforeImport(store: String)
}

/// Who is writing to a store: recorded in history so other processes can tell their own changes from others'.
public struct ProcessIdentity: Sendable, Hashable, Codable {
    /// The host app's bundle identifier (e.g. `com.example.trips`, or `com.example.trips.widget`).
    public var bundleIdentifier: String
    /// The process name (e.g. `Trips`, `TripsWidget`).
    public var processName: String
    /// The OS process ID.
    public var processID: Int32

    public init(bundleIdentifier: String, processName: String, processID: Int32) {
        self.bundleIdentifier = bundleIdentifier
        self.processName = processName
        self.processID = processID
    }

    /// This process: bundle identifier from `$REPLICA_BUNDLE_IDENTIFIER` (default: the process name),
    /// process name and PID from the OS.
    public static var current: ProcessIdentity {
        let info = ProcessInfo.processInfo
        return ProcessIdentity(
            bundleIdentifier: info.environment["REPLICA_BUNDLE_IDENTIFIER"] ?? info.processName,
            processName: info.processName,
            processID: info.processIdentifier
        )
    }
}

// MARK: - Clock

/// A wall clock in Unix milliseconds.
public protocol WallClock: Sendable {
    /// Milliseconds since 1970-01-01T00:00:00Z.
    func nowMilliseconds() -> Int64
}

/// The system's real-time clock.
public struct SystemClock: WallClock {
    public init() {}
    public func nowMilliseconds() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1000 + Int64(spec.tv_nsec) / 1_000_000
    }
}

/// A clock that moves only when told to: for tests and the simulator (skew and jumps included). Tasks can wait for
/// it to reach a time (``sleep(until:)``); moving it forward wakes them, in deadline order.
public final class ManualClock: WallClock {
    private struct State {
        var now: Int64
        var nextWaiter = 0
        var waiters: [(id: Int, deadline: Int64, continuation: CheckedContinuation<Void, any Error>)] = []
    }
    private let state: Mutex<State>

    /// - Parameter milliseconds: the starting time, Unix milliseconds.
    public init(milliseconds: Int64) { state = Mutex(State(now: milliseconds)) }

    public func nowMilliseconds() -> Int64 { state.withLock { $0.now } }

    /// Moves the clock by `milliseconds` (negative values move it backwards, like a jump of the device clock).
    public func advance(by milliseconds: Int64) { update { $0 &+= milliseconds } }

    /// Sets the clock to `milliseconds` since the Unix epoch.
    public func set(milliseconds: Int64) { update { $0 = milliseconds } }

    /// The number of tasks waiting in ``sleep(until:)`` (tests wait for a runtime to settle into its wait).
    public var waiterCount: Int { state.withLock { $0.waiters.count } }

    /// Waits until the clock reads `deadline` or later (returns at once when it already does).
    /// - Throws: `CancellationError` when the waiting task is cancelled.
    public func sleep(until deadline: Int64) async throws {
        let id = state.withLock { state -> Int in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resume: Bool? = state.withLock { state in
                    if Task.isCancelled { return false }
                    if state.now >= deadline { return true }
                    state.waiters.append((id, deadline, continuation))
                    return nil
                }
                switch resume {
                case true?: continuation.resume()
                case false?: continuation.resume(throwing: CancellationError())
                case nil: break
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
    }

    private func update(_ change: (inout Int64) -> Void) {
        let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            change(&state.now)
            let now = state.now
            let due = state.waiters.filter { $0.deadline <= now }.sorted { ($0.deadline, $0.id) < ($1.deadline, $1.id) }
            state.waiters.removeAll { $0.deadline <= now }
            return due.map(\.continuation)
        }
        for continuation in due { continuation.resume() }
    }
}

// MARK: - Randomness

/// A source of 64-bit random words.
public protocol RandomSource: Sendable {
    /// The next random 64-bit word.
    func next() -> UInt64
    /// Fills `buffer` with random bytes.
    func fill(_ buffer: UnsafeMutableRawBufferPointer)
}

extension RandomSource {
    public func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        var index = 0
        while index < buffer.count {
            var word = next()
            for _ in 0..<8 where index < buffer.count {
                buffer[index] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                index += 1
            }
        }
    }
}

/// The OS CSPRNG through libsodium's `randombytes_buf`.
/// Source: <https://doc.libsodium.org/generating_random_data>
public struct SodiumRandomSource: RandomSource {
    public init() { SodiumRuntime.ensureInitialized() }
    public func next() -> UInt64 {
        var value: UInt64 = 0
        withUnsafeMutableBytes(of: &value) { randombytes_buf($0.baseAddress!, 8) }
        return value
    }
    public func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        randombytes_buf(base, buffer.count)
    }
}

/// A deterministic random source (SplitMix64). Same seed, same sequence.
public final class SeededRandomSource: RandomSource {
    private let state: Mutex<UInt64>

    public init(seed: UInt64) { state = Mutex(seed) }

    public func next() -> UInt64 {
        state.withLock { s in
            s &+= 0x9E37_79B9_7F4A_7C15
            var z = s
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }
}

/// libsodium must be initialised once per process before use.
enum SodiumRuntime {
    private static let initialized: Bool = sodium_init() >= 0
    static func ensureInitialized() {
        precondition(initialized, "Replica: libsodium failed to initialise (sodium_init)")
    }
}
