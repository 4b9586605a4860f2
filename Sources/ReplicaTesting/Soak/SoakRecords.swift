// What a soak run's device processes (`replica-device`) write down and what the checker reads: the journal of every
// write a device made, each device's store at the end, and every byte the cloud keeps for the zone. Plain JSON, one
// object per line, so a journal cut short by `kill -9` loses at most its last line.

import Foundation
import Replica

/// A field value as the soak's devices write it: JSON-native (a reference is the target's UUID as text).
public enum SoakValue: Hashable, Sendable, Codable, CustomStringConvertible {
    case null
    case integer(Int64)
    case text(String)

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let number = try? container.decode(Int64.self) {
            self = .integer(number)
        } else {
            self = .text(try container.decode(String.self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case let .integer(number): try container.encode(number)
        case let .text(text): try container.encode(text)
        }
    }

    public var description: String {
        switch self {
        case .null: return "null"
        case let .integer(number): return String(number)
        case let .text(text): return "\"\(text.prefix(48))\""
        }
    }

    /// The value a cloud record's field holds for this one (a reference is a 16-byte blob there).
    public init(_ value: SQLiteValue) {
        switch value {
        case .null: self = .null
        case let .integer(number): self = .integer(number)
        case let .real(number): self = .text(String(number))
        case let .text(text): self = .text(text)
        case let .blob(bytes):
            if bytes.count == 16 {
                let id = bytes.withUnsafeBytes { UUID(uuid: $0.loadUnaligned(as: uuid_t.self)) }
                self = .text(id.uuidString)
            } else {
                self = .text(bytes.base64EncodedString())
            }
        }
    }
}

/// One line of a device's journal: a write it is about to make (`intent`), made and committed (`ack`, with the
/// causal length and field stamps the store gave it), or given up before commit (`abort`).
public struct SoakJournalEntry: Codable, Hashable, Sendable {
    public enum Phase: String, Codable, Sendable { case intent, ack, abort }
    public enum Operation: String, Codable, Sendable { case insert, update, delete }

    /// The device's name.
    public var device: String
    /// How many times the device process was started before this one (values written are unique per generation).
    public var generation: Int
    /// The write's number within its generation (an intent, its ack or abort share it).
    public var index: Int
    public var phase: Phase
    public var operation: Operation
    public var entity: String
    public var id: UUID
    /// The fields the write sets (all of them for an insert), by name.
    public var fields: [String: SoakValue]
    /// After commit: the record's causal length (odd while alive).
    public var causalLength: Int64?
    /// After commit: the stamps of the fields written, as text (`FieldStamp.description`).
    public var stamps: [String: String]?

    public init(device: String, generation: Int, index: Int, phase: Phase, operation: Operation, entity: String, id: UUID,
                fields: [String: SoakValue], causalLength: Int64? = nil, stamps: [String: String]? = nil) {
        self.device = device
        self.generation = generation
        self.index = index
        self.phase = phase
        self.operation = operation
        self.entity = entity
        self.id = id
        self.fields = fields
        self.causalLength = causalLength
        self.stamps = stamps
    }

    /// Reads a journal file: one entry per line. A last line cut short (the process was killed while writing it) is
    /// left out; any other malformed line is an error.
    public static func read(_ url: URL) throws -> [SoakJournalEntry] {
        let text = String(decoding: try Data(contentsOf: url), as: UTF8.self)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: true)
        let decoder = JSONDecoder()
        var entries: [SoakJournalEntry] = []
        for (number, line) in lines.enumerated() {
            do {
                entries.append(try decoder.decode(SoakJournalEntry.self, from: Data(line.utf8)))
            } catch {
                if number == lines.count - 1 && !text.hasSuffix("\n") { break }
                throw SoakFormatError(description: "\(url.lastPathComponent) line \(number + 1) is not a journal entry")
            }
        }
        return entries
    }
}

/// A soak file that cannot be read.
public struct SoakFormatError: Error, CustomStringConvertible {
    public var description: String
}

/// One record's replication state in a device's store (`ReplicationState`, as text).
public struct SoakLedgerState: Codable, Hashable, Sendable {
    public var entity: String
    public var causalLength: Int64
    public var pending: Bool
    public var stamps: [String: String]

    public init(entity: String, causalLength: Int64, pending: Bool, stamps: [String: String]) {
        self.entity = entity
        self.causalLength = causalLength
        self.pending = pending
        self.stamps = stamps
    }
}

/// A device's store after healing (`replica-device dump`).
public struct SoakDeviceDump: Codable, Sendable {
    public var device: String
    /// Live rows: entity → record ID (text) → field → value.
    public var rows: [String: [String: [String: SoakValue]]]
    /// The ledger: record ID (text) → state.
    public var states: [String: SoakLedgerState]
    /// Whether the ledger is settled: nothing pending, rejected, waiting for a parent or undecryptable, and the engine
    /// not blocked.
    public var upToDate: Bool

    public init(device: String, rows: [String: [String: [String: SoakValue]]], states: [String: SoakLedgerState], upToDate: Bool) {
        self.device = device
        self.rows = rows
        self.states = states
        self.upToDate = upToDate
    }
}

/// Every byte the cloud keeps for the soak's zone (`replica-device cloud-dump`): each record's stored body (the
/// record's JSON without its change tag) and each metadata value.
public struct SoakCloudDump: Codable, Sendable {
    public struct Record: Codable, Sendable {
        public var id: UUID
        public var changeTag: String
        /// The stored body, base64.
        public var body: String

        public init(id: UUID, changeTag: String, body: Data) {
            self.id = id
            self.changeTag = changeTag
            self.body = body.base64EncodedString()
        }
    }

    public var records: [Record]
    /// Zone metadata values, base64.
    public var metadata: [String]

    public init(records: [Record], metadata: [Data]) {
        self.records = records
        self.metadata = metadata.map { $0.base64EncodedString() }
    }
}

/// The shape of the soak's model, as the checker needs it: per entity, each field's kind and default.
public struct SoakSchema: Sendable {
    public enum Kind: Sendable { case attribute, encrypted, reference }

    public struct Field: Sendable {
        public var name: String
        public var kind: Kind
        public var defaultValue: SoakValue
        public var isUnique: Bool
    }

    /// Entity name → fields.
    public var entities: [String: [Field]]

    /// The model `replica-device` syncs: folders holding notes (nullify), a note's body sealed for the cloud and its
    /// slug unique.
    public static let notes = SoakSchema(entities: [
        "Folder": [Field(name: "name", kind: .attribute, defaultValue: .text(""), isUnique: false)],
        "Note": [
            Field(name: "title", kind: .attribute, defaultValue: .text(""), isUnique: false),
            Field(name: "body", kind: .encrypted, defaultValue: .null, isUnique: false),
            Field(name: "rating", kind: .attribute, defaultValue: .integer(0), isUnique: false),
            Field(name: "slug", kind: .attribute, defaultValue: .text(""), isUnique: true),
            Field(name: "folder", kind: .reference, defaultValue: .null, isUnique: false),
        ],
    ])

    /// The entity a reference field points to.
    public static let referenceTargets = ["Note.folder": "Folder"]
}
