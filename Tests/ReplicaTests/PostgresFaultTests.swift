import Foundation
import Synchronization
import Testing
@testable import Replica
@testable import ReplicaPostgres
import ReplicaTesting

/// An executable of the package, built beside the test bundle (`swift test` builds the test target's dependencies).
func packageExecutable(_ name: String) -> URL {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent(name).path) {
        directory = directory.deletingLastPathComponent()
    }
    return directory.appendingPathComponent(name)
}

/// A directory of its own under the system temporary directory, for a soak's stores, journals and logs.
func soakDirectory(_ label: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("replica-\(label)-\(UUID().uuidString.prefix(8))", isDirectory: true)
}

/// Fails the test with the soak's findings and the end of its log.
func expectPassed(_ report: SoakRun.Report, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(report.passed, """
        soak seed \(report.seed): \(report.violations.prefix(10).map(\.description).joined(separator: "; "))
        \(report.deviceFailures.joined(separator: "; "))
        log (end): \(report.log.suffix(40).joined(separator: "\n"))
        """, sourceLocation: sourceLocation)
    #expect(report.acknowledgedWrites > 50, "the devices wrote too little to show anything", sourceLocation: sourceLocation)
}

/// Faults on a real server, with real OS processes as devices (`replica-device`): after healing every device holds
/// the same data as the cloud, no write a device's store acknowledged is missing, nothing is resurrected
/// (`SoakOutcome.check()`, the simulator's invariants over real stores).
@Suite("PostgreSQL faults with device processes", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresFaultTests {
    /// A soak of `devices` processes for `seconds` on `url` with only `faults`.
    static func soak(_ label: String, url: String, owner: String?, devices: Int, seconds: Double, seed: UInt64,
                     faults: SoakRun.Faults) async throws -> SoakRun.Report {
        let configuration = SoakRun.Configuration(cloudURL: url, owner: owner, devices: devices, duration: seconds, seed: seed,
                                                  deviceExecutable: packageExecutable("replica-device"),
                                                  directory: soakDirectory(label), faults: faults)
        let report = try await SoakRun(configuration).run()
        try? FileManager.default.removeItem(at: configuration.directory)
        return report
    }

    /// Whether some device logged a failed request of one of `kinds` (the fault was felt mid-request).
    static func felt(_ report: SoakRun.Report, _ kinds: [String]) -> Bool {
        report.log.contains { line in line.contains(" sync: ") && kinds.contains { line.contains($0) } }
    }

    @Test("the server crash-restarts (pg_ctl restart -m immediate) in the middle of uploads and fetches: devices converge, no acknowledged write is lost")
    func serverRestarts() async throws {
        // A server of this test's own: the restarts would break every other test's connections.
        let cluster = try PostgresCluster.start(durable: true)
        try cluster.makeCloudDatabase()
        var faults = SoakRun.Faults.none
        faults.minimumInterval = 1.5
        faults.maximumInterval = 2.5
        faults.extra = [(name: "restart", weight: 1, perform: { @Sendable in
            try cluster.restart()
            return "the server is back"
        })]
        let report = try await Self.soak("restarts", url: cluster.connectionString(database: "replica_cloud", role: "backend"),
                                         owner: "restarted", devices: 3, seconds: 9, seed: 11, faults: faults)
        withExtendedLifetime(cluster) {}
        expectPassed(report)
        #expect(report.faults["restart", default: 0] >= 3)
        #expect(Self.felt(report, ["network unavailable", "service unavailable"]), "no request was caught by a restart")
    }

    @Test("every session of a device is terminated (pg_terminate_backend) again and again mid-sync: devices converge, nothing is lost")
    func connectionsTerminated() async throws {
        let server = try PostgresTestServer.get()
        // The sessions are ended from this process (milliseconds), each fault the next device in turn: a
        // `replica-device terminate` process per fault takes seconds on a loaded machine, and then too few faults
        // land inside the soak, or only after it.
        let terminator = Mutex((next: 0, terminated: 0))
        var faults = SoakRun.Faults.none
        faults.minimumInterval = 0.15
        faults.maximumInterval = 0.5
        faults.extra = [(name: "terminate", weight: 1, perform: { @Sendable in
            try terminator.withLock { state in
                let device = "device-\(state.next % 3)"
                state.next += 1
                let count = try server.rawConnection(role: PostgresTestServer.appRole).integer("""
                    SELECT pg_catalog.count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity
                    WHERE application_name = $1 AND pid <> pg_catalog.pg_backend_pid()
                    """, [.text("replica-device-\(device)")]) ?? 0
                state.terminated += Int(count)
                return "terminated \(count) session(s) of \(device)"
            }
        })]
        let report = try await Self.soak("disconnects", url: server.connectionString(role: PostgresTestServer.appRole),
                                         owner: "disconnected-\(UUID().uuidString.prefix(8))", devices: 3, seconds: 7, seed: 12,
                                         faults: faults)
        expectPassed(report)
        let terminated = terminator.withLock { $0.terminated }
        // Sessions really ended (the pool reconnects a session dropped while idle without an error, so a device
        // feels only those ended mid-request; the invariants above are what must hold either way).
        #expect(terminated >= 4, "\(report.log.filter { $0.contains("terminate") }.prefix(4))")
    }

    @Test("device processes are killed with SIGKILL mid-write and mid-sync and restarted: devices converge, nothing acknowledged is lost")
    func devicesKilled() async throws {
        let server = try PostgresTestServer.get()
        var faults = SoakRun.Faults.none
        faults.processKills = 1
        faults.minimumInterval = 0.4
        faults.maximumInterval = 1.0
        let report = try await Self.soak("kills", url: server.connectionString(role: PostgresTestServer.appRole),
                                         owner: "killed-\(UUID().uuidString.prefix(8))", devices: 3, seconds: 7, seed: 13, faults: faults)
        expectPassed(report)
        #expect(report.faults["kill", default: 0] >= 3)
        // Killed processes came back (as later generations, writing values of their own).
        #expect(report.log.contains { $0.contains("run: start device-") && $0.contains("(generation 1,") },
                "\(report.log.filter { $0.contains("start") || $0.contains("kill") })")
    }

    @Test("replica-sim soak: 3 device processes for 20 s with every kind of fault; it reports its seed and log, and every invariant holds")
    func soakCommand() async throws {
        let server = try PostgresTestServer.get()
        let log = soakDirectory("soak-log").appendingPathExtension("txt")
        defer { try? FileManager.default.removeItem(at: log) }
        let directory = soakDirectory("soak")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (status, output, error) = try await SoakRun.run(packageExecutable("replica-sim"), [
            "soak", "--cloud", server.connectionString(role: PostgresTestServer.appRole), "--owner", "soak-\(UUID().uuidString.prefix(8))",
            "--devices", "3", "--duration", "20", "--seed", "21", "--directory", directory.path, "--log", log.path,
        ], environment: [:])
        let last = output.split(separator: "\n").last.map(String.init) ?? ""
        #expect(status == 0, "\(output.suffix(4_000))\n\(error)")
        #expect(output.hasPrefix("soak: seed 21, 3 device(s), 20 s"))
        #expect(last.contains("\"verdict\":\"pass\""), "\(last)")
        #expect(last.contains("\"seed\":21"))
        // The log tells what happened: faults of every kind, restarted generations, heal rounds.
        let text = try String(contentsOf: log, encoding: .utf8)
        for event in ["kill -9", "terminate the sessions", "SIGSTOP", "offline for", "heal round 1", "checked: every invariant held"] {
            #expect(text.contains(event), "the log lacks '\(event)'")
        }
    }

    @Test("the check bites: devices whose engine uploads encrypted fields in plaintext fail the soak's no-plaintext invariant")
    func plantedPlaintextIsCaught() async throws {
        let server = try PostgresTestServer.get()
        var configuration = SoakRun.Configuration(cloudURL: server.connectionString(role: PostgresTestServer.appRole),
                                                  owner: "planted-\(UUID().uuidString.prefix(8))", devices: 2, duration: 2, seed: 14,
                                                  deviceExecutable: packageExecutable("replica-device"),
                                                  directory: soakDirectory("planted"), faults: .none)
        configuration.canaries = [.plaintextUploaded]
        configuration.healTimeout = 5
        let report = try await SoakRun(configuration).run()
        try? FileManager.default.removeItem(at: configuration.directory)
        #expect(report.violations.contains { $0.invariant == .noPlaintext }, "\(report.violations)")
    }
}
