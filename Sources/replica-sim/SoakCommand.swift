// replica-sim soak: real device processes against a real PostgreSQL cloud (ReplicaTesting's SoakRun).

import Foundation
import Replica
import ReplicaTesting
import Synchronization

let soakUsage = """
      soak     --cloud URL [--owner NAME] [--devices N] [--duration SECONDS] [--seed S] [--directory DIR]
               [--device PATH] [--no-faults] [--log FILE] [--canary NAME]
               N device processes (replica-device, built beside replica-sim) write, sync and suffer faults (kill -9 and
               restarts, killed connections, SIGSTOP pauses, offline spells) against the PostgreSQL cloud URL (schema
               installed: replica-cloud init) for SECONDS, then heal, then check convergence, no lost acknowledged
               write, no resurrection, unique keys, referential integrity and no plaintext of encrypted fields in the
               cloud. Not deterministic: prints its seed and a log of what it did (also to FILE)
    """

/// The `replica-device` executable beside this one, or the one `--device` names.
func deviceExecutable(_ given: String?) throws -> URL {
    if let given { return URL(fileURLWithPath: given) }
    let own = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    let beside = own.deletingLastPathComponent().appendingPathComponent("replica-device")
    guard FileManager.default.isExecutableFile(atPath: beside.path) else {
        throw UsageError(message: "no replica-device beside replica-sim (build it: swift build --product replica-device), or give --device PATH")
    }
    return beside
}

func soakCommand(_ arguments: Arguments) throws -> ExitCode {
    guard let url = arguments.value("--cloud") ?? ProcessInfo.processInfo.environment["REPLICA_CLOUD_URL"] else {
        throw UsageError(message: "soak needs --cloud URL (or REPLICA_CLOUD_URL)")
    }
    let devices = try arguments.integer("--devices", in: 1...64) ?? 3
    let durationText = arguments.value("--duration") ?? "20"
    guard let duration = Double(durationText), duration > 0, duration <= 86_400 else {
        throw UsageError(message: "--duration needs seconds in (0, 86400], not '\(durationText)'")
    }
    // Not a simulation: the seed only picks the workload and the faults; drawn from the OS when not given.
    let seed = try arguments.seed("--seed") ?? SodiumRandomSource().next() % 1_000_000
    let owner = arguments.value("--owner") ?? "soak-\(seed)"
    let directory = URL(fileURLWithPath: arguments.value("--directory")
        ?? FileManager.default.temporaryDirectory.appendingPathComponent("replica-soak-\(seed)-\(ProcessInfo.processInfo.processIdentifier)").path)
    var configuration = SoakRun.Configuration(cloudURL: url, owner: owner, devices: devices, duration: duration, seed: seed,
                                              deviceExecutable: try deviceExecutable(arguments.value("--device")), directory: directory,
                                              faults: arguments.flags.contains("--no-faults") ? .none : SoakRun.Faults())
    configuration.healTimeout = max(60, duration)
    configuration.canaries = try canaryOptions(arguments)
    emit("soak: seed \(seed), \(devices) device(s), \(durationText) s, owner \(owner), under \(directory.path)")

    let outcome = Mutex<Result<SoakRun.Report, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let run = SoakRun(configuration)
    Task {
        do {
            let report = try await run.run()
            outcome.withLock { $0 = .success(report) }
        } catch {
            outcome.withLock { $0 = .failure(error) }
        }
        done.signal()
    }
    done.wait()
    let report = try outcome.withLock { $0! }.get()
    for line in report.log { emit(line) }
    if let logPath = arguments.value("--log") {
        try (report.log.joined(separator: "\n") + "\n").write(toFile: logPath, atomically: true, encoding: .utf8)
    }
    for failure in report.deviceFailures { emit("FAIL device: \(failure)") }
    for violation in report.violations { emit("FAIL \(violation)") }
    var line = JSONLine()
    line.add("command", "soak")
    line.addRaw("seed", String(seed))
    line.add("devices", devices)
    line.add("duration", durationText)
    line.add("verdict", report.passed ? "pass" : "fail")
    line.add("violations", report.violations.count)
    line.add("device_failures", report.deviceFailures.count)
    line.add("acknowledged_writes", report.acknowledgedWrites)
    line.add("cloud_records", report.cloudRecords)
    line.add("heal_rounds", report.healRounds)
    for (kind, count) in report.faults.sorted(by: { $0.key < $1.key }) { line.add("faults_\(kind)", count) }
    emit(line.string)
    return report.passed ? .pass : .fail
}
