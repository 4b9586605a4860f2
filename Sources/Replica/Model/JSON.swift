import Foundation

/// The JSON coders of every structure Replica stores as JSON (composite attributes, sync bookkeeping, cloud records,
/// history tombstones, zone metadata).
///
/// A `Double` attribute may hold an infinity (only NaN is refused on save), which plain JSON cannot spell:
/// `JSONEncoder`'s default throws on it, and a swallowed failure lost data. Non-finite numbers are written as the
/// strings `"+Infinity"`, `"-Infinity"` and `"NaN"` and read back from them; finite numbers are unchanged, so JSON
/// written before reads the same. Keys are sorted so the bytes are deterministic.
enum ReplicaJSON {
    static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "+Infinity", negativeInfinity: "-Infinity", nan: "NaN")
        return encoder
    }

    static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "+Infinity", negativeInfinity: "-Infinity", nan: "NaN")
        return decoder
    }

    /// `value` as JSON text (sorted keys, non-finite numbers as strings).
    /// - Throws: `EncodingError` when `value`'s `encode(to:)` throws (a field stamp out of its encodable range).
    static func string<T: Encodable>(_ value: T) throws -> String {
        String(decoding: try encoder().encode(value), as: UTF8.self)
    }

    /// ``string(_:)`` for values whose encoding cannot fail (no field stamps): a failure is a programmer error.
    static func stamplessString<T: Encodable>(_ value: T) -> String {
        do { return try string(value) } catch { preconditionFailure("Replica: \(T.self) failed to encode as JSON: \(error)") }
    }

    /// The `T` that JSON text `json` holds, or `nil` when there is no text or it does not decode as `T`.
    static func decode<T: Decodable>(_ type: T.Type, _ json: String?) -> T? {
        guard let json else { return nil }
        return try? decoder().decode(T.self, from: Data(json.utf8))
    }
}

/// Reads the JSON string that starts at `position` in `bytes` (at its opening quote) and moves `position` past it.
/// Handles the escapes `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r` and `\t`; `nil` for anything else (a `\u`
/// escape, a raw control character, no closing quote) — the callers then take a slower, complete decoder.
/// - Parameter validatingUTF8: `true` refuses bytes that are not UTF-8 (as `JSONDecoder` does); `false` repairs them
///   (`String(decoding:)`).
func scanJSONString(_ bytes: UnsafeBufferPointer<UInt8>, _ position: inout Int, validatingUTF8: Bool) -> String? {
    guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else { return nil }
    position += 1
    let start = position
    var escaped = false
    while position < bytes.count {
        let byte = bytes[position]
        if byte == UInt8(ascii: "\"") { break }
        if byte < 0x20 { return nil }
        if byte == UInt8(ascii: "\\") {
            escaped = true
            position += 1
            guard position < bytes.count else { return nil }
        }
        position += 1
    }
    guard position < bytes.count else { return nil }
    let raw = UnsafeBufferPointer(rebasing: bytes[start..<position])
    position += 1
    func text<C: Collection>(_ units: C) -> String? where C.Element == UInt8 {
        validatingUTF8 ? String(validating: units, as: UTF8.self) : String(decoding: units, as: UTF8.self)
    }
    guard escaped else { return text(raw) }
    var unescaped: [UInt8] = []
    unescaped.reserveCapacity(raw.count)
    var index = 0
    while index < raw.count {
        let byte = raw[index]
        index += 1
        guard byte == UInt8(ascii: "\\") else { unescaped.append(byte); continue }
        switch raw[index] {
        case UInt8(ascii: "\""): unescaped.append(UInt8(ascii: "\""))
        case UInt8(ascii: "\\"): unescaped.append(UInt8(ascii: "\\"))
        case UInt8(ascii: "/"): unescaped.append(UInt8(ascii: "/"))
        case UInt8(ascii: "b"): unescaped.append(0x08)
        case UInt8(ascii: "f"): unescaped.append(0x0C)
        case UInt8(ascii: "n"): unescaped.append(0x0A)
        case UInt8(ascii: "r"): unescaped.append(0x0D)
        case UInt8(ascii: "t"): unescaped.append(0x09)
        default: return nil
        }
        index += 1
    }
    return text(unescaped)
}
