// Shared models and helpers of the persistence-core tests.
import Foundation
import Testing
@testable import Replica

// MARK: - Temporary directories and environments

/// A fresh directory under the system temporary directory, removed when the value is released.
///
/// Suites hold one as a stored property: Swift Testing creates a new suite instance for every test, so every test gets
/// its own directory (and so its own store files).
final class TestDirectory: Sendable {
    let url: URL

    init() {
        url = FileManager.default.temporaryDirectory
            .appendingPathComponent("replica-tests", isDirectory: true)
            .appendingPathComponent(UUID().uuidString, isDirectory: true)
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    /// A seeded environment whose default store directory (and app groups) live in this directory.
    func environment(seed: UInt64 = 1) -> ReplicaEnvironment {
        .seeded(seed: seed, directory: url)
    }

    /// The default store file of configuration `name`.
    func storeURL(_ name: String = "default") -> URL {
        url.appendingPathComponent("\(name).store")
    }
}

/// Opens a separate, raw connection to a store file (as another process would).
func rawConnection(_ url: URL, readOnly: Bool = false) throws -> Connection {
    try Connection(location: .file(url), readOnly: readOnly)
}

/// The names of the user tables of a store file, sorted.
/// The entity tables of a store file plus `replica_metadata` (history and sync bookkeeping tables left out).
func tableNames(in url: URL) throws -> [String] {
    let db = try rawConnection(url, readOnly: true)
    return try db.rows("""
        SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
          AND (name NOT LIKE 'replica_%' OR name = 'replica_metadata') ORDER BY name
        """).map { row in
        guard case let .text(name) = row[0] else { return "?" }
        return name
    }
}

/// The number of rows of `table` in a store file, read through a raw connection.
func rowCount(_ table: String, in url: URL) throws -> Int64 {
    let db = try rawConnection(url, readOnly: true)
    guard case let .integer(count)? = try db.scalar("SELECT count(*) FROM \(quoted(table))") else { return -1 }
    return count
}

extension ReplicaError {
    /// The validation failures of a `.modelValidationFailure`, or `[]`.
    var validationFailures: [ModelValidationFailure] {
        if case let .modelValidationFailure(failures) = self { return failures }
        return []
    }

    /// The violations of an `.invalidSchema`, or `[]`.
    var schemaViolations: [SchemaViolation] {
        if case let .invalidSchema(error) = self { return error.violations }
        return []
    }
}

// MARK: - Every attribute type

/// A composite attribute: a `Codable` struct stored inline as JSON.
struct Address: CompositeAttribute {
    var street: String
    var city: String
    var postalCode: Int?
}

/// A model with one attribute of every type, required and optional, read through the default `Decodable` path.
struct Everything: PersistentModel, Codable, Equatable {
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

    static let entity = ModelEntity<Everything>([
        .attribute("string", \.string, default: ""),
        .attribute("int", \.int, default: 0),
        .attribute("double", \.double, default: 0),
        .attribute("bool", \.bool, default: false),
        .attribute("date", \.date),
        .attribute("data", \.data, options: .externalStorage),
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
}

/// The same fields as ``Everything``, read through a hand-written `init(row:)` (by position and by name).
/// It is deliberately not `Decodable`, so the hand-written initializer is the only way to read it.
struct EverythingFast: PersistentModel, Equatable {
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

    static let entity = ModelEntity<EverythingFast>([
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
}

extension EverythingFast {
    init(row: ModelRow) throws {
        id = row.id
        string = try row.decode(at: 0)
        int = try row.decode(at: 1)
        double = try row.decode(at: 2)
        bool = try row.decode(at: 3)
        date = try row.decode(at: 4)
        data = try row.decode(at: 5)
        uuid = try row.decode(at: 6)
        url = try row.decode(at: 7)
        address = try row.decode(at: 8)
        optionalString = try row.decode(named: "optionalString")
        optionalInt = try row.decode(named: "optionalInt")
        optionalDouble = try row.decode(named: "optionalDouble")
        optionalBool = try row.decode(named: "optionalBool")
        optionalDate = try row.decode(named: "optionalDate")
        optionalData = try row.decode(named: "optionalData")
        optionalUUID = try row.decode(named: "optionalUUID")
        optionalURL = try row.decode(named: "optionalURL")
        optionalAddress = try row.decode(named: "optionalAddress")
    }

    /// The same values as `model`.
    init(_ model: Everything) {
        self.init(
            id: model.id, string: model.string, int: model.int, double: model.double, bool: model.bool, date: model.date,
            data: model.data, uuid: model.uuid, url: model.url, address: model.address,
            optionalString: model.optionalString, optionalInt: model.optionalInt, optionalDouble: model.optionalDouble,
            optionalBool: model.optionalBool, optionalDate: model.optionalDate, optionalData: model.optionalData,
            optionalUUID: model.optionalUUID, optionalURL: model.optionalURL, optionalAddress: model.optionalAddress)
    }
}

// MARK: - Trips: a to-many relationship with a cascade rule (synced-compatible)

struct Trip: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var destination: String?
    var rating: Int = 0
    var items: [Reference<Item>] = []

    static let entity = ModelEntity<Trip>([
        .attribute("name", \.name, default: "", options: .preserveValueOnDeletion),
        .attribute("destination", \.destination),
        .attribute("rating", \.rating, default: 0),
        .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
    ])
}

struct Item: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var trip: Reference<Trip>?

    static let entity = ModelEntity<Item>([
        .attribute("title", \.title, default: ""),
        .toOne("trip", \.trip, inverse: "items"),
    ])
}

/// A local-only model with a unique key and no defaults (not allowed in synced stores).
struct Note: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var text: String
    var slug: String

    static let entity = ModelEntity<Note>([
        .attribute("text", \.text),
        .attribute("slug", \.slug, options: .unique),
    ])
}

// MARK: - Delete rules

/// Folder -> Document -> Page, cascading over two levels.
struct Folder: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var documents: [Reference<Document>] = []

    static let entity = ModelEntity<Folder>([
        .attribute("name", \.name),
        .toMany("documents", \.documents, inverse: "folder", deleteRule: .cascade),
    ])
}

struct Document: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var folder: Reference<Folder>?
    var pages: [Reference<Page>] = []

    static let entity = ModelEntity<Document>([
        .attribute("title", \.title),
        .toOne("folder", \.folder, inverse: "documents"),
        .toMany("pages", \.pages, inverse: "document", deleteRule: .cascade),
    ])
}

struct Page: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var number: Int = 0
    var document: Reference<Document>?

    static let entity = ModelEntity<Page>([
        .attribute("number", \.number),
        .toOne("document", \.document, inverse: "pages"),
    ])
}

/// A shelf cannot be deleted while it holds books.
struct Shelf: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var label: String = ""
    var books: [Reference<Book>] = []

    static let entity = ModelEntity<Shelf>([
        .attribute("label", \.label),
        .toMany("books", \.books, inverse: "shelf", deleteRule: .deny),
    ])
}

struct Book: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var shelf: Reference<Shelf>?

    static let entity = ModelEntity<Book>([
        .attribute("title", \.title),
        .toOne("shelf", \.shelf, inverse: "books"),
    ])
}

/// Deleting a team clears its players' references.
struct Team: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var players: [Reference<Player>] = []

    static let entity = ModelEntity<Team>([
        .attribute("name", \.name),
        .toMany("players", \.players, inverse: "team", deleteRule: .nullify),
    ])
}

struct Player: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var team: Reference<Team>?

    static let entity = ModelEntity<Player>([
        .attribute("name", \.name),
        .toOne("team", \.team, inverse: "players"),
    ])
}

/// An account must have an owner (a required to-one relationship); deleting the owner would leave it without one.
struct Person: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var accounts: [Reference<Account>] = []

    static let entity = ModelEntity<Person>([
        .attribute("name", \.name),
        .toMany("accounts", \.accounts, inverse: "owner", deleteRule: .nullify),
    ])
}

struct Account: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var number: String = ""
    var owner: Reference<Person>

    static let entity = ModelEntity<Account>([
        .attribute("number", \.number),
        .toOne("owner", \.owner, inverse: "accounts"),
    ])
}

/// A delete rule that does nothing: the children keep a dangling reference.
struct Album: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var photos: [Reference<Photo>] = []

    static let entity = ModelEntity<Album>([
        .attribute("title", \.title),
        .toMany("photos", \.photos, inverse: "album", deleteRule: .noAction),
    ])
}

struct Photo: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var caption: String = ""
    var album: Reference<Album>?

    static let entity = ModelEntity<Photo>([
        .attribute("caption", \.caption),
        .toOne("album", \.album, inverse: "photos"),
    ])
}

// MARK: - Uniqueness

/// A single unique key (`email`) and an optional one (`nickname`).
struct User: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var email: String = ""
    var nickname: String?

    static let entity = ModelEntity<User>([
        .attribute("email", \.email, options: .unique),
        .attribute("nickname", \.nickname, options: .unique),
    ])
}

/// A compound unique key (`group` + `member`), with an optional part.
struct Membership: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var group: String = ""
    var member: String?
    var role: String = ""

    static let entity = ModelEntity<Membership>([
        .attribute("group", \.group),
        .attribute("member", \.member),
        .attribute("role", \.role),
    ], uniquenessConstraints: [["group", "member"]])
}
