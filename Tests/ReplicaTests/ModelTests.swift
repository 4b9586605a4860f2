// Models: PersistentModel, PersistentIdentifier, Reference, Snapshot, and a round trip of every attribute type through a
// store, by the default Decodable path and by a hand-written init(row:).
import Foundation
import Testing
@testable import Replica

@Suite("Models")
struct ModelTests {
    let directory = TestDirectory()

    // MARK: Identity

    @Test func entityNameDefaultsToTheTypeName() {
        #expect(Trip.entityName == "Trip")
        #expect(Trip.schemaEntity.name == "Trip")
        struct Renamed: PersistentModel, Codable {
            static var entityName: String { "Custom" }
            var id = UUID.unassigned
            static let entity = ModelEntity<Renamed>([])
        }
        #expect(Renamed.schemaEntity.name == "Custom")
        #expect(Renamed().persistentModelID.entityName == "Custom")
    }

    @Test func persistentIdentifierOrdersByEntityThenIDBytes() throws {
        let low = try #require(UUID(uuidString: "00000000-0000-7000-8000-000000000001"))
        let high = try #require(UUID(uuidString: "FF000000-0000-7000-8000-000000000000"))
        #expect(PersistentIdentifier(entityName: "A", id: low) < PersistentIdentifier(entityName: "A", id: high))
        #expect(PersistentIdentifier(entityName: "A", id: high) < PersistentIdentifier(entityName: "B", id: low))
        #expect(!(PersistentIdentifier(entityName: "A", id: low) < PersistentIdentifier(entityName: "A", id: low)))
        let id = PersistentIdentifier(entityName: "Trip", id: high)
        #expect(id.description == "Trip/ff000000-0000-7000-8000-000000000000")
        #expect(id == PersistentIdentifier(entityName: "Trip", id: high))
        #expect(id != PersistentIdentifier(entityName: "Item", id: high))
        let decoded = try JSONDecoder().decode(PersistentIdentifier.self, from: JSONEncoder().encode(id))
        #expect(decoded == id)

        var trip = Trip(name: "x")
        trip.id = high
        #expect(trip.persistentModelID == id)
        #expect(Reference(trip).persistentModelID == id)
        #expect(Reference<Trip>(high).description == id.description)
    }

    @Test func unassignedIsTheNilUUID() {
        #expect(UUID.unassigned.uuidString == "00000000-0000-0000-0000-000000000000")
        #expect(Trip().id == .unassigned)
    }

    @Test func snapshotHoldsFieldsInStorageOrder() throws {
        let folder = try #require(UUID(uuidString: "01890000-0000-7000-8000-0000000000AA"))
        var document = Document(title: "Plan", folder: Reference(folder))
        document.id = try #require(UUID(uuidString: "01890000-0000-7000-8000-0000000000BB"))
        document.pages = [Reference(UUID())]
        let snapshot = Document.entity.snapshot(of: document)
        #expect(snapshot.entityName == "Document")
        #expect(snapshot.id == document.id)
        #expect(snapshot.persistentModelID == document.persistentModelID)
        // Attributes, then to-one references as 16-byte blobs; to-many relationships are not part of the record.
        #expect(snapshot.values == [.text("Plan"), folder.sqliteValue])
        #expect(Document.entity.fieldName(for: \Document.title) == "title")
        #expect(Document.entity.fieldName(for: \Document.folder) == "folder")
        #expect(Document.entity.fieldName(for: \Document.pages) == nil)

        var orphan = document
        orphan.folder = nil
        #expect(Document.entity.snapshot(of: orphan).values == [.text("Plan"), .null])
    }

    @Test func storedFormOfEveryAttributeType() throws {
        let uuid = try #require(UUID(uuidString: "00112233-4455-6677-8899-AABBCCDDEEFF"))
        let model = Everything(string: "s", int: -3, double: 2.5, bool: true, date: Date(timeIntervalSince1970: 86_400.25),
                               data: Data([9]), uuid: uuid, url: URL(string: "https://example.com/a?b=c#d")!,
                               address: Address(street: "1 Main St", city: "Springfield", postalCode: 12345))
        let values = Everything.entity.snapshot(of: model).values
        #expect(Array(values.prefix(9)) == [
            .text("s"), .integer(-3), .real(2.5), .integer(1), .real(86_400.25), .blob(Data([9])),
            .blob(Data([0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF])),
            .text("https://example.com/a?b=c#d"),
            .text(#"{"city":"Springfield","postalCode":12345,"street":"1 Main St"}"#),
        ])
        #expect(values.dropFirst(9).allSatisfy { $0.isNull })
    }

    // MARK: Round trips through a store

    /// Models that exercise edge values of every attribute type.
    static let samples: [Everything] = [
        // Empty values and nil optionals.
        Everything(),
        // Typical values, every optional set.
        Everything(
            string: "Reykjavík 🌋 \"quoted\" 'single' \n newline", int: .max, double: -1234.5678, bool: true,
            date: Date(timeIntervalSince1970: 1_767_225_600.123456), data: Data((0...255).map { UInt8($0) }),
            uuid: UUID(uuidString: "01890000-1111-7222-8333-444455556666")!,
            url: URL(string: "https://user@example.com:8443/path/to%20file?query=a&b=%C3%A9#fragment")!,
            address: Address(street: "Laugavegur 1", city: "Reykjavík", postalCode: 101),
            optionalString: "", optionalInt: .min, optionalDouble: 0.1, optionalBool: false,
            optionalDate: Date(timeIntervalSince1970: -1_000_000.5), optionalData: Data(),
            optionalUUID: UUID(uuidString: "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF")!,
            optionalURL: URL(fileURLWithPath: "/tmp/some dir/file.txt"),
            optionalAddress: Address(street: "", city: "", postalCode: nil)),
        // Extreme numbers and dates, composite with unicode, a URL with only a scheme-specific part.
        Everything(
            string: String(repeating: "x", count: 10_000), int: .min, double: .greatestFiniteMagnitude, bool: false,
            date: Date(timeIntervalSince1970: 4_102_444_800.000001), data: Data([0]), uuid: .unassigned,
            url: URL(string: "mailto:someone@example.com")!,
            address: Address(street: "Straße \"7\" / ü", city: "東京", postalCode: -1),
            optionalString: "0", optionalInt: 0, optionalDouble: -0.0, optionalBool: true,
            optionalDate: Date(timeIntervalSince1970: 0), optionalData: Data(repeating: 0, count: 3),
            optionalUUID: .unassigned, optionalURL: URL(string: "urn:isbn:0451450523")!,
            optionalAddress: Address(street: "a", city: "b", postalCode: 0)),
    ]

    private func roundTrip<Model: PersistentModel & Equatable>(_ models: [Model], seed: UInt64) throws {
        let environment = directory.environment(seed: seed)
        var ids: [UUID] = []
        do {
            let container = try ModelContainer(for: Model.self, environment: environment)
            let context = ModelContext(container)
            ids = models.map { context.insert($0).id }
            try context.save()
        }
        // A new container on the same file reads what the first one wrote.
        let container = try ModelContainer(for: Model.self, environment: environment)
        let context = ModelContext(container)
        for (model, id) in zip(models, ids) {
            var expected = model
            expected.id = id
            let fetched = try #require(try context.model(Model.self, id: id))
            #expect(fetched == expected)
        }
        let all = try context.fetch(Model.self)
        #expect(all.count == models.count)
        #expect(Set(all.map(\.id)) == Set(ids))
    }

    @Test func everyAttributeTypeRoundTripsThroughDecodable() throws {
        try roundTrip(Self.samples, seed: 1)
    }

    @Test func everyAttributeTypeRoundTripsThroughHandWrittenInit() throws {
        try roundTrip(Self.samples.map(EverythingFast.init), seed: 2)
    }

    @Test func emptyStringAndEmptyDataStayValuesNotNull() throws {
        let container = try ModelContainer(for: Everything.self, environment: directory.environment())
        let context = ModelContext(container)
        let model = context.insert(Everything(string: "", data: Data(), optionalString: "", optionalData: Data()))
        try context.save()
        let db = try rawConnection(directory.storeURL())
        let row = try #require(try db.rows(#"SELECT "string", "data", "optionalString", "optionalData", "optionalInt" FROM "Everything" WHERE "id" = ?"#,
                                           [model.id.sqliteValue]).first)
        // `data` is marked external storage: the row references an empty file (see Specs/external-storage.md).
        #expect(row == [.text(""), .text(AssetStore.reference(for: Data())), .text(""), .blob(Data()), .null])
        let fetched = try #require(try ModelContext(container).model(Everything.self, id: model.id))
        #expect(fetched.data == Data())
        #expect(fetched.optionalString == "")
        #expect(fetched.optionalData == Data())
        #expect(fetched.optionalInt == nil)
    }

    @Test func datesKeepSubMillisecondPrecision() throws {
        let dates = [
            Date(timeIntervalSince1970: 1_767_225_600.123456),
            Date(timeIntervalSince1970: 1_767_225_600.000001),
            Date(timeIntervalSince1970: 0.5),
            Date(timeIntervalSince1970: -86_400.75),
            Date(timeIntervalSinceReferenceDate: 0),
            Date(timeIntervalSinceReferenceDate: 789_000_000.25),
        ]
        let container = try ModelContainer(for: Everything.self, environment: directory.environment())
        let context = ModelContext(container)
        let ids = dates.map { context.insert(Everything(date: $0, optionalDate: $0)).id }
        try context.save()
        let reader = ModelContext(container)
        for (date, id) in zip(dates, ids) {
            let fetched = try #require(try reader.model(Everything.self, id: id))
            #expect(fetched.date == date)
            #expect(fetched.optionalDate == date)
        }
        // A date taken from the reference-date clock (like `Date()`) is stored as seconds since 1970 in a Double, which
        // keeps it to well under a microsecond (not always to the last bit: see the storage table on AttributeType).
        let arbitrary = Date(timeIntervalSinceReferenceDate: 789_000_000.123456789)
        let arbitraryID = context.insert(Everything(date: arbitrary)).id
        try context.save()
        let fetched = try #require(try ModelContext(container).model(Everything.self, id: arbitraryID))
        #expect(abs(fetched.date.timeIntervalSince(arbitrary)) < 1e-6)

        // Dates are stored as REAL seconds since 1970, readable by SQLite's date functions.
        let db = try rawConnection(directory.storeURL())
        #expect(try db.scalar(#"SELECT datetime("date", 'unixepoch') FROM "Everything" WHERE "id" = ?"#, [ids[0].sqliteValue])
                == .text("2026-01-01 00:00:00"))
    }

    @Test func storedValuesOfTheWrongTypeAreReportedWithoutTheValue() throws {
        let container = try ModelContainer(for: Everything.self, EverythingFast.self, environment: directory.environment())
        let context = ModelContext(container)
        let slow = context.insert(Everything())
        let fast = context.insert(EverythingFast())
        try context.save()
        let db = try rawConnection(directory.storeURL())
        let secret = "top-secret-value"
        try db.run(#"UPDATE "Everything" SET "int" = ? WHERE "id" = ?"#, [.text(secret), slow.id.sqliteValue])
        try db.run(#"UPDATE "EverythingFast" SET "int" = ? WHERE "id" = ?"#, [.text(secret), fast.id.sqliteValue])

        for read in [{ _ = try ModelContext(container).model(Everything.self, id: slow.id) },
                     { _ = try ModelContext(container).model(EverythingFast.self, id: fast.id) }] {
            let error = #expect(throws: ReplicaError.self) { try read() }
            guard case let .valueConversion(conversion)? = error else {
                Issue.record("expected .valueConversion, got \(String(describing: error))")
                continue
            }
            #expect(conversion.expected == "Int")
            #expect(conversion.found == "TEXT(16 bytes)")
            #expect(conversion.attribute?.contains("Everything") == true)
            #expect(error?.description.contains(secret) == false)
        }
    }

    @Test func handWrittenInitReadsByPositionAndName() throws {
        let row = ModelRow(id: .unassigned, values: [.text("a"), .integer(2), .null], entityName: "E",
                           fieldIndexByName: ["a": 0, "b": 1, "c": 2])
        #expect(row[0] == .text("a"))
        #expect(row["b"] == .integer(2))
        #expect(row["zzz"] == nil)
        #expect(try row.decode(String.self, at: 0) == "a")
        #expect(try row.decode(Int.self, named: "b") == 2)
        #expect(try row.decode(String?.self, named: "c") == nil)
        let missing = #expect(throws: ValueConversionError.self) { try row.decode(Int.self, named: "zzz") }
        #expect(missing?.attribute?.contains("zzz") == true)
        let wrongType = #expect(throws: ValueConversionError.self) { try row.decode(Int.self, at: 0) }
        #expect(wrongType?.found == "TEXT(1 bytes)")
        #expect(throws: ValueConversionError.self) { try row.decode(String.self, at: 2) }
    }

    @Test func toManyReferencesAreFilledForBothDecodingPaths() throws {
        struct FastTrip: PersistentModel {
            static var entityName: String { "Trip" }
            var id = UUID.unassigned
            var name = ""
            var items: [Reference<Item>] = []
            static let entity = ModelEntity<FastTrip>([
                .attribute("name", \.name, default: ""),
                .attribute("destination", \FastTrip.destinationPlaceholder),
                .attribute("rating", \.rating, default: 0),
                .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
            ])
            var destinationPlaceholder: String?
            var rating = 0
            init() {}
            init(row: ModelRow) throws {
                id = row.id
                name = try row.decode(at: 0)
                // Every field is read: a field left out would be overwritten when the model is saved back (the
                // container's declaration check reports it).
                destinationPlaceholder = try row.decode(named: "destination")
                rating = try row.decode(named: "rating")
                items = row.references("items")
            }
        }
        let container = try ModelContainer(for: Trip.self, Item.self, environment: directory.environment())
        let context = ModelContext(container)
        let trip = context.insert(Trip(name: "T"))
        let first = context.insert(Item(title: "1", trip: Reference(trip)))
        let second = context.insert(Item(title: "2", trip: Reference(trip)))
        context.insert(Item(title: "unrelated"))
        try context.save()

        let reader = ModelContext(container)
        let decoded = try #require(try reader.model(Trip.self, id: trip.id))
        #expect(decoded.items.map(\.id) == [first.id, second.id])
        // The same table read through a hand-written initializer.
        let fastContainer = try ModelContainer(for: FastTrip.self, Item.self, environment: directory.environment(seed: 9))
        let fast = try #require(try ModelContext(fastContainer).model(FastTrip.self, id: trip.id))
        #expect(fast.name == "T")
        #expect(fast.items.map(\.id) == [first.id, second.id])
    }

    @Test func notANumberIsRefusedOnSave() throws {
        // SQLite stores a bound NaN as NULL (https://www.sqlite.org/datatype3.html), which would make the record
        // unreadable: a save refuses it with a typed validation failure and writes nothing.
        let container = try ModelContainer(for: Everything.self, environment: directory.environment())
        let context = ModelContext(container)
        let record = context.insert(Everything(double: .nan))
        #expect(throws: ReplicaError.modelValidationFailure([
            .unrepresentableValue(entity: "Everything", attribute: "double", id: record.persistentModelID),
        ])) { try context.save() }
        #expect(try ModelContext(container).fetch(Everything.self).isEmpty)
    }
}
