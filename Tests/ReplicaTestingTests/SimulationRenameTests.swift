// Renamed attributes and app updates in simulation scenarios: the vocabulary (`renamedFrom` / `renamedSince`, a
// device's `upgrade`), its checks, the schema each app version declares to the library (synced attributes keep their
// cloud name, local ones are renamed through an original name), and a run in which a device updates and its local
// store must rename the column and keep the values.
import Foundation
import Replica
import ReplicaTesting
import Testing

private let scenarioName = "renamed-attribute-across-versions"

/// A scenario with an inline Note (synced) / Draft (local) schema whose attributes and devices are the given JSON.
private func json(note: String = #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "title", "renamedSince": 2}"#,
                  draft: String = #"{"name": "body", "type": "string", "default": "", "renamedFrom": "text", "renamedSince": 2}"#,
                  draftStore: String = #"{"name": "drafts", "kind": "local", "entities": ["Draft"]}"#,
                  devices: String = #"[{"name": "old", "schemaVersion": 1}, {"name": "new"}]"#,
                  storage: String = "memory") -> String {
    """
    {"schema": {"version": 2, "entities": [
        {"name": "Note", "attributes": [\(note), {"name": "pinned", "type": "bool", "default": false}]},
        {"name": "Draft", "attributes": [\(draft), {"name": "slug", "type": "string", "optional": true}]}]},
     "stores": [{"name": "notes", "kind": "synced", "entities": ["Note"]}, \(draftStore)],
     "devices": \(devices), "storage": "\(storage)", "steps": 20}
    """
}

@Suite("Simulator: renamed attributes")
struct SimulationRenameTests {
    @Test("a synced attribute keeps its cloud name in every app version; a local one is declared under the version's name with its original name")
    func librarySchemas() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        let v1 = scenario.librarySchema(version: 1), v2 = scenario.librarySchema(version: 2)
        let note1 = try #require(v1.entity(named: "Note")), note2 = try #require(v2.entity(named: "Note"))
        #expect(note1.attributes.map(\.name) == ["title", "memo", "pinned"])
        #expect(note2.attributes.map(\.name) == ["title", "memo", "pinned", "rating"])
        #expect(note2.attributes.allSatisfy { $0.originalName == nil })
        let draft1 = try #require(v1.entity(named: "Draft")), draft2 = try #require(v2.entity(named: "Draft"))
        #expect(draft1.attributes.map(\.name) == ["text", "slug"])
        #expect(draft1.attributes.allSatisfy { $0.originalName == nil })
        #expect(draft2.attributes.map(\.name) == ["body", "slug"])
        #expect(draft2.attribute(named: "body")?.originalName == "text")
        // Both versions are valid for the library (a synced attribute with an original name would be refused).
        try v1.validate()
        try v2.validate()
        let heading = try #require(scenario.schema.entity(named: "Note")?.attributes.first)
        #expect(heading.appName(version: 1) == "title" && heading.appName(version: 2) == "heading" && heading.cloudName == "title")
    }

    @Test("scenarios without renames or updates leave both out of their canonical JSON (their hashes and traces stay as they were)")
    func canonicalJSON() throws {
        for scenario in try ScenarioCatalog.builtIn() where scenario.name != scenarioName && scenario.migration == nil {
            #expect(!scenario.canonicalJSON.contains("renamed"), "\(scenario.name)")
            #expect(!scenario.canonicalJSON.contains("upgrade"), "\(scenario.name)")
        }
        let renamed = try ScenarioCatalog.resolve(scenarioName).canonicalJSON
        #expect(renamed.contains(#""renamedFrom":"title","renamedSince":2"#))
        #expect(renamed.contains(#""upgrade":{"atStep":8,"fromVersion":1}"#))
    }

    @Test("a malformed rename or update is reported with the field and the problem", arguments: [
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedSince": 2}"#),
         "schema.entities[0].attributes[0].renamedSince", "needs renamedFrom"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "title"}"#),
         "schema.entities[0].attributes[0].renamedFrom", "needs renamedSince"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "title", "renamedSince": 3}"#),
         "schema.entities[0].attributes[0].renamedSince", "out of range 2...2"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "title", "renamedSince": 1}"#),
         "schema.entities[0].attributes[0].renamedSince", "out of range 2...2"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "pinned", "renamedSince": 2}"#),
         "schema.entities[0].attributes[0].renamedFrom", "clashes with another attribute"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "heading", "renamedSince": 2}"#),
         "schema.entities[0].attributes[0].renamedFrom", "the attribute's own name"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "renamedFrom": "id", "renamedSince": 2}"#),
         "schema.entities[0].attributes[0].renamedFrom", "not a valid identifier"),
        (json(note: #"{"name": "heading", "type": "string", "default": "", "since": 2, "renamedFrom": "title", "renamedSince": 2}"#),
         "schema.entities[0].attributes[0].renamedFrom", "no earlier name"),
        (json(draftStore: #"{"name": "drafts", "kind": "app-group", "synced": false, "entities": ["Draft"]}"#,
              devices: #"[{"name": "phone", "extensionSchemaVersion": 1}]"#),
         "devices[0].extensionSchemaVersion", "a column renamed while another app version has the file open"),
        (json(devices: #"[{"name": "old", "schemaVersion": 1, "upgrade": {"fromVersion": 1, "atStep": 5}}]"#, storage: "file"),
         "devices[0].upgrade.fromVersion", "must start at an older one"),
        (json(devices: #"[{"name": "new", "upgrade": {"fromVersion": 1}}]"#, storage: "file"),
         "devices[0].upgrade.atStep", "missing"),
        (json(devices: #"[{"name": "new", "upgrade": {"fromVersion": 1, "atStep": 0}}]"#, storage: "file"),
         "devices[0].upgrade.atStep", "out of range"),
        (json(devices: #"[{"name": "new", "upgrade": {"fromVersion": 1, "atStep": 5}}]"#),
         "devices[0].upgrade", "its stores must be files"),
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

    @Test("an inline scenario with a rename and an update runs: old and new devices agree through the cloud name")
    func inlineRun() throws {
        let scenario = try Scenario.parse(Data(json(devices: #"[{"name": "old", "schemaVersion": 1}, {"name": "new"}, {"name": "updated", "upgrade": {"fromVersion": 1, "atStep": 5}}]"#,
                                                    storage: "file").utf8), file: "inline.json", defaultName: "inline")
        for seed in UInt64(0)..<3 {
            let result = try Simulator.run(scenario, seed: seed, options: SimulationOptions(recordsTrace: true))
            #expect(result.violation == nil, "seed \(seed): \(result.violation?.description ?? "")")
            #expect(result.trace.contains { $0.contains(#""ev":"upgrade","device":"updated","from":1,"to":2"#) })
            // Synced fields are named by their cloud name in every trace line, whatever the device's version.
            #expect(!result.trace.contains { $0.contains(#""heading""#) && !$0.contains("scenario_json") })
        }
    }

    @Test("a device's update renames its local column and keeps every value (with the rename-adds-column canary the values are gone)")
    func updateKeepsLocalValues() throws {
        let scenario = try ScenarioCatalog.resolve(scenarioName)
        // Seed 14 (60 steps) writes a draft on the laptop before its update at step 8.
        let clean = try Simulator.run(scenario, seed: 14, options: SimulationOptions(steps: 60, recordsTrace: false))
        #expect(clean.violation == nil, "\(clean.violation?.description ?? "")")
        let broken = try Simulator.run(scenario, seed: 14, options: SimulationOptions(canaries: [.renameAddsColumn], steps: 60, recordsTrace: false))
        let violation = try #require(broken.violation)
        #expect(violation.invariant == .referenceModel)
        #expect(violation.description.contains("laptop local store 'drafts'") && violation.description.contains(".body is \"\""), "\(violation)")
    }
}
