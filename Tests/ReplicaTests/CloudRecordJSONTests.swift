import Foundation
import Testing
@testable import Replica

/// The stored JSON form of a record, written and read by hand (`CloudRecordJSON.encode`/`decode`): what it writes,
/// JSONDecoder reads as the same record; what JSONEncoder writes, it reads as the same record; anything else it hands
/// to JSONDecoder.
@Suite("Cloud record JSON")
struct CloudRecordJSONTests {
    /// A random record: every value kind (reals of every magnitude, non-finite ones, blobs, strings with quotes,
    /// escapes, control characters and non-ASCII), tags, redirects, ended redirects.
    static func record(_ random: SeededRandomSource) -> CloudRecord {
        func draw(_ bound: Int) -> Int { Int(random.next() % UInt64(bound)) }
        func uuid() -> UUID {
            var bytes = [UInt8](repeating: 0, count: 16)
            for i in 0..<16 { bytes[i] = UInt8(truncatingIfNeeded: random.next()) }
            return bytes.withUnsafeBytes { UUID(uuid: $0.loadUnaligned(as: uuid_t.self)) }
        }
        func stamp() -> FieldStamp {
            FieldStamp(incarnation: Int64(1 + 2 * draw(3)), clock: HLC(physical: Int64(draw(1 << 40)), logical: Int32(draw(65_536)), replica: uuid()))
        }
        let pieces = ["a", "é", "\"", "\\", "/", "\n", "\t", "\u{1}", "\u{1F}", "日本", "🙂", " ", "}", "{\"x\":1}", "\u{7F}", "\u{2028}"]
        func text() -> String { (0..<draw(6)).map { _ in pieces[draw(pieces.count)] }.joined() }
        func value() -> SQLiteValue {
            switch draw(9) {
            case 0: return .null
            case 1: return .integer(Int64(bitPattern: random.next()))
            case 2: return .integer(Int64(draw(1_000)) - 500)
            case 3: return .real(Double(bitPattern: random.next() & 0x7FEF_FFFF_FFFF_FFFF) * (draw(2) == 0 ? 1 : -1))
            case 4: return .real([0.0, -0.0, 1.0, 0.1, 1e-300, .leastNonzeroMagnitude, 1e300, 2.5, 123456789.0, .infinity, -.infinity][draw(11)])
            case 5: return .blob(Data((0..<draw(40)).map { _ in UInt8(truncatingIfNeeded: random.next()) }))
            default: return .text(text())
            }
        }
        var fields: [String: CloudField] = [:]
        for _ in 0..<draw(12) { fields[draw(4) == 0 ? text() : "f\(draw(50))"] = CloudField(value: value(), stamp: stamp(), isEncrypted: draw(5) == 0) }
        return CloudRecord(recordID: uuid(), recordType: draw(4) == 0 ? text() : "Note", changeTag: draw(2) == 0 ? nil : "\(draw(1 << 30)).\(draw(1_000))",
                           causalLength: Int64(1 + draw(6)), created: stamp(), redirect: draw(4) == 0 ? uuid() : nil,
                           endedRedirects: (0..<draw(3)).map { _ in EndedRedirect(incarnation: Int64(1 + 2 * draw(3)), winner: uuid()) },
                           fields: fields)
    }

    @Test("both ways agree with JSONEncoder/JSONDecoder over 2,000 random records: the same bytes written, the same record read")
    func agreesWithFoundation() throws {
        let random = SeededRandomSource(seed: 42)
        let encoder = CloudRecordJSON.encoder(), decoder = CloudRecordJSON.decoder()
        for _ in 0..<2_000 {
            let record = Self.record(random)
            let written = try CloudRecordJSON.encode(record)
            // JSONDecoder reads what the fast path writes; the fast path reads what JSONEncoder writes; each way the
            // same record (compared by JSONEncoder's bytes: NaN is not equal to itself).
            let byFoundation = try decoder.decode(CloudRecord.self, from: written)
            let foundationBytes = try encoder.encode(record)
            #expect(written == foundationBytes, "the fast path writes JSONEncoder's bytes")
            #expect(try encoder.encode(byFoundation) == foundationBytes)
            #expect(try encoder.encode(CloudRecordJSON.decode(foundationBytes)) == foundationBytes)
            #expect(try encoder.encode(CloudRecordJSON.decode(written)) == foundationBytes)
            #expect(try CloudRecordJSON.encode(record) == written)
            if !record.fields.values.contains(where: { if case let .real(x) = $0.value { x.isNaN } else { false } }) {
                #expect(try CloudRecordJSON.decode(written) == record)
            }
        }
    }

    @Test("a NaN, infinities, and a string with every escape round-trip through the stored form")
    func specialValues() throws {
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: UUID(uuidString: "00000000-0000-7000-8000-000000000001")!))
        let record = CloudRecord(recordID: UUID(uuidString: "00000000-0000-7000-8000-000000000002")!, recordType: "Note", causalLength: 1,
                                 created: stamp, fields: [
                                     "nan": CloudField(value: .real(.nan), stamp: stamp),
                                     "up": CloudField(value: .real(.infinity), stamp: stamp),
                                     "text": CloudField(value: .text("\"\\/\u{8}\u{C}\n\r\t\u{0}\u{1F}é"), stamp: stamp, isEncrypted: true),
                                 ])
        let written = try CloudRecordJSON.encode(record)
        let text = String(decoding: written, as: UTF8.self)
        #expect(text.contains(#"{"real":{"_0":"NaN"}}"#) && text.contains(#"{"real":{"_0":"+Infinity"}}"#))
        #expect(text.contains(#""\"\\/\b\f\n\r\t\u0000\u001fé""#))
        let back = try CloudRecordJSON.decode(written)
        guard case let .real(nan)? = back.fields["nan"]?.value, nan.isNaN else { Issue.record("NaN lost"); return }
        #expect(back.fields["up"]?.value == .real(.infinity))
        #expect(back.fields["text"] == record.fields["text"])
    }

    @Test("other spellings of the same JSON are read as JSONDecoder reads them; a malformed record throws as it does")
    func otherSpellings() throws {
        let record = Self.record(SeededRandomSource(seed: 7))
        let compact = String(decoding: try CloudRecordJSON.encoder().encode(record), as: UTF8.self)
        let spaced = compact.replacingOccurrences(of: ",\"", with: ", \"").replacingOccurrences(of: ":{", with: ": {")
        #expect(try CloudRecordJSON.encode(CloudRecordJSON.decode(Data(spaced.utf8))) == CloudRecordJSON.encode(record))
        // An unknown key is ignored, as JSONDecoder ignores it.
        let extended = "{\"future\":[1,2]," + compact.dropFirst()
        #expect(try CloudRecordJSON.decode(Data(extended.utf8)).recordID == record.recordID)
        for broken in ["", "{}", "[]", String(compact.dropLast()), compact.replacingOccurrences(of: "\"recordID\"", with: "\"recordId\"")] {
            #expect(throws: DecodingError.self) { try CloudRecordJSON.decode(Data(broken.utf8)) }
        }
    }

    /// What a decoding gives: the record's JSONEncoder bytes, or the error's type. (Not the error's case or path:
    /// JSONDecoder reads a dictionary's entries in hash order and validates strings lazily, so which of two damaged
    /// fields it names first varies between two runs of JSONDecoder itself.)
    static func outcome(_ decode: () throws -> CloudRecord) -> String {
        do {
            return String(decoding: try CloudRecordJSON.encoder().encode(decode()), as: UTF8.self)
        } catch is DecodingError {
            return "DecodingError"
        } catch {
            return "other error: \(type(of: error))"
        }
    }

    @Test("hostile bytes — 10,000 mutations and truncations of stored records — decode to the record or the DecodingError JSONDecoder gives")
    func hostileBytesDecodeAsJSONDecoderDecodes() throws {
        let random = SeededRandomSource(seed: 2_024)
        func draw(_ bound: Int) -> Int { Int(random.next() % UInt64(bound)) }
        // Bytes a mutation writes: JSON punctuation, digits, letters of the keywords and hex, escapes, bytes that are
        // not UTF-8 (a lone continuation byte, a truncated sequence, an overlong NUL), control characters.
        let alphabet: [[UInt8]] = ["{", "}", "[", "]", ":", ",", "\"", "\\", "0", "1", "7", "9", "-", ".", "e", "E", "+",
                                   "a", "f", "g", "t", "n", " ", "\\u0000", "\\ud800", "null", "true", "1e999", "\u{1}"]
            .map { Array($0.utf8) } + [[0x80], [0xC3], [0xE6, 0x97], [0xC0, 0x80], [0xFF], [0xED, 0xA0, 0x80], [0x00], [0x7F]]
        var accepted = 0, refused = 0
        for round in 0..<10_000 {
            var bytes = [UInt8](try CloudRecordJSON.encode(Self.record(random)))
            switch round % 4 {
            case 0:  // truncated
                bytes = Array(bytes.prefix(draw(bytes.count)))
            case 1:  // one byte replaced
                bytes[draw(bytes.count)] = alphabet[draw(alphabet.count)].first!
            case 2:  // a run inserted
                bytes.insert(contentsOf: alphabet[draw(alphabet.count)], at: draw(bytes.count + 1))
            default:  // up to four edits of either kind, or a run removed
                for _ in 0..<(1 + draw(4)) where !bytes.isEmpty {
                    let at = draw(bytes.count)
                    switch draw(3) {
                    case 0: bytes.replaceSubrange(at..<min(bytes.count, at + 1 + draw(8)), with: alphabet[draw(alphabet.count)])
                    case 1: bytes.removeSubrange(at..<min(bytes.count, at + 1 + draw(8)))
                    default: bytes.insert(contentsOf: alphabet[draw(alphabet.count)], at: at)
                    }
                }
            }
            let data = Data(bytes)
            let fast = Self.outcome { try CloudRecordJSON.decode(data) }
            let foundation = Self.outcome { try CloudRecordJSON.decoder().decode(CloudRecord.self, from: data) }
            #expect(fast == foundation, "input \(String(decoding: data, as: UTF8.self).debugDescription)")
            if fast.hasPrefix("DecodingError") { refused += 1 } else { accepted += 1 }
        }
        // The mutations reach both outcomes often (so the property compares accepted records, not only errors).
        #expect(accepted > 250 && refused > 2_500, "accepted \(accepted), refused \(refused)")
    }

    @Test("a stamp the text form cannot hold — creation or field, negative or past 48-bit milliseconds or a 16-bit counter — is refused with EncodingError, as JSONEncoder refuses it")
    func unencodableStampsAreRefused() throws {
        let replica = UUID(uuidString: "00000000-0000-7000-8000-000000000003")!
        let fits = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: replica))
        let beyond = [FieldStamp(incarnation: -1, clock: fits.clock),
                      FieldStamp(incarnation: 1, clock: HLC(physical: HLC.maxPhysical + 1, logical: 0, replica: replica)),
                      FieldStamp(incarnation: 1, clock: HLC(physical: -1, logical: 0, replica: replica)),
                      FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: HLC.maxLogical + 1, replica: replica))]
        for stamp in beyond {
            for inCreation in [true, false] {
                let record = CloudRecord(recordID: replica, recordType: "Note", causalLength: 1, created: inCreation ? stamp : fits,
                                         fields: ["a": CloudField(value: .null, stamp: fits), "b": CloudField(value: .integer(1), stamp: inCreation ? fits : stamp)])
                #expect(record.unencodableStamp == (inCreation ? .creation : .field("b")))
                #expect(throws: EncodingError.self) { try CloudRecordJSON.encoder().encode(record) }
                #expect(throws: EncodingError.self) { try CloudRecordJSON.encode(record) }
            }
        }
    }

    @Test("bytes that are not UTF-8 inside a string are refused as JSONDecoder refuses them, never repaired")
    func invalidUTF8IsRefused() throws {
        let record = Self.record(SeededRandomSource(seed: 11))
        var bytes = [UInt8](try CloudRecordJSON.encode(record))
        let type = try #require(bytes.firstRange(of: Array("\"recordType\":\"".utf8)))
        bytes.insert(contentsOf: [0xFF, 0xC3], at: type.upperBound)
        let data = Data(bytes)
        #expect(throws: DecodingError.self) { try CloudRecordJSON.decoder().decode(CloudRecord.self, from: data) }
        #expect(throws: DecodingError.self) { try CloudRecordJSON.decode(data) }
    }
}
