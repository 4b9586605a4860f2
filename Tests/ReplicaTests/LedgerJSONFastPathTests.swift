// The JSON the sync ledger writes and reads by hand must be exactly what JSONEncoder writes and JSONDecoder reads.
import Foundation
import Testing
@testable import Replica

@Suite("Ledger JSON fast paths")
struct LedgerJSONFastPathTests {
    static let stamp = FieldStamp(incarnation: 3, clock: HLC(physical: 1_700_000_000_123, logical: 7,
                                                            replica: UUID(uuidString: "0A1B2C3D-4E5F-6789-ABCD-EF0123456789")!))

    @Test func tokenAndLeaseMatchJSONEncoder() throws {
        for (epoch, sequence) in [(Int64(0), Int64(0)), (.min, .max), (-5, 17), (1, 123_456_789)] {
            let token = ServerChangeToken(epoch: epoch, sequence: sequence)
            #expect(try token.ledgerJSON == ReplicaJSON.string(token))
        }
        for expires in [Int64(0), -42, .max, .min] {
            let lease = SyncEngine.Lease(holder: UUID(), expires: expires)
            #expect(try lease.json == ReplicaJSON.string(lease))
        }
    }

    @Test func cloudFieldsReadAsJSONDecoderReadsThem() throws {
        let values: [SQLiteValue] = [.null, .integer(0), .integer(-1), .integer(.max), .integer(.min), .text(""),
                                     .text("a \"quoted\" \\ back/slash\n\t\r\u{8}\u{C}\u{1}\u{7F} é 😀"),
                                     .real(1.5), .real(-0.0), .real(.infinity), .real(.nan), .blob(Data([0, 1, 255]))]
        var maps: [[String: CloudField]] = [[:]]
        for (index, value) in values.enumerated() {
            maps.append(["f": CloudField(value: value, stamp: Self.stamp, isEncrypted: index % 2 == 0)])
        }
        maps.append(Dictionary(uniqueKeysWithValues: values.enumerated().map {
            ("k\($0.offset)\\\"é", CloudField(value: $0.element, stamp: Self.stamp))
        }))
        for map in maps {
            let json = try ReplicaJSON.string(map)
            let slow = ReplicaJSON.decode([String: CloudField].self, json)
            let fast = SyncLedger.decodeCloudFields(json)
            #expect(fast?.keys.sorted() == slow?.keys.sorted())
            for (key, field) in slow ?? [:] {
                let other = try #require(fast?[key])
                #expect(other.stamp == field.stamp && other.isEncrypted == field.isEncrypted)
                switch (other.value, field.value) {
                case let (.real(a), .real(b)): #expect(a.bitPattern == b.bitPattern || (a.isNaN && b.isNaN))
                case let (a, b): #expect(a == b)
                }
            }
        }
        // Other spellings JSONDecoder accepts or refuses: same result.
        let stamp = Self.stamp.description
        for json in ["{}", " {}", "{\"a\":{\"value\":{\"null\":{}},\"stamp\":\"\(stamp)\",\"isEncrypted\":true}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\",\"value\":{\"integer\":{\"_0\":007}}}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\",\"value\":{\"integer\":{\"_0\":1e3}}}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\",\"value\":{\"integer\":{\"_0\":99999999999999999999}}}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\",\"value\":{\"text\":{\"_0\":\"\\u00e9\\ud83d\\ude00\"}}}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"bad\",\"value\":{\"null\":{}}}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\"}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\",\"value\":{\"null\":{}}},\"a\":{\"isEncrypted\":true,\"stamp\":\"\(stamp)\",\"value\":{\"null\":{}}}}",
                     "{\"a\":{\"isEncrypted\":false,\"stamp\":\"\(stamp)\",\"value\":{\"null\":{}}}} ", "[", ""] {
            let slow = ReplicaJSON.decode([String: CloudField].self, json)
            let fast = SyncLedger.decodeCloudFields(json)
            #expect(fast == slow, "\(json)")
        }
    }
}
