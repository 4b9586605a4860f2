import Foundation
import Replica
import ReplicaTesting
import Testing

/// The seeds CI runs per built-in scenario (as the sweep: `REPLICA_SIM_SEEDS`, default 20).
private let ciSeeds = UInt64(Int(ProcessInfo.processInfo.environment["REPLICA_SIM_SEEDS"] ?? "") ?? 20)

private func zoneDeletionScenario() throws -> Scenario { try ScenarioCatalog.resolve("zone-deletion-policies") }

@Suite("Simulator: zone deletion")
struct SimulationZoneDeletionTests {
    private static let base = #"""
        {"schema": "albums", "stores": [{"name": "albums", "kind": "synced", "entities": ["Album", "Photo"]}],
         "devices": [{"name": "a", "zoneDeletionPolicy": "POLICY"}, {"name": "b"}], "faults": {"zoneDelete": 0.05}, "steps": 5}
        """#

    @Test("a device's zoneDeletionPolicy parses, the default stays out of the canonical JSON, and a bad one is named")
    func policyParses() throws {
        let erase = try Scenario.parse(Data(Self.base.replacingOccurrences(of: "POLICY", with: "eraseLocalData").utf8), file: "z.json")
        #expect(erase.devices[0].zoneDeletionPolicy == .eraseLocalData)
        #expect(erase.devices[1].zoneDeletionPolicy == nil)
        #expect(erase.faults.zoneDelete == 0.05)
        #expect(erase.canonicalJSON.contains(#""zoneDeletionPolicy":"eraseLocalData""#))
        #expect(erase.canonicalJSON.contains(#""zoneDelete":0.05"#))
        let keep = try Scenario.parse(Data(Self.base.replacingOccurrences(of: "POLICY", with: "keepAndReupload").utf8), file: "z.json")
        #expect(keep.devices[0].zoneDeletionPolicy == nil)
        #expect(!keep.canonicalJSON.contains("zoneDeletionPolicy"))
        // The canonical JSON reads back (traces embed it).
        #expect(try JSONDecoder().decode(Scenario.self, from: Data(erase.canonicalJSON.utf8)) == erase)
        do {
            _ = try Scenario.parse(Data(Self.base.replacingOccurrences(of: "POLICY", with: "eraseAll").utf8), file: "z.json")
            Issue.record("accepted an unknown policy")
        } catch {
            #expect(error.field == "devices[0].zoneDeletionPolicy")
            #expect(error.problem.contains("keepAndReupload, eraseLocalData"), "\(error.problem)")
        }
    }

    @Test("over the CI seeds the zone is deleted for every reason, erasing devices erase, keeping devices keep, and every invariant holds")
    func policiesApplied() throws {
        let scenario = try zoneDeletionScenario()
        let erasing = Set(scenario.devices.filter { $0.zoneDeletionPolicy == .eraseLocalData }.map(\.name))
        #expect(!erasing.isEmpty && erasing.count < scenario.devices.count)
        var reasons = Set<String>(), erased = 0, kept = 0
        for seed in 0..<ciSeeds {
            let result = try Simulator.run(scenario, seed: seed)
            #expect(result.violation == nil, "seed \(seed): \(result.violation?.description ?? "")")
            for line in result.trace where line.contains(#""ev":"zone-deletion""#) {
                let event = try #require(JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                let device = try #require((event["process"] as? String)?.split(separator: "/").first.map(String.init))
                let reason = try #require(event["reason"] as? String), response = try #require(event["response"] as? String)
                reasons.insert(reason)
                // The library's policy decided: erase only on an erasing device, and never for an encrypted-data reset.
                let expected = erasing.contains(device) && reason != "encryptedDataReset" ? "eraseLocalData" : "keepAndReupload"
                #expect(response == expected, "seed \(seed): \(line)")
                if response == "eraseLocalData" { erased += 1 } else { kept += 1 }
            }
            #expect(result.stats.erasedStores == result.trace.filter { $0.contains(#""response":"eraseLocalData""#) }.count)
        }
        #expect(reasons == ["deleted", "purged", "encryptedDataReset"])
        #expect(erased > 0 && kept > 0, "erased \(erased), kept \(kept)")
    }

    @Test("the canary erase-leaves-link-rows is caught within the CI seeds by zone-deletion-erase and shrunk to a short trace")
    func canaryCaught() throws {
        let scenario = try zoneDeletionScenario()
        let options = SimulationOptions(canaries: [.eraseLeavesLinkRows], recordsTrace: false)
        var caught: SimulationResult?
        for seed in 0..<ciSeeds where caught == nil {
            let result = try Simulator.run(scenario, seed: seed, options: options)
            if result.violation != nil { caught = result }
        }
        let failure = try #require(caught, "erase-leaves-link-rows was not caught within \(ciSeeds) seeds")
        #expect(failure.violation?.invariant == .zoneDeletionErase, "\(failure.violation?.description ?? "")")
        let shrunk = try Simulator.shrink(scenario, tape: failure.tape.choices, seed: failure.seed, options: options, budget: 2_000)
        let violation = try #require(shrunk.violation)
        #expect(violation.invariant == .zoneDeletionErase)
        #expect(violation.message.contains("replica_link_"), "\(violation.message)")
        #expect(shrunk.steps <= 15, "shrunk to \(shrunk.steps) steps\n\(shrunk.witness.joined(separator: "\n"))")
        // Without the canary the same tape passes.
        let clean = try Simulator.run(scenario, tape: shrunk.tape.choices, seed: failure.seed, options: SimulationOptions(recordsTrace: false))
        #expect(clean.violation == nil, "\(clean.violation?.description ?? "")")
    }
}
