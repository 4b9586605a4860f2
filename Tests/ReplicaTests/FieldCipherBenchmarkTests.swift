import CSodium
import Foundation
import Testing
@testable import Replica

/// Timing of the field cipher against raw libsodium calls doing the same work. Off by default; run in a release
/// build with `REPLICA_CRYPTO_BENCH=1 swift test -c release -Xswiftc -enable-testing --filter FieldCipherBenchmark`.
/// Prints timings (thread CPU time) only, never values.
@Suite("Field cipher benchmark", .serialized, .enabled(if: ProcessInfo.processInfo.environment["REPLICA_CRYPTO_BENCH"] != nil))
struct FieldCipherBenchmarkTests {
    static let count = 100_000

    /// CPU time of the calling thread spent in `body`, in seconds (steadier than wall time on a shared machine).
    static func seconds(_ body: () throws -> Void) rethrows -> Double {
        func now() -> Double {
            var spec = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
            return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
        }
        let start = now()
        try body()
        return now() - start
    }

    @Test("seal + open of 100k records with two 64-byte encrypted fields vs raw crypto_aead_xchacha20poly1305_ietf calls")
    func sealOpen() throws {
        let random = SodiumRandomSource()
        let replica = UUID()
        let records: [CloudRecord] = (0..<Self.count).map { i in
            let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 1_767_225_600_000 + Int64(i), logical: 0, replica: replica))
            return CloudRecord(recordID: UUID(), recordType: "Diary", causalLength: 1, created: stamp, fields: [
                "title": CloudField(value: .text("title \(i)"), stamp: stamp),
                "secret": CloudField(value: .text(secretText("s", i)), stamp: stamp, isEncrypted: true),
                "photo": CloudField(value: .blob(secretBlob(i)), stamp: stamp, isEncrypted: true),
            ])
        }
        // Raw: per field, a random nonce, encrypt 64 bytes with ~100 bytes of associated data into a fresh buffer that
        // is kept (as sealed values are); then decrypt every one.
        var key = [UInt8](repeating: 0, count: 32)
        randombytes_buf(&key, 32)
        let ad = [UInt8](repeating: 0xAD, count: 100)
        let message = [UInt8](repeating: 0x61, count: 64)
        var rawSealed: [[UInt8]] = []
        rawSealed.reserveCapacity(Self.count * 2)
        let rawEncrypt = Self.seconds {
            for _ in 0..<(Self.count * 2) {
                var sealed = [UInt8](repeating: 0, count: 24 + 64 + 16)
                sealed.withUnsafeMutableBufferPointer { s in
                    randombytes_buf(s.baseAddress!, 24)
                    _ = crypto_aead_xchacha20poly1305_ietf_encrypt(s.baseAddress! + 24, nil, message, 64, ad, 100, nil, s.baseAddress!, key)
                }
                rawSealed.append(sealed)
            }
        }
        var sink = 0
        let rawDecrypt = Self.seconds {
            var opened = [UInt8](repeating: 0, count: 64)
            for sealed in rawSealed {
                sealed.withUnsafeBufferPointer { s in
                    sink &+= Int(crypto_aead_xchacha20poly1305_ietf_decrypt(&opened, nil, nil, s.baseAddress! + 24, 80, ad, 100, s.baseAddress!, key))
                }
            }
        }
        let raw = rawEncrypt + rawDecrypt
        #expect(sink == 0)
        let cipher = try FieldCipher(zone: "notes", encryptedFields: ["Diary": ["secret", "photo"]], random: random)
        try key.withUnsafeBytes { try cipher.setKey(version: 1, $0) }
        var sealed: [CloudRecord] = []
        sealed.reserveCapacity(Self.count)
        let seal = try Self.seconds {
            for start in stride(from: 0, to: Self.count, by: 200) {
                var batch = Array(records[start..<min(start + 200, Self.count)])
                try cipher.seal(&batch)
                sealed += batch
            }
        }
        var copied = 0
        let copyOnly = Self.seconds {
            for start in stride(from: 0, to: Self.count, by: 200) {
                var batch = Array(records[start..<min(start + 200, Self.count)])
                for i in batch.indices { batch[i].fields["secret"]!.isEncrypted = true }
                copied += batch.count
            }
        }
        print(String(format: "[bench] copying batches and touching one field: %.3f s", copyOnly))
        var failures = 0
        let open = Self.seconds {
            for start in stride(from: 0, to: Self.count, by: 500) {
                for result in cipher.open(Array(sealed[start..<min(start + 500, Self.count)])) {
                    if case .failure = result { failures += 1 }
                }
            }
        }
        #expect(failures == 0)
        print(String(format: "[bench] %d records x 2 fields: raw encrypt %.3f s + decrypt %.3f s = %.3f s; FieldCipher seal %.3f s (%.2fx) + open %.3f s (%.2fx) = %.3f s (%.2fx raw)",
                     Self.count, rawEncrypt, rawDecrypt, raw, seal, seal / rawEncrypt, open, open / rawDecrypt, seal + open, (seal + open) / raw))
    }

    @Test("insert + sync of 20k records with two 64-byte encrypted fields, with and without encryption")
    func syncPath() throws {
        let n = 20_000
        func run(encrypted: Bool) throws -> (insert: Double, upload: Double, download: Double) {
            let cloud = InMemoryCloudDatabase()
            let encryption = encrypted ? try Keys.raw(1) : nil
            let models: [any PersistentModel.Type] = encrypted ? [Diary.self] : [PlainDiary.self]
            let a = try CryptoDevice("A", seed: 1, encryption: encryption, models: models)
            let b = try CryptoDevice("B", seed: 2, encryption: encryption, models: models)
            let insert = try Self.seconds {
                for i in 0..<n {
                    if encrypted {
                        a.context.insert(Diary(title: "t\(i)", secret: secretText("s", i), photo: secretBlob(i)))
                    } else {
                        a.context.insert(PlainDiary(title: "t\(i)", secret: secretText("s", i), photo: secretBlob(i)))
                    }
                }
                try a.context.save()
            }
            let upload = try Self.seconds { try a.sync(cloud, maxSteps: 10_000) }
            let download = try Self.seconds { try b.sync(cloud, maxSteps: 10_000) }
            return (insert, upload, download)
        }
        let plain = try run(encrypted: false)
        let sealed = try run(encrypted: true)
        let plainTotal = plain.insert + plain.upload + plain.download
        let sealedTotal = sealed.insert + sealed.upload + sealed.download
        print(String(format: "[bench] %d records: plain insert %.3f upload %.3f download %.3f = %.3f s; encrypted insert %.3f upload %.3f download %.3f = %.3f s (%.3fx)",
                     n, plain.insert, plain.upload, plain.download, plainTotal, sealed.insert, sealed.upload, sealed.download, sealedTotal,
                     sealedTotal / plainTotal))
    }
}

/// ``Diary`` without encryption, for the baseline.
struct PlainDiary: PersistentModel, Codable, Equatable {
    static var entityName: String { "Diary" }
    var id = UUID.unassigned
    var title: String = ""
    var secret: String = ""
    var photo: Data?
    var mood: Int = 0
    static let entity = ModelEntity<PlainDiary>([
        .attribute("title", \.title, default: ""),
        .attribute("secret", \.secret, default: ""),
        .attribute("photo", \.photo),
        .attribute("mood", \.mood, default: 0),
    ])
}
