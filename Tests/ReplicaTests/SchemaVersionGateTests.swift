// The zone's union schema and Schema.version (Specs R13): a build that adds to the schema without raising the version
// is refused before it uploads anything, so it cannot make older devices look like they removed what they never had.
import Foundation
import Testing
@testable import Replica

/// Version 1 of a note.
private struct NoteV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var title: String = ""
    static let entity = ModelEntity<NoteV1>([
        .attribute("title", \.title, default: ""),
    ])
}

/// Version 2 of the note: one more attribute (and, in the same build, a new entity ``Reminder``).
private struct NoteV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "Note" }
    var id = UUID.unassigned
    var title: String = ""
    var color: String = "yellow"
    static let entity = ModelEntity<NoteV2>([
        .attribute("title", \.title, default: ""),
        .attribute("color", \.color, default: "yellow"),
    ])
}

/// An entity only version 2 has.
private struct Reminder: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<Reminder>([
        .attribute("text", \.text, default: ""),
    ])
}

private let v1Models: [any PersistentModel.Type] = [NoteV1.self]
private let v2Models: [any PersistentModel.Type] = [NoteV2.self, Reminder.self]
private let one = Schema.Version(1, 0, 0)

@Suite("Schema versions at the gate")
struct SchemaVersionGateTests {
    @Test("a build that adds an attribute and an entity but keeps version 1.0.0 is refused before it uploads, and v1 devices keep syncing")
    func additionsWithoutNewVersionRefused() throws {
        let cloud = InMemoryCloudDatabase()
        let v1 = try Device("v1", seed: 1, models: v1Models, version: one)
        v1.context.insert(NoteV1(title: "from v1"))
        try v1.context.save()
        try v1.sync(cloud)
        let before = cloud.storedBytes(of: "notes")
        let schemaBefore = try cloud.zoneMetadata("notes")["schema"]

        let v2 = try Device("v2", seed: 2, models: v2Models, version: one)
        v2.context.insert(NoteV2(title: "from v2", color: "red"))
        v2.context.insert(Reminder(text: "call"))
        try v2.context.save()
        let expected = ReplicaError.incompatibleSchema([
            .addedWithoutRaisingVersion(additions: ["Note.color", "entity Reminder"], version: one, zoneVersion: one),
        ])
        #expect(throws: expected) { try v2.sync(cloud) }
        #expect(try v2.engine.status().blockedBy == expected)
        #expect(expected.description == "schema incompatible with the zone: this device adds Note.color and entity Reminder "
                + "without raising Schema.version above 1.0.0 (the zone's version)")
        #expect(cloud.storedBytes(of: "notes") == before)  // no union written, no record sent
        #expect(try cloud.zoneMetadata("notes")["schema"] == schemaBefore)

        // The v1 device is not blocked, and keeps syncing.
        v1.context.insert(NoteV1(title: "still from v1"))
        try v1.context.save()
        let status = try v1.sync(cloud)
        #expect(status.blockedBy == nil)
        #expect(status.isUpToDate)
        #expect(cloud.records(in: "notes").count == 2)
        // Nor is a v1 device that starts now (the report: every v1 device was blocked).
        let later = try Device("v1 later", seed: 3, models: v1Models, version: one)
        let laterStatus = try later.sync(cloud)
        #expect(laterStatus.blockedBy == nil)
        #expect(try ModelContext(later.container).fetch(NoteV1.self).count == 2)
    }

    @Test("the same build with the version raised to 1.1.0 syncs with v1 devices both ways")
    func additionsWithNewVersionAccepted() throws {
        let cloud = InMemoryCloudDatabase()
        let v1 = try Device("v1", seed: 1, models: v1Models, version: one)
        v1.context.insert(NoteV1(title: "from v1"))
        try v1.context.save()
        try v1.sync(cloud)
        let v2 = try Device("v2", seed: 2, models: v2Models, version: Schema.Version(1, 1, 0))
        v2.context.insert(NoteV2(title: "from v2", color: "red"))
        v2.context.insert(Reminder(text: "call"))
        try v2.context.save()
        #expect(try v2.sync(cloud).isUpToDate)
        #expect(try v1.sync(cloud).isUpToDate)
        #expect(try Set(ModelContext(v1.container).fetch(NoteV1.self).map(\.title)) == ["from v1", "from v2"])
        #expect(try Set(ModelContext(v2.container).fetch(NoteV2.self).map(\.title)) == ["from v1", "from v2"])
    }

    @Test("the first device on an empty zone and a device reopening with the same schema are not refused")
    func firstDeviceAndReopenAccepted() throws {
        let cloud = InMemoryCloudDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("replica-version-gate-\(UUID().uuidString)")
        do {
            let first = try Device("first", seed: 1, models: v2Models, version: one, directory: directory)
            first.context.insert(NoteV2(title: "first"))
            try first.context.save()
            #expect(try first.sync(cloud).blockedBy == nil)
        }
        let reopened = try Device("first", seed: 1, models: v2Models, version: one, directory: directory)
        reopened.context.insert(NoteV2(title: "after reopening"))
        try reopened.context.save()
        let status = try reopened.sync(cloud)
        #expect(status.blockedBy == nil)
        #expect(status.isUpToDate)
        #expect(cloud.records(in: "notes").count == 2)
        // A second device with the same schema and version is not refused either.
        let twin = try Device("twin", seed: 3, models: v2Models, version: one)
        #expect(try twin.sync(cloud).isUpToDate)
        #expect(try ModelContext(twin.container).fetch(NoteV2.self).count == 2)
    }

    @Test("a device refused for lacking what the zone has is told both versions")
    func removalNamesVersions() throws {
        // A zone written by a build that mislabelled its additions before the gate refused that (or by a newer build
        // at the same version): the v1 device is refused, and the message names both versions.
        let cloud = InMemoryCloudDatabase()
        let v2 = try Device("v2", seed: 2, models: v2Models, version: one)
        try v2.sync(cloud)
        let v1 = try Device("v1", seed: 1, models: v1Models, version: one)
        let expected = ReplicaError.incompatibleSchema([
            .attributeRemoved(entity: "Note", attribute: "color"),
            .entityRemoved("Reminder"),
            .versions(device: one, zone: one),
        ])
        #expect(throws: expected) { try v1.sync(cloud) }
        #expect(expected.description.hasSuffix("; this device declares 1.0.0; the zone was written by 1.0.0"))
        #expect(SchemaDifference.versions(device: one, zone: Schema.Version(1, 1, 0)).description
                == "this device declares 1.0.0; the zone was written by 1.1.0")
    }
}
