import Foundation
import Replica
import ReplicaTesting
import Testing

private let scenarioName = "runtime-scheduled-sync"

/// Scenarios whose simulated apps sync through the sync runtime's decision code (`"runtime"`, Specs P7).
@Suite("Simulator: apps syncing through the sync runtime")
struct SimulationRuntimeTests {
    @Test("the runtime section parses, survives the canonical JSON, and stays out of the canonical JSON of scenarios without it")
    func canonicalJSON() throws {
        let runtimeScenarios = [scenarioName, "runtime-cancelled-sync"]
        for scenario in try ScenarioCatalog.builtIn() where !runtimeScenarios.contains(scenario.name) {
            #expect(scenario.runtime == nil, "\(scenario.name)")
            #expect(!scenario.canonicalJSON.contains(#""runtime""#), "\(scenario.name)")
        }
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        let runtime = try #require(scenario.runtime)
        #expect(runtime.timerMs == 60_000 && runtime.debounceMs == 300 && runtime.syncNow > 0 && runtime.stop > 0 && runtime.pause > 0)
        #expect(try JSONDecoder().decode(Scenario.self, from: Data(scenario.canonicalJSON.utf8)) == scenario)
        // The cancellation rate came later: absent while 0, so traces saved before it keep their scenario hash.
        #expect(runtime.cancel == 0 && !scenario.canonicalJSON.contains(#""cancel""#))
        let cancelling = try ScenarioCatalog.resolve("runtime-cancelled-sync")
        #expect(try #require(cancelling.runtime).cancel > 0)
        #expect(try JSONDecoder().decode(Scenario.self, from: Data(cancelling.canonicalJSON.utf8)) == cancelling)
    }

    @Test("a malformed runtime section is reported with the field and the problem", arguments: [
        (#""runtime": {"timerMs": 0}"#, "runtime.timerMs", "out of range"),
        (#""runtime": {"syncNow": 2}"#, "runtime.syncNow", "out of range"),
        (#""runtime": {"syncNow": 0.5, "stop": 0.5}"#, "runtime", "add up to more than"),
        (#""runtime": {"sleep": 1}"#, "runtime.sleep", "unknown field"),
    ])
    func malformed(runtime: String, field: String, problem: String) throws {
        let json = #"{"schema": "posts", "stores": [{"name": "p", "kind": "synced", "entities": ["Post"]}], "devices": [{"name": "a"}], "steps": 5, "#
            + runtime + "}"
        do {
            _ = try Scenario.parse(Data(json.utf8), file: "bad.json")
            Issue.record("accepted a malformed runtime section")
        } catch {
            #expect(error.field == field)
            #expect(error.problem.contains(problem), "\(error.problem)")
        }
    }

    @Test("a run drives the runtimes: passes start by themselves, syncNow calls return, runtimes stop, start again and pause")
    func runtimesAreDriven() throws {
        let result = try Simulator.run(try ScenarioCatalog.resolve(scenarioName), seed: 2)
        #expect(result.violation == nil, "\(result.violation?.description ?? "")")
        let text = result.traceText
        for event in [#""ev":"pass-start""#, #""kind":"automatic""#, #""ev":"sync-now-returned""#, #""action":"stop-runtime""#,
                      #""ev":"runtime-start""#, #""action":"pause-runtime""#, #""state":"waiting-for-network""#] {
            #expect(text.contains(event), "\(event)")
        }
        // After heal no syncNow is called: what converges there, the runtimes did by themselves.
        let heal = try #require(result.trace.firstIndex { $0.contains(#""phase":"heal""#) })
        #expect(!result.trace[heal...].contains { $0.contains(#""action":"sync-now""#) })
    }

    @Test("a syncNow whose request is still in flight at its bound returns there: the pass gives the request up (SyncPass.deadlinePassed, as SyncDriver does) and ends stopped")
    func requestInFlightAtTheBoundIsAbandoned() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        var abandoned = 0
        for seed in UInt64(0)..<4 {
            let result = try Simulator.run(scenario, seed: seed)
            #expect(result.violation == nil, "seed \(seed): \(result.violation?.description ?? "")")
            for (index, line) in result.trace.enumerated() where line.contains(#""ev":"abandon-at-bound""#) {
                abandoned += 1
                // The pass ends at once, stopped, at the same time.
                let next = result.trace[(index + 1)...].first { $0.contains(#""ev":"pass-end""#) }
                #expect(next?.contains(#""end":"stopped""#) == true, "\(next ?? "no pass-end")")
            }
        }
        #expect(abandoned > 0, "no seed had a request in flight at a syncNow's bound")
    }

    @Test("cancelled syncNow calls (runtime-cancelled-sync): a running pass ends cancelled at its next step and sends nothing more, a call waiting for another pass returns at its cancellation, and the runtimes still converge")
    func cancelledCallsEnd() throws {
        let scenario = try ScenarioCatalog.resolve("runtime-cancelled-sync")
        var endedPass = 0, endedWaiting = 0
        for seed in UInt64(0)..<4 {
            let result = try Simulator.run(scenario, seed: seed)
            #expect(result.violation == nil, "seed \(seed): \(result.violation?.description ?? "")")
            for (index, line) in result.trace.enumerated() where line.contains(#""ev":"sync-now-cancelled""#) {
                // The pass of the cancelled call ends, cancelled, before the store sends anything else.
                let store = try #require(line.firstMatch(of: /"store":"[a-z]+"/)).output
                let process = try #require(line.firstMatch(of: /"process":"[a-z\/]+"/)).output
                let next = result.trace[(index + 1)...].first {
                    $0.contains(process) && $0.contains(store) && ($0.contains(#""ev":"pass-end""#) || $0.contains(#""ev":"send""#))
                }
                #expect(next?.contains(#""end":"cancelled""#) == true, "seed \(seed): \(next ?? "no pass-end")")
                endedPass += 1
            }
            endedWaiting += result.trace.filter { $0.contains(#""result":"cancelled while waiting""#) }.count
        }
        #expect(endedPass > 0, "no seed cancelled a call while its pass ran")
        #expect(endedWaiting > 0, "no seed cancelled a call waiting for another pass")
    }
}
