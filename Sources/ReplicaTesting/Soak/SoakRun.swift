// A soak: real OS processes as devices (`replica-device`), a real PostgreSQL cloud, a random workload and faults for
// a bounded time, then healing and the invariants of `SoakInvariants.swift`. Not deterministic — processes race, the
// server schedules — so a run reports its seed and a log of everything it did (see Simulations/README.md for turning a
// failure into a deterministic scenario).

import Foundation
import Replica
import Synchronization

/// One soak run.
public final class SoakRun: @unchecked Sendable {
    /// What to run.
    public struct Configuration: Sendable {
        /// The cloud: a libpq connection string with the replica schema installed (`replica-cloud init`).
        public var cloudURL: String
        /// The user an app-backend role acts for; `nil` when the URL's role is the user.
        public var owner: String?
        /// Device processes.
        public var devices: Int
        /// Seconds of workload and faults (healing comes after).
        public var duration: Double
        public var seed: UInt64
        /// The `replica-device` executable.
        public var deviceExecutable: URL
        /// Where stores, journals and logs go (made if missing; kept for inspection).
        public var directory: URL
        /// Faults the run injects between workload steps.
        public var faults: Faults
        /// Seconds each device may take to heal in one round.
        public var healTimeout: Double = 60
        /// Bugs planted in every device's engine (`Canary`), to show that the check catches them.
        public var canaries: Set<Canary> = []

        public init(cloudURL: String, owner: String?, devices: Int, duration: Double, seed: UInt64, deviceExecutable: URL,
                    directory: URL, faults: Faults = Faults()) {
            self.cloudURL = cloudURL
            self.owner = owner
            self.devices = devices
            self.duration = duration
            self.seed = seed
            self.deviceExecutable = deviceExecutable
            self.directory = directory
            self.faults = faults
        }
    }

    /// The faults of a run, by kind, and how often (relative weights; 0 leaves a kind out).
    public struct Faults: Sendable {
        /// `kill -9` of a device process (mid-write or mid-sync), restarted 0.2–2 s later.
        public var processKills = 2
        /// `pg_terminate_backend` of every session of one device.
        public var connectionKills = 3
        /// `SIGSTOP` of a device process for 0.2–1.5 s (its requests stall mid-flight), then `SIGCONT`.
        public var pauses = 1
        /// Percent of each device's steps that begin an offline spell (writes go on, no sync) of 0.3–2 s.
        public var offlinePercent = 2
        /// Seconds between two faults: at least this…
        public var minimumInterval = 0.3
        /// …at most this.
        public var maximumInterval = 1.5
        /// Further faults of the caller's (e.g. a server restart), each with its weight: the closure performs it and
        /// returns what to log. It runs on the run's own thread (see ``SoakRun/run()``) and may block it.
        public var extra: [(name: String, weight: Int, perform: @Sendable () throws -> String)] = []

        public init() {}

        /// No faults at all (a control run).
        public static var none: Faults {
            var faults = Faults()
            faults.processKills = 0
            faults.connectionKills = 0
            faults.pauses = 0
            faults.offlinePercent = 0
            return faults
        }
    }

    /// What a run did and found.
    public struct Report: Sendable {
        public var seed: UInt64
        /// Everything that happened, in order: the run's own events and each device process's log lines.
        public var log: [String]
        /// The invariants broken (empty: every one held).
        public var violations: [SoakViolation]
        /// Device processes that failed on their own (not killed by the run), with their error output.
        public var deviceFailures: [String]
        /// Faults injected, by kind.
        public var faults: [String: Int]
        /// Writes the devices' stores acknowledged.
        public var acknowledgedWrites: Int
        /// Records in the cloud at the end (tombstones included).
        public var cloudRecords: Int
        /// Heal rounds until nothing moved.
        public var healRounds: Int

        public var passed: Bool { violations.isEmpty && deviceFailures.isEmpty }
    }

    /// A device process of the run.
    /// A device process. Used by one thread at a time: the run's task, or its chaos thread while the task waits.
    private final class Device: @unchecked Sendable {
        let index: Int
        let name: String
        let store: URL
        let journal: URL
        let logFile: URL
        var generation = 0
        var process: Process?
        var killedByRun = false
        var restartAt: Double?

        init(index: Int, directory: URL) {
            self.index = index
            name = "device-\(index)"
            store = directory.appendingPathComponent(name, isDirectory: true)
            journal = directory.appendingPathComponent("\(name).journal")
            logFile = directory.appendingPathComponent("\(name).log")
        }
    }

    public let configuration: Configuration
    private let random: SeededRandomSource
    private var log: [String] = []
    private var faultCounts: [String: Int] = [:]
    private var failures: [String] = []
    private let start = ContinuousClock.now
    /// The run's start as Unix time, in seconds: the devices' log lines count from it (a soak is not deterministic;
    /// its log is for reading).
    private let origin = Date().timeIntervalSince1970

    public init(_ configuration: Configuration) {
        precondition(configuration.devices >= 1, "a soak needs at least one device")
        self.configuration = configuration
        random = SeededRandomSource(seed: configuration.seed)
    }

    private var elapsed: Double {
        let duration = ContinuousClock.now - start
        return Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    private func note(_ text: String) { log.append(String(format: "%7.2f run: ", elapsed) + text) }

    private func draw(_ bound: Int) -> Int { Int(random.next() % UInt64(max(1, bound))) }

    private func drawSeconds(_ low: Double, _ high: Double) -> Double { low + (high - low) * Double(draw(10_001)) / 10_000 }

    /// Runs the soak: workload and faults for the configured time, then healing, then every invariant.
    /// - Throws: when the run itself cannot go on (a directory cannot be made, the device executable cannot start, a
    ///   dump does not parse) — never for a broken invariant, which the report carries.
    public func run() async throws -> Report {
        let fileManager = FileManager.default
        try fileManager.createDirectory(at: configuration.directory, withIntermediateDirectories: true)
        note("seed \(configuration.seed), \(configuration.devices) device(s), \(configuration.duration) s, directory \(configuration.directory.path)")
        let devices = (0..<configuration.devices).map { Device(index: $0, directory: configuration.directory) }
        for device in devices { try launch(device) }

        // Chaos, on a thread of its own: faults must come on time even when Swift's cooperative pool (as wide as the
        // machine has cores) is busy for minutes, as it is beside a parallel test suite.
        try await Self.onThreadOfItsOwn { try self.chaos(devices) }
        note("workload over: waiting for the devices to finish")
        for device in devices {
            try await waitForExit(device, seconds: 30)
        }

        // Heal: every device syncs until up to date, round after round, until a round in which nothing was saved.
        var rounds = 0
        for round in 1...8 {
            rounds = round
            let results = try await withThrowingTaskGroup(of: (String, Int32, String).self) { group in
                for device in devices {
                    let name = device.name, store = device.store.path
                    group.addTask { [configuration] in
                        let (status, output, error) = try await Self.runDevice(configuration, ["heal", "--store", store, "--name", name,
                                                                                               "--timeout", String(configuration.healTimeout)],
                                                                               name: name)
                        return (name, status, output + error)
                    }
                }
                var results: [(String, Int32, String)] = []
                for try await result in group { results.append(result) }
                return results.sorted { $0.0 < $1.0 }
            }
            var saved = 0
            var unsettled: [String] = []
            for (name, status, output) in results {
                let text = output.trimmingCharacters(in: .whitespacesAndNewlines)
                note("heal round \(round) \(name): \(text)")
                if status != 0 { unsettled.append("\(name) did not heal: \(text)") }
                if let line = output.split(separator: "\n").last, let data = line.data(using: .utf8),
                   let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any], let count = object["saved"] as? Int {
                    saved += count
                }
            }
            // Nothing moved in a whole round: every device has read a cloud that no longer changes. A device that is
            // still not up to date then will not become so by more rounds.
            if saved == 0 && round >= 2 {
                failures += unsettled
                break
            }
            if round == 8 { failures += unsettled }
        }

        // Read back what is left and check.
        let dumps = try await withThrowingTaskGroup(of: SoakDeviceDump.self) { group in
            for device in devices {
                let name = device.name, store = device.store.path
                group.addTask { [configuration] in
                    let (status, output, error) = try await Self.runDevice(configuration, ["dump", "--store", store, "--name", name], name: name)
                    guard status == 0, let data = output.data(using: .utf8) else {
                        throw SoakFormatError(description: "\(name): dump failed: \(error)")
                    }
                    return try JSONDecoder().decode(SoakDeviceDump.self, from: data)
                }
            }
            var dumps: [SoakDeviceDump] = []
            for try await dump in group { dumps.append(dump) }
            return dumps.sorted { $0.device < $1.device }
        }
        var cloudArguments = ["cloud-dump", "--cloud", configuration.cloudURL]
        if let owner = configuration.owner { cloudArguments += ["--owner", owner] }
        let (status, output, error) = try await Self.run(configuration.deviceExecutable, cloudArguments, environment: [:])
        guard status == 0, let data = output.data(using: .utf8) else { throw SoakFormatError(description: "cloud-dump failed: \(error)") }
        let cloud = try JSONDecoder().decode(SoakCloudDump.self, from: data)
        var journal: [SoakJournalEntry] = []
        for device in devices where fileManager.fileExists(atPath: device.journal.path) {
            journal += try SoakJournalEntry.read(device.journal)
        }
        let outcome = SoakOutcome(journal: journal, devices: dumps, cloud: cloud)
        let violations = try outcome.check()
        note("checked: \(violations.isEmpty ? "every invariant held" : "\(violations.count) violation(s)")")
        for violation in violations.prefix(20) { note("  \(violation)") }

        // The devices' own log lines, merged by time.
        var lines = log
        for device in devices {
            let text = (try? String(contentsOf: device.logFile, encoding: .utf8)) ?? ""
            lines += text.split(separator: "\n").map { String($0) }
        }
        let merged = lines.sorted { (Double($0.split(separator: " ").first ?? "") ?? 0) < (Double($1.split(separator: " ").first ?? "") ?? 0) }
        return Report(seed: configuration.seed, log: merged, violations: violations, deviceFailures: failures, faults: faultCounts,
                      acknowledgedWrites: journal.filter { $0.phase == .ack }.count, cloudRecords: cloud.records.count,
                      healRounds: rounds)
    }

    // MARK: Faults

    /// Faults at random intervals until the time is up; killed devices come back after a while. Blocks its thread.
    private func chaos(_ devices: [Device]) throws {
        var nextFault = drawSeconds(configuration.faults.minimumInterval, configuration.faults.maximumInterval)
        while elapsed < configuration.duration {
            Thread.sleep(forTimeInterval: 0.05)
            for device in devices {
                if let at = device.restartAt, elapsed >= at {
                    device.restartAt = nil
                    if configuration.duration - elapsed > 0.5 { try launch(device) }
                }
                try reap(device)
            }
            if elapsed >= nextFault {
                try injectFault(devices)
                nextFault = elapsed + drawSeconds(configuration.faults.minimumInterval, configuration.faults.maximumInterval)
            }
        }
    }

    /// Runs `body` on a new thread and waits for it without holding a thread of the cooperative pool.
    private static func onThreadOfItsOwn(_ body: @escaping @Sendable () throws -> Void) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let thread = Thread {
                do {
                    try body()
                    continuation.resume()
                } catch {
                    continuation.resume(throwing: error)
                }
            }
            thread.name = "soak chaos"
            thread.start()
        }
    }

    private func injectFault(_ devices: [Device]) throws {
        let faults = configuration.faults
        var kinds: [(String, Int)] = [("kill", faults.processKills), ("disconnect", faults.connectionKills), ("pause", faults.pauses)]
        kinds += faults.extra.map { ($0.name, $0.weight) }
        let total = kinds.reduce(0) { $0 + max(0, $1.1) }
        guard total > 0 else { return }
        var roll = draw(total)
        var kind = kinds[0].0
        for (name, weight) in kinds where weight > 0 {
            if roll < weight { kind = name; break }
            roll -= weight
        }
        let running = devices.filter { $0.process?.isRunning == true }
        switch kind {
        case "kill", "disconnect", "pause":
            guard !running.isEmpty else { return }
            let device = running[draw(running.count)]
            guard let process = device.process else { return }
            faultCounts[kind, default: 0] += 1
            if kind == "kill" {
                device.killedByRun = true
                kill(process.processIdentifier, SIGKILL)
                device.restartAt = elapsed + drawSeconds(0.2, 2)
                note("kill -9 \(device.name) (generation \(device.generation)); restart at \(String(format: "%.2f", device.restartAt!))")
            } else if kind == "disconnect" {
                let (_, output, error) = try Self.runBlocking(configuration.deviceExecutable,
                                                              ["terminate", "--cloud", configuration.cloudURL, "--application", Self.applicationName(device.name)],
                                                              environment: [:])
                note("terminate the sessions of \(device.name): \((output + error).trimmingCharacters(in: .whitespacesAndNewlines))")
            } else {
                let seconds = drawSeconds(0.2, 1.5)
                kill(process.processIdentifier, SIGSTOP)
                note("SIGSTOP \(device.name) for \(String(format: "%.2f", seconds)) s")
                Thread.sleep(forTimeInterval: seconds)
                kill(process.processIdentifier, SIGCONT)
                note("SIGCONT \(device.name)")
            }
        default:
            guard let fault = faults.extra.first(where: { $0.name == kind }) else { return }
            faultCounts[kind, default: 0] += 1
            note("\(kind): begin")
            let outcome = try fault.perform()
            note("\(kind): \(outcome)")
        }
    }

    // MARK: Processes

    static func applicationName(_ device: String) -> String { "replica-device-\(device)" }

    private func launch(_ device: Device) throws {
        let process = Process()
        process.executableURL = configuration.deviceExecutable
        let remaining = max(0.5, configuration.duration - elapsed)
        var arguments = ["run", "--store", device.store.path, "--cloud", configuration.cloudURL, "--name", device.name,
                         "--journal", device.journal.path, "--seed", String(configuration.seed &+ UInt64(device.index) &* 7_919 &+ UInt64(device.generation) &* 104_729),
                         "--generation", String(device.generation), "--duration", String(format: "%.2f", remaining),
                         "--offline-percent", String(configuration.faults.offlinePercent),
                         // Each line a device logs starts with the seconds since this instant: the run's clock.
                         "--origin", String(format: "%.3f", origin)]
        if !configuration.canaries.isEmpty { arguments += ["--canary", configuration.canaries.map(\.rawValue).sorted().joined(separator: ",")] }
        if let owner = configuration.owner { arguments += ["--owner", owner] }
        process.arguments = arguments
        process.environment = Self.environment(device: device.name)
        if !FileManager.default.fileExists(atPath: device.logFile.path) {
            _ = FileManager.default.createFile(atPath: device.logFile.path, contents: nil)
        }
        let output = try FileHandle(forWritingTo: device.logFile)
        try output.seekToEnd()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        device.process = process
        device.killedByRun = false
        note("start \(device.name) (generation \(device.generation), pid \(process.processIdentifier))")
        device.generation += 1
    }

    /// Notes a device process that ended on its own with a failure.
    private func reap(_ device: Device) throws {
        guard let process = device.process, !process.isRunning else { return }
        device.process = nil
        if device.killedByRun { return }
        if process.terminationStatus != 0 || process.terminationReason != .exit {
            let tail = ((try? String(contentsOf: device.logFile, encoding: .utf8)) ?? "").split(separator: "\n").suffix(5).joined(separator: " | ")
            failures.append("\(device.name) exited with status \(process.terminationStatus): \(tail)")
            note("\(device.name) failed on its own (status \(process.terminationStatus))")
        }
    }

    private func waitForExit(_ device: Device, seconds: Double) async throws {
        let deadline = elapsed + seconds
        while let process = device.process, process.isRunning, elapsed < deadline {
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        if let process = device.process, process.isRunning {
            note("\(device.name) did not finish: SIGKILL")
            device.killedByRun = true
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try reap(device)
    }

    private static func environment(device: String) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["PGAPPNAME"] = applicationName(device)
        return environment
    }

    /// Runs `replica-device` with `arguments` plus the cloud and owner, as device `name`.
    static func runDevice(_ configuration: Configuration, _ arguments: [String], name: String) async throws -> (Int32, String, String) {
        var all = arguments + ["--cloud", configuration.cloudURL]
        if let owner = configuration.owner { all += ["--owner", owner] }
        if !configuration.canaries.isEmpty { all += ["--canary", configuration.canaries.map(\.rawValue).sorted().joined(separator: ",")] }
        return try await run(configuration.deviceExecutable, all, environment: environment(device: name))
    }

    /// ``run(_:_:environment:)`` blocking the calling thread (the chaos thread's).
    static func runBlocking(_ executable: URL, _ arguments: [String], environment: [String: String]) throws -> (Int32, String, String) {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        if !environment.isEmpty { process.environment = environment }
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        try process.run()
        let collected = Mutex<(Data, Data)>((Data(), Data()))
        let group = DispatchGroup()
        for (pipe, isOutput) in [(output, true), (error, false)] {
            group.enter()
            DispatchQueue.global().async {
                let data = pipe.fileHandleForReading.readDataToEndOfFile()
                collected.withLock { if isOutput { $0.0 = data } else { $0.1 = data } }
                group.leave()
            }
        }
        group.wait()
        process.waitUntilExit()
        let (out, err) = collected.withLock { $0 }
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }

    /// Runs `executable` to its end; returns its exit status, standard output and standard error.
    /// - Parameter environment: the child's whole environment; empty: this process's.
    public static func run(_ executable: URL, _ arguments: [String], environment: [String: String]) async throws -> (Int32, String, String) {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        if !environment.isEmpty { process.environment = environment }
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        try process.run()
        // Read both pipes to their ends on other threads (a full pipe would stall the child).
        let collected = Mutex<(Data, Data)>((Data(), Data()))
        let group = DispatchGroup()
        for (pipe, isOutput) in [(output, true), (error, false)] {
            group.enter()
            DispatchQueue.global().async {
                let data = pipe.fileHandleForReading.readDataToEndOfFile()
                collected.withLock { if isOutput { $0.0 = data } else { $0.1 = data } }
                group.leave()
            }
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            group.notify(queue: .global()) { continuation.resume() }
        }
        process.waitUntilExit()
        let (out, err) = collected.withLock { $0 }
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }
}
