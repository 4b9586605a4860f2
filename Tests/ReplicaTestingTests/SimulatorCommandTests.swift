import Foundation
import Testing

/// Runs the `replica-sim` executable (built beside the test bundle) and returns its exit code and output.
private func replicaSim(_ arguments: [String]) throws -> (code: Int32, stdout: String, stderr: String) {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<3 where !FileManager.default.fileExists(atPath: directory.appendingPathComponent("replica-sim").path) {
        directory = directory.deletingLastPathComponent()
    }
    let process = Process()
    process.executableURL = directory.appendingPathComponent("replica-sim")
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let stdout = out.fileHandleForReading.readDataToEndOfFile()
    let stderr = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
}

/// The last line of `text`, parsed as a JSON object.
private func lastJSON(_ text: String) throws -> [String: Any] {
    let line = try #require(text.split(separator: "\n").last)
    return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
}

private func temporaryFile(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("replica-sim-test-\(ProcessInfo.processInfo.processIdentifier)-\(name)").path
}

@Suite("replica-sim command")
struct SimulatorCommandTests {
    @Test("run: verdict as the last JSON line, exit 0, trace written; replay is identical")
    func runAndReplay() throws {
        let trace = temporaryFile("run.ndjson")
        let run = try replicaSim(["run", "--scenario", "trips", "--seed", "4", "--steps", "25", "--trace", trace])
        #expect(run.code == 0, "\(run.stdout)\(run.stderr)")
        let verdict = try lastJSON(run.stdout)
        #expect(verdict["scenario"] as? String == "trips")
        #expect(verdict["seed"] as? Int == 4)
        #expect(verdict["steps"] as? Int == 25)
        #expect(verdict["verdict"] as? String == "pass")
        #expect(verdict["invariant"] is NSNull)
        let digest = try #require(verdict["trace_digest"] as? String)
        #expect(digest.count == 64)

        let replay = try replicaSim(["replay", trace])
        #expect(replay.code == 0, "\(replay.stdout)")
        let replayed = try lastJSON(replay.stdout)
        #expect(replayed["trace_digest"] as? String == digest)
        #expect(replayed["deterministic"] as? Bool == true)

        // A trace edited by hand no longer matches: nondeterminism, exit 3, the line named.
        var lines = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n").map(String.init)
        lines[3] = lines[3].replacingOccurrences(of: "\"t\":", with: "\"t\": ")
        try (lines.joined(separator: "\n") + "\n").write(toFile: trace, atomically: true, encoding: .utf8)
        let diverged = try replicaSim(["replay", trace])
        #expect(diverged.code == 3)
        #expect(try lastJSON(diverged.stdout)["divergent_line"] as? Int == 4)
    }

    @Test("a canary run fails with exit 1 and names the invariant; shrink writes a smaller failing trace")
    func canaryAndShrink() throws {
        let trace = temporaryFile("canary.ndjson")
        let shrunk = temporaryFile("canary-shrunk.ndjson")
        var failing: (seed: Int, output: String)?
        for seed in 0..<30 where failing == nil {
            let run = try replicaSim(["run", "--scenario", "trips", "--seed", "\(seed)", "--steps", "30", "--canary", "child-tombstones-forgotten",
                                      "--trace", trace])
            if run.code == 1 { failing = (seed, run.stdout) } else { #expect(run.code == 0) }
        }
        let failure = try #require(failing)
        let verdict = try lastJSON(failure.output)
        #expect(verdict["verdict"] as? String == "fail")
        let invariant = try #require(verdict["invariant"] as? String)
        let shrink = try replicaSim(["shrink", trace, "-o", shrunk, "--budget", "60"])
        #expect(shrink.code == 1)
        let after = try lastJSON(shrink.stdout)
        #expect(after["invariant"] as? String == invariant)
        #expect((after["steps"] as? Int ?? 99) <= (verdict["steps"] as? Int ?? 0))
        #expect(try replicaSim(["replay", shrunk]).code == 1)
    }

    @Test("a malformed scenario exits 2 naming the file and the field")
    func badScenario() throws {
        let path = temporaryFile("bad.json")
        try #"{"schema": "trips", "stores": [{"name": "t", "kind": "synced", "entities": ["Trip", "BucketListItem", "Accommodation"]}], "devices": [{"name": "a", "stores": ["nope"]}], "steps": 3}"#
            .write(toFile: path, atomically: true, encoding: .utf8)
        let run = try replicaSim(["run", "--scenario", path, "--seed", "1"])
        #expect(run.code == 2)
        #expect(run.stderr.contains("\(path): field 'devices[0].stores[0]': no store 'nope'"), "\(run.stderr)")
        #expect(try replicaSim(["run", "--scenario", "trips"]).code == 2)
        #expect(try replicaSim(["frobnicate"]).code == 2)
        #expect(try replicaSim(["run", "--scenario", "trips", "--seed", "1", "--canary", "no-such-bug"]).code == 2)
    }

    @Test("list --json: one object with arrays scenarios and canaries")
    func list() throws {
        let list = try replicaSim(["list", "--json"])
        #expect(list.code == 0)
        let object = try lastJSON(list.stdout)
        let scenarios = try #require(object["scenarios"] as? [[String: Any]])
        let canaries = try #require(object["canaries"] as? [[String: Any]])
        #expect(scenarios.count >= 5)
        #expect(canaries.count >= 8)
        #expect(scenarios.contains { $0["name"] as? String == "trips" })
        #expect(canaries.contains { $0["name"] as? String == "lww-by-wall-clock" })
    }

    @Test("explore: a summary table and a last JSON line with seeds")
    func explore() throws {
        let run = try replicaSim(["explore", "--scenario", "people-unique", "--seeds", "2", "--steps", "20", "--jobs", "1", "--no-save"])
        #expect(run.code == 0, "\(run.stdout)")
        #expect(run.stdout.contains("people-unique"))
        #expect(run.stdout.contains("ops/s/core"))
        let verdict = try lastJSON(run.stdout)
        #expect(verdict["seeds"] as? Int == 2)
        #expect(verdict["verdict"] as? String == "pass")
        #expect(verdict["invariant"] is NSNull)
    }

    /// A trace of a short passing run whose header's `scenario_json` is changed by `edit`.
    private func traceWithHeader(_ name: String, _ edit: (inout [String: Any]) -> Void) throws -> String {
        let trace = temporaryFile("\(name).ndjson")
        let run = try replicaSim(["run", "--scenario", "trips", "--seed", "1", "--steps", "3", "--trace", trace])
        #expect(run.code == 0, "\(run.stdout)\(run.stderr)")
        var lines = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n").map(String.init)
        var header = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        edit(&header)
        lines[0] = String(decoding: try JSONSerialization.data(withJSONObject: header, options: [.sortedKeys]), as: UTF8.self)
        try (lines.joined(separator: "\n") + "\n").write(toFile: trace, atomically: true, encoding: .utf8)
        return trace
    }

    /// Applies `edit` to the header's scenario object.
    private func editScenario(_ edit: @escaping (inout [String: Any]) -> Void) -> (inout [String: Any]) -> Void {
        { header in
            var scenario = header["scenario_json"] as? [String: Any] ?? [:]
            edit(&scenario)
            header["scenario_json"] = scenario
        }
    }

    @Test("replay and shrink check a trace header's scenario as a scenario file is checked: exit 2 naming the field", arguments: [
        ("no-devices", "scenario_json.devices", "must not be empty"),
        ("unknown-store", "scenario_json.devices[0].stores[0]", "no store 'nowhere'"),
        ("schema-version-zero", "scenario_json.devices[1].schemaVersion", "out of range"),
        ("negative-rate", "scenario_json.faults.crash", "out of range"),
        ("negative-weight", "scenario_json.workload.delete", "out of range"),
        ("digest-every-zero", "scenario_json.timing.digestEvery", "out of range"),
        ("scenario-as-string", "scenario_json", "expected an object, found a string"),
        ("missing-field", "scenario_json.timing", "missing"),
    ])
    func malformedHeaderScenario(name: String, field: String, problem: String) throws {
        let edit: (inout [String: Any]) -> Void
        switch name {
        case "no-devices": edit = editScenario { $0["devices"] = [Any]() }
        case "unknown-store": edit = editScenario { scenario in
            var devices = scenario["devices"] as! [[String: Any]]
            devices[0]["stores"] = ["nowhere"]
            scenario["devices"] = devices
        }
        case "schema-version-zero": edit = editScenario { scenario in
            var devices = scenario["devices"] as! [[String: Any]]
            devices[1]["schemaVersion"] = 0
            scenario["devices"] = devices
        }
        case "negative-rate": edit = editScenario { scenario in
            var faults = scenario["faults"] as! [String: Any]
            faults["crash"] = -0.5
            scenario["faults"] = faults
        }
        case "negative-weight": edit = editScenario { scenario in
            var workload = scenario["workload"] as! [String: Any]
            workload["delete"] = -3
            scenario["workload"] = workload
        }
        case "digest-every-zero": edit = editScenario { scenario in
            var timing = scenario["timing"] as! [String: Any]
            timing["digestEvery"] = 0
            scenario["timing"] = timing
        }
        case "missing-field": edit = editScenario { $0["timing"] = nil }
        default: edit = { $0["scenario_json"] = "trips" }
        }
        let trace = try traceWithHeader("header-\(name)", edit)
        for command in [["replay", trace], ["shrink", trace, "-o", temporaryFile("header-\(name)-out.ndjson")]] {
            let result = try replicaSim(command)
            #expect(result.code == 2, "\(command[0]) \(name): exit \(result.code)\n\(result.stdout)\(result.stderr)")
            #expect(result.stderr.contains("\(trace): field '\(field)': "), "\(command[0]) \(name): \(result.stderr)")
            #expect(result.stderr.contains(problem), "\(command[0]) \(name): \(result.stderr)")
        }
    }
}
