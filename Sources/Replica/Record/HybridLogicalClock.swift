import Foundation

/// A hybrid logical clock timestamp (Kulkarni et al., "Logical Physical Clocks", 2014): physical milliseconds, a
/// logical counter, and the replica that made it. Ordered by (physical, logical, replica), so any two stamps of any two
/// replicas compare, and an event that has seen another always orders after it, whatever the device clocks say.
public struct HLC: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Physical component, Unix milliseconds (48 bits used: `0 ... ``maxPhysical```).
    public var physical: Int64
    /// Logical counter within one physical millisecond (16 bits used: ``tick(wall:replica:)`` and
    /// ``receive(_:wall:replica:)`` carry into the next millisecond rather than pass ``maxLogical``).
    public var logical: Int32
    /// The replica (store identity) that made the stamp.
    public var replica: UUID

    public init(physical: Int64, logical: Int32, replica: UUID) {
        self.physical = physical
        self.logical = logical
        self.replica = replica
    }

    /// The smallest stamp of `replica`.
    public static func zero(_ replica: UUID) -> HLC { HLC(physical: 0, logical: 0, replica: replica) }

    public static func < (lhs: HLC, rhs: HLC) -> Bool {
        if lhs.physical != rhs.physical { return lhs.physical < rhs.physical }
        if lhs.logical != rhs.logical { return lhs.logical < rhs.logical }
        return lhs.replica.bytesPrecede(rhs.replica)
    }

    /// The stamp for a local event at wall time `wall` (ms) after this one, on `replica`.
    ///
    /// The result always lies within the encodable range (physical 0 ... ``maxPhysical``, logical
    /// 0 ... ``maxLogical``): a wall clock outside it counts as its nearest end, and a clock already at the very top
    /// (``isExhausted``) saturates there — it returns a stamp equal to (not after) this one, which the sync ledger
    /// refuses with ``ReplicaError/clockExhausted(store:)`` rather than reuse. Never overflows.
    public func tick(wall: Int64, replica: UUID) -> HLC {
        let wall = Self.clampedPhysical(wall), physical = Self.clampedPhysical(self.physical)
        if wall > physical { return HLC(physical: wall, logical: 0, replica: replica) }
        return .carrying(physical: physical, logical: Int64(Self.clampedLogical(logical)) + 1, replica: replica)
    }

    /// This clock after receiving `remote` at wall time `wall`: never behind either (each taken within the encodable
    /// range, as in ``tick(wall:replica:)``; the result saturates at the top of it). Never overflows.
    public func receive(_ remote: HLC, wall: Int64, replica: UUID) -> HLC {
        let own = Self.clampedPhysical(physical), theirs = Self.clampedPhysical(remote.physical)
        let top = max(own, theirs, Self.clampedPhysical(wall))
        let ownLogical = Int64(Self.clampedLogical(self.logical)), theirLogical = Int64(Self.clampedLogical(remote.logical))
        let logical: Int64
        if top == own && top == theirs { logical = max(ownLogical, theirLogical) + 1 }
        else if top == own { logical = ownLogical + 1 }
        else if top == theirs { logical = theirLogical + 1 }
        else { logical = 0 }
        return .carrying(physical: top, logical: logical, replica: replica)
    }

    /// The largest physical time (ms) the fixed-width text form holds: 2⁴⁸ − 1 (12 hex digits, the year 10889).
    public static let maxPhysical: Int64 = (1 << 48) - 1

    /// The largest logical counter the fixed-width text form holds (4 hex digits).
    public static let maxLogical: Int32 = 0xFFFF

    /// `true` at the very top of the encodable range, `(maxPhysical, maxLogical)`: no later stamp exists.
    public var isExhausted: Bool { physical >= Self.maxPhysical && logical >= Self.maxLogical }

    /// Whether the fixed-width text form holds this clock exactly (physical `0 ... maxPhysical`, logical
    /// `0 ... maxLogical`).
    public var isEncodable: Bool { physical >= 0 && physical <= Self.maxPhysical && logical >= 0 && logical <= Self.maxLogical }

    @inline(__always)
    static func clampedPhysical(_ value: Int64) -> Int64 { min(max(value, 0), maxPhysical) }

    @inline(__always)
    static func clampedLogical(_ value: Int32) -> Int32 { min(max(value, 0), maxLogical) }

    /// `(physical, logical)`, except that a counter past ``maxLogical`` carries into the next millisecond:
    /// `(physical + 1, 0)` is still after every stamp of `physical`, and it keeps the text form's width (and so its
    /// order and its ability to be read back). Bounded drift, as in Kulkarni et al. At ``maxPhysical`` there is no
    /// next millisecond: the result saturates at `(maxPhysical, maxLogical)`.
    private static func carrying(physical: Int64, logical: Int64, replica: UUID) -> HLC {
        guard logical > Int64(maxLogical) else { return HLC(physical: physical, logical: Int32(logical), replica: replica) }
        guard physical < maxPhysical else { return HLC(physical: maxPhysical, logical: maxLogical, replica: replica) }
        return HLC(physical: physical + 1, logical: 0, replica: replica)
    }

    /// Fixed-width lowercase hex: 12 digits of physical time, 4 of logical counter, 32 of replica ID. Lexicographic
    /// order of the text equals the stamp order.
    public var description: String { hex }

    var hex: String {
        if fitsHex { return String(unsafeUninitializedCapacity: 48) { writeHex(into: $0, at: 0); return 48 } }
        return hexDigits(UInt64(max(0, physical)), width: 12) + hexDigits(UInt64(max(0, logical)), width: 4)
            + replica.bytes.map { hexDigits(UInt64($0), width: 2) }.joined()
    }

    /// Parses the 48-digit form (hex digits of either case, nothing else: no sign, no space).
    init?(hex: Substring) {
        var text = hex
        guard text.utf8.count == 48, let parsed = text.withUTF8({ HLC.parse($0, at: 0) }) else { return nil }
        self = parsed
    }
}

/// The version of one field's value: the record incarnation it was written in, then the HLC of the write.
///
/// A field is a last-writer-wins register ordered by this stamp. Putting the incarnation first makes a re-inserted
/// record's fields (a higher incarnation) beat every field of the incarnation before, so a re-insert starts fresh.
public struct FieldStamp: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    /// The causal length of the record when the field was written (odd: the incarnation).
    public var incarnation: Int64
    /// When and where the field was written.
    public var clock: HLC

    public init(incarnation: Int64, clock: HLC) {
        self.incarnation = incarnation
        self.clock = clock
    }

    public static func < (lhs: FieldStamp, rhs: FieldStamp) -> Bool {
        (lhs.incarnation, lhs.clock) < (rhs.incarnation, rhs.clock)
    }

    /// 16 hex digits of incarnation, then the HLC's 48: 64 characters whose lexicographic order is the stamp order.
    public var description: String {
        if fitsHex { return String(unsafeUninitializedCapacity: 64) { writeHex(into: $0, at: 0); return 64 } }
        return hexDigits(UInt64(max(0, incarnation)), width: 16) + clock.hex
    }

    /// Parses the 64-digit form (hex digits of either case, nothing else). Returns `nil` for any other text,
    /// including an incarnation beyond `Int64.max` (its first digit 8 or more): a stamp from outside is refused,
    /// never converted with a trap.
    public init?(_ text: String) {
        var bytes = text
        guard bytes.utf8.count == 64, let parsed = bytes.withUTF8({ FieldStamp.parse($0, at: 0) }) else { return nil }
        self = parsed
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let stamp = FieldStamp(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "malformed field stamp"))
        }
        self = stamp
    }

    /// Writes the 64-digit text form.
    /// - Throws: `EncodingError.invalidValue` for a stamp the text form cannot hold (a negative incarnation, or a
    ///   clock outside 48-bit milliseconds and a 16-bit counter): written in a wider form, it could never be read back.
    public func encode(to encoder: any Encoder) throws {
        guard fitsHex else {
            throw EncodingError.invalidValue(self, .init(codingPath: encoder.codingPath, debugDescription: "field stamp outside the text form's range"))
        }
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

func hexDigits(_ value: UInt64, width: Int) -> String {
    let digits = String(value, radix: 16)
    return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
}
