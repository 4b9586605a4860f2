// The hand-written text forms of the sync ledger must produce exactly the bytes JSONEncoder and the hex formatting
// produced before, and read them (and anything else JSONDecoder accepts) back.
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

    @Test("the stamps column is byte-for-byte what JSONEncoder wrote, and reads back")
    func stampsColumn() throws {
        for dictionary in Self.stamps(seed: 2) {
            let json = SyncLedger.encodeStamps(dictionary)
            #expect(json == Self.slowJSON(dictionary))
            #expect(SyncLedger.decodeStamps(json) == dictionary)
        }
        // What the fast parser does not handle still reads through JSONDecoder.
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: .unassigned))
        #expect(SyncLedger.decodeStamps("{ \"title\" : \"\(stamp)\" }") == ["title": stamp])
        #expect(SyncLedger.decodeStamps("{\"ti\\u0074le\":\"\(stamp)\"}") == ["title": stamp])
        #expect(SyncLedger.decodeStamps("{}") == [:])
        #expect(SyncLedger.decodeStamps("{\"title\":\"\(stamp)\"") == nil)
        #expect(SyncLedger.decodeStamps("not json") == nil)
        #expect(SyncLedger.decodeStamps(nil) == nil)
    }
}
