import Foundation
import Replica
import ReplicaTesting
import Synchronization
import Testing

/// How many seeds the "every built-in scenario passes" test runs: `REPLICA_SIM_SEEDS` (e.g. 1000), default 20.
private let seedsPerScenario = Int(ProcessInfo.processInfo.environment["REPLICA_SIM_SEEDS"] ?? "") ?? 20

/// Built-in scenarios whose seeds cost more in a debug build, with the seeds the sweep runs of each unless
/// `REPLICA_SIM_SEEDS` is set: a `large-files` seed moves tens of megabytes of assets (about 3 s of CPU in debug, 1 s in
/// release); `replica-sim explore` covers it in release (Simulations/README.md).
private let seedCaps = ["large-files": 5]

private func seeds(of name: String) -> Int {
    ProcessInfo.processInfo.environment["REPLICA_SIM_SEEDS"] == nil ? min(seedsPerScenario, seedCaps[name] ?? seedsPerScenario) : seedsPerScenario
}

private func builtInScenarios() throws -> [Scenario] { try ScenarioCatalog.builtIn() }

private func scenario(_ name: String) throws -> Scenario { try ScenarioCatalog.resolve(name) }

private func simulationsDirectory() throws -> URL { try #require(ScenarioCatalog.directory()) }

@Suite("Simulator: scenarios")
struct SimulationScenarioTests {
    @Test("at least five built-in scenarios cover every seed schema and every store kind")
    func builtInCoverage() throws {
        let scenarios = try builtInScenarios()
        #expect(scenarios.count >= 5)
        let seeds = Set(scenarios.flatMap(\.schemaSeeds))
        #expect(seeds.isSuperset(of: ["trips", "people", "notes", "posts", "drafts"]))
        let kinds = Set(scenarios.flatMap { $0.stores.map(\.kind) })
        #expect(kinds == Set(Scenario.StoreKind.allCases))
        #expect(scenarios.contains { $0.storage == .file })
        #expect(scenarios.contains { scenario in scenario.devices.contains { $0.schemaVersion < scenario.schema.version } })
        // Names are unique and equal the file names.
        #expect(Set(scenarios.map(\.name)).count == scenarios.count)
        for path in ScenarioCatalog.builtInPaths() {
            let name = ((path as NSString).lastPathComponent as NSString).deletingPathExtension
            #expect(try Scenario.load(path: path).name == name)
        }
    }

    @Test("a malformed scenario is reported with the file, the field and the problem", arguments: [
        (#"{"schema": "trips", "stores": [], "devices": [], "steps": 1}"#, "stores", "must not be empty"),
        (#"{"schema": "tripz", "stores": [], "devices": [], "steps": 1}"#, "schema", "unknown seed schema 'tripz'"),
        (#"{"schema": "trips", "stores": [{"name": "t", "kind": "synced", "entities": ["Trip", "BucketListItem", "Accommodation"]}], "devices": [{"name": "a", "stores": ["x"]}], "steps": 1}"#,
         "devices[0].stores[0]", "no store 'x'"),
        (#"{"schema": "trips", "stores": [{"name": "t", "kind": "cloudy", "entities": ["Trip"]}], "devices": [{"name": "a"}], "steps": 1}"#,
         "stores[0].kind", "not one of"),
        (#"{"schema": "trips", "stores": [{"name": "t", "kind": "synced", "entities": ["Trip"]}], "devices": [{"name": "a"}], "steps": 1}"#,
         "stores[0].entities", "not in store 't'"),
        (#"{"schema": "people", "stores": [{"name": "p", "kind": "local", "entities": ["Person", "Address"]}], "devices": [{"name": "a"}], "steps": 0}"#,
         "steps", "out of range"),
        (#"{"schema": "people", "stores": [{"name": "p", "kind": "local", "entities": ["Person", "Address"]}], "devices": [{"name": "a"}], "steps": 5, "faults": {"crash": 2}}"#,
         "faults.crash", "out of range"),
        (#"{"schema": "people", "stores": [{"name": "p", "kind": "local", "entities": ["Person", "Address"]}], "devices": [{"name": "a"}], "steps": 5, "fautls": {}}"#,
         "fautls", "unknown field"),
        (#"{"schema": "people", "stores": [{"name": "p", "kind": "local", "entities": ["Person", "Address"]}], "devices": [{"name": "a", "schemaVersion": 3}], "steps": 5}"#,
         "devices[0].schemaVersion", "out of range"),
        (#"{"schema": {"entities": [{"name": "A", "attributes": [{"name": "x", "type": "strng"}]}]}, "stores": [], "devices": [], "steps": 1}"#,
         "schema.entities[0].attributes[0].type", "'strng' is not one of"),
        (#"{"schema": {"entities": [{"name": "A", "attributes": [{"name": "x", "type": "string"}]}]}, "stores": [{"name": "s", "kind": "synced", "entities": ["A"]}], "devices": [{"name": "d"}], "steps": 1}"#,
         "stores[0].entities[0]", "must be optional or have a default"),
        (#"{"schema": "people", "stores": [{"name": "p", "kind": "local", "entities": ["Person", "Address"]}], "devices": [{"name": "a"}], "steps": 5, "workload": {"largeAssetPercent": 101}}"#,
         "workload.largeAssetPercent", "out of range"),
        (#"{"schema": "trips", "steps": 1,"#, "(file)", "not valid JSON"),
    ])
    func malformed(json: String, field: String, problem: String) throws {
        do {
            _ = try Scenario.parse(Data(json.utf8), file: "Simulations/bad.json")
            Issue.record("accepted a malformed scenario")
        } catch {
            #expect(error.file == "Simulations/bad.json")
            #expect(error.field == field)
            #expect(error.problem.contains(problem), "\(error.problem)")
            #expect(error.description.hasPrefix("Simulations/bad.json: field '\(field)': "))
        }
    }

    @Test("an inline schema with versions gives older devices the older schema")
    func inlineSchema() throws {
        let json = #"""
        {"schema": {"version": 2, "entities": [
            {"name": "Box", "attributes": [{"name": "label", "type": "string", "default": ""},
                                           {"name": "weight", "type": "double", "optional": true, "since": 2}],
             "relationships": [{"name": "items", "destination": "Item", "inverse": "box", "toMany": true, "deleteRule": "cascade"}]},
            {"name": "Item", "attributes": [{"name": "name", "type": "string", "default": "", "options": ["unique"]}],
             "relationships": [{"name": "box", "destination": "Box", "inverse": "items"}]}]},
         "stores": [{"name": "boxes", "kind": "synced", "entities": ["Box", "Item"]}],
         "devices": [{"name": "old", "schemaVersion": 1}, {"name": "new"}],
         "steps": 30}
        """#
        let parsed = try Scenario.parse(Data(json.utf8), file: "inline.json", defaultName: "inline")
        #expect(parsed.name == "inline")
        #expect(parsed.schema.schema(version: 1).entity(named: "Box")?.attribute(named: "weight") == nil)
        #expect(parsed.schema.schema(version: 2).entity(named: "Box")?.attribute(named: "weight") != nil)
        let result = try Simulator.run(parsed, seed: 3, options: SimulationOptions(recordsTrace: false))
        #expect(result.violation == nil, "\(result.violation?.description ?? "")")
    }
}

@Suite("Simulator: determinism and traces")
struct SimulationTraceTests {
    @Test("the same seed gives byte-identical traces, for every built-in scenario", arguments: try builtInScenarios().map(\.name))
    func sameSeedSameTrace(name: String) throws {
        let scenario = try scenario(name)
        let first = try Simulator.run(scenario, seed: 11)
        let second = try Simulator.run(scenario, seed: 11)
        #expect(first.trace.count > 10)
        #expect(first.traceText == second.traceText)
        #expect(first.traceDigest == second.traceDigest)
        // A trace has a header, digests and a verdict.
        #expect(first.trace.first?.hasPrefix(#"{"type":"header","format":1,"scenario":"\#(name)""#) == true)
        #expect(first.trace.contains { $0.contains(#""ev":"digest""#) })
        #expect(first.trace.last?.hasPrefix(#"{"type":"verdict""#) == true)
        // Replaying the trace re-executes it byte for byte.
        let replay = try Simulator.replay(traceText: first.traceText, file: "\(name).ndjson")
        #expect(replay.divergence == nil)
    }

    @Test("replay reports the first line that differs")
    func replayDivergence() throws {
        let scenario = try scenario("trips")
        let result = try Simulator.run(scenario, seed: 5, options: SimulationOptions(steps: 30))
        var lines = result.trace
        let index = try #require(lines.firstIndex { $0.contains(#""ev":"send""#) })
        lines[index] = lines[index].replacingOccurrences(of: #""ev":"send""#, with: #""ev":"sent""#)
        let replay = try Simulator.replay(traceText: lines.joined(separator: "\n") + "\n", file: "tampered.ndjson")
        #expect(replay.divergence?.line == index + 1)
        #expect(replay.divergence?.replayed == result.trace[index])
    }

    @Test("weights and faults added later stay out of the canonical JSON while 0, so older scenarios keep their hashes and traces")
    func laterFieldsLeftOutWhileZero() throws {
        var trips = try scenario("trips")
        trips.steps = 3
        // The hash trips (with 3 steps) had before the operations and faults added for the defects of Simulations/delete-reinsert-one-save.json and its kin existed.
        #expect(trips.hash == "a0dc8bb247b27b7a")
        for key in ["deleteReinsert", "copies", "staleCopy", "batchDelete", "reopen", "corruptStamps", "corruptUnknown", "corruptClock",
                    "corruptCausalLength", "hostileRecord", "zoneDelete", "zoneDeletionPolicy", "largeAssetPercent"] {
            #expect(!trips.canonicalJSON.contains("\"\(key)\""), "\(key)")
        }
        var changed = trips
        changed.workload.deleteReinsert = 3
        changed.faults.hostileRecord = 0.25
        changed.workload.largeAssetPercent = 30
        let decoded = try JSONDecoder().decode(Scenario.self, from: Data(changed.canonicalJSON.utf8))
        #expect(decoded == changed)
        #expect(decoded.hash != trips.hash)
    }

    @Test("a scenario using the later operations and faults replays byte for byte", arguments: ["delete-reinsert-one-save", "copies-of-one-record",
                                                                                                "hostile-remote-clocks", "corrupt-bookkeeping"])
    func laterOperationsReplay(name: String) throws {
        let scenario = try Scenario.load(path: try simulationsDirectory().appendingPathComponent("\(name).json").path)
        let result = try Simulator.run(scenario, seed: 3, options: SimulationOptions(steps: 12))
        let replay = try Simulator.replay(traceText: result.traceText, file: "\(name).ndjson")
        #expect(replay.divergence == nil, "\(replay.divergence.map { "line \($0.line): \($0.replayed)" } ?? "")")
    }

    @Test("largeAssetPercent writes external values beyond one cloud chunk: transfers take several chunks, and still pass")
    func largeAssets() throws {
        let chunk = CloudAssetReference.chunkSize
        let sizes = Scenario.Workload.largeAssetSizes
        #expect(sizes == sizes.sorted() && sizes.first! < chunk && sizes.contains(chunk + 1) && sizes.last! > 2 * chunk)
        let scenario = try scenario("large-files")
        #expect(scenario.workload.largeAssetPercent > 0 && scenario.canonicalJSON.contains(#""largeAssetPercent":"#))
        let result = try Simulator.run(scenario, seed: 0, options: SimulationOptions(steps: 20))
        #expect(result.violation == nil, "\(result.violation?.description ?? "")")
        // Three-chunk assets went up chunk by chunk, and came down in full chunks.
        #expect(result.trace.contains { $0.contains(#""result":"asset 2 of 3 chunks""#) })
        #expect(result.trace.contains { $0.contains(#""result":"asset chunk of \#(chunk) bytes""#) })
    }

    @Test("no value of an encrypted attribute ever appears in a trace")
    func noSecretsInTraces() throws {
        let result = try Simulator.run(try scenario("notes-files"), seed: 2)
        #expect(!result.traceText.contains("secret-"))
    }
}

@Suite("Simulator: invariants hold on every built-in scenario")
struct SimulationSweepTests {
    @Test("every built-in scenario passes its seeds (REPLICA_SIM_SEEDS, default 20; large-files 5)", arguments: try builtInScenarios().map(\.name))
    func builtInScenarioPasses(name: String) throws {
        let scenario = try scenario(name)
        let outcomes = Simulator.explore(scenario, seeds: (0..<UInt64(seeds(of: name))).map { $0 }, options: SimulationOptions(recordsTrace: false),
                                         jobs: 1, shrinkBudget: 200)
        for outcome in outcomes where outcome.result.violation != nil {
            let shrunk = outcome.shrunk ?? outcome.result
            Issue.record("""
                \(name) seed \(outcome.seed) failed: \(outcome.result.violation!)
                shrunk to \(shrunk.steps) steps: \(shrunk.violation.map { "\($0)" } ?? "passes")
                \(shrunk.witness.joined(separator: "\n"))
                """)
        }
    }
}

@Suite("Simulator: canaries")
struct SimulationCanaryTests {
    /// Fewer steps than the hunting scenario's own make runs (and shrinking) faster in debug builds.
    static let huntSteps = 60

    @Test("each canary is caught within 1,000 seeds and shrunk to at most 15 steps", arguments: CanaryCatalog.all.map(\.canary))
    func canaryCaught(canary: Canary) throws {
        let entry = try #require(CanaryCatalog.entry(named: canary.rawValue))
        let scenario = try scenario(entry.scenario)
        let options = SimulationOptions(canaries: [canary], steps: Self.huntSteps, recordsTrace: false)
        var caught: SimulationResult?
        for seed in UInt64(0)..<1_000 {
            let result = try Simulator.run(scenario, seed: seed, options: options)
            if result.violation != nil {
                caught = result
                break
            }
        }
        let failure = try #require(caught, "\(canary.rawValue) was not caught within 1,000 seeds of \(entry.scenario)")
        let shrunk = try Simulator.shrink(scenario, tape: failure.tape.choices, seed: failure.seed, options: options, budget: 1_000)
        let violation = try #require(shrunk.violation)
        #expect(violation.invariant == failure.violation?.invariant)
        #expect(shrunk.steps <= 15, "\(canary.rawValue): shrunk to \(shrunk.steps) steps\n\(shrunk.witness.joined(separator: "\n"))")
    }

    @Test("without canaries the hunting seeds pass")
    func noCanaryNoFailure() throws {
        for entry in CanaryCatalog.all {
            let result = try Simulator.run(try scenario(entry.scenario), seed: 0, options: SimulationOptions(steps: Self.huntSteps, recordsTrace: false))
            #expect(result.violation == nil, "\(entry.scenario): \(result.violation?.description ?? "")")
        }
    }
}

@Suite("Simulator: exploring")
struct SimulationExploreTests {
    @Test("explore returns every shrunk failure with its trace, even when the exploration records no traces (no empty files in failures/)")
    func exploreKeepsShrunkTraces() throws {
        let entry = try #require(CanaryCatalog.entry(named: Canary.nonIdempotentApply.rawValue))
        let scenario = try scenario(entry.scenario)
        let options = SimulationOptions(canaries: [.nonIdempotentApply], steps: 40, recordsTrace: false)
        var failing: UInt64?
        for seed in UInt64(0)..<200 where failing == nil {
            if try Simulator.run(scenario, seed: seed, options: options).violation != nil { failing = seed }
        }
        let seed = try #require(failing)
        let outcomes = Simulator.explore(scenario, seeds: [seed], options: options, jobs: 1, shrinkBudget: 20)
        let outcome = try #require(outcomes.first)
        #expect(outcome.result.violation != nil)
        let shrunk = try #require(outcome.shrunk)
        #expect(shrunk.violation?.invariant == outcome.result.violation?.invariant)
        #expect(!shrunk.trace.isEmpty)
        // The saved text is a trace the tools can read back: a header with the shrunk tape, and the verdict last.
        let header = try TraceFormat.header(of: shrunk.traceText, file: "shrunk")
        #expect(header.tape.choices == shrunk.tape.choices)
        #expect(shrunk.trace.last?.contains("\"verdict\":\"fail\"") == true)
    }
}

extension SimulationExploreTests {
    @Test("explore shrinks only the first failures of each invariant, chosen by seed order whatever the thread count, and reports shrink progress and every run of a shrink")
    func exploreShrinksTheFirstFailuresPerInvariant() throws {
        let entry = try #require(CanaryCatalog.entry(named: Canary.nonIdempotentApply.rawValue))
        let scenario = try scenario(entry.scenario)
        let options = SimulationOptions(canaries: [.nonIdempotentApply], steps: 40, recordsTrace: false)
        var failing: [UInt64] = []
        for seed in UInt64(0)..<400 where failing.count < 3 {
            if try Simulator.run(scenario, seed: seed, options: options).violation != nil { failing.append(seed) }
        }
        try #require(failing.count == 3, "the canary fails at least three of 400 seeds")
        let seeds = Array(UInt64(0)...failing[2])
        let reports = Mutex<[(Int, Int)]>([])
        let heartbeats = Mutex<[UInt64: [Int]]>([:])
        let outcomes = Simulator.explore(scenario, seeds: seeds, options: options, jobs: 2, shrinkBudget: 10, shrinkFirst: 1,
                                         shrinking: { done, total in reports.withLock { $0.append((done, total)) } },
                                         shrinkRuns: { seed, runs in heartbeats.withLock { $0[seed, default: []].append(runs) } })
        let failed = outcomes.filter { $0.result.violation != nil }
        #expect(failed.count >= 3)
        let invariants = Set(failed.compactMap { $0.result.violation?.invariant.rawValue })
        let shrunk = outcomes.filter { $0.shrunk != nil }
        // One shrink per violated invariant: the lowest failing seed of each.
        #expect(shrunk.count == invariants.count)
        for invariant in invariants {
            let first = failed.first { $0.result.violation?.invariant.rawValue == invariant }
            #expect(first?.shrunk != nil, "the first failure of \(invariant) is the one shrunk")
        }
        // Each shrink reports every run it makes, counting up from 1, and only shrunk seeds report.
        let beats = heartbeats.withLock { $0 }
        #expect(Set(beats.keys) == Set(shrunk.map(\.seed)))
        for (_, runs) in beats { #expect(runs == Array(1...runs.count)) }
        let progress = reports.withLock { $0 }
        #expect(progress.first.map { $0 == (0, invariants.count) } == true)
        #expect(progress.last.map { $0 == (invariants.count, invariants.count) } == true)
        // Nothing to shrink: no shrink progress and no shrunk results.
        let none = Simulator.explore(scenario, seeds: seeds, options: options, jobs: 1, shrinkBudget: 10, shrinkFirst: 0)
        #expect(none.allSatisfy { $0.shrunk == nil })
        #expect(none.map { $0.result.violation?.invariant } == outcomes.map { $0.result.violation?.invariant })
    }
}

@Suite("Simulator: regressions and known issues")
struct SimulationRegressionTests {
    /// Traces in Simulations/regressions/ of library bugs that are still open, by the bug part of the file name: replaying
    /// them must still fail (a known issue); when a fix lands the known issue stops reproducing and this list must
    /// shrink.
    static let open: [String: String] = [
        "winner-holds-unmodeled-loser-write": "files-unique-content seed 266 (1 of 300 seeds): the winner of a duplicate of unique "
            + "external content ends holding a caption write of the tablet, stamped after the laptop's upsert, that the reference "
            + "model does not find among the winner's or its losers' acknowledged writes; not diagnosed yet (the tablet's re-insert "
            + "of the phone's record it had never seen, which then lost the duplicate, is the suspect)",
    ]

    static func regressionFiles() -> [String] {
        guard let directory = ScenarioCatalog.directory()?.appendingPathComponent("regressions"),
              let names = try? FileManager.default.contentsOfDirectory(atPath: directory.path) else { return [] }
        return names.filter { $0.hasSuffix(".ndjson") }.sorted()
    }

    @Test("every regression trace replays with every invariant holding (open bugs: known issues)", arguments: regressionFiles())
    func regression(file: String) throws {
        let url = try simulationsDirectory().appendingPathComponent("regressions").appendingPathComponent(file)
        let text = try String(contentsOf: url, encoding: .utf8)
        let header = try TraceFormat.header(of: text, file: file)
        let result = try Simulator.run(header.scenario, tape: header.tape.choices, seed: header.seed, options: SimulationOptions(recordsTrace: false))
        let key = Self.open.keys.sorted().first { file.contains($0) }
        if let key {
            withKnownIssue("open bug: \(Self.open[key]!)") {
                #expect(result.violation == nil, "\(result.violation?.description ?? "")")
            }
        } else {
            #expect(result.violation == nil, "\(file): \(result.violation?.description ?? "")")
        }
    }

    /// Simulations/known-traps/ holds scenarios whose open bug traps (ends the process): the suite never runs them;
    /// it only checks that they are well-formed. Run one with `replica-sim explore --scenario Simulations/known-traps/NAME.json`.
    @Test("the scenarios in Simulations/known-traps/ (if any) are well-formed")
    func knownTrapScenarios() throws {
        let directory = try simulationsDirectory().appendingPathComponent("known-traps")
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).filter { $0.hasSuffix(".json") }.sorted()
        for name in names { _ = try Scenario.load(path: directory.appendingPathComponent(name).path) }
    }

    @Test("the scenarios in Simulations/known-issues/ (if any) still fail: each reproduces an open bug")
    func knownIssueScenarios() throws {
        let directory = try simulationsDirectory().appendingPathComponent("known-issues")
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).filter { $0.hasSuffix(".json") }.sorted()
        for name in names {
            let scenario = try Scenario.load(path: directory.appendingPathComponent(name).path)
            var failed = false
            for seed in UInt64(0)..<40 where !failed {
                failed = try Simulator.run(scenario, seed: seed, options: SimulationOptions(steps: 80, recordsTrace: false)).violation != nil
            }
            withKnownIssue("open bug reproduced by Simulations/known-issues/\(name)") {
                #expect(!failed, "\(name) reproduces its bug")
            }
        }
    }
}
