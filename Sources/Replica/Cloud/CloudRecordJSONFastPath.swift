import Foundation

// The stored JSON form of a record (``CloudRecordJSON``), written and read by hand: a server cloud codes every record
// it sends or receives, and Foundation's JSONEncoder/JSONDecoder cost about a hundred times what libpq does for the
// same record (replica-bench B13). The bytes are exactly the ones `CloudRecordJSON.encoder()` writes — the same keys
// and nesting, keys sorted, slashes unescaped, reals in JSONEncoder's spelling, non-finite reals as strings. Reading
// takes exactly the shape these functions (or JSONEncoder) write, as valid UTF-8, and hands anything else to
// JSONDecoder, so the result — a record or the `DecodingError` — is always what JSONDecoder would give.

extension CloudRecordJSON {
    /// The stored form of `record` (``CloudRecord/changeTag`` included when set): the bytes ``encoder()`` writes for
    /// it.
    /// - Throws: `EncodingError.invalidValue`, as ``encoder()`` does, when a stamp cannot be written (a negative
    ///   incarnation, or a clock outside 48-bit milliseconds and a 16-bit counter: ``CloudRecord/unencodableStamp``).
    /// - Complexity: O(size of the record).
    public static func encode(_ record: CloudRecord) throws -> Data {
        if let site = record.unencodableStamp {
            let stamp = if case let .field(name) = site, let field = record.fields[name] { field.stamp } else { record.created }
            throw EncodingError.invalidValue(stamp, .init(codingPath: [], debugDescription: "field stamp outside the text form's range"))
        }
        var writer = JSONBytes()
        writer.record(record)
        return Data(writer.bytes)
    }

    /// The record `data` holds in the stored form (as ``decoder()`` decodes it: the same record for any JSON it
    /// accepts, including other spellings, whitespace and unknown keys).
    /// - Throws: the `DecodingError` ``decoder()`` throws for `data` when it is not a record (malformed JSON, bytes
    ///   that are not UTF-8, a missing key, a wrong type, a malformed UUID, stamp or base64 value).
    /// - Complexity: O(`data.count`).
    public static func decode(_ data: Data) throws -> CloudRecord {
        let fast: CloudRecord? = data.withUnsafeBytes { raw in
            var reader = RecordReader(bytes: raw.bindMemory(to: UInt8.self))
            guard let record = reader.record(), reader.atEnd else { return nil }
            return record
        }
        if let fast { return fast }
        return try decoder().decode(CloudRecord.self, from: data)
    }
}

/// Appends JSON to a byte buffer.
private struct JSONBytes {
    var bytes: [UInt8] = []

    init() { bytes.reserveCapacity(1_024) }

    mutating func raw(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    mutating func string(_ text: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): raw("\\\"")
            case UInt8(ascii: "\\"): raw("\\\\")
            case 0x0A: raw("\\n")
            case 0x0D: raw("\\r")
            case 0x09: raw("\\t")
            case 0x08: raw("\\b")
            case 0x0C: raw("\\f")
            case 0..<0x20:
                raw("\\u00")
                let hex: [UInt8] = Array("0123456789abcdef".utf8)
                bytes.append(hex[Int(byte >> 4)])
                bytes.append(hex[Int(byte & 0xF)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    mutating func integer(_ value: Int64) { bytes.append(contentsOf: String(value).utf8) }

    mutating func uuid(_ id: UUID) { string(id.uuidString) }

    mutating func value(_ value: SQLiteValue) {
        switch value {
        case .null:
            raw("{\"null\":{}}")
        case let .integer(number):
            raw("{\"integer\":{\"_0\":")
            integer(number)
            raw("}}")
        case let .real(number):
            raw("{\"real\":{\"_0\":")
            if number.isNaN {
                raw("\"NaN\"")
            } else if number.isInfinite {
                if number > 0 { raw("\"+Infinity\"") } else { raw("\"-Infinity\"") }
            } else {
                // JSONEncoder's spelling: Swift's shortest round-trip text without a trailing ".0" (`1`, `-0`, `1e+300`).
                let text = number.description
                bytes.append(contentsOf: text.hasSuffix(".0") ? text.utf8.dropLast(2) : text.utf8[...])
            }
            raw("}}")
        case let .text(text):
            raw("{\"text\":{\"_0\":")
            string(text)
            raw("}}")
        case let .blob(data):
            raw("{\"blob\":{\"_0\":")
            string(data.base64EncodedString())
            raw("}}")
        }
    }

    /// Keys in the order JSONEncoder's `sortedKeys` gives them.
    mutating func record(_ record: CloudRecord) {
        raw("{\"causalLength\":")
        integer(record.causalLength)
        if let tag = record.changeTag {
            raw(",\"changeTag\":")
            string(tag)
        }
        raw(",\"created\":")
        string(record.created.description)
        if !record.endedRedirects.isEmpty {
            raw(",\"endedRedirects\":[")
            for (index, ended) in record.endedRedirects.enumerated() {
                if index > 0 { bytes.append(UInt8(ascii: ",")) }
                raw("{\"incarnation\":")
                integer(ended.incarnation)
                raw(",\"winner\":")
                uuid(ended.winner)
                bytes.append(UInt8(ascii: "}"))
            }
            bytes.append(UInt8(ascii: "]"))
        }
        raw(",\"fields\":{")
        for (index, name) in record.fields.keys.sorted().enumerated() {
            let field = record.fields[name]!
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            string(name)
            raw(":{\"isEncrypted\":")
            if field.isEncrypted { raw("true") } else { raw("false") }
            raw(",\"stamp\":")
            string(field.stamp.description)
            raw(",\"value\":")
            value(field.value)
            bytes.append(UInt8(ascii: "}"))
        }
        raw("},\"recordID\":")
        uuid(record.recordID)
        raw(",\"recordType\":")
        string(record.recordType)
        if let redirect = record.redirect {
            raw(",\"redirect\":")
            uuid(redirect)
        }
        bytes.append(UInt8(ascii: "}"))
    }
}

/// Reads the stored form; `nil` (the caller asks JSONDecoder) for anything it does not read exactly as JSONDecoder
/// would: whitespace, `\u` escapes, unknown or repeated keys, numbers out of range or in other spellings.
private struct RecordReader {
    let bytes: UnsafeBufferPointer<UInt8>
    var position = 0

    var atEnd: Bool { position == bytes.count }

    private mutating func take(_ byte: UInt8) -> Bool {
        guard position < bytes.count, bytes[position] == byte else { return false }
        position += 1
        return true
    }

    private mutating func take(_ literal: StaticString) -> Bool {
        let count = literal.utf8CodeUnitCount
        guard bytes.count - position >= count, let base = bytes.baseAddress,
              memcmp(base + position, literal.utf8Start, count) == 0 else { return false }
        position += count
        return true
    }

    /// `{ "key": value, … }`: calls `member` with each key (positioned after its colon); `false` when it refuses.
    private mutating func object(_ member: (inout RecordReader, String) -> Bool) -> Bool {
        guard take(UInt8(ascii: "{")) else { return false }
        if take(UInt8(ascii: "}")) { return true }
        repeat {
            guard let key = string(), take(UInt8(ascii: ":")), member(&self, key) else { return false }
        } while take(UInt8(ascii: ","))
        return take(UInt8(ascii: "}"))
    }

    mutating func record() -> CloudRecord? {
        var id: UUID?, type: String?, tag: String?, causalLength: Int64?, created: FieldStamp?, redirect: UUID?
        var ended: [EndedRedirect]?, fields: [String: CloudField]?
        var seen = Set<String>()
        let parsed = object { reader, key in
            guard seen.insert(key).inserted else { return false }
            switch key {
            case "recordID": id = reader.uuid(); return id != nil
            case "recordType": type = reader.string(); return type != nil
            case "changeTag": tag = reader.string(); return tag != nil
            case "causalLength": causalLength = reader.integer(); return causalLength != nil
            case "created": created = reader.string().flatMap(FieldStamp.init); return created != nil
            case "redirect": redirect = reader.uuid(); return redirect != nil
            case "endedRedirects": ended = reader.endedRedirects(); return ended != nil
            case "fields": fields = reader.fields(); return fields != nil
            default: return false
            }
        }
        guard parsed, let id, let type, let causalLength, let created, let fields else { return nil }
        return CloudRecord(recordID: id, recordType: type, changeTag: tag, causalLength: causalLength, created: created,
                           redirect: redirect, endedRedirects: ended ?? [], fields: fields)
    }

    private mutating func endedRedirects() -> [EndedRedirect]? {
        guard take(UInt8(ascii: "[")) else { return nil }
        var list: [EndedRedirect] = []
        if take(UInt8(ascii: "]")) { return list }
        repeat {
            var incarnation: Int64?, winner: UUID?
            let parsed = object { reader, key in
                switch key {
                case "incarnation" where incarnation == nil: incarnation = reader.integer(); return incarnation != nil
                case "winner" where winner == nil: winner = reader.uuid(); return winner != nil
                default: return false
                }
            }
            guard parsed, let incarnation, let winner else { return nil }
            list.append(EndedRedirect(incarnation: incarnation, winner: winner))
        } while take(UInt8(ascii: ","))
        return take(UInt8(ascii: "]")) ? list : nil
    }

    private mutating func fields() -> [String: CloudField]? {
        var fields: [String: CloudField] = [:]
        let parsed = object { reader, name in
            guard fields[name] == nil, let field = reader.field() else { return false }
            fields[name] = field
            return true
        }
        return parsed ? fields : nil
    }

    private mutating func field() -> CloudField? {
        var isEncrypted: Bool?, stamp: FieldStamp?, value: SQLiteValue?
        let parsed = object { reader, key in
            switch key {
            case "isEncrypted" where isEncrypted == nil:
                if reader.take("true") { isEncrypted = true } else if reader.take("false") { isEncrypted = false }
                return isEncrypted != nil
            case "stamp" where stamp == nil: stamp = reader.string().flatMap(FieldStamp.init); return stamp != nil
            case "value" where value == nil: value = reader.value(); return value != nil
            default: return false
            }
        }
        guard parsed, let isEncrypted, let stamp, let value else { return nil }
        return CloudField(value: value, stamp: stamp, isEncrypted: isEncrypted)
    }

    /// `{"null":{}}`, `{"integer":{"_0":N}}`, `{"real":{"_0":X}}`, `{"text":{"_0":"…"}}`, `{"blob":{"_0":"base64"}}`.
    private mutating func value() -> SQLiteValue? {
        if take("{\"null\":{}}") { return .null }
        let result: SQLiteValue
        if take("{\"integer\":{\"_0\":") {
            guard let number = integer() else { return nil }
            result = .integer(number)
        } else if take("{\"real\":{\"_0\":") {
            if take("\"NaN\"") { result = .real(.nan) }
            else if take("\"+Infinity\"") { result = .real(.infinity) }
            else if take("\"-Infinity\"") { result = .real(-.infinity) }
            else {
                guard let number = real() else { return nil }
                result = .real(number)
            }
        } else if take("{\"text\":{\"_0\":") {
            guard let text = string() else { return nil }
            result = .text(text)
        } else if take("{\"blob\":{\"_0\":") {
            guard let text = string(), let data = Data(base64Encoded: text) else { return nil }
            result = .blob(data)
        } else {
            return nil
        }
        return take("}}") ? result : nil
    }

    private mutating func uuid() -> UUID? { string().flatMap(UUID.init(uuidString:)) }

    /// `-?(0|[1-9][0-9]*)` within Int64.
    private mutating func integer() -> Int64? {
        let start = position
        if position < bytes.count, bytes[position] == UInt8(ascii: "-") { position += 1 }
        let digits = position
        while position < bytes.count, bytes[position] >= UInt8(ascii: "0"), bytes[position] <= UInt8(ascii: "9") { position += 1 }
        guard position > digits, position - digits <= 19 else { return nil }
        if bytes[digits] == UInt8(ascii: "0") && position - digits > 1 { return nil }
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") || bytes[position] == UInt8(ascii: "e")
            || bytes[position] == UInt8(ascii: "E") { return nil }
        return Int64(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<position]), as: UTF8.self))
    }

    /// A JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`), finite as a Double.
    private mutating func real() -> Double? {
        let start = position
        func digits() -> Int {
            let from = position
            while position < bytes.count, bytes[position] >= UInt8(ascii: "0"), bytes[position] <= UInt8(ascii: "9") { position += 1 }
            return position - from
        }
        _ = take(UInt8(ascii: "-"))
        let integerStart = position
        let integerDigits = digits()
        guard integerDigits > 0, !(bytes[integerStart] == UInt8(ascii: "0") && integerDigits > 1) else { return nil }
        if take(UInt8(ascii: ".")) { guard digits() > 0 else { return nil } }
        if take(UInt8(ascii: "e")) || take(UInt8(ascii: "E")) {
            if !take(UInt8(ascii: "+")) { _ = take(UInt8(ascii: "-")) }
            guard digits() > 0 else { return nil }
        }
        guard let number = Double(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<position]), as: UTF8.self)),
              number.isFinite else { return nil }
        return number
    }

    /// A JSON string without `\u` escapes or raw control characters; bytes that are not UTF-8 are refused, as
    /// JSONDecoder refuses them.
    private mutating func string() -> String? { scanJSONString(bytes, &position, validatingUTF8: true) }
}
