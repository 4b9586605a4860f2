import Foundation
import Replica
import ReplicaTesting
import Testing

private let scenarioName = "synced-stage-refused"

/// A custom migration stage that changes a synced store's attribute in place (issue 23's trials, found by people): the
/// library refuses it, the updated device stays at its old version, and `migrated-once` holds synced values to it.
@Suite("Simulator: a custom stage of a synced attribute is refused")
struct SimulationSyncedStageTests {
    private static func json(stores: String, entity: String = "Price") -> String {
        #"{"schema": {"version": 2, "entities": [{"name": "Price", "attributes": [{"name": "amount", "type": "integer", "default": 0}]}, "#
            + #"{"name": "Note", "attributes": [{"name": "title", "type": "string", "default": ""}]}]}, "stores": "# + stores
            + #", "devices": [{"name": "a"}], "storage": "file", "migration": {"stages": [{"toVersion": 2, "entity": ""# + entity
            + #"", "attribute": "amount", "factor": 100, "phase": "willMigrate"}]}, "steps": 5}"#
    }

    @Test("a stage may name a synced store's attribute, in a scenario without local-only stores")
    func parses() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        let stage = try #require(scenario.migration?.stages.first)
        #expect(stage.entity == "Price" && stage.factor == 100)
        #expect(scenario.stores.allSatisfy { $0.isSynced })
        _ = try Scenario.parse(Data(Self.json(stores: #"[{"name": "prices", "kind": "synced", "entities": ["Price", "Note"]}]"#).utf8), file: "ok.json")
    }

    @Test("a synced stage beside a local-only store, or a stage of an app-group store, is reported with the field and the problem", arguments: [
        (json(stores: #"[{"name": "prices", "kind": "synced", "entities": ["Price"]}, {"name": "notes", "kind": "local", "entities": ["Note"]}]"#),
         "migration.stages[0].entity", "no local-only stores"),
        (json(stores: #"[{"name": "prices", "kind": "app-group", "entities": ["Price", "Note"]}]"#),
         "migration.stages[0].entity", "of a local-only or synced store"),
    ])
    func malformed(json: String, field: String, problem: String) throws {
        do {
            _ = try Scenario.parse(Data(json.utf8), file: "Simulations/bad.json")
            Issue.record("accepted a malformed scenario")
        } catch {
            #expect(error.field == field, "\(error)")
            #expect(error.problem.contains(problem), "\(error.problem)")
        }
    }

    @Test("the update is refused (the store unchanged), the device stays at its old version and keeps syncing; every invariant holds")
    func refusedUpdateKeepsSyncing() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        var refused = 0
        for seed in UInt64(0)..<6 {
            let result = try Simulator.run(scenario, seed: seed)
            #expect(result.violation == nil, "seed \(seed): \(result.violation?.description ?? "")")
            let lines = result.trace.filter { $0.contains(#""ev":"update-refused""#) }
            refused += lines.count
            for line in lines { #expect(line.contains("of records in the synced store 'prices'"), "\(line)") }
        }
        #expect(refused > 0, "no update was refused in 6 seeds")
    }

    @Test("with the refusal switched off (canary synced-stage-in-place) migrated-once names the synced value the stage multiplied")
    func canaryCaughtByMigratedOnce() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        let options = SimulationOptions(canaries: [.syncedStageInPlace], recordsTrace: false)
        var caught: SimulationResult?
        for seed in UInt64(0)..<20 where caught == nil {
            let result = try Simulator.run(scenario, seed: seed, options: options)
            if result.violation != nil { caught = result }
        }
        let violation = try #require(caught?.violation)
        #expect(violation.invariant.rawValue == "migrated-once", "\(violation)")
        #expect(violation.description.contains("which no device wrote"), "\(violation)")
    }
}
