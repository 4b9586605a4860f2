import Foundation

/// A position in one store's history (SwiftData's `DefaultHistoryToken`): the store's replica identity and a
/// transaction number that increases with every save and is never reused, even after history is pruned.
public struct HistoryToken: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    /// The replica identity of the store the token belongs to.
    public let storeIdentity: UUID
    /// The transaction number.
    public let value: Int64

    public init(storeIdentity: UUID, value: Int64) {
        self.storeIdentity = storeIdentity
        self.value = value
    }

    /// Orders tokens of one store by value (tokens of different stores order by store identity first).
    public static func < (lhs: HistoryToken, rhs: HistoryToken) -> Bool {
        if lhs.storeIdentity != rhs.storeIdentity {
            return lhs.storeIdentity.bytesPrecede(rhs.storeIdentity)
        }
        return lhs.value < rhs.value
    }

    public var description: String { "\(storeIdentity.uuidString.lowercased())#\(value)" }
}

/// One saved transaction of a store (SwiftData's `DefaultHistoryTransaction`).
public struct HistoryTransaction: Hashable, Sendable {
    /// The transaction's token.
    public let token: HistoryToken
    /// The configuration (store) name.
    public let storeName: String
    /// The author the saving context set (``ModelContext/author``); sync imports use ``HistoryTransaction/syncAuthor``.
    public let author: String?
    /// When the transaction was saved, from the saving environment's clock (millisecond precision).
    public let timestamp: Date
    /// The bundle identifier of the saving process.
    public let bundleIdentifier: String
    /// The name of the saving process.
    public let processName: String
    /// The OS process ID of the saving process.
    public let processID: Int32
    /// The changes, in the order they were applied.
    public let changes: [HistoryChange]

    /// The author of transactions that sync imports (so the engine never exports them again).
    public static let syncAuthor = "replica.sync"
}

/// One change of a history transaction (SwiftData's `HistoryChange`).
public enum HistoryChange: Hashable, Sendable {
    /// A record was inserted.
    case insert(PersistentIdentifier)
    /// A record was updated; `updatedAttributes` names the fields whose stored value changed.
    case update(PersistentIdentifier, updatedAttributes: [String])
    /// A record was deleted; the tombstone keeps the attributes marked ``Schema/Attribute/Options/preserveValueOnDeletion``.
    case delete(PersistentIdentifier, tombstone: HistoryTombstone)

    /// The changed record.
    public var changedPersistentIdentifier: PersistentIdentifier {
        switch self {
        case let .insert(id), let .update(id, _), let .delete(id, _): return id
        }
    }
}

/// The values a deleted record keeps in history (SwiftData's `HistoryTombstone`): attributes marked
/// ``Schema/Attribute/Options/preserveValueOnDeletion``, by name.
///
/// Its ``description`` shows the values as values (`title: "Buy milk"`, `42`, `2026-12-01T10:00:00Z`, `<12 bytes>`)
/// once history read them with the store's schema (``ModelContext/fetchHistory(_:)``, the change stream), and
/// `<encrypted>` for attributes marked ``Schema/Attribute/Options/allowsCloudEncryption``; a tombstone built without
/// the schema shows storage classes and sizes only.
public struct HistoryTombstone: Hashable, Sendable, Codable {
    /// Preserved values by attribute name.
    public let values: [String: SQLiteValue]
    /// The attributes' types, as the schema history was read with declares them (empty when read without one).
    /// Not part of equality or coding.
    var attributeTypes: [String: Schema.AttributeType] = [:]
    /// The attributes marked ``Schema/Attribute/Options/allowsCloudEncryption``: never shown.
    var encryptedAttributes: Set<String> = []

    public init(values: [String: SQLiteValue] = [:]) { self.values = values }

    private enum CodingKeys: String, CodingKey { case values }

    public static func == (lhs: HistoryTombstone, rhs: HistoryTombstone) -> Bool { lhs.values == rhs.values }
    public func hash(into hasher: inout Hasher) { hasher.combine(values) }

    /// The preserved value of `attribute`, or `nil` when it was not preserved.
    public subscript(attribute: String) -> SQLiteValue? { values[attribute] }

    /// The preserved value of `attribute` decoded as `Value`.
    /// - Throws: ``ValueConversionError`` when it was not preserved or has another type.
    public func value<Value: AttributeValue>(_ attribute: String, as type: Value.Type = Value.self) throws -> Value {
        guard let stored = values[attribute] else {
            throw ValueConversionError(expected: "\(Value.self)", found: .null, attribute: "\(attribute) (not preserved)")
        }
        return try Value(sqliteValue: stored)
    }
}

/// Which history to read (SwiftData's `HistoryDescriptor`).
public struct HistoryDescriptor: Sendable, Hashable {
    /// How transactions are ordered.
    public enum SortKey: Sendable, Hashable {
        /// By token (save order within a store).
        case token
        /// By timestamp, then token.
        case timestamp
    }

    /// Only transactions after this token (of its store). A token older than pruned history throws
    /// ``ReplicaError/historyTokenExpired(_:)``; one of a store this container does not have throws
    /// ``ReplicaError/historyTokenFromAnotherStore(_:)``.
    public var afterToken: HistoryToken?
    /// Only transactions of these stores (configuration names); `nil` for every store (or the token's store).
    public var storeNames: [String]?
    /// Only transactions by these authors.
    public var authors: [String]?
    /// Leave out transactions by these authors.
    public var excludedAuthors: [String]?
    /// Only transactions saved at or after this time.
    public var fromDate: Date?
    /// Only transactions saved before this time.
    public var toDate: Date?
    /// Only changes of these entities; transactions with no such change are left out.
    public var entityNames: [String]?
    /// The order of the result.
    public var sortBy: SortKey
    /// `true` for newest first.
    public var reverse: Bool
    /// At most this many transactions.
    public var fetchLimit: Int?

    public init(after token: HistoryToken? = nil, storeNames: [String]? = nil, authors: [String]? = nil,
                excludedAuthors: [String]? = nil, from: Date? = nil, to: Date? = nil, entityNames: [String]? = nil,
                sortBy: SortKey = .token, reverse: Bool = false, fetchLimit: Int? = nil) {
        self.afterToken = token
        self.storeNames = storeNames
        self.authors = authors
        self.excludedAuthors = excludedAuthors
        self.fromDate = from
        self.toDate = to
        self.entityNames = entityNames
        self.sortBy = sortBy
        self.reverse = reverse
        self.fetchLimit = fetchLimit
    }
}
