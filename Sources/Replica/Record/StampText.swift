import Foundation

// The fixed-width hex text form of clocks and field stamps (the `created` column, the conflict log, CloudRecord
// JSON), written and parsed by hand: String(radix:) costs more than the SQLite work of a merge.

/// Writes `value` as `width` lowercase hex digits (the caller checks that it fits).
@inline(__always)
private func writeHex(_ value: UInt64, width: Int, into buffer: UnsafeMutableBufferPointer<UInt8>, at start: Int) {
    guard let base = buffer.baseAddress else { return }
    precondition(start >= 0 && start + width <= buffer.count)
    var v = value
    var p = base + start + width
    for _ in 0..<width {
        p -= 1
        let nibble = UInt8(truncatingIfNeeded: v & 0xF)
        p.pointee = nibble < 10 ? nibble &+ 48 : nibble &+ 87  // "0"..."9", "a"..."f"
        v >>= 4
    }
}

/// Parses `count` hex digits (`0-9`, `a-f`, `A-F`) at `start`; `nil` if any byte is not one.
@inline(__always)
private func parseHex(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int, _ count: Int) -> UInt64? {
    precondition(start >= 0 && count >= 0 && start + count <= bytes.count)
    guard let base = bytes.baseAddress else { return count == 0 ? 0 : nil }
    var value: UInt64 = 0
    var p = base + start
    for _ in 0..<count {
        let byte = p.pointee
        p += 1
        // A decimal digit, or (with the case bit set) a letter a-f.
        let decimal = byte &- UInt8(ascii: "0")
        let letter = (byte | 0x20) &- UInt8(ascii: "a")
        let digit: UInt8
        if decimal < 10 { digit = decimal } else if letter < 6 { digit = letter &+ 10 } else { return nil }
        value = value << 4 | UInt64(digit)
    }
    return value
}

extension HLC {
    /// Whether the fixed-width hex form holds this clock exactly (physical below 2^48, logical below 2^16).
    var fitsHex: Bool { physical >= 0 && physical < 1 << 48 && logical >= 0 && logical < 1 << 16 }

    /// Writes the 48 hex digits at `start`.
    func writeHex(into buffer: UnsafeMutableBufferPointer<UInt8>, at start: Int) {
        Replica.writeHex(UInt64(physical), width: 12, into: buffer, at: start)
        Replica.writeHex(UInt64(logical), width: 4, into: buffer, at: start + 12)
        let (high, low) = replica.orderedHalves
        Replica.writeHex(high, width: 16, into: buffer, at: start + 16)
        Replica.writeHex(low, width: 16, into: buffer, at: start + 32)
    }

    /// Parses 48 hex digits at `start`.
    static func parse(_ bytes: UnsafeBufferPointer<UInt8>, at start: Int) -> HLC? {
        guard let physical = parseHex(bytes, start, 12), let logical = parseHex(bytes, start + 12, 4),
              let high = parseHex(bytes, start + 16, 16), let low = parseHex(bytes, start + 32, 16) else { return nil }
        var uuid = UUID.unassigned.uuid
        withUnsafeMutableBytes(of: &uuid) { raw in
            raw.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
            raw.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
        }
        return HLC(physical: Int64(physical), logical: Int32(logical), replica: UUID(uuid: uuid))
    }
}

extension FieldStamp {
    /// Whether the 64-digit form holds this stamp exactly.
    var fitsHex: Bool { incarnation >= 0 && clock.fitsHex }

    /// Writes the 64 hex digits at `start`.
    func writeHex(into buffer: UnsafeMutableBufferPointer<UInt8>, at start: Int) {
        Replica.writeHex(UInt64(incarnation), width: 16, into: buffer, at: start)
        clock.writeHex(into: buffer, at: start + 16)
    }

    /// Parses 64 hex digits at `start`.
    static func parse(_ bytes: UnsafeBufferPointer<UInt8>, at start: Int) -> FieldStamp? {
        guard let incarnation = parseHex(bytes, start, 16), incarnation <= UInt64(Int64.max),
              let clock = HLC.parse(bytes, at: start + 16) else { return nil }
        return FieldStamp(incarnation: Int64(incarnation), clock: clock)
    }
}
