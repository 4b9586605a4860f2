import Foundation
import Replica
import ReplicaTesting

// B11 — the simulator on the trips scenario (Simulations/trips.json), seeds 0..<N on one core, through the
// simulation kit's API exactly as `replica-sim explore --scenario trips --jobs 1` (and `make sim-bench`) runs them.
// Reported like replica-sim reports it: device operations (workload operations, records built for uploads, records
// merged; `SimulationStats.deviceOperations`) per CPU second, the CPU seconds being the sum of each seed's thread
// CPU time (run, plus shrinking should a seed fail).

func simulatorTrial(seeds: Int) throws -> Trial {
    let scenario: Scenario
    do {
        scenario = try ScenarioCatalog.resolve("trips")
    } catch {
        throw CheckFailed("B11: \(error) (run replica-bench from the package directory, or set REPLICA_SIMULATIONS_DIR)")
    }
    var outcomes: [Simulator.SeedOutcome] = []
    return Trial(run: {}, check: {
        try require(outcomes.count == seeds, "B11: \(outcomes.count) of \(seeds) seeds ran")
        let failed = outcomes.filter { $0.result.violation != nil }
        try require(failed.isEmpty, "B11: \(failed.count) seeds failed, first \(failed.first.map { "\($0.seed): \($0.result.violation!)" } ?? "")")
    }, measured: {
        let w0 = monotonicNow()
        outcomes = Simulator.explore(scenario, seeds: (0..<UInt64(seeds)).map { $0 }, options: SimulationOptions(recordsTrace: false),
                                     jobs: 1)
        let wall = monotonicNow() - w0
        let cpu = outcomes.reduce(0) { $0 + $1.seconds }
        let operations = outcomes.reduce(0) { $0 + $1.result.stats.deviceOperations }
        return Measurement(sample: Sample(cpu: cpu, wall: wall), peakMB: nil, items: operations)
    }, note: {
        outcomes.isEmpty ? nil : "\(seeds) seeds, \(outcomes.reduce(0) { $0 + $1.result.stats.deviceOperations }) device ops"
    })
}

func monotonicNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
