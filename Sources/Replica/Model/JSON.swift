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
}
