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
