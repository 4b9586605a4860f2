import Foundation

// Text forms of the sync bookkeeping that is read and written for every record a save or an import touches: field
// stamps (hex) and the ledger's `stamps` column (a JSON object, field name → stamp). Written and parsed by hand:
// JSONEncoder/JSONDecoder and String(radix:) cost more than the SQLite work of a merge. The bytes are exactly what
// JSONEncoder (sorted keys, slashes unescaped) and the hex formatting produce, so the stored format is unchanged; any
// input the fast parsers do not recognise goes through JSONDecoder / the general parser as before.

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

/// The value of one hex digit, or `nil`.
@inline(__always)
private func hexValue(_ byte: UInt8) -> UInt64? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): return UInt64(byte - UInt8(ascii: "0"))
    case UInt8(ascii: "a")...UInt8(ascii: "f"): return UInt64(byte - UInt8(ascii: "a") + 10)
    case UInt8(ascii: "A")...UInt8(ascii: "F"): return UInt64(byte - UInt8(ascii: "A") + 10)
    default: return nil
    }
}

/// Parses `count` hex digits at `start`.
@inline(__always)
private func parseHex(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int, _ count: Int) -> UInt64? {
    var value: UInt64 = 0
    for i in start..<start + count {
        guard let digit = hexValue(bytes[i]) else { return nil }
        value = value << 4 | digit
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

extension SyncLedger {
    /// The `stamps` column: `{"name":"<64 hex>",...}` with keys in sorted order — the bytes JSONEncoder writes.
    static func encodeStamps(_ stamps: [String: FieldStamp]) -> String {
        var fields = Array(stamps)
        fields.sort { $0.key < $1.key }
        var size = 2
        for (key, stamp) in fields {
            // Names are identifiers; anything JSON would escape (or a stamp out of range) takes the general path.
            guard stamp.fitsHex, key.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x80 && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") })
            else { return encode(stamps) }
            size += key.utf8.count + 64 + 6
        }
        if !fields.isEmpty { size -= 1 }
        return String(unsafeUninitializedCapacity: size) { buffer in
            let base = buffer.baseAddress!
            var i = 0
            base[i] = UInt8(ascii: "{")
            i += 1
            var previous: (stamp: FieldStamp, at: Int)?
            for n in fields.indices {
                if n > 0 {
                    base[i] = UInt8(ascii: ",")
                    i += 1
                }
                base[i] = UInt8(ascii: "\"")
                i += 1
                var key = fields[n].key
                i += key.withUTF8 { bytes in
                    (base + i).update(from: bytes.baseAddress!, count: bytes.count)
                    return bytes.count
                }
                base[i] = UInt8(ascii: "\"")
                base[i + 1] = UInt8(ascii: ":")
                base[i + 2] = UInt8(ascii: "\"")
                i += 3
                let stamp = fields[n].value
                if let previous, previous.stamp == stamp {
                    // Usually every field carries the same stamp (an insert): copy the digits already written.
                    (base + i).update(from: base + previous.at, count: 64)
                } else {
                    stamp.writeHex(into: buffer, at: i)
                }
                previous = (stamp, i)
                i += 64
                base[i] = UInt8(ascii: "\"")
                i += 1
            }
            base[i] = UInt8(ascii: "}")
            return i + 1
        }
    }

    /// Reads a `stamps` column; `nil` when it is absent or unreadable.
    static func decodeStamps(_ json: String?) -> [String: FieldStamp]? {
        guard var json else { return nil }
        let fast = json.withUTF8 { bytes -> [String: FieldStamp]? in
            var result: [String: FieldStamp] = [:]
            var i = 0
            let n = bytes.count
            guard n >= 2, bytes[0] == UInt8(ascii: "{") else { return nil }
            i = 1
            if bytes[i] == UInt8(ascii: "}") { return i + 1 == n ? result : nil }
            while true {
                guard i < n, bytes[i] == UInt8(ascii: "\"") else { return nil }
                let keyStart = i + 1
                var keyEnd = keyStart
                while keyEnd < n, bytes[keyEnd] != UInt8(ascii: "\"") {
                    if bytes[keyEnd] == UInt8(ascii: "\\") { return nil }  // escapes: general path
                    keyEnd += 1
                }
                guard keyEnd + 68 < n, bytes[keyEnd + 1] == UInt8(ascii: ":"), bytes[keyEnd + 2] == UInt8(ascii: "\""),
                      bytes[keyEnd + 67] == UInt8(ascii: "\""),
                      let stamp = FieldStamp.parse(bytes, at: keyEnd + 3) else { return nil }
                let key = String(decoding: UnsafeBufferPointer(rebasing: bytes[keyStart..<keyEnd]), as: UTF8.self)
                result[key] = stamp
                i = keyEnd + 68
                if bytes[i] == UInt8(ascii: "}") { return i + 1 == n ? result : nil }
                guard bytes[i] == UInt8(ascii: ",") else { return nil }
                i += 1
            }
        }
        return fast ?? decode([String: FieldStamp].self, json)
    }
}
