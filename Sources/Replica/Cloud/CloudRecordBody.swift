import Foundation

// The stored form of a cloud record — its "body" — in the compact binary format, and the reader that takes a body in
// either stored form (binary or the JSON of ``CloudRecordJSON``). A server cloud codes every record it sends or
// receives; the binary form costs a small fraction of the JSON one (replica-bench B13; Specs/cloud-postgres.md §2).
//
// Binary body, format version 1. Integers are big-endian; varints are unsigned LEB128 (7 bits a byte, low group
// first, at most 10 bytes); strings are a varint byte count and that many bytes of valid UTF-8:
//
//     u8        0xC1 — the marker (a byte that occurs in no UTF-8 text, so it never starts a JSON body)
//     u8        1 — the format version
//     u8        flags: 0x01 a change tag follows, 0x02 a redirect, 0x04 ended redirects; other bits 0
//     16 B      record ID
//     Int64     causal length
//     string    record type
//     [string   change tag]
//     [16 B     redirect: the winner's ID]
//     [varint E, E × (Int64 incarnation, 16 B winner)]          ended redirects, in incarnation order
//     varint S  (≥ 1), S × 36 B stamps: incarnation (Int64), HLC physical ms (Int64), HLC logical (Int32), replica
//               (16 B). Stamp 0 is the record's creation stamp; the others in order of first use by the fields.
//     varint F, F × field, in strictly increasing order of the names' UTF-8 bytes:
//               string name, u8 kind, varint stamp index (< S), value
//               kind: low nibble 0 null (no bytes), 1 integer (Int64), 2 real (IEEE 754 binary64 bits, UInt64),
//               3 text (string), 4 blob (varint count, bytes); 0x10 set when the field is encrypted; other bits 0
//     nothing after the last field.
//
// Equal records give equal bytes. Every stamp must fit the 64-hex-digit text form (incarnation ≥ 0, physical
// milliseconds below 2^48, logical below 2^16), as in the JSON form, so both forms hold exactly the same records:
// a writer refuses other stamps, a reader refuses a body that has one. A reader checks every length and count
// against the bytes that remain before it reads or allocates, and answers anything malformed with a
// ``CloudRecordBodyError`` naming the problem and its byte offset (never a value of the record).

/// A binary record body that cannot be read, or a record that cannot be written in the binary form (its reason names
/// the problem and, for a body, the byte offset; never a value of the record).
public struct CloudRecordBodyError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What is wrong.
    public var reason: String
    /// The offset in the body where reading stopped; `nil` for an error of writing.
    public var offset: Int?

    public init(reason: String, offset: Int?) {
        self.reason = reason
        self.offset = offset
    }

    public var description: String {
        if let offset { return "malformed binary record body at byte \(offset): \(reason)" }
        return "record cannot be written as a binary body: \(reason)"
    }
}

/// The stored forms of a ``CloudRecord``: the compact binary body (written by server clouds) and the JSON of
/// ``CloudRecordJSON`` (still read). The file comment above states the binary layout.
///
/// Readers tell the forms apart by the first byte: ``marker`` (0xC1) starts a binary body — its second byte is the
/// format ``version`` — and anything else is JSON.
public enum CloudRecordBody {
    /// The first byte of every binary body. It occurs in no UTF-8 text, so no JSON body starts with it.
    public static let marker: UInt8 = 0xC1
    /// The binary format version this code writes and reads (the second byte of a binary body).
    public static let version: UInt8 = 1

    /// `true` when `body` is in the binary form (its first byte is ``marker``), `false` for JSON.
    public static func isBinary(_ body: Data) -> Bool { body.first == marker }

    /// The binary body of `record` (``CloudRecord/changeTag`` included when set and `includingChangeTag`).
    /// - Throws: ``CloudRecordBodyError`` when a stamp does not fit the text form (``CloudRecord/unencodableStamp``).
    /// - Complexity: O(size of the record).
    public static func encode(_ record: CloudRecord, includingChangeTag: Bool = true) throws(CloudRecordBodyError) -> Data {
        var writer = Writer()
        var bytes: [UInt8] = []
        try writer.append(record, includingChangeTag: includingChangeTag, to: &bytes)
        return Data(bytes)
    }

    /// The record a body holds, in either stored form.
    /// - Throws: ``CloudRecordBodyError`` for a malformed binary body; the `DecodingError` of
    ///   ``CloudRecordJSON/decode(_:)`` for JSON that is not a record.
    /// - Complexity: O(`body.count`).
    public static func decode(_ body: Data) throws -> CloudRecord {
        var reader = Reader()
        return try reader.read(body)
    }

    /// The record type a body names when its record cannot be read, if the body still names one (for reports of
    /// unreadable records); `nil` otherwise.
    public static func recordType(of body: Data) -> String? {
        if isBinary(body) {
            return body.withUnsafeBytes { raw -> String? in
                var scanner = Scanner(bytes: raw)
                return try? scanner.header().type
            }
        }
        return ((try? JSONSerialization.jsonObject(with: body)) as? [String: Any])?["recordType"] as? String
    }

    // MARK: Writing

    /// Writes binary bodies. Reusing one writer for a batch saves work: records of one type usually have the same field
    /// names, and the writer remembers the last record's names in order (as bytes), so it sorts only when they change
    /// and never hashes a name.
    public struct Writer {
        /// Scratch space for the record being written (kept between records, so a batch allocates it once): the
        /// fields' names as UTF-8, one after another in the dictionary's order, where each starts (and the end), where
        /// each field is in the dictionary, the positions in name order, the distinct stamps, each field's stamp index
        /// (in name order).
        private var nameBytes: [UInt8] = []
        private var nameStarts: [Int] = []
        private var entries: [Dictionary<String, CloudField>.Index] = []
        private var order: [Int] = []
        private var stamps: [FieldStamp] = []
        private var stampIndices: [Int] = []

        /// Whether the record written last has a text field whose bytes start with `replica-asset:`, the start of
        /// every asset reference's text form: when `false`, its ``CloudRecord/assetReferences`` is empty, and a cloud
        /// need not walk its fields again to find them (when `true`, it may still be empty: the text may not parse).
        public private(set) var lastRecordMayReferenceAssets = false

        public init() {}

        /// Appends the binary body of `record` to `buffer`.
        /// - Throws: ``CloudRecordBodyError`` when a stamp does not fit the text form (`buffer` is then unchanged).
        public mutating func append(_ record: CloudRecord, includingChangeTag: Bool = true, to buffer: inout [UInt8])
            throws(CloudRecordBodyError) {
            let recordFields = record.fields
            sortNames(recordFields)
            stamps.removeAll(keepingCapacity: true)
            stampIndices.removeAll(keepingCapacity: true)
            stamps.append(record.created)
            var valueBytes = 0
            for position in order {
                let field = recordFields.values[entries[position]]
                var index = 0
                while index < stamps.count && stamps[index] != field.stamp { index += 1 }
                if index == stamps.count { stamps.append(field.stamp) }
                stampIndices.append(index)
                switch field.value {
                case .null: break
                case .integer, .real: valueBytes += 8
                case let .text(text): valueBytes += stringSize(text)
                case let .blob(data): valueBytes += varintSize(data.count) + data.count
                }
            }
            for stamp in stamps where !stamp.fitsHex {
                let site = record.unencodableStamp.map { "\($0)" } ?? "a stamp"
                throw CloudRecordBodyError(reason: "\(site) has a clock outside 48-bit milliseconds and a 16-bit counter", offset: nil)
            }
            let tag = includingChangeTag ? record.changeTag : nil
            var flags: UInt8 = 0
            var size = 3 + 16 + 8 + stringSize(record.recordType) + valueBytes
            if let tag { flags |= 0x01; size += stringSize(tag) }
            if record.redirect != nil { flags |= 0x02; size += 16 }
            if !record.endedRedirects.isEmpty {
                flags |= 0x04
                size += varintSize(record.endedRedirects.count) + 24 * record.endedRedirects.count
            }
            size += varintSize(stamps.count) + 36 * stamps.count + varintSize(order.count)
            for (rank, position) in order.enumerated() {
                let length = nameStarts[position + 1] - nameStarts[position]
                size += varintSize(length) + length + 1 + varintSize(stampIndices[rank])
            }
            let start = buffer.count
            buffer.append(contentsOf: repeatElement(0, count: size))
            var mayReferenceAssets = false
            defer { lastRecordMayReferenceAssets = mayReferenceAssets }
            buffer.withUnsafeMutableBytes { whole in
                var out = Output(base: whole.baseAddress! + start)
                out.byte(CloudRecordBody.marker)
                out.byte(CloudRecordBody.version)
                out.byte(flags)
                out.uuid(record.recordID)
                out.int64(record.causalLength)
                out.string(record.recordType)
                if let tag { out.string(tag) }
                if let redirect = record.redirect { out.uuid(redirect) }
                if !record.endedRedirects.isEmpty {
                    out.varint(record.endedRedirects.count)
                    for ended in record.endedRedirects {
                        out.int64(ended.incarnation)
                        out.uuid(ended.winner)
                    }
                }
                out.varint(stamps.count)
                for stamp in stamps { out.stamp(stamp) }
                out.varint(order.count)
                nameBytes.withUnsafeBytes { names in
                    for (rank, position) in order.enumerated() {
                        let from = nameStarts[position], length = nameStarts[position + 1] - from
                        out.varint(length)
                        if length > 0 { out.base.copyMemory(from: names.baseAddress! + from, byteCount: length) }
                        out.base += length
                        let field = recordFields.values[entries[position]]
                        let encrypted: UInt8 = field.isEncrypted ? 0x10 : 0
                        let stampIndex = stampIndices[rank]
                        switch field.value {
                        case .null:
                            out.byte(encrypted)
                            out.varint(stampIndex)
                        case let .integer(number):
                            out.byte(1 | encrypted)
                            out.varint(stampIndex)
                            out.int64(number)
                        case let .real(number):
                            out.byte(2 | encrypted)
                            out.varint(stampIndex)
                            out.uint64(number.bitPattern)
                        case let .text(text):
                            out.byte(3 | encrypted)
                            out.varint(stampIndex)
                            if out.string(text) { mayReferenceAssets = true }
                        case let .blob(data):
                            out.byte(4 | encrypted)
                            out.varint(stampIndex)
                            out.varint(data.count)
                            out.bytes(data)
                        }
                    }
                }
                precondition(out.base == whole.baseAddress! + start + size, "binary record body: size mismatch")
            }
        }

        /// The binary body of `record` (its change tag included when set).
        /// - Throws: as ``append(_:includingChangeTag:to:)``.
        public mutating func body(_ record: CloudRecord) throws(CloudRecordBodyError) -> Data {
            var bytes: [UInt8] = []
            try append(record, to: &bytes)
            return Data(bytes)
        }

        /// Fills `entries` (where each field is in the dictionary, by position), `nameBytes`/`nameStarts` (the names'
        /// UTF-8 by position) and `order` (the positions in the order of the names' UTF-8 bytes). The positions are
        /// the last record's when its names are this one's: each name of the dictionary is matched to a remembered
        /// one by its bytes (no name is hashed or sorted); otherwise the names are remembered anew, sorted.
        private mutating func sortNames(_ recordFields: [String: CloudField]) {
            let count = recordFields.count
            if count == order.count, count > 0 {
                entries.removeAll(keepingCapacity: true)
                entries.append(contentsOf: repeatElement(recordFields.startIndex, count: count))
                var matched = 0
                var index = recordFields.startIndex
                nameBytes.withUnsafeBytes { names in
                    nameStarts.withUnsafeBufferPointer { starts in
                        entries.withUnsafeMutableBufferPointer { entries in
                            while index != recordFields.endIndex {
                                var name = recordFields.keys[index]
                                let position = name.withUTF8 { utf8 -> Int in
                                    for position in 0..<count {
                                        let from = starts[position]
                                        guard starts[position + 1] - from == utf8.count else { continue }
                                        if utf8.isEmpty || memcmp(names.baseAddress! + from, utf8.baseAddress!, utf8.count) == 0 {
                                            return position
                                        }
                                    }
                                    return -1
                                }
                                // Names are distinct, so each remembered one matches at most one name.
                                guard position >= 0 else { return }
                                entries[position] = index
                                matched += 1
                                recordFields.formIndex(after: &index)
                            }
                        }
                    }
                }
                if matched == count { return }
            }
            var sorted = Array(recordFields.keys)
            sorted.sort(by: utf8Precedes)
            nameBytes.removeAll(keepingCapacity: true)
            nameStarts.removeAll(keepingCapacity: true)
            entries.removeAll(keepingCapacity: true)
            order.removeAll(keepingCapacity: true)
            for var name in sorted {
                nameStarts.append(nameBytes.count)
                name.withUTF8 { nameBytes.append(contentsOf: $0) }
                order.append(entries.count)
                entries.append(recordFields.index(forKey: name)!)
            }
            nameStarts.append(nameBytes.count)
        }
    }

    // MARK: Reading

    /// Reads bodies in either stored form. Reusing one reader for a page saves work: it remembers the last binary
    /// body's record type and field names, reuses them when the next body spells the same ones, and then builds the
    /// record's field dictionary from a template of those names without hashing a name. Not thread-safe: one reader
    /// per page or task.
    public struct Reader {
        private var typeBytes: [UInt8] = []
        private var type = ""
        /// The names by position, their bytes one after another, and where each one's bytes end.
        private var names: [String] = []
        private var nameBytes: [UInt8] = []
        private var nameEnds: [Int] = []
        /// Name → position for exactly `names`, or `nil` when it must be made again.
        private var template: [String: Int]?
        private var stamps: [FieldStamp] = []
        /// The fields of the body being read, by position, until they move into the record's dictionary.
        private var buffer = FieldBuffer(capacity: 16)

        public init() {}

        /// The record `body` holds, in either stored form.
        /// - Throws: ``CloudRecordBodyError`` for a malformed binary body; the `DecodingError` of
        ///   ``CloudRecordJSON/decode(_:)`` for JSON that is not a record.
        public mutating func read(_ body: Data) throws -> CloudRecord {
            guard body.first == marker else { return try CloudRecordJSON.decode(body) }
            return try body.withUnsafeBytes { raw throws(CloudRecordBodyError) in try readBinary(raw) }
        }

        /// The record the bytes of `body` hold, in either stored form (read in place: a binary body is not copied).
        /// - Throws: as the other `read(_:)`.
        public mutating func read(_ body: UnsafeRawBufferPointer) throws -> CloudRecord {
            guard body.first == marker else { return try CloudRecordJSON.decode(Data(body)) }
            return try readBinary(body)
        }

        /// Reads a binary body (the caller saw the marker).
        public mutating func readBinary(_ body: UnsafeRawBufferPointer) throws(CloudRecordBodyError) -> CloudRecord {
            var scanner = Scanner(bytes: body)
            let (flags, id, causalLength) = try scanner.fixedHeader()
            let typeUTF8 = try scanner.bytes(scanner.length("record type"), "record type")
            if !(typeBytes.count == typeUTF8.count && !typeUTF8.isEmpty
                 && typeBytes.withUnsafeBytes({ memcmp($0.baseAddress!, typeUTF8.baseAddress!, typeUTF8.count) == 0 })) {
                guard let text = validString(typeUTF8) else {
                    scanner.position -= typeUTF8.count
                    throw scanner.error("record type is not UTF-8")
                }
                type = text
                typeBytes = Array(typeUTF8)
            }
            let tag = flags & 0x01 != 0 ? try scanner.string("change tag") : nil
            let redirect = flags & 0x02 != 0 ? try scanner.uuid("redirect") : nil
            var ended: [EndedRedirect] = []
            if flags & 0x04 != 0 {
                let count = try scanner.count("ended redirects", bytesEach: 24)
                ended.reserveCapacity(count)
                for _ in 0..<count {
                    let incarnation = try scanner.int64("ended redirect")
                    ended.append(EndedRedirect(incarnation: incarnation, winner: try scanner.uuid("ended redirect")))
                }
            }
            let stampCount = try scanner.count("stamps", bytesEach: 36)
            guard stampCount >= 1 else { throw scanner.error("no creation stamp") }
            stamps.removeAll(keepingCapacity: true)
            for index in 0..<stampCount { stamps.append(try scanner.stamp(index)) }
            let fieldCount = try scanner.count("fields", bytesEach: 3)
            if buffer.capacity < fieldCount { buffer = FieldBuffer(capacity: max(fieldCount, 2 * buffer.capacity)) }
            let fields = buffer.base
            var initialized = 0
            // A malformed body leaves no field behind.
            defer { if initialized > 0 { fields.deinitialize(count: initialized) } }
            var previous: UnsafeRawBufferPointer?
            for position in 0..<fieldCount {
                let nameBytes = try scanner.bytes(scanner.length("field name"), "field name")
                // A name that is the last body's at this position follows the one before it (the remembered names are
                // in order, and names after one that differs are forgotten); any other is checked.
                if !nameMatches(nameBytes, at: position) {
                    if let previous, !utf8Precedes(previous, nameBytes) {
                        throw scanner.error("field names not in strictly increasing order")
                    }
                    guard let name = validString(nameBytes) else {
                        scanner.position -= nameBytes.count
                        throw scanner.error("a field name is not UTF-8")
                    }
                    setName(name, bytes: nameBytes, at: position)
                }
                previous = nameBytes
                let kind = try scanner.byte("field kind")
                guard kind & ~0x1F == 0 else { throw scanner.error("unknown field kind \(kind)") }
                let index = try scanner.varint("stamp index")
                guard index < UInt64(stampCount) else { throw scanner.error("stamp index out of range") }
                let value: SQLiteValue
                switch kind & 0x0F {
                case 0: value = .null
                case 1: value = .integer(try scanner.int64("integer value"))
                case 2: value = .real(Double(bitPattern: try scanner.uint64("real value")))
                case 3: value = .text(try scanner.string("text value"))
                case 4:
                    let bytes = try scanner.bytes(scanner.length("blob value"), "blob value")
                    value = .blob(bytes.isEmpty ? Data() : Data(bytes: bytes.baseAddress!, count: bytes.count))
                default: throw scanner.error("unknown value type \(kind & 0x0F)")
                }
                (fields + position).initialize(to: CloudField(value: value, stamp: stamps[Int(index)], isEncrypted: kind & 0x10 != 0))
                initialized += 1
            }
            guard scanner.atEnd else { throw scanner.error("bytes after the last field") }
            if names.count > fieldCount {
                names.removeSubrange(fieldCount...)
                nameBytes.removeSubrange((fieldCount == 0 ? 0 : nameEnds[fieldCount - 1])...)
                nameEnds.removeSubrange(fieldCount...)
                template = nil
            }
            if template == nil {
                var made = [String: Int](minimumCapacity: fieldCount)
                for (position, name) in names.enumerated() { made[name] = position }
                // Swift compares strings by canonical equivalence: two spellings of one name (say "é" precomposed and
                // decomposed) have different bytes but would be one key.
                guard made.count == names.count else { throw scanner.error("two field names are the same text in different Unicode forms") }
                template = made
            }
            // The template's layout is kept (no name is hashed again); each field moves out of the buffer once.
            initialized = 0
            let dictionary = template!.mapValues { (fields + $0).move() }
            return CloudRecord(recordID: id, recordType: type, changeTag: tag, causalLength: causalLength,
                               created: stamps[0], redirect: redirect, endedRedirects: ended, fields: dictionary)
        }

        /// Whether the name at `position` of the last body had these bytes.
        @inline(__always)
        private func nameMatches(_ bytes: UnsafeRawBufferPointer, at position: Int) -> Bool {
            guard position < nameEnds.count else { return false }
            let start = position == 0 ? 0 : nameEnds[position - 1]
            guard nameEnds[position] - start == bytes.count else { return false }
            return bytes.isEmpty || nameBytes.withUnsafeBytes { memcmp($0.baseAddress! + start, bytes.baseAddress!, bytes.count) == 0 }
        }

        /// Sets the name at `position` (forgetting the names after it).
        private mutating func setName(_ name: String, bytes: UnsafeRawBufferPointer, at position: Int) {
            if position < names.count {
                names.removeSubrange(position...)
                nameBytes.removeSubrange((position == 0 ? 0 : nameEnds[position - 1])...)
                nameEnds.removeSubrange(position...)
            }
            names.append(name)
            nameBytes.append(contentsOf: bytes)
            nameEnds.append(nameBytes.count)
            template = nil
        }
    }

    /// Room for the fields of one body (uninitialized between bodies).
    private final class FieldBuffer {
        let base: UnsafeMutablePointer<CloudField>
        let capacity: Int

        init(capacity: Int) {
            self.capacity = capacity
            base = .allocate(capacity: capacity)
        }

        deinit { base.deallocate() }
    }
}

/// `bytes` as a string when they are UTF-8 (ASCII checked eight bytes at a time); `nil` otherwise.
@inline(__always)
private func validString(_ bytes: UnsafeRawBufferPointer) -> String? {
    let count = bytes.count
    guard count > 0, let base = bytes.baseAddress else { return "" }
    var i = 0
    var ascii = true
    while i + 8 <= count {
        if base.loadUnaligned(fromByteOffset: i, as: UInt64.self) & 0x8080_8080_8080_8080 != 0 { ascii = false; break }
        i += 8
    }
    if ascii {
        while i < count {
            if base.load(fromByteOffset: i, as: UInt8.self) >= 0x80 { ascii = false; break }
            i += 1
        }
    }
    let units = bytes.assumingMemoryBound(to: UInt8.self)
    guard ascii || isUTF8(units) else { return nil }
    return String(decoding: units, as: UTF8.self)
}

/// Whether `units` are well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF; Unicode
/// Table 3-7).
private func isUTF8(_ units: UnsafeBufferPointer<UInt8>) -> Bool {
    var i = 0
    let n = units.count
    while i < n {
        let lead = units[i]
        if lead < 0x80 { i += 1; continue }
        let length: Int, low: UInt8, high: UInt8
        switch lead {
        case 0xC2...0xDF: length = 2; low = 0x80; high = 0xBF
        case 0xE0: length = 3; low = 0xA0; high = 0xBF
        case 0xE1...0xEC, 0xEE...0xEF: length = 3; low = 0x80; high = 0xBF
        case 0xED: length = 3; low = 0x80; high = 0x9F
        case 0xF0: length = 4; low = 0x90; high = 0xBF
        case 0xF1...0xF3: length = 4; low = 0x80; high = 0xBF
        case 0xF4: length = 4; low = 0x80; high = 0x8F
        default: return false
        }
        guard i + length <= n, units[i + 1] >= low, units[i + 1] <= high else { return false }
        for k in 2..<length where units[i + k] & 0xC0 != 0x80 { return false }
        i += length
    }
    return true
}

// MARK: - Byte-level helpers

/// Whether `a`'s UTF-8 bytes precede `b`'s (the field order of the binary form).
private func utf8Precedes(_ a: String, _ b: String) -> Bool {
    var a = a, b = b
    return a.withUTF8 { x in b.withUTF8 { y in utf8Precedes(UnsafeRawBufferPointer(x), UnsafeRawBufferPointer(y)) } }
}

private func utf8Precedes(_ x: UnsafeRawBufferPointer, _ y: UnsafeRawBufferPointer) -> Bool {
    let common = min(x.count, y.count)
    if common > 0 {
        let order = memcmp(x.baseAddress!, y.baseAddress!, common)
        if order != 0 { return order < 0 }
    }
    return x.count < y.count
}

private func utf8Equal(_ a: String, _ bytes: UnsafeRawBufferPointer) -> Bool {
    var a = a
    return a.withUTF8 { x in x.count == bytes.count && (x.isEmpty || memcmp(x.baseAddress!, bytes.baseAddress!, x.count) == 0) }
}

private func varintSize(_ value: Int) -> Int {
    var size = 1
    var v = UInt64(value) >> 7
    while v != 0 { size += 1; v >>= 7 }
    return size
}

private func stringSize(_ text: String) -> Int {
    let count = text.utf8.count
    return varintSize(count) + count
}

/// The bytes every asset reference's text form starts with (``CloudAssetReference/fieldValue``).
private let assetPrefix: [UInt8] = Array("replica-asset:".utf8)

/// Writes into memory the caller sized exactly.
private struct Output {
    var base: UnsafeMutableRawPointer

    @inline(__always) mutating func byte(_ value: UInt8) {
        base.storeBytes(of: value, as: UInt8.self)
        base += 1
    }

    @inline(__always) mutating func uint64(_ value: UInt64) {
        base.storeBytes(of: value.bigEndian, as: UInt64.self)
        base += 8
    }

    @inline(__always) mutating func int64(_ value: Int64) { uint64(UInt64(bitPattern: value)) }

    @inline(__always) mutating func varint(_ value: Int) {
        var v = UInt64(value)
        while v >= 0x80 {
            byte(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        byte(UInt8(v))
    }

    @inline(__always) mutating func uuid(_ id: UUID) {
        withUnsafeBytes(of: id.uuid) { base.copyMemory(from: $0.baseAddress!, byteCount: 16) }
        base += 16
    }

    mutating func stamp(_ stamp: FieldStamp) {
        int64(stamp.incarnation)
        int64(stamp.clock.physical)
        base.storeBytes(of: UInt32(bitPattern: stamp.clock.logical).bigEndian, as: UInt32.self)
        base += 4
        uuid(stamp.clock.replica)
    }

    /// Writes `text` (its byte count, then its UTF-8) and returns whether its bytes start with `replica-asset:`.
    @discardableResult
    mutating func string(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { utf8 in
            varint(utf8.count)
            if !utf8.isEmpty { base.copyMemory(from: utf8.baseAddress!, byteCount: utf8.count) }
            base += utf8.count
            return utf8.count >= assetPrefix.count && assetPrefix.withUnsafeBytes { memcmp(utf8.baseAddress!, $0.baseAddress!, $0.count) == 0 }
        }
    }

    mutating func bytes(_ data: Data) {
        data.withUnsafeBytes { raw in
            if !raw.isEmpty { base.copyMemory(from: raw.baseAddress!, byteCount: raw.count) }
        }
        base += data.count
    }
}

/// Reads a binary body with a bounds check before every read.
private struct Scanner {
    let bytes: UnsafeRawBufferPointer
    var position = 0

    init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    var atEnd: Bool { position == bytes.count }
    var remaining: Int { bytes.count - position }

    func error(_ reason: String) -> CloudRecordBodyError { CloudRecordBodyError(reason: reason, offset: position) }

    /// Marker, version, flags, record ID, causal length and record type.
    mutating func header() throws(CloudRecordBodyError) -> (flags: UInt8, id: UUID, causalLength: Int64, type: String) {
        let (flags, id, causalLength) = try fixedHeader()
        return (flags, id, causalLength, try string("record type"))
    }

    /// Marker, version, flags, record ID and causal length.
    mutating func fixedHeader() throws(CloudRecordBodyError) -> (flags: UInt8, id: UUID, causalLength: Int64) {
        guard try byte("marker") == CloudRecordBody.marker else { position = 0; throw error("not a binary body") }
        let version = try byte("format version")
        guard version == CloudRecordBody.version else {
            position -= 1
            throw error("unknown format version \(version) (this reader knows \(CloudRecordBody.version))")
        }
        let flags = try byte("flags")
        guard flags & ~0x07 == 0 else { position -= 1; throw error("unknown flags \(flags)") }
        let id = try uuid("record ID")
        return (flags, id, try int64("causal length"))
    }

    @inline(__always)
    mutating func bytes(_ count: Int, _ what: String) throws(CloudRecordBodyError) -> UnsafeRawBufferPointer {
        guard count <= remaining else { throw error("\(what) runs past the end (\(count) bytes, \(remaining) left)") }
        defer { position += count }
        return UnsafeRawBufferPointer(rebasing: bytes[position..<(position + count)])
    }

    @inline(__always)
    mutating func byte(_ what: String) throws(CloudRecordBodyError) -> UInt8 {
        guard remaining >= 1 else { throw error("\(what) missing: the body ends") }
        defer { position += 1 }
        return bytes[position]
    }

    @inline(__always)
    mutating func uint64(_ what: String) throws(CloudRecordBodyError) -> UInt64 {
        guard remaining >= 8 else { throw error("\(what) runs past the end") }
        defer { position += 8 }
        return UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: position, as: UInt64.self))
    }

    @inline(__always)
    mutating func int64(_ what: String) throws(CloudRecordBodyError) -> Int64 { Int64(bitPattern: try uint64(what)) }

    @inline(__always)
    mutating func uuid(_ what: String) throws(CloudRecordBodyError) -> UUID {
        guard remaining >= 16 else { throw error("\(what) runs past the end") }
        var value = UUID.unassigned.uuid
        withUnsafeMutableBytes(of: &value) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[position..<(position + 16)])) }
        position += 16
        return UUID(uuid: value)
    }

    /// An unsigned LEB128 varint of at most 64 bits.
    @inline(__always)
    mutating func varint(_ what: String) throws(CloudRecordBodyError) -> UInt64 {
        let start = position
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while position < bytes.count {
            let byte = bytes[position]
            position += 1
            guard shift < 63 || (shift == 63 && byte <= 1) else { position = start; throw error("\(what) is not a 64-bit varint") }
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
        }
        position = start
        throw error("\(what) runs past the end")
    }

    /// A byte count (at most what remains).
    @inline(__always)
    mutating func length(_ what: String) throws(CloudRecordBodyError) -> Int {
        let value = try varint(what)
        guard value <= UInt64(remaining) else { throw error("\(what) runs past the end (\(value) bytes, \(remaining) left)") }
        return Int(value)
    }

    /// A count of items of at least `bytesEach` bytes each (at most what the remaining bytes can hold).
    @inline(__always)
    mutating func count(_ what: String, bytesEach: Int) throws(CloudRecordBodyError) -> Int {
        let value = try varint(what)
        guard value <= UInt64(remaining / bytesEach) else { throw error("\(value) \(what) cannot fit in the \(remaining) bytes left") }
        return Int(value)
    }

    @inline(__always)
    mutating func string(_ what: String) throws(CloudRecordBodyError) -> String {
        let utf8 = try bytes(length(what), what)
        guard let text = validString(utf8) else {
            position -= utf8.count
            throw error("\(what) is not UTF-8")
        }
        return text
    }

    /// Stamp `index` of the table: 36 bytes, within the text form's range.
    mutating func stamp(_ index: Int) throws(CloudRecordBodyError) -> FieldStamp {
        guard remaining >= 36 else { throw error("stamp \(index) runs past the end") }
        let start = position
        let incarnation = try int64("stamp")
        let physical = try int64("stamp")
        let logical = Int32(bitPattern: UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: position, as: UInt32.self)))
        position += 4
        let replica = try uuid("stamp")
        let stamp = FieldStamp(incarnation: incarnation, clock: HLC(physical: physical, logical: logical, replica: replica))
        guard stamp.fitsHex else {
            position = start
            throw error("stamp \(index) is outside the range of the text form (incarnation ≥ 0, 48-bit milliseconds, 16-bit counter)")
        }
        return stamp
    }
}
