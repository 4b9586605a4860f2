// The Codable convenience path: models that adopt CodablePersistentModel are encoded through encode(to:) and must
// store exactly what the key-path path stores.
import Foundation
import Testing
@testable import Replica

/// `Everything`'s fields, stored through `encode(to:)`.
struct EverythingCodable: CodablePersistentModel, Equatable {
    var id = UUID.unassigned
    var string: String = ""
    var int: Int = 0
    var double: Double = 0
    var bool: Bool = false
    var date: Date = Date(timeIntervalSince1970: 0)
    var data: Data = Data()
    var uuid: UUID = .unassigned
    var url: URL = URL(string: "https://example.com")!
    var address: Address = Address(street: "", city: "")
    var optionalString: String?
    var optionalInt: Int?
    var optionalDouble: Double?
    var optionalBool: Bool?
    var optionalDate: Date?
    var optionalData: Data?
    var optionalUUID: UUID?
    var optionalURL: URL?
    var optionalAddress: Address?

    static let entity = ModelEntity<EverythingCodable>([
        .attribute("string", \.string, default: ""),
        .attribute("int", \.int, default: 0),
        .attribute("double", \.double, default: 0),
        .attribute("bool", \.bool, default: false),
        .attribute("date", \.date),
        .attribute("data", \.data),
        .attribute("uuid", \.uuid),
        .attribute("url", \.url),
        .attribute("address", \.address),
        .attribute("optionalString", \.optionalString),
        .attribute("optionalInt", \.optionalInt),
        .attribute("optionalDouble", \.optionalDouble),
        .attribute("optionalBool", \.optionalBool),
        .attribute("optionalDate", \.optionalDate),
        .attribute("optionalData", \.optionalData),
        .attribute("optionalUUID", \.optionalUUID),
        .attribute("optionalURL", \.optionalURL),
        .attribute("optionalAddress", \.optionalAddress),
    ])

    init(_ model: Everything) {
        id = model.id
        string = model.string; int = model.int; double = model.double; bool = model.bool; date = model.date
        data = model.data; uuid = model.uuid; url = model.url; address = model.address
        optionalString = model.optionalString; optionalInt = model.optionalInt; optionalDouble = model.optionalDouble
        optionalBool = model.optionalBool; optionalDate = model.optionalDate; optionalData = model.optionalData
        optionalUUID = model.optionalUUID; optionalURL = model.optionalURL; optionalAddress = model.optionalAddress
    }
}

/// Relationships (optional and required to-one, to-many), a property declared out of attribute order, and a
/// transient property that is encoded but is no attribute.
struct CodableChild: CodablePersistentModel, Equatable {
    var id = UUID.unassigned
    var owner: Reference<CodableOwner>
    var title: String = ""
    var parent: Reference<CodableOwner>?
    var scratch: String = "not stored"
    var children: [Reference<CodableChild>] = []
    var mother: Reference<CodableChild>?

    static let entity = ModelEntity<CodableChild>([
        .attribute("title", \.title, default: ""),
        .toOne("owner", \.owner, inverse: "owned"),
        .toOne("parent", \.parent),
        .toOne("mother", \.mother, inverse: "children"),
        .toMany("children", \.children, inverse: "mother"),
    ])

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(UUID.self, forKey: .id)
        owner = try container.decode(Reference<CodableOwner>.self, forKey: .owner)
        title = try container.decode(String.self, forKey: .title)
        parent = try container.decodeIfPresent(Reference<CodableOwner>.self, forKey: .parent)
        children = try container.decode([Reference<CodableChild>].self, forKey: .children)
        mother = try container.decodeIfPresent(Reference<CodableChild>.self, forKey: .mother)
    }

    init(owner: Reference<CodableOwner>, title: String, parent: Reference<CodableOwner>? = nil) {
        self.owner = owner
        self.title = title
        self.parent = parent
    }
}

struct CodableOwner: CodablePersistentModel, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var owned: [Reference<CodableChild>] = []

    static let entity = ModelEntity<CodableOwner>([
        .attribute("name", \.name),
        .toMany("owned", \.owned, inverse: "owner", deleteRule: .cascade),
    ])
}

/// A custom `encode(to:)` that leaves fields out: they are read through their key paths instead.
struct PartialEncoder: CodablePersistentModel, Equatable {
    var id = UUID.unassigned
    var kept: String = ""
    var skipped: Int = 0
    var skippedOptional: String?

    static let entity = ModelEntity<PartialEncoder>([
        .attribute("kept", \.kept, default: ""),
        .attribute("skipped", \.skipped, default: 0),
        .attribute("skippedOptional", \.skippedOptional),
    ])

    private enum CodingKeys: String, CodingKey { case id, kept, skipped, skippedOptional }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(kept, forKey: .kept)
    }

    init(kept: String, skipped: Int, skippedOptional: String?) {
        self.kept = kept
        self.skipped = skipped
        self.skippedOptional = skippedOptional
    }
}

@Suite("Codable encoding path")
struct CodableEncodingTests {
    let directory = TestDirectory()

    /// What the key-path getters store for `model`.
    func typedValues<Model: PersistentModel>(_ model: Model) -> [SQLiteValue] {
        Model.entity.fieldEncoders.map { $0(model) }
    }

    @Test("a CodablePersistentModel stores exactly what its key paths store, for every attribute type")
    func sameValuesAsKeyPaths() {
        #expect(EverythingCodable.entity.codableEncoder != nil)
        #expect(Everything.entity.codableEncoder == nil)
        for sample in ModelTests.samples {
            let codable = EverythingCodable(sample)
            let values = EverythingCodable.entity.snapshot(of: codable).values
            #expect(values == typedValues(codable))
            #expect(values == Everything.entity.snapshot(of: sample).values)
        }
    }

    @Test("references: an optional one as its ID or NULL, a required one not yet set as NULL; to-many and transient properties are skipped")
    func relationshipsAndTransientProperties() throws {
        let ownerID = try #require(UUID(uuidString: "01890000-0000-7000-8000-0000000000AA"))
        var child = CodableChild(owner: Reference(ownerID), title: "t", parent: Reference(ownerID))
        child.children = [Reference(UUID())]
        var values = CodableChild.entity.snapshot(of: child).values
        #expect(values == typedValues(child))
        #expect(values == [.text("t"), ownerID.sqliteValue, ownerID.sqliteValue, .null])

        let unset = CodableChild(owner: Reference(UUID.unassigned), title: "")
        values = CodableChild.entity.snapshot(of: unset).values
        #expect(values == typedValues(unset))
        #expect(values == [.text(""), .null, .null, .null])
    }

    @Test("fields a custom encode(to:) leaves out are read through their key paths")
    func unwrittenFieldsFallBackToKeyPaths() {
        let model = PartialEncoder(kept: "k", skipped: 7, skippedOptional: "o")
        #expect(PartialEncoder.entity.snapshot(of: model).values == [.text("k"), .integer(7), .text("o")])
        let empty = PartialEncoder(kept: "", skipped: 0, skippedOptional: nil)
        #expect(PartialEncoder.entity.snapshot(of: empty).values == [.text(""), .integer(0), .null])
    }

    @Test("a CodablePersistentModel round-trips through a store, updates included")
    func roundTrip() throws {
        let container = try ModelContainer(for: EverythingCodable.self, CodableOwner.self, CodableChild.self,
                                           environment: directory.environment())
        let context = ModelContext(container)
        let saved = ModelTests.samples.map { context.insert(EverythingCodable($0)) }
        let owner = context.insert(CodableOwner(name: "o"))
        let child = context.insert(CodableChild(owner: Reference(owner), title: "c"))
        try context.save()

        let reader = ModelContext(container)
        for model in saved {
            #expect(try reader.model(EverythingCodable.self, id: model.id) == model)
        }
        var fetchedChild = try #require(try reader.model(CodableChild.self, id: child.id))
        #expect(fetchedChild.owner == Reference(owner))
        #expect(try reader.model(CodableOwner.self, id: owner.id)?.owned == [Reference(child)])

        fetchedChild.title = "renamed"
        reader.update(fetchedChild)
        try reader.save()
        let history = try reader.fetchHistory()
        #expect(history.last?.changes == [.update(child.persistentModelID, updatedAttributes: ["title"])])
        #expect(try ModelContext(container).model(CodableChild.self, id: child.id)?.title == "renamed")
    }
}
