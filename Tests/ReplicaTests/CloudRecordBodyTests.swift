import Foundation
import Testing
@testable import Replica

/// The binary record body (`CloudRecordBody`, layout in CloudRecordBody.swift and Specs/cloud-postgres.md §2): what
/// it writes reads back as the same record, equal records give equal bytes, JSON bodies are still read, and every
/// malformed body is refused with a `CloudRecordBodyError` — never a trap, never a record made up.
@Suite("Cloud record binary body")
struct CloudRecordBodyTests {
    static let replica = UUID(uuidString: "00000000-0000-7000-8000-000000000002")!
    static let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 2, logical: 3, replica: replica))

    /// The record whose bytes `layoutIsPinned` spells out.
    static let small = CloudRecord(recordID: UUID(uuidString: "00000000-0000-7000-8000-000000000001")!, recordType: "T",
                                   causalLength: 1, created: stamp,
                                   fields: ["b": CloudField(value: .text("x"), stamp: stamp, isEncrypted: true),
                                            "a": CloudField(value: .integer(5), stamp: stamp)])

    static func hex(_ data: Data) -> String { data.map { String(format: "%02x", $0) }.joined() }

    static func bytes(hex text: String) -> [UInt8] {
        let digits = Array(text.utf8.filter { $0 != UInt8(ascii: " ") })
        return stride(from: 0, to: digits.count, by: 2).map { UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
    }

    /// The bytes of `record` through JSONEncoder: a comparison that holds for NaN (which is not equal to itself).
    static func canonical(_ record: CloudRecord) throws -> Data { try CloudRecordJSON.encoder().encode(record) }

    @Test("the layout: marker 0xC1, version 1, flags, ID, causal length, type, stamps (creation first), fields in name order")
    func layoutIsPinned() throws {
        let expected = "c1 01 00" + " 00000000000070008000000000000001" + " 0000000000000001" + " 01 54"
            + " 01" + " 0000000000000001 0000000000000002 00000003 00000000000070008000000000000002"
            + " 02" + " 01 61 01 00 0000000000000005" + " 01 62 13 00 01 78"
        #expect(Self.hex(try CloudRecordBody.encode(Self.small)) == expected.replacingOccurrences(of: " ", with: ""))
        #expect(try CloudRecordBody.decode(Data(Self.bytes(hex: expected))) == Self.small)
        #expect(CloudRecordBody.isBinary(try CloudRecordBody.encode(Self.small)))
    }

    @Test("2,000 random records round-trip, with and without change tags; equal records give equal bytes")
    func roundTrip() throws {
        let random = SeededRandomSource(seed: 7)
        var writer = CloudRecordBody.Writer()
        var reader = CloudRecordBody.Reader()
        for _ in 0..<2_000 {
            let record = CloudRecordJSONTests.record(random)
            let body = try CloudRecordBody.encode(record)
            // One writer and one reader across records of every shape (their caches of names) give what fresh ones do.
            var appended: [UInt8] = [9]
            try writer.append(record, to: &appended)
            #expect(Data(appended.dropFirst()) == body)
            let back = try reader.read(body)
            #expect(try Self.canonical(back) == Self.canonical(record))
            #expect(try CloudRecordBody.encode(back) == body, "decoding and encoding again gives the same bytes")
            // The same fields inserted in another order: the same bytes.
            var shuffled = record
            shuffled.fields = [:]
            for name in record.fields.keys.sorted().reversed() { shuffled.fields[name] = record.fields[name] }
            #expect(try CloudRecordBody.encode(shuffled) == body)
            // Without the change tag (how a server that keeps tags in a column stores it).
            let untagged = try CloudRecordBody.encode(record, includingChangeTag: false)
            var expected = record
            expected.changeTag = nil
            #expect(try Self.canonical(reader.read(untagged)) == Self.canonical(expected))
            #expect(untagged.count < (try CloudRecordJSON.encode(record)).count + 64)
        }
    }

    @Test("the writer notes each record with a text field that may be an asset reference (a cloud reads only those records' fields again for assets), and only text counts")
    func writerNotesPossibleAssetReferences() throws {
        var writer = CloudRecordBody.Writer()
        var bytes: [UInt8] = []
        let asset = CloudAssetReference(of: Data([1, 2, 3]))
        let cases: [(SQLiteValue, Bool)] = [
            (.text(asset.fieldValue), true), (.text(SealedAssetReference(keyVersion: 2, sealed: asset).fieldValue), true),
            (.text("replica-asset: not a reference"), true), (.text("replica-asset"), false), (.text(" replica-asset:sha256:"), false),
            (.blob(Data(asset.fieldValue.utf8)), false), (.integer(7), false),
        ]
        for (value, noted) in cases {
            var record = Self.small
            record.fields["c"] = CloudField(value: value, stamp: Self.stamp)
            try writer.append(record, to: &bytes)
            #expect(writer.lastRecordMayReferenceAssets == noted, "\(value)")
            // Never missed: a record with references is always noted.
            #expect(record.assetReferences.isEmpty || writer.lastRecordMayReferenceAssets)
        }
        try writer.append(Self.small, to: &bytes)
        #expect(!writer.lastRecordMayReferenceAssets, "the note is the last record's, not sticky")
    }

    @Test("every value kind and edge survives exactly: Int64 and real extremes, NaN's bits, -0, empty and non-ASCII text, NUL, empty and long blobs, empty names, encrypted flags")
    func edgeValues() throws {
        let values: [SQLiteValue] = [.null, .integer(.min), .integer(.max), .integer(0), .real(-0.0), .real(.nan), .real(.infinity),
                                     .real(-.infinity), .real(.leastNonzeroMagnitude), .real(.greatestFiniteMagnitude), .text(""),
                                     .text("a\u{0}b"), .text("日本 🙂 \"\\"), .blob(Data()), .blob(Data(repeating: 0xC1, count: 70_000))]
        var fields: [String: CloudField] = [:]
        for (index, value) in values.enumerated() {
            fields[index == 0 ? "" : "f\(index)é"] = CloudField(value: value, stamp: Self.stamp, isEncrypted: index % 3 == 0)
        }
        let other = FieldStamp(incarnation: 3, clock: HLC(physical: HLC.maxPhysical, logical: HLC.maxLogical, replica: Self.replica))
        fields["z"] = CloudField(value: .integer(1), stamp: other)
        let record = CloudRecord(recordID: Self.replica, recordType: "Ünïcode", changeTag: "7.9", causalLength: 4, created: other,
                                 redirect: Self.small.recordID, endedRedirects: [EndedRedirect(incarnation: 1, winner: Self.replica),
                                                                                 EndedRedirect(incarnation: 3, winner: Self.small.recordID)],
                                 fields: fields)
        let back = try CloudRecordBody.decode(try CloudRecordBody.encode(record))
        #expect(try Self.canonical(back) == Self.canonical(record))
        for (name, field) in record.fields {
            let read = try #require(back.fields[name])
            #expect(read.isEncrypted == field.isEncrypted && read.stamp == field.stamp)
            if case let .real(x) = field.value, case let .real(y) = read.value { #expect(x.bitPattern == y.bitPattern, "\(name)") }
        }
    }

    @Test("JSON bodies are still read (both forms, by the first byte), and no JSON body starts with the marker")
    func readsJSON() throws {
        let random = SeededRandomSource(seed: 8)
        for _ in 0..<300 {
            let record = CloudRecordJSONTests.record(random)
            let json = try CloudRecordJSON.encode(record)
            #expect(json.first == UInt8(ascii: "{") && !CloudRecordBody.isBinary(json))
            #expect(try Self.canonical(CloudRecordBody.decode(json)) == Self.canonical(record))
            let foundation = try CloudRecordJSON.encoder().encode(record)
            #expect(try Self.canonical(CloudRecordBody.decode(foundation)) == Self.canonical(record))
            #expect(CloudRecordBody.recordType(of: json) == record.recordType)
            #expect(CloudRecordBody.recordType(of: try CloudRecordBody.encode(record)) == record.recordType)
        }
        #expect(throws: DecodingError.self) { try CloudRecordBody.decode(Data("{\"recordID\": 42".utf8)) }
        #expect(throws: DecodingError.self) { try CloudRecordBody.decode(Data()) }
        // A body whose type is readable but whose fields are not still names its type.
        var damaged = [UInt8](try CloudRecordBody.encode(Self.small))
        damaged.removeLast(3)
        #expect(CloudRecordBody.recordType(of: Data(damaged)) == "T")
        #expect(throws: CloudRecordBodyError.self) { try CloudRecordBody.decode(Data(damaged)) }
    }

    @Test("a stamp the text form cannot hold is refused on writing, and a body holding one is refused on reading")
    func stampsOutsideTheTextForm() throws {
        let fits = Self.stamp
        let beyond = [FieldStamp(incarnation: -1, clock: fits.clock),
                      FieldStamp(incarnation: 1, clock: HLC(physical: HLC.maxPhysical + 1, logical: 0, replica: Self.replica)),
                      FieldStamp(incarnation: 1, clock: HLC(physical: -1, logical: 0, replica: Self.replica)),
                      FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: HLC.maxLogical + 1, replica: Self.replica))]
        let body = [UInt8](try CloudRecordBody.encode(Self.small))
        let stampAt = 3 + 16 + 8 + 2 + 1  // after the header, the type and the stamp count
        for stamp in beyond {
            for inCreation in [true, false] {
                let record = CloudRecord(recordID: Self.replica, recordType: "Note", causalLength: 1, created: inCreation ? stamp : fits,
                                         fields: ["a": CloudField(value: .null, stamp: fits), "b": CloudField(value: .integer(1), stamp: inCreation ? fits : stamp)])
                #expect(throws: CloudRecordBodyError.self) { try CloudRecordBody.encode(record) }
                do {
                    _ = try CloudRecordBody.encode(record)
                } catch {
                    #expect(error.description.contains(inCreation ? "the creation stamp" : "field 'b'"), "\(error)")
                }
            }
            // The same stamp written over the small record's only stamp, by hand.
            var patched = body
            withUnsafeBytes(of: stamp.incarnation.bigEndian) { patched.replaceSubrange(stampAt..<stampAt + 8, with: $0) }
            withUnsafeBytes(of: stamp.clock.physical.bigEndian) { patched.replaceSubrange(stampAt + 8..<stampAt + 16, with: $0) }
            withUnsafeBytes(of: stamp.clock.logical.bigEndian) { patched.replaceSubrange(stampAt + 16..<stampAt + 20, with: $0) }
            #expect(throws: CloudRecordBodyError.self) { try CloudRecordBody.decode(Data(patched)) }
        }
    }

    /// The error a body gives, or "accepted".
    static func outcome(_ bytes: [UInt8]) -> String {
        do {
            _ = try CloudRecordBody.decode(Data(bytes))
            return "accepted"
        } catch let error as CloudRecordBodyError {
            return error.reason
        } catch {
            return "\(type(of: error))"
        }
    }

    @Test("malformed bodies are refused with the problem named: every truncation, an unknown version or flag or kind, bytes left over, names out of order or repeated, a stamp index out of range, counts and lengths past the end, text that is not UTF-8")
    func malformedBodies() throws {
        let body = [UInt8](try CloudRecordBody.encode(Self.small))
        for length in 0..<body.count {
            let outcome = Self.outcome(Array(body.prefix(length)))
            #expect(outcome != "accepted", "prefix of \(length) bytes")
            #expect(length == 0 ? outcome == "DecodingError" : !outcome.contains("Error"), "prefix of \(length): \(outcome)")
        }
        func changed(_ at: Int, _ byte: UInt8) -> [UInt8] { var copy = body; copy[at] = byte; return copy }
        #expect(Self.outcome(changed(1, 2)).contains("unknown format version 2"))
        #expect(Self.outcome(changed(2, 0x08)).contains("unknown flags"))
        #expect(Self.outcome(body + [0]).contains("bytes after the last field"))
        // The type's length at 27, the stamp count at 29, the stamp at 30–65; fields: the count at 66, "a" at 67 (name
        // at 68, kind at 69, stamp index at 70, value at 71–78), "b" at 79 (name at 80, kind at 81, index at 82, text
        // length at 83, text at 84).
        #expect(body.count == 85 && body[66] == 2 && body[68] == UInt8(ascii: "a") && body[80] == UInt8(ascii: "b"))
        #expect(Self.outcome(changed(80, UInt8(ascii: "a"))).contains("not in strictly increasing order"))
        #expect(Self.outcome(changed(80, UInt8(ascii: "0"))).contains("not in strictly increasing order"))
        #expect(Self.outcome(changed(70, 1)).contains("stamp index out of range"))
        #expect(Self.outcome(changed(69, 0x20)).contains("unknown field kind"))
        #expect(Self.outcome(changed(69, 0x07)).contains("unknown value type"))
        #expect(Self.outcome(changed(66, 0x7F)).contains("cannot fit"))
        #expect(Self.outcome(changed(27, 0x7F)).contains("runs past the end"))
        #expect(Self.outcome(changed(68, 0xFF)).contains("not UTF-8"))
        #expect(Self.outcome(changed(84, 0xC3)).contains("not UTF-8"))
        // A stamp count that claims more than the bytes hold, and a varint longer than 64 bits.
        #expect(Self.outcome(changed(29, 0x7F)).contains("cannot fit"))
        var long = body
        long.replaceSubrange(29..<30, with: [UInt8](repeating: 0xFF, count: 10) + [0x01])
        #expect(Self.outcome(long).contains("not a 64-bit varint"))
        // No stamp at all: the creation stamp is missing.
        var stampless = Array(body.prefix(29)) + [0, 0]
        #expect(Self.outcome(stampless).contains("no creation stamp"))
        stampless = Array(body.prefix(29))
        #expect(Self.outcome(stampless) != "accepted")
    }

    @Test("20,000 random mutations of binary bodies: each decodes to a record that encodes again, or is refused with a CloudRecordBodyError")
    func hostileBytes() throws {
        let random = SeededRandomSource(seed: 2_025)
        func draw(_ bound: Int) -> Int { Int(random.next() % UInt64(bound)) }
        var accepted = 0, refused = 0
        for round in 0..<20_000 {
            var bytes = [UInt8](try CloudRecordBody.encode(CloudRecordJSONTests.record(random)))
            for _ in 0..<(1 + draw(3)) where bytes.count > 1 {
                let at = 1 + draw(bytes.count - 1)
                switch (round + draw(4)) % 4 {
                case 0: bytes = Array(bytes.prefix(at))
                case 1: bytes[at] = UInt8(truncatingIfNeeded: random.next())
                case 2: bytes.insert(contentsOf: [0xFF, 0x80, 0x00, 0x7F][..<(1 + draw(4))], at: at)
                default: bytes.removeSubrange(at..<min(bytes.count, at + 1 + draw(8)))
                }
            }
            do {
                let record = try CloudRecordBody.decode(Data(bytes))
                // What decodes is a record the writer takes (stamps in range, names valid) and reads back the same.
                #expect(try Self.canonical(CloudRecordBody.decode(CloudRecordBody.encode(record))) == Self.canonical(record))
                accepted += 1
            } catch is CloudRecordBodyError {
                refused += 1
            }
        }
        #expect(accepted > 1_000 && refused > 10_000, "accepted \(accepted), refused \(refused)")
    }
}

extension CloudRecordBodyTests {
    @Test("two field names that are one Swift string in different Unicode forms are refused, never merged into one field; names are written byte-exact")
    func canonicallyEquivalentNames() throws {
        let composed = "caf\u{E9}", decomposed = "cafe\u{301}"
        #expect(composed == decomposed && Array(composed.utf8) != Array(decomposed.utf8))
        // A record with the decomposed spelling keeps its bytes, also after a record with the composed one.
        var writer = CloudRecordBody.Writer()
        var first: [UInt8] = [], second: [UInt8] = []
        try writer.append(CloudRecord(recordID: Self.replica, recordType: "T", causalLength: 1, created: Self.stamp,
                                      fields: [composed: CloudField(value: .integer(1), stamp: Self.stamp)]), to: &first)
        try writer.append(CloudRecord(recordID: Self.replica, recordType: "T", causalLength: 1, created: Self.stamp,
                                      fields: [decomposed: CloudField(value: .integer(1), stamp: Self.stamp)]), to: &second)
        #expect(second.firstRange(of: Array(decomposed.utf8)) != nil && second.firstRange(of: Array(composed.utf8)) == nil)
        // A hostile body naming both spellings (in byte order) is refused.
        let one = try CloudRecordBody.encode(CloudRecord(recordID: Self.replica, recordType: "T", causalLength: 1, created: Self.stamp,
                                                         fields: ["a": CloudField(value: .integer(1), stamp: Self.stamp),
                                                                  "b": CloudField(value: .integer(2), stamp: Self.stamp)]))
        var bytes = [UInt8](one)
        let a = try #require(bytes.firstRange(of: [1, UInt8(ascii: "a"), 1]))
        let names = [Array(composed.utf8), Array(decomposed.utf8)].sorted { $0.lexicographicallyPrecedes($1) }
        bytes.replaceSubrange(a.lowerBound..<a.lowerBound + 2, with: [UInt8(names[0].count)] + names[0])
        let b = try #require(bytes.firstRange(of: [1, UInt8(ascii: "b"), 1]))
        bytes.replaceSubrange(b.lowerBound..<b.lowerBound + 2, with: [UInt8(names[1].count)] + names[1])
        #expect(Self.outcome(bytes).contains("different Unicode forms"), "\(Self.outcome(bytes))")
    }
}
