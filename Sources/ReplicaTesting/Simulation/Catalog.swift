// Where the built-in scenarios live, and which scenario hunts which canary.

import Foundation
import Replica

/// The built-in scenarios: the JSON files directly in `Simulations/`.
public enum ScenarioCatalog {
    /// The `Simulations/` directory: `$REPLICA_SIMULATIONS_DIR`, else the nearest `Simulations/` beside a
    /// `Package.swift` from the working directory up, else the one of the source tree this was built from.
    public static func directory() -> URL? {
        let fileManager = FileManager.default
        if let path = ProcessInfo.processInfo.environment["REPLICA_SIMULATIONS_DIR"], !path.isEmpty {
            return URL(fileURLWithPath: path, isDirectory: true)
        }
        var candidate = URL(fileURLWithPath: fileManager.currentDirectoryPath, isDirectory: true)
        for _ in 0..<8 {
            let simulations = candidate.appendingPathComponent("Simulations", isDirectory: true)
            if fileManager.fileExists(atPath: candidate.appendingPathComponent("Package.swift").path),
               fileManager.fileExists(atPath: simulations.path) {
                return simulations
            }
            candidate = candidate.deletingLastPathComponent()
        }
        // Sources/ReplicaTesting/Simulation/Catalog.swift -> the package root.
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        let simulations = source.appendingPathComponent("Simulations", isDirectory: true)
        return fileManager.fileExists(atPath: simulations.path) ? simulations : nil
    }

    /// The paths of the built-in scenario files, sorted by name.
    public static func builtInPaths() -> [String] {
        guard let directory = directory(),
              let names = try? FileManager.default.contentsOfDirectory(atPath: directory.path) else { return [] }
        return names.filter { $0.hasSuffix(".json") }.sorted().map { directory.appendingPathComponent($0).path }
    }

    /// Every built-in scenario.
    /// - Throws: ``ScenarioError`` for the first malformed one.
    public static func builtIn() throws(ScenarioError) -> [Scenario] {
        var scenarios: [Scenario] = []
        for path in builtInPaths() { scenarios.append(try Scenario.load(path: path)) }
        return scenarios
    }

    /// Resolves `NAME` (a built-in scenario) or `PATH` (a JSON file).
    /// - Throws: ``ScenarioError``.
    public static func resolve(_ nameOrPath: String) throws(ScenarioError) -> Scenario {
        if nameOrPath.hasSuffix(".json") || nameOrPath.contains("/") {
            return try Scenario.load(path: nameOrPath)
        }
        guard let path = builtInPaths().first(where: { (($0 as NSString).lastPathComponent as NSString).deletingPathExtension == nameOrPath }) else {
            let known = builtInPaths().map { (($0 as NSString).lastPathComponent as NSString).deletingPathExtension }
            throw ScenarioError(file: nameOrPath, field: "(file)",
                                problem: "no built-in scenario of that name (built in: \(known.joined(separator: ", ")))")
        }
        return try Scenario.load(path: path)
    }
}

/// The canaries `replica-sim` can switch on, with the built-in scenario that hunts each.
public enum CanaryCatalog {
    /// One canary.
    public struct Entry: Sendable, Hashable {
        /// The deliberate bug.
        public var canary: Canary
        /// What it breaks.
        public var summary: String
        /// The built-in scenario whose workload and faults make the bug show.
        public var scenario: String
    }

    /// Per canary name: what it breaks and where to hunt it. Adding a canary to ``Canary`` takes one line here
    /// (names of canaries the library does not have yet are ignored until it does).
    static let table: [(name: String, scenario: String, summary: String)] = [
        ("lww-by-wall-clock", "trips-mixed-versions", "field stamps use the device wall clock, not the HLC"),
        ("token-before-apply", "notes-files", "the server change token commits before the fetched batch"),
        ("non-idempotent-apply", "trips", "merging the same record twice bumps its causal length"),
        ("absent-as-null", "trips-mixed-versions", "fields missing from an incoming record become nulls"),
        ("tombstones-dropped-early", "trips-flaky-network", "the ledger forgets a tombstone once the cloud acknowledges it"),
        ("child-tombstones-forgotten", "trips", "a local cascade deletes children without tombstones"),
        ("conflict-clobbers", "trips", "a save conflict overwrites the server record without merging"),
        ("stale-ack-clears-pending", "trips-flaky-network", "a save acknowledgement clears a newer local edit from the outbox"),
        ("import-skips-history", "trips", "sync imports write rows without a history transaction"),
        ("plaintext-uploaded", "notes-files", "encrypted attributes are uploaded without sealing"),
        ("dedup-skipped", "people-unique", "concurrent records with one unique key are not deduplicated"),
        ("last-copy-wins", "copies-of-one-record", "update(_:) writes a copy whole: two copies' edits do not add up, a stale copy reverts a saved edit"),
        ("unbounded-remote-clock", "hostile-remote-clocks", "remote stamps far ahead of the device clock are merged and drag it along"),
        ("gate-ignores-options", "encryption-turned-on-across-versions", "the schema gate ignores cloud options such as encryption"),
        ("unknown-entity-refused", "app-group-two-app-versions", "an older process refuses a newer entity's queued records for good"),
        ("unknown-types-never-adopted", "app-group-two-app-versions", "records kept as of an unknown type never reach the table of a schema that declares it"),
        ("erase-leaves-link-rows", "zone-deletion-policies", "a store erased because its zone was deleted keeps its many-to-many link rows"),
        ("rename-adds-column", "renamed-attribute-across-versions", "a local store adds a new column for an attribute with an original name instead of renaming the old one"),
        ("conflict-log-misses-deletes", "trips", "an unsynced local write that a remote delete or cascade removed is not logged as a conflict"),
        ("conflict-log-misses-store-columns", "app-group-two-app-versions", "an unsynced write to a column only another app version declares is not logged when the older one merges it away"),
        ("layout-outranks-recorded-version", "migration-plan-across-versions", "a migration plan starts where the store's tables are, so after an open without the plan added columns it skips the custom stage"),
        ("rename-outside-plan", "migration-plan-across-versions", "a container without the plan renames a plan-managed store's columns, so the plan then skips the custom stage"),
        ("empty-ambiguous-store-refused", "values-only-migration", "an app cannot open the empty store its widget's unversioned container created when the plan's layouts are alike across a custom stage"),
        ("undo-drops-pending-edit", "undo-redo", "undo() with an edit pending undoes the save before it and overwrites or keeps the edit, instead of undoing the edit"),
        ("sync-now-waits-for-backoff", "runtime-scheduled-sync", "an explicit syncNow waits out the engine's own backoff instead of trying at once"),
        ("sync-now-waits-for-request", "runtime-scheduled-sync", "a bounded syncNow waits for its request in flight past its bound instead of abandoning it"),
        ("cancelled-sync-now-goes-on", "runtime-cancelled-sync", "a pass goes on sending after the task awaiting its syncNow was cancelled"),
        ("missing-asset-refusal-rejects", "assets-save-across-reset", "a record the cloud refuses for an asset its reset zone lost is rejected instead of the asset going up again"),
        ("waiting-version-outlives-newer", "files-zone-reset", "a version waiting for an asset keeps waiting after a newer version or the tombstone merged, for an asset a zone reset lost"),
        ("waiting-value-wins-tie", "sealed-files", "joining a fetched version with one waiting for its asset lets the waiting value win a tie, whose sealed bytes a zone reset took"),
        ("synced-stage-in-place", "synced-stage-refused", "a custom stage that changes a synced attribute in place is not refused, so every device applies it again to values others migrated"),
        ("stale-key-set-writes-held", "encrypted-zone-reset", "a write sealed under the key set a zone reset replaced is held as undecryptable even by the device that holds it, so no device ever reads the record"),
        ("unique-external-compared-as-bytes", "files-unique-content", "a save compares an external-storage value's bytes with rows that hold its file's reference, so an insert of unique content another record holds is neither an upsert nor refused"),
    ]

    /// Every canary the library has, in the library's order.
    public static var all: [Entry] {
        Canary.allCases.map { canary in
            let row = table.first { $0.name == canary.rawValue }
            return Entry(canary: canary, summary: row?.summary ?? "(no description)", scenario: row?.scenario ?? "trips")
        }
    }

    /// The entry for a canary name.
    public static func entry(named name: String) -> Entry? { all.first { $0.canary.rawValue == name } }
}
