// The hand-written forms of the sync ledger: the hex stamps must be exactly the bytes the hex formatting produced
// before; the `stamps` column's compact form must round-trip every map exactly; the JSON form stores wrote before it
// (and anything else JSONDecoder accepts) must still read back.
import Foundation
import Testing
@testable import Replica

@Suite("Ledger text forms")
struct LedgerCodingTests {
    /// The formatting the fast paths replace.
    static func slowHex(_ hlc: HLC) -> String {
        hexDigits(UInt64(max(0, hlc.physical)), width: 12) + hexDigits(UInt64(max(0, hlc.logical)), width: 4)
            + hlc.replica.bytes.map { hexDigits(UInt64($0), width: 2) }.joined()
    }

    static func slowJSON(_ stamps: [String: FieldStamp]) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try! encoder.encode(stamps), as: UTF8.self)
    }

    static func stamps(seed: UInt64) -> [[String: FieldStamp]] {
        let random = SeededRandomSource(seed: seed)
        let names = ["title", "body", "rating", "a", "Z", "_x", "a1", "a10", "a_b", "aB", "é", "with space", "q\"uote", "back\\slash", "a/b"]
        return (0..<200).map { _ in
            var result: [String: FieldStamp] = [:]
            for _ in 0..<Int(random.next() % 6) {
                var uuid = UUID.unassigned.uuid
                withUnsafeMutableBytes(of: &uuid) { $0.storeBytes(of: random.next(), toByteOffset: 0, as: UInt64.self); $0.storeBytes(of: random.next(), toByteOffset: 8, as: UInt64.self) }
                let clock = HLC(physical: Int64(random.next() % (1 << 48)), logical: Int32(random.next() % (1 << 16)), replica: UUID(uuid: uuid))
                result[names[Int(random.next() % UInt64(names.count))]] = FieldStamp(incarnation: Int64(random.next() % 1_000), clock: clock)
            }
            return result
        }
    }

    @Test("stamps and clocks print as before and parse back")
    func hexForms() throws {
        for dictionary in Self.stamps(seed: 1) {
            for stamp in dictionary.values {
                #expect(stamp.clock.hex == Self.slowHex(stamp.clock))
                #expect(stamp.description == hexDigits(UInt64(stamp.incarnation), width: 16) + Self.slowHex(stamp.clock))
                #expect(FieldStamp(stamp.description) == stamp)
                #expect(FieldStamp(stamp.description.uppercased()) == stamp)
                #expect(HLC(hex: Substring(stamp.clock.hex)) == stamp.clock)
            }
        }
        let max = HLC(physical: (1 << 48) - 1, logical: (1 << 16) - 1, replica: UUID(uuidString: "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF")!)
        #expect(max.hex == String(repeating: "f", count: 48))
        #expect(HLC(physical: 0, logical: 0, replica: .unassigned).hex == String(repeating: "0", count: 48))
        #expect(FieldStamp("x" + String(repeating: "0", count: 63)) == nil)
        #expect(FieldStamp(String(repeating: "0", count: 63)) == nil)
    }

    @Test("the JSON stamps column that stores wrote before the compact form still reads back")
    func legacyStampsColumn() throws {
        for dictionary in Self.stamps(seed: 2) {
            #expect(SyncLedger.decodeStamps(Self.slowJSON(dictionary)) == dictionary)
        }
        // What the fast parser does not handle still reads through JSONDecoder.
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: .unassigned))
        #expect(SyncLedger.decodeStamps("{ \"title\" : \"\(stamp)\" }") == ["title": stamp])
        #expect(SyncLedger.decodeStamps("{\"ti\\u0074le\":\"\(stamp)\"}") == ["title": stamp])
        #expect(SyncLedger.decodeStamps("{}") == [:])
        #expect(SyncLedger.decodeStamps("{\"title\":\"\(stamp)\"") == nil)
        #expect(SyncLedger.decodeStamps("not json") == nil)
        #expect(SyncLedger.decodeStamps(nil as String?) == nil)
    }

    static func decodeCompact(_ data: Data) -> [String: FieldStamp]? {
        data.withUnsafeBytes { SyncLedger.decodeStamps($0) }
    }

    @Test("the compact stamps column round-trips every map, odd names and extreme values included")
    func compactStampsColumn() throws {
        for dictionary in Self.stamps(seed: 3) {
            let data = SyncLedger.encodeStamps(dictionary)
            #expect(data.first == SyncLedger.stampsFormatVersion)
            #expect(Self.decodeCompact(data) == dictionary)
            // Equal maps give equal bytes, however the dictionary was built.
            var rebuilt: [String: FieldStamp] = [:]
            for key in dictionary.keys.sorted().reversed() { rebuilt[key] = dictionary[key] }
            #expect(SyncLedger.encodeStamps(rebuilt) == data)
        }
        // An empty map is a version byte and two zero counts.
        #expect(SyncLedger.encodeStamps([:]) == Data([1, 0, 0]))
        #expect(Self.decodeCompact(Data([1, 0, 0])) == [:])
        // Values the hex form cannot hold (negative, beyond 48-bit milliseconds or a 16-bit counter) round-trip exactly.
        let extremes: [FieldStamp] = [
            FieldStamp(incarnation: .max, clock: HLC(physical: .max, logical: .max, replica: UUID(uuidString: "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF")!)),
            FieldStamp(incarnation: .min, clock: HLC(physical: .min, logical: .min, replica: .unassigned)),
            FieldStamp(incarnation: -1, clock: HLC(physical: 1 << 48, logical: 1 << 16, replica: UUID(uuidString: "01900000-0000-7000-8000-00000000beef")!)),
            FieldStamp(incarnation: 0, clock: HLC(physical: 0, logical: 0, replica: .unassigned)),
        ]
        // Odd names: empty, non-ASCII, quotes, backslashes, control characters, NUL, long enough for multi-byte lengths.
        let names = ["", "é", "日本語", "q\"uote", "back\\slash", "tab\there", "nul\u{0}in", String(repeating: "long", count: 100), "🙂", "a", "A"]
        var odd: [String: FieldStamp] = [:]
        for (offset, name) in names.enumerated() { odd[name] = extremes[offset % extremes.count] }
        let data = SyncLedger.encodeStamps(odd)
        #expect(Self.decodeCompact(data) == odd)
        // Distinct stamps are written once each.
        let shared = Dictionary(uniqueKeysWithValues: (0..<50).map { ("field\($0)", extremes[0]) })
        #expect(SyncLedger.encodeStamps(shared).count < 1 + 1 + 36 + 1 + 50 * 9)
        #expect(Self.decodeCompact(SyncLedger.encodeStamps(shared)) == shared)
    }

    @Test("the positional encoder writes the same bytes as the dictionary encoder")
    func positionalEncoding() throws {
        let names = ["title", "body", "rating", "Zeta", "é", "a_b", "a"]
        let order = names.indices.sorted { names[$0].utf8.lexicographicallyPrecedes(names[$1].utf8) }
        for dictionary in Self.stamps(seed: 4) {
            // Stamps for a subset of `names`, by position.
            let values = Array(dictionary.values)
            var positional = [FieldStamp?](repeating: nil, count: names.count)
            var equivalent: [String: FieldStamp] = [:]
            for (offset, stamp) in values.enumerated() where offset < names.count && offset % 2 == 0 {
                positional[offset] = stamp
                equivalent[names[offset]] = stamp
            }
            #expect(SyncLedger.encodeStamps(names: names, order: order, stamps: positional) == SyncLedger.encodeStamps(equivalent))
        }
    }

    @Test("the one-stamp shortcut writes the same bytes as the dictionary encoder, and only when one stamp covers every field")
    func oneStampEncoding() throws {
        let names = ["title", "body", "rating", "Zeta", "é", "a_b", "a", String(repeating: "long", count: 40)]
        let order = names.indices.sorted { names[$0].utf8.lexicographicallyPrecedes(names[$1].utf8) }
        let tail = SyncLedger.oneStampTail(names: names, order: order)
        for dictionary in Self.stamps(seed: 5) {
            for stamp in dictionary.values {
                // Every field, one stamp: the shortcut.
                let all = [FieldStamp?](repeating: stamp, count: names.count)
                let every = Dictionary(uniqueKeysWithValues: names.map { ($0, stamp) })
                let fast = SyncLedger.encodeStamps(names: names, order: order, stamps: all, oneStampTail: tail)
                #expect(fast == SyncLedger.encodeStamps(every))
                #expect(fast == SyncLedger.encodeStamps(names: names, order: order, stamps: all))
                #expect(Self.decodeCompact(fast) == every)
                // A field without a stamp, or with another one: the general encoder's bytes.
                var partial = all
                partial[3] = nil
                var other = all
                other[5] = FieldStamp(incarnation: stamp.incarnation &+ 1, clock: stamp.clock)
                for stamps in [partial, other] {
                    var equivalent: [String: FieldStamp] = [:]
                    for (index, stamp) in stamps.enumerated() { if let stamp { equivalent[names[index]] = stamp } }
                    #expect(SyncLedger.encodeStamps(names: names, order: order, stamps: stamps, oneStampTail: tail)
                            == SyncLedger.encodeStamps(equivalent))
                }
            }
        }
    }

    @Test("malformed compact stamps are rejected, never trusted")
    func malformedCompactStamps() throws {
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 2, replica: UUID(uuidString: "01900000-0000-7000-8000-00000000beef")!))
        let good = SyncLedger.encodeStamps(["title": stamp, "body": stamp])
        #expect(Self.decodeCompact(good) == ["title": stamp, "body": stamp])
        // Every truncation fails, and so does a trailing byte.
        for length in 0..<good.count { #expect(Self.decodeCompact(good.prefix(length)) == nil) }
        #expect(Self.decodeCompact(good + [0]) == nil)
        // An unknown version.
        var version = good
        version[0] = 2
        #expect(Self.decodeCompact(version) == nil)
        // A stamp index out of range (the last byte is the last field's index).
        var index = good
        index[index.count - 1] = 1
        #expect(Self.decodeCompact(index) == nil)
        // A field named twice.
        var twice = SyncLedger.encodeStamps(["aaaa": stamp, "bbbb": stamp])
        let b = twice.firstIndex(of: UInt8(ascii: "b"))!
        for offset in 0..<4 { twice[b + offset] = UInt8(ascii: "a") }
        #expect(Self.decodeCompact(twice) == nil)
        // Counts far beyond the bytes there are, and a varint beyond 64 bits.
        #expect(Self.decodeCompact(Data([1, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F])) == nil)
        #expect(Self.decodeCompact(Data([1, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F])) == nil)
        #expect(Self.decodeCompact(Data([1, 0] + [UInt8](repeating: 0xFF, count: 10) + [0x7F])) == nil)
        #expect(Self.decodeCompact(Data()) == nil)
    }
}
