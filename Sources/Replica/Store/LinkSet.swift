import Foundation

/// The links of one record through one many-to-many relationship, as they replicate: a causal-length set (R17).
/// Internal.
///
/// Each linked record ID carries a causal length: odd while the link is present, even while it is removed; a link
/// never made has length 0. Adding a link that is absent (even `n`) makes it `n + 1`; removing a present one (odd
/// `n`) makes it `n + 1`. Merging two sets takes the larger length of each ID (a join: commutative, associative,
/// idempotent), so a re-add after a removal — a longer causal history — wins over the removal, and two devices that
/// both add or both remove a link agree. (Causal-length sets: Yu & Rostad, "A low-cost set CRDT based on causal
/// lengths", PaPoC 2020.)
///
/// Encoded (``encoded``) as a BLOB: a format byte (1), then for each ID in byte order its 16 bytes and its length as
/// 8 bytes big-endian. Equal sets give equal bytes.
struct LinkSet: Hashable, Sendable {
    /// Causal length by linked record ID (every length ≥ 1).
    private(set) var lengths: [UUID: Int64]

    /// The format byte of ``encoded``.
    static let format: UInt8 = 1

    /// A set with the given lengths (each within `1 ... ReplicationBounds.maxCausalLength`).
    init(_ lengths: [UUID: Int64] = [:]) { self.lengths = lengths }

    /// Whether the link to `id` is present (odd length).
    func contains(_ id: UUID) -> Bool { lengths[id].map { $0 % 2 == 1 } ?? false }

    /// The present links, in ID byte order.
    var members: [UUID] { lengths.keys.filter(contains).sorted { $0.bytesPrecede($1) } }

    /// Every ID the set has a length for (present or removed), in ID byte order.
    var ids: [UUID] { lengths.keys.sorted { $0.bytesPrecede($1) } }

    /// Adds the link to `id` when it is absent. Returns `false` when its length is at the bound (nothing changes).
    @discardableResult
    mutating func add(_ id: UUID) -> Bool {
        let length = lengths[id] ?? 0
        guard length % 2 == 0 else { return true }
        guard length < ReplicationBounds.maxCausalLength else { return false }
        lengths[id] = length + 1
        return true
    }

    /// Removes the link to `id` when it is present. Returns `false` when its length is at the bound.
    @discardableResult
    mutating func remove(_ id: UUID) -> Bool {
        guard let length = lengths[id], length % 2 == 1 else { return true }
        guard length < ReplicationBounds.maxCausalLength else { return false }
        lengths[id] = length + 1
        return true
    }

    /// The join of two sets: each ID at the larger of its two lengths. Commutative, associative and idempotent.
    /// Complexity: O(n + m) dictionary operations.
    func joined(with other: LinkSet) -> LinkSet {
        var result = self
        for (id, length) in other.lengths where length > (result.lengths[id] ?? 0) { result.lengths[id] = length }
        return result
    }

    /// The set's bytes (see the type's documentation).
    var encoded: Data {
        var bytes = Data(capacity: 1 + lengths.count * 24)
        bytes.append(Self.format)
        for id in ids {
            withUnsafeBytes(of: id.uuid) { bytes.append(contentsOf: $0) }
            withUnsafeBytes(of: UInt64(lengths[id]!).bigEndian) { bytes.append(contentsOf: $0) }
        }
        return bytes
    }

    /// The set ``encoded`` wrote, or `nil` for bytes it cannot have written: another format, a truncated entry, IDs
    /// out of order or repeated, a length outside `1 ... ReplicationBounds.maxCausalLength`, or the nil record ID.
    init?(encoded bytes: Data) {
        let bytes = [UInt8](bytes)
        guard bytes.first == Self.format, (bytes.count - 1) % 24 == 0 else { return nil }
        var lengths: [UUID: Int64] = [:]
        lengths.reserveCapacity((bytes.count - 1) / 24)
        var previous: UUID?
        var offset = 1
        while offset < bytes.count {
            var uuid = UUID.unassigned.uuid
            withUnsafeMutableBytes(of: &uuid) { raw in for index in 0..<16 { raw[index] = bytes[offset + index] } }
            let id = UUID(uuid: uuid)
            var length: UInt64 = 0
            for index in 16..<24 { length = length << 8 | UInt64(bytes[offset + index]) }
            guard id != .unassigned, length >= 1, length <= UInt64(ReplicationBounds.maxCausalLength),
                  previous.map({ $0.bytesPrecede(id) }) ?? true else { return nil }
            lengths[id] = Int64(length)
            previous = id
            offset += 24
        }
        self.lengths = lengths
    }

    /// The set a field value holds: a BLOB that ``init(encoded:)`` reads; `nil` otherwise.
    init?(value: SQLiteValue) {
        guard case let .blob(bytes) = value else { return nil }
        self.init(encoded: bytes)
    }

    /// The set as a field value.
    var value: SQLiteValue { .blob(encoded) }
}
