import CSodium
import Foundation
@testable import Replica

// Helpers of the external-storage suites (External storage, External storage faults, External data handles and
// their edge cases).

/// `count` bytes that differ for every `seed` (xorshift64: not compressible, not all equal).
func externalBytes(_ count: Int, seed: UInt64) -> Data {
    var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
    var result = [UInt8](repeating: 0, count: count)
    for index in 0..<count {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        result[index] = UInt8(truncatingIfNeeded: state)
    }
    return Data(result)
}

/// The lowercase hex SHA-256 of `data`, computed with libsodium's one-shot call (independent of Replica's).
func libsodiumSHA256(_ data: Data) -> String {
    var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
    data.withUnsafeBytes { _ = crypto_hash_sha256(&digest, $0.bindMemory(to: UInt8.self).baseAddress, UInt64($0.count)) }
    return digest.map { String(format: "%02x", $0) }.joined()
}

/// The `ExternalStorageError` of a `ReplicaError.externalStorage` that `body` throws, or `nil` when it throws another
/// error or none.
func externalStorageProblem(_ body: () throws -> Void) -> ExternalStorageError? {
    do {
        try body()
        return nil
    } catch let ReplicaError.externalStorage(error) {
        return error
    } catch {
        return nil
    }
}
