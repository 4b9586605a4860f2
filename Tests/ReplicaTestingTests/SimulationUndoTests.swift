// Undo and redo in simulation scenarios: the workload weights `undo` and `redo` (left out of the canonical JSON while 0),
// a run of the built-in undo-redo scenario over the CI seeds in which every kind of step occurs and every invariant
// holds, and the canary undo-drops-pending-edit caught and shrunk.
import Foundation
import Replica
import ReplicaTesting
import Testing

/// The seeds CI runs per built-in scenario (as the sweep: `REPLICA_SIM_SEEDS`, default 20).
private let ciSeeds = UInt64(Int(ProcessInfo.processInfo.environment["REPLICA_SIM_SEEDS"] ?? "") ?? 20)

private let scenarioName = "undo-redo"

@Suite("Simulator: undo and redo")
struct SimulationUndoTests {
    @Test("the undo and redo weights parse and stay out of the canonical JSON of scenarios that do not use them")
    func canonicalJSON() throws {
        for scenario in try ScenarioCatalog.builtIn() where scenario.name != scenarioName {
            #expect(!scenario.canonicalJSON.contains(#""undo""#), "\(scenario.name)")
            #expect(!scenario.canonicalJSON.contains(#""redo""#), "\(scenario.name)")
        }
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        #expect(scenario.workload.undo == 14 && scenario.workload.redo == 8)
        #expect(scenario.canonicalJSON.contains(#""undo":14"#) && scenario.canonicalJSON.contains(#""redo":8"#))
        #expect(try JSONDecoder().decode(Scenario.self, from: Data(scenario.canonicalJSON.utf8)) == scenario)
    }

    @Test("over the CI seeds undo-redo undoes pending edits and saved groups, redoes, and every invariant holds")
    func ciSeedsPass() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        var results: [String: Int] = [:]
        for seed in 0..<ciSeeds {
            let result = try Simulator.run(scenario, seed: seed, options: SimulationOptions(recordsTrace: true))
            #expect(result.violation == nil, "seed \(seed): \(result.violation?.description ?? "")")
            for line in result.trace where line.contains(#""action":"undo""#) || line.contains(#""action":"redo""#) {
                guard let range = line.range(of: #""result":""#) else { continue }
                let rest = line[range.upperBound...]
                results[String(rest.prefix { $0 != "\"" }), default: 0] += 1
            }
        }
        for expected in ["undid the pending edit", "undone", "saved the pending edit, nothing to redo", "redone"] {
            #expect((results[expected] ?? 0) > 0, "no step '\(expected)' in \(ciSeeds) seeds: \(results)")
        }
    }

    @Test("the canary undo-drops-pending-edit is caught within the CI seeds by undo-redo and shrunk to a short trace")
    func canaryCaught() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        let options = SimulationOptions(canaries: [.undoDropsPendingEdit], recordsTrace: false)
        var caught: SimulationResult?
        for seed in 0..<ciSeeds where caught == nil {
            let result = try Simulator.run(scenario, seed: seed, options: options)
            if result.violation != nil { caught = result }
        }
        let failure = try #require(caught, "undo-drops-pending-edit was not caught within \(ciSeeds) seeds")
        #expect(failure.violation?.invariant == .localSaves, "\(failure.violation?.description ?? "")")
        let shrunk = try Simulator.shrink(scenario, tape: failure.tape.choices, seed: failure.seed, options: options, budget: 2_000)
        let violation = try #require(shrunk.violation)
        #expect(violation.invariant == .localSaves)
        #expect(violation.message.contains("undo with an edit pending"), "\(violation.message)")
        #expect(shrunk.steps <= 5, "shrunk to \(shrunk.steps) steps\n\(shrunk.witness.joined(separator: "\n"))")
        // Without the canary the same tape passes.
        let clean = try Simulator.run(scenario, tape: shrunk.tape.choices, seed: failure.seed, options: SimulationOptions(recordsTrace: false))
        #expect(clean.violation == nil, "\(clean.violation?.description ?? "")")
    }
}
