import Foundation
import Testing
@testable import Replica

/// Three versions of one synced entity: version 2 adds `mood` with default "calm", version 3 changes that default.
struct MoodNoteV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "MoodNote" }
    var id = UUID.unassigned
    var title: String = ""
    static let entity = ModelEntity<MoodNoteV1>([.attribute("title", \.title, default: "")])
}

struct MoodNoteV2: PersistentModel, Codable, Equatable {
    static var entityName: String { "MoodNote" }
    var id = UUID.unassigned
    var title: String = ""
    var mood: String = "calm"
    static let entity = ModelEntity<MoodNoteV2>([.attribute("title", \.title, default: ""), .attribute("mood", \.mood, default: "calm")])
}

struct MoodNoteV3: PersistentModel, Codable, Equatable {
    static var entityName: String { "MoodNote" }
    var id = UUID.unassigned
    var title: String = ""
    var mood: String = "happy"
    static let entity = ModelEntity<MoodNoteV3>([.attribute("title", \.title, default: ""), .attribute("mood", \.mood, default: "happy")])
}

@Suite("Schema versions in sync")
struct SchemaVersionSyncTests {
    /// A field nobody wrote is materialized with the default of the version that merged it; a device that merged an
    /// old record under version 2 must not keep "calm" after upgrading to version 3, while a device that starts at
    /// version 3 shows "happy" (R8: the declared default, that is, the current one).
    @Test("devices on the same schema version agree on a field no writer set, after its default changed")
    func changedDefaultConverges() throws {
        let cloud = InMemoryCloudDatabase()
        let old = try Device("v1", seed: 1, models: [MoodNoteV1.self])
        old.context.insert(MoodNoteV1(title: "written before moods existed"))
        try old.context.save()
        try old.sync(cloud)
        let directory = temporaryTestDirectory()
        do {
            let upgraded = try Device("v2", seed: 2, models: [MoodNoteV2.self], version: Schema.Version(2, 0, 0), directory: directory)
            try upgraded.sync(cloud)
            #expect(try ModelContext(upgraded.container).fetch(MoodNoteV2.self).map(\.mood) == ["calm"])
        }
        let twiceUpgraded = try Device("v2 then v3", seed: 3, models: [MoodNoteV3.self], version: Schema.Version(3, 0, 0), directory: directory)
        try twiceUpgraded.sync(cloud)
        let fresh = try Device("v3", seed: 4, models: [MoodNoteV3.self], version: Schema.Version(3, 0, 0))
        try fresh.sync(cloud)
        let moods = try [twiceUpgraded, fresh].map { try ModelContext($0.container).fetch(MoodNoteV3.self).map(\.mood) }
        #expect(moods[0] == moods[1], "\(moods)")
        #expect(moods[0] == ["happy"])
    }

    @Test("an older device that cannot read a newer version's union schema keeps syncing and leaves that schema alone")
    func newerUnionSchemaSurvivesOlderDevice() throws {
        let cloud = InMemoryCloudDatabase()
        let newer = try Device("v2", seed: 2, models: [SyncNoteV2.self], version: Schema.Version(2, 0, 0))
        newer.context.insert(SyncNoteV2(title: "from a newer version", mood: "happy"))
        try newer.context.save()
        try newer.sync(cloud)
        // Make the union what a future version would write: version 3, and an attribute type this build lacks.
        let written = try #require(try cloud.zoneMetadata("notes")["schema"])
        let future = Data(String(decoding: written, as: UTF8.self)
            .replacingOccurrences(of: #""major":2"#, with: #""major":3"#)
            .replacingOccurrences(of: #""type":"string""#, with: #""type":"decimal""#).utf8)
        #expect(future != written)
        #expect(try cloud.setZoneMetadata("notes", key: "schema", value: future, ifCurrent: written) == future)

        let older = try Device("v1", seed: 1)
        let status = try older.sync(cloud)
        #expect(status.isUpToDate)
        #expect(try older.notes().map(\.title) == ["from a newer version"])
        #expect(try cloud.zoneMetadata("notes")["schema"] == future, "the older device replaced the newer union schema with its own")
    }
}
