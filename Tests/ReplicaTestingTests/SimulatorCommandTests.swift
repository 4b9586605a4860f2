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
}
