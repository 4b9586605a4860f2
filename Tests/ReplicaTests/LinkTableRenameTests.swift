// Many-to-many link tables under entity renames: a local store moves the links to the link table of the new name
// (renamed, or copied with its sides exchanged when the rename changes which side owns the table); a synced entity
// cannot be renamed, so its link table and cloud names stay.
import Foundation
import Testing
@testable import Replica

private struct BandV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Band" }
    var id = UUID.unassigned
    var name: String = ""
    var members: [Reference<MusicianV1>] = []
    static let entity = ModelEntity<BandV1>([
        .attribute("name", \.name, default: ""),
        .toMany("members", \.members, inverse: "bands"),
    ])
}

private struct MusicianV1: PersistentModel, Codable, Equatable {
    static var entityName: String { "Musician" }
    var id = UUID.unassigned
    var name: String = ""
    var bands: [Reference<BandV1>] = []
    static let entity = ModelEntity<MusicianV1>([
        .attribute("name", \.name, default: ""),
        .toMany("bands", \.bands, inverse: "members"),
    ])
}

/// `Band` renamed `Group`: ("Group", "members") still sorts before ("Musician", "bands"), so the group side keeps
/// owning the link table, now `replica_link_Group_members`.
private struct Group: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var members: [Reference<MusicianOfGroup>] = []
    static let entity = ModelEntity<Group>([
        .attribute("name", \.name, default: ""),
        .toMany("members", \.members, inverse: "bands"),
    ], originalName: "Band")
}

private struct MusicianOfGroup: PersistentModel, Codable, Equatable {
    static var entityName: String { "Musician" }
    var id = UUID.unassigned
    var name: String = ""
    var bands: [Reference<Group>] = []
    static let entity = ModelEntity<MusicianOfGroup>([
        .attribute("name", \.name, default: ""),
        .toMany("bands", \.bands, inverse: "members"),
    ])
}

/// `Musician` renamed `Artist`: ("Artist", "bands") sorts before ("Band", "members"), so the rename makes the artist
/// side the owner of the link table `replica_link_Artist_bands`.
private struct BandOfArtists: PersistentModel, Codable, Equatable {
    static var entityName: String { "Band" }
    var id = UUID.unassigned
    var name: String = ""
    var members: [Reference<Artist>] = []
    static let entity = ModelEntity<BandOfArtists>([
        .attribute("name", \.name, default: ""),
        .toMany("members", \.members, inverse: "bands"),
    ])
}

private struct Artist: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var bands: [Reference<BandOfArtists>] = []
    static let entity = ModelEntity<Artist>([
        .attribute("name", \.name, default: ""),
        .toMany("bands", \.bands, inverse: "members"),
    ], originalName: "Musician")
}

@Suite("Many-to-many link tables under renames")
struct LinkTableRenameTests {
    let directory = TestDirectory()

    /// Two bands and three musicians, linked: A–{x, y}, B–{y, z}. Returns the IDs by name.
    private func makeV1Store() throws -> [String: UUID] {
        let container = try ModelContainer(for: BandV1.self, MusicianV1.self, environment: directory.environment(seed: 1))
        let context = ModelContext(container)
        let musicians = ["x", "y", "z"].map { context.insert(MusicianV1(name: $0)) }
        let a = context.insert(BandV1(name: "A", members: [Reference(musicians[0]), Reference(musicians[1])]))
        let b = context.insert(BandV1(name: "B", members: [Reference(musicians[1]), Reference(musicians[2])]))
        try context.save()
        var ids = ["A": a.id, "B": b.id]
        for musician in musicians { ids[musician.name] = musician.id }
        return ids
    }

    private func linkTables() throws -> [String] {
        try rawConnection(directory.storeURL(), readOnly: true)
            .rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'replica\\_link\\_%' ESCAPE '\\' ORDER BY name")
            .compactMap { if case let .text(name) = $0[0] { name } else { nil } }
    }

    @Test("an entity rename that keeps the owner side renames the link table; every link is still there from both sides")
    func renameKeepingOwner() throws {
        let ids = try makeV1Store()
        let container = try ModelContainer(for: Group.self, MusicianOfGroup.self, environment: directory.environment(seed: 2))
        let context = ModelContext(container)
        var groups: [String: Set<UUID>] = [:]
        for group in try context.fetch(Group.self) { groups[group.name] = Set(group.members.map(\.id)) }
        #expect(groups == ["A": [ids["x"]!, ids["y"]!], "B": [ids["y"]!, ids["z"]!]])
        var musicians: [String: Set<UUID>] = [:]
        for musician in try context.fetch(MusicianOfGroup.self) { musicians[musician.name] = Set(musician.bands.map(\.id)) }
        #expect(musicians == ["x": [ids["A"]!], "y": [ids["A"]!, ids["B"]!], "z": [ids["B"]!]])
        #expect(try linkTables() == ["replica_link_Group_members"])
        let indexes = try rawConnection(directory.storeURL(), readOnly: true)
            .rows("SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'replica\\_link\\_%' ESCAPE '\\' ORDER BY name").map(\.[0])
        #expect(indexes == [.text("replica_link_Group_members_member")])
        // Reopening moves nothing again, and new links go to the renamed table.
        var a = try #require(try context.fetch(Group.self).first { $0.name == "A" })
        a.members.append(Reference(ids["z"]!))
        context.update(a)
        try context.save()
        let again = try ModelContainer(for: Group.self, MusicianOfGroup.self, environment: directory.environment(seed: 3))
        #expect(try ModelContext(again).fetch(Group.self).first { $0.name == "A" }.map { Set($0.members.map(\.id)) }
                == [ids["x"]!, ids["y"]!, ids["z"]!])
    }

    @Test("an entity rename that makes the other side the owner copies the links with the sides exchanged and drops the old table")
    func renameSwappingOwner() throws {
        let ids = try makeV1Store()
        let container = try ModelContainer(for: BandOfArtists.self, Artist.self, environment: directory.environment(seed: 2))
        let context = ModelContext(container)
        var bands: [String: Set<UUID>] = [:]
        for band in try context.fetch(BandOfArtists.self) { bands[band.name] = Set(band.members.map(\.id)) }
        #expect(bands == ["A": [ids["x"]!, ids["y"]!], "B": [ids["y"]!, ids["z"]!]])
        var artists: [String: Set<UUID>] = [:]
        for artist in try context.fetch(Artist.self) { artists[artist.name] = Set(artist.bands.map(\.id)) }
        #expect(artists == ["x": [ids["A"]!], "y": [ids["A"]!, ids["B"]!], "z": [ids["B"]!]])
        #expect(try linkTables() == ["replica_link_Artist_bands"])
        // The owner column now holds artists.
        let owners = try rawConnection(directory.storeURL(), readOnly: true)
            .rows("SELECT DISTINCT owner FROM replica_link_Artist_bands").compactMap { try? UUID(sqliteValue: $0[0]) }
        #expect(Set(owners) == [ids["x"]!, ids["y"]!, ids["z"]!])
        // Queries through the relationship use the new table.
        let withY = try context.fetch(FetchDescriptor<BandOfArtists>()).filter { $0.members.contains { $0.id == ids["y"]! } }
        #expect(withY.count == 2)
    }

    @Test("a synced many-to-many entity cannot be renamed: the cloud record type and the link field keep their names")
    func syncedRenameRefused() throws {
        let error = #expect(throws: ReplicaError.self) {
            _ = try Device("renamed", seed: 1, models: [Group.self, MusicianOfGroup.self])
        }
        guard case let .invalidSchema(validation)? = error else {
            Issue.record("expected an invalid schema, got \(String(describing: error))")
            return
        }
        #expect(validation.violations.contains(.syncedRename(entity: "Group", member: nil, originalName: "Band")))
    }
}
