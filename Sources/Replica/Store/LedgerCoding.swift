import CSQLite
import Foundation

// Forms of the sync bookkeeping that is read and written for every record a save or an import touches: field stamps
// as fixed-width hex (the `created` column, the conflict log, CloudRecord JSON) and the ledger's `stamps` column.
// Written and parsed by hand: JSONEncoder/JSONDecoder and String(radix:) cost more than the SQLite work of a merge.
//
// The `stamps` column has two forms, told apart per row by SQLite's storage class (columns are dynamically typed):
//
// - TEXT (stores written before the compact form): a JSON object, field name → 64-hex-digit stamp, keys sorted —
//   about 1 kB for a record of ten fields. Still read; any row written again is written in the compact form.
// - BLOB (the compact form, ``SyncLedger/encodeStamps(_:)``), every integer big-endian:
//
//       u8        format version (1)
//       varint    S, the number of distinct stamps
//       S × 36 B  each stamp once: incarnation (Int64), HLC physical ms (Int64), HLC logical (Int32), replica UUID (16 B)
//       varint    F, the number of fields
//       F ×       varint name length, name (UTF-8), varint index of the field's stamp (< S)
//
//   Fields are in the order of their names' UTF-8 bytes and stamps in order of first use, so equal maps give equal
//   bytes. Varints are unsigned LEB128 (7 bits a byte, low group first), at most 10 bytes. Every Int64/Int32 value
//   round-trips exactly (the hex form holds only 48-bit milliseconds and a 16-bit counter). A typical record
//   (ten fields, one stamp) takes about 110 bytes.

extension SyncLedger {
    /// The version byte that starts the compact `stamps` form.
    static let stampsFormatVersion: UInt8 = 1

    /// Bytes of one stamp in the compact form.
    private static let stampBytes = 36

    /// The `stamps` column in the compact form (see the top of this file).
    static func encodeStamps(_ stamps: [String: FieldStamp]) -> Data {
        var names: [String] = []
        var values: [FieldStamp?] = []
        names.reserveCapacity(stamps.count)
        values.reserveCapacity(stamps.count)
        for (name, stamp) in stamps {
            names.append(name)
            values.append(stamp)
        }
        var order = Array(names.indices)
        if order.count > 1 { order.sort { precedes(names[$0], names[$1]) } }
        return encodeStamps(names: names, order: order, stamps: values)
    }

    /// Whether `a`'s UTF-8 bytes precede `b`'s (the field order of the compact form).
    @inline(__always)
    static func precedes(_ a: String, _ b: String) -> Bool {
        var a = a, b = b
        return a.withUTF8 { x in
            b.withUTF8 { y in
                let common = min(x.count, y.count)
                if common > 0 {
                    let order = memcmp(x.baseAddress!, y.baseAddress!, common)
                    if order != 0 { return order < 0 }
                }
                return x.count < y.count
            }
        }
    }

    /// The compact `stamps` form of the stamped fields among `names` (the stamp of `names[i]` is `stamps[i]`, `nil`
    /// for a field without one), where `order` lists the positions of `names` in the order of their UTF-8 bytes
    /// (``EntityStatements/fieldsInStampOrder``): the bytes ``encodeStamps(_:)`` writes for the equivalent dictionary,
    /// without building or sorting one.
    static func encodeStamps(names: [String], order: [Int], stamps: [FieldStamp?], oneStampTail: [UInt8]? = nil) -> Data {
        // Every field stamped by one write (a record as one save uploaded it): the bytes after the stamp depend only
        // on the names, written once per entity (``oneStampTail(names:order:)``).
        if let oneStampTail, let first = stamps.first ?? nil, stamps.allSatisfy({ $0 == first }) {
            return encodeStamps(every: first, oneStampTail: oneStampTail)
        }
        // Distinct stamps in order of first use (a record usually has one or two, so a linear search is fastest),
        // and each field's index among them (-1: no stamp).
        var distinct: [FieldStamp] = []
        var indices = [Int](repeating: -1, count: stamps.count)
        var fieldCount = 0
        var size = 1
        for position in order {
            guard let stamp = stamps[position] else { continue }
            var index = 0
            while index < distinct.count && distinct[index] != stamp { index += 1 }
            if index == distinct.count { distinct.append(stamp) }
            indices[position] = index
            fieldCount += 1
            let length = names[position].utf8.count
            size += varintSize(UInt64(length)) + length + varintSize(UInt64(index))
        }
        size += varintSize(UInt64(distinct.count)) + distinct.count * stampBytes + varintSize(UInt64(fieldCount))
        var data = Data(count: size)
        data.withUnsafeMutableBytes { raw in
            var i = 0
            raw[i] = stampsFormatVersion
            i += 1
            writeVarint(UInt64(distinct.count), raw, &i)
            for stamp in distinct {
                writeStamp(stamp, raw, at: i)
                i += stampBytes
            }
            writeVarint(UInt64(fieldCount), raw, &i)
            for position in order where indices[position] >= 0 {
                let utf8 = names[position].utf8
                writeVarint(UInt64(utf8.count), raw, &i)
                // Contiguous for native strings (no copy); `copyBytes` handles any other.
                let copied = utf8.withContiguousStorageIfAvailable { bytes -> Bool in
                    if !bytes.isEmpty { (raw.baseAddress! + i).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
                    return true
                }
                if copied == nil {
                    UnsafeMutableRawBufferPointer(rebasing: raw[i..<(i + utf8.count)]).copyBytes(from: utf8)
                }
                i += utf8.count
                writeVarint(UInt64(indices[position]), raw, &i)
            }
            precondition(i == size)
        }
        return data
    }

    /// The compact form of a map stamping every field of an entity (at least one) with `stamp`, given the entity's
    /// `oneStampTail` (``oneStampTail(names:order:)``).
    static func encodeStamps(every stamp: FieldStamp, oneStampTail: [UInt8]) -> Data {
        var data = Data(count: 2 + stampBytes + oneStampTail.count)
        data.withUnsafeMutableBytes { raw in
            raw[0] = stampsFormatVersion
            raw[1] = 1
            writeStamp(stamp, raw, at: 2)
            oneStampTail.withUnsafeBytes { (raw.baseAddress! + 2 + stampBytes).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        }
        return data
    }

    /// Writes one stamp's 36 bytes at `i`.
    @inline(__always)
    private static func writeStamp(_ stamp: FieldStamp, _ raw: UnsafeMutableRawBufferPointer, at i: Int) {
        raw.storeBytes(of: UInt64(bitPattern: stamp.incarnation).bigEndian, toByteOffset: i, as: UInt64.self)
        raw.storeBytes(of: UInt64(bitPattern: stamp.clock.physical).bigEndian, toByteOffset: i + 8, as: UInt64.self)
        raw.storeBytes(of: UInt32(bitPattern: stamp.clock.logical).bigEndian, toByteOffset: i + 16, as: UInt32.self)
        let (high, low) = stamp.clock.replica.orderedHalves
        raw.storeBytes(of: high.bigEndian, toByteOffset: i + 20, as: UInt64.self)
        raw.storeBytes(of: low.bigEndian, toByteOffset: i + 28, as: UInt64.self)
    }

    /// Reads one stamp's 36 bytes at `i` (the caller checks that they are there).
    @inline(__always)
    static func readStamp(_ bytes: UnsafeRawBufferPointer, at i: Int) -> FieldStamp {
        let incarnation = Int64(bitPattern: UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)))
        let physical = Int64(bitPattern: UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: i + 8, as: UInt64.self)))
        let logical = Int32(bitPattern: UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: i + 16, as: UInt32.self)))
        var uuid = UUID.unassigned.uuid
        withUnsafeMutableBytes(of: &uuid) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[(i + 20)..<(i + 36)])) }
        return FieldStamp(incarnation: incarnation, clock: HLC(physical: physical, logical: logical, replica: UUID(uuid: uuid)))
    }

    /// The bytes that follow the one distinct stamp in the compact form of a map stamping every one of `names` with
    /// that stamp (`order` as in ``encodeStamps(names:order:stamps:oneStampTail:)``): the field count, then each name
    /// with stamp index 0.
    static func oneStampTail(names: [String], order: [Int]) -> [UInt8] {
        var size = varintSize(UInt64(names.count))
        for name in names { size += varintSize(UInt64(name.utf8.count)) + name.utf8.count + 1 }
        var tail = [UInt8](repeating: 0, count: size)
        tail.withUnsafeMutableBytes { raw in
            var i = 0
            writeVarint(UInt64(names.count), raw, &i)
            for position in order {
                let utf8 = Array(names[position].utf8)
                writeVarint(UInt64(utf8.count), raw, &i)
                for byte in utf8 { raw[i] = byte; i += 1 }
                writeVarint(0, raw, &i)
            }
            precondition(i == size)
        }
        return tail
    }

    /// Reads the compact `stamps` form from `bytes`; `nil` when they are not a well-formed instance of it (an
    /// unknown version, a stamp index out of range, a repeated field name, bytes left over, ...).
    static func decodeStamps(_ bytes: UnsafeRawBufferPointer) -> [String: FieldStamp]? {
        var i = 0
        guard bytes.count >= 1, bytes[0] == stampsFormatVersion else { return nil }
        i = 1
        guard let stampCount = readVarint(bytes, &i), stampCount <= UInt64((bytes.count - i) / stampBytes) else { return nil }
        var distinct: [FieldStamp] = []
        distinct.reserveCapacity(Int(stampCount))
        for _ in 0..<Int(stampCount) {
            distinct.append(readStamp(bytes, at: i))
            i += stampBytes
        }
        // Each field takes at least two bytes (a length and an index).
        guard let fieldCount = readVarint(bytes, &i), fieldCount <= UInt64((bytes.count - i) / 2) else { return nil }
        var result = [String: FieldStamp](minimumCapacity: Int(fieldCount))
        for _ in 0..<Int(fieldCount) {
            guard let length = readVarint(bytes, &i), length <= UInt64(bytes.count - i) else { return nil }
            let end = i + Int(length)
            let name = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[i..<end]).assumingMemoryBound(to: UInt8.self), as: UTF8.self)
            i = end
            guard let index = readVarint(bytes, &i), index < UInt64(distinct.count),
                  result.updateValue(distinct[Int(index)], forKey: name) == nil else { return nil }
        }
        return i == bytes.count ? result : nil
    }

    /// The stamps of the `stamps` column at `index` of the current row of `statement` by storage position of the
    /// entity of `statements` (`nil`: no stamp), and how many fields the column stamps in all, names this entity does
    /// not store included: the map ``readStamps(_:_:)`` reads (an unreadable or NULL column: none), looked up by
    /// ``EntityStatements/fieldNames``. A column in the compact form with names in order (as every encoder writes
    /// it) is read without building the map or hashing a name: its names are matched in one pass against the
    /// entity's, which ``EntityStatements/oneStampTail`` lists in the same order.
    ///
    /// `readable` is `false` when the column is NULL or does not decode (then there are no stamps, and the caller treats
    /// the row as one whose bookkeeping cannot be read — never as one without stamps).
    static func readStampsByPosition(_ statement: Statement, _ index: Int32, _ statements: EntityStatements)
        -> (stamps: [FieldStamp?], count: Int, readable: Bool) {
        let fieldCount = statements.fieldNames.count
        if let stamp = readOneStamp(statement, index, oneStampTail: statements.oneStampTail) {
            return ([FieldStamp?](repeating: stamp, count: fieldCount), fieldCount, true)
        }
        if sqlite3_column_type(statement.handle, index) == SQLITE_BLOB,
           let result = decodeStampsByPosition(statement.blob(index), statements) {
            return (result.stamps, result.count, true)
        }
        guard let map = readStamps(statement, index) else { return ([FieldStamp?](repeating: nil, count: fieldCount), 0, false) }
        return (statements.fieldNames.map { map[$0] }, map.count, true)
    }

    /// ``readStampsByPosition(_:_:_:)`` for a column in the compact form: `nil` when `bytes` are not a well-formed
    /// instance of it (then ``decodeStamps(_:)`` finds no map either), when their names are not in strictly increasing
    /// order (the map tells a repeated name from an unsorted one), or when a name is not ASCII: the caller then
    /// decodes the map.
    private static func decodeStampsByPosition(_ bytes: UnsafeRawBufferPointer, _ statements: EntityStatements) -> (stamps: [FieldStamp?], count: Int)? {
        var i = 0
        guard bytes.count >= 1, bytes[0] == stampsFormatVersion else { return nil }
        i = 1
        guard let stampCount = readVarint(bytes, &i), stampCount <= UInt64((bytes.count - i) / stampBytes) else { return nil }
        let stampsStart = i
        i += Int(stampCount) * stampBytes
        guard let fieldCount = readVarint(bytes, &i), fieldCount <= UInt64((bytes.count - i) / 2) else { return nil }
        let order = statements.fieldsInStampOrder
        var result = [FieldStamp?](repeating: nil, count: statements.fieldNames.count)
        return statements.oneStampTail.withUnsafeBytes { tail -> (stamps: [FieldStamp?], count: Int)? in
            // Names are matched byte for byte, which is how `String` compares them only when they are ASCII (it
            // compares non-ASCII text by canonical equivalence): anything else takes the map.
            for byte in tail where byte >= 0x80 { return nil }
            // The entity's names in stamp order, as the tail lists them: a varint count, then each name's varint
            // length, bytes and stamp index (0).
            var t = 0
            guard let nameCount = readVarint(tail, &t), nameCount == UInt64(order.count) else { return nil }
            var k = 0
            /// The bytes of the entity's `k`th name in stamp order (at `t`), or `nil` past the last.
            func entityName(_ t: Int) -> (start: Int, count: Int, next: Int)? {
                guard k < order.count else { return nil }
                var j = t
                guard let length = readVarint(tail, &j), j + Int(length) < tail.count else { return nil }
                return (j, Int(length), j + Int(length) + 1)
            }
            var previous: (start: Int, count: Int)?
            for _ in 0..<Int(fieldCount) {
                guard let length = readVarint(bytes, &i), length <= UInt64(bytes.count - i) else { return nil }
                let name = (start: i, count: Int(length))
                for offset in name.start..<(name.start + name.count) where bytes[offset] >= 0x80 { return nil }
                i += name.count
                guard let stampIndex = readVarint(bytes, &i), stampIndex < stampCount else { return nil }
                if let previous, compare(bytes, previous, bytes, name) >= 0 { return nil }
                previous = name
                // Skip the entity's names that precede this one; an equal one takes the stamp.
                while let candidate = entityName(t) {
                    let order = compare(tail, (candidate.start, candidate.count), bytes, name)
                    if order > 0 { break }
                    if order == 0 {
                        result[statements.fieldsInStampOrder[k]] = readStamp(bytes, at: stampsStart + Int(stampIndex) * stampBytes)
                    }
                    t = candidate.next
                    k += 1
                }
            }
            return i == bytes.count ? (result, Int(fieldCount)) : nil
        }
    }

    /// The order of two byte strings (negative, zero, positive): their bytes, then their lengths.
    @inline(__always)
    private static func compare(_ a: UnsafeRawBufferPointer, _ x: (start: Int, count: Int), _ b: UnsafeRawBufferPointer,
                                _ y: (start: Int, count: Int)) -> Int {
        let common = min(x.count, y.count)
        if common > 0 {
            let order = memcmp(a.baseAddress! + x.start, b.baseAddress! + y.start, common)
            if order != 0 { return Int(order) }
        }
        return x.count - y.count
    }

    /// Bytes of `value` as an unsigned LEB128 varint.
    @inline(__always)
    private static func varintSize(_ value: UInt64) -> Int {
        var size = 1
        var v = value >> 7
        while v != 0 { size += 1; v >>= 7 }
        return size
    }

    @inline(__always)
    private static func writeVarint(_ value: UInt64, _ raw: UnsafeMutableRawBufferPointer, _ i: inout Int) {
        var v = value
        while v >= 0x80 {
            raw[i] = UInt8(truncatingIfNeeded: v) | 0x80
            v >>= 7
            i += 1
        }
        raw[i] = UInt8(v)
        i += 1
    }

    /// Reads a varint at `i` (advancing it); `nil` past the end or beyond 64 bits.
    @inline(__always)
    private static func readVarint(_ bytes: UnsafeRawBufferPointer, _ i: inout Int) -> UInt64? {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while i < bytes.count {
            let byte = bytes[i]
            i += 1
            guard shift < 64, shift < 63 || byte <= 1 else { return nil }
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
        }
        return nil
    }

    /// Reads a `stamps` column in the old TEXT form (JSON); `nil` when it is absent or unreadable.
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
        return fast ?? ReplicaJSON.decode([String: FieldStamp].self, json)
    }
}

// MARK: Preserved fields (the `unknown` and `tombstone` columns)

extension SyncLedger {
    /// The `unknown` or `tombstone` column (JSON of `[String: CloudField]`, as ``encode(_:)`` writes it): parsed by
    /// hand when it has exactly the shape JSONEncoder writes for integer, text and null values (no whitespace, no
    /// `\u` escapes, each key once); anything else (reals, blobs, other spellings) goes to JSONDecoder, so the result
    /// is always what `decode([String: CloudField].self, json)` returns.
    static func decodeCloudFields(_ json: String) -> [String: CloudField]? {
        var text = json
        if let fields = text.withUTF8({ bytes -> [String: CloudField]? in
            var parser = CloudFieldsParser(bytes: bytes)
            return parser.parse()
        }) { return fields }
        return ReplicaJSON.decode([String: CloudField].self, json)
    }
}

/// The fast path of ``SyncLedger/decodeCloudFields(_:)``: `nil` for anything it does not read exactly as JSONDecoder
/// would.
private struct CloudFieldsParser {
    let bytes: UnsafeBufferPointer<UInt8>
    var position = 0

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    mutating func parse() -> [String: CloudField]? {
        guard take(UInt8(ascii: "{")) else { return nil }
        var fields: [String: CloudField] = [:]
        if take(UInt8(ascii: "}")) { return position == bytes.count ? fields : nil }
        repeat {
            guard let name = string(), take(UInt8(ascii: ":")), let field = field(),
                  fields.updateValue(field, forKey: name) == nil else { return nil }
        } while take(UInt8(ascii: ","))
        guard take(UInt8(ascii: "}")), position == bytes.count else { return nil }
        return fields
    }

    private mutating func take(_ byte: UInt8) -> Bool {
        guard position < bytes.count, bytes[position] == byte else { return false }
        position += 1
        return true
    }

    private mutating func take(_ literal: StaticString) -> Bool {
        let count = literal.utf8CodeUnitCount
        guard bytes.count - position >= count,
              memcmp(bytes.baseAddress! + position, literal.utf8Start, count) == 0 else { return false }
        position += count
        return true
    }

    /// `{"isEncrypted":…,"stamp":…,"value":…}`, keys in any order, each once.
    private mutating func field() -> CloudField? {
        guard take(UInt8(ascii: "{")) else { return nil }
        var isEncrypted: Bool?
        var stamp: FieldStamp?
        var value: SQLiteValue?
        repeat {
            if take("\"isEncrypted\":") {
                guard isEncrypted == nil else { return nil }
                if take("true") { isEncrypted = true } else if take("false") { isEncrypted = false } else { return nil }
            } else if take("\"stamp\":") {
                guard stamp == nil, let text = string(), let parsed = FieldStamp(text) else { return nil }
                stamp = parsed
            } else if take("\"value\":") {
                guard value == nil, let parsed = sqliteValue() else { return nil }
                value = parsed
            } else {
                return nil
            }
        } while take(UInt8(ascii: ","))
        guard take(UInt8(ascii: "}")), let isEncrypted, let stamp, let value else { return nil }
        return CloudField(value: value, stamp: stamp, isEncrypted: isEncrypted)
    }

    /// `{"null":{}}`, `{"integer":{"_0":N}}` or `{"text":{"_0":"…"}}`.
    private mutating func sqliteValue() -> SQLiteValue? {
        let result: SQLiteValue
        if take("{\"null\":{}}") { return .null }
        if take("{\"integer\":{\"_0\":") {
            guard let number = integer() else { return nil }
            result = .integer(number)
        } else if take("{\"text\":{\"_0\":") {
            guard let text = string() else { return nil }
            result = .text(text)
        } else {
            return nil
        }
        return take("}}") ? result : nil
    }

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

    /// A JSON string without `\u` escapes or raw control characters.
    private mutating func string() -> String? { scanJSONString(bytes, &position, validatingUTF8: false) }
}
