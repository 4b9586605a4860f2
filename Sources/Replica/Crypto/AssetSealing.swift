import CSodium
import Foundation

/// How a sealed asset is laid out and keyed (`Specs/external-storage.md`, "Sealed assets"). Internal.
///
/// The plaintext is sealed with libsodium's `crypto_secretstream_xchacha20poly1305` as a sequence of messages that
/// each fill one cloud chunk exactly: chunk 0 is the 24-byte stream header and the first message (1 MiB − 24 − 17
/// bytes of plaintext), every further chunk one message of 1 MiB − 17 bytes; the last message (tagged `FINAL`) is
/// shorter. Every message carries the same associated data, binding the asset to its zone, record type, record ID,
/// field, the write's stamp and the key version: opened anywhere else, it fails authentication.
///
/// Keys: from the zone's field key of that version, `crypto_kdf_derive_from_key` with context `rpassets` derives the
/// stream key (subkey 1) and a header key (subkey 2). The header is not random: it is the keyed BLAKE2b (header key)
/// of the associated data and the plaintext's SHA-256 — a synthetic nonce. The same write sealed again (a retry, a
/// restart, another upload after a zone reset) gives the same bytes, so an upload resumes and deduplicates; two
/// different plaintexts never share a header under one key; and the cloud learns nothing but the sealed size.
enum AssetSealing {
    static let headerLength = Int(crypto_secretstream_xchacha20poly1305_headerbytes())
    static let overhead = Int(crypto_secretstream_xchacha20poly1305_abytes())
    static let keyLength = Int(crypto_secretstream_xchacha20poly1305_keybytes())
    static var firstCapacity: Int64 { Int64(CloudAssetReference.chunkSize - headerLength - overhead) }
    static var laterCapacity: Int64 { Int64(CloudAssetReference.chunkSize - overhead) }

    /// The number of messages (= cloud chunks) of a sealed asset of `plainSize` bytes (at least 1).
    static func messageCount(plainSize: Int64) -> Int {
        plainSize <= firstCapacity ? 1 : 1 + Int((plainSize - firstCapacity + laterCapacity - 1) / laterCapacity)
    }

    /// The sealed size of `plainSize` bytes.
    static func sealedSize(plainSize: Int64) -> Int64 {
        Int64(headerLength) + plainSize + Int64(overhead * messageCount(plainSize: plainSize))
    }

    /// The plaintext bytes message `index` seals.
    static func plainRange(_ index: Int, plainSize: Int64) -> Range<Int64> {
        if index == 0 { return 0..<min(plainSize, firstCapacity) }
        let start = firstCapacity + Int64(index - 1) * laterCapacity
        return min(start, plainSize)..<min(plainSize, start + laterCapacity)
    }

    /// The associated data of every message of a sealed asset.
    static func associatedData(zone: String, recordType: String, recordID: UUID, field: String, stamp: FieldStamp, keyVersion: UInt32) -> [UInt8] {
        var bytes = Array("replica-sealed-asset-1".utf8)
        func append(_ text: String) {
            let utf8 = Array(text.utf8)
            bytes.appendBigEndianBytes(UInt32(utf8.count))
            bytes += utf8
        }
        withUnsafeBytes(of: recordID.uuid) { bytes += $0 }
        append(zone)
        append(recordType)
        append(field)
        bytes.appendBigEndianBytes(UInt64(bitPattern: stamp.incarnation))
        bytes.appendBigEndianBytes(UInt64(bitPattern: stamp.clock.physical))
        bytes.appendBigEndianBytes(UInt32(truncatingIfNeeded: stamp.clock.logical))
        withUnsafeBytes(of: stamp.clock.replica.uuid) { bytes += $0 }
        bytes.appendBigEndianBytes(keyVersion)
        return bytes
    }

    /// Derives the stream key (the first 32 bytes of `keys`) and the header key (the next 32) from `fieldKey`.
    static func deriveKeys(fieldKey: UnsafeRawBufferPointer, into keys: UnsafeMutableRawBufferPointer) {
        let context = Array("rpassets".utf8).map { CChar(bitPattern: $0) }
        let base = keys.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let key = fieldKey.baseAddress!.assumingMemoryBound(to: UInt8.self)
        _ = crypto_kdf_derive_from_key(base, keyLength, 1, context, key)
        _ = crypto_kdf_derive_from_key(base + keyLength, keyLength, 2, context, key)
    }

    /// The synthetic stream header of a plaintext whose SHA-256 is `plainHash` (hex) under `headerKey`.
    static func header(headerKey: UnsafeRawBufferPointer, associatedData: [UInt8], plainHash: String) -> [UInt8] {
        var input = associatedData
        input += Array(plainHash.utf8)
        var header = [UInt8](repeating: 0, count: headerLength)
        _ = crypto_generichash(&header, headerLength, input, UInt64(input.count),
                               headerKey.baseAddress!.assumingMemoryBound(to: UInt8.self), headerKey.count)
        return header
    }
}

/// Seals the messages of one asset in order (one message, one cloud chunk, in memory). Wipes its state when released.
final class AssetSealStream {
    private var state = crypto_secretstream_xchacha20poly1305_state()
    private let header: [UInt8]
    private let associatedData: [UInt8]
    private let messages: Int
    /// The index of the next message to seal.
    private(set) var next = 0

    /// A stream with `header` under `streamKey`. `crypto_secretstream_xchacha20poly1305_init_push` draws its header
    /// from `randombytes`; `init_pull` with the synthetic header makes the same state that `init_push` makes when it
    /// draws that header (the subkey from HChaCha20 of the header's first 16 bytes, the counter reset, the last 8
    /// bytes as the nonce), so sealing stays deterministic and the standard `pull` opens it (tested).
    init(streamKey: UnsafeRawBufferPointer, header: [UInt8], associatedData: [UInt8], messages: Int) {
        self.header = header
        self.associatedData = associatedData
        self.messages = messages
        _ = crypto_secretstream_xchacha20poly1305_init_pull(&state, header, streamKey.baseAddress!.assumingMemoryBound(to: UInt8.self))
    }

    deinit { sodium_memzero(&state, MemoryLayout.size(ofValue: state)) }

    /// Seals the next message; returns its cloud chunk (the header first, for message 0).
    func seal(_ plain: Data) -> Data {
        let prefix = next == 0 ? header.count : 0
        var chunk = Data(count: prefix + plain.count + AssetSealing.overhead)
        let tag = next == messages - 1 ? crypto_secretstream_xchacha20poly1305_tag_final() : crypto_secretstream_xchacha20poly1305_tag_message()
        chunk.withUnsafeMutableBytes { out in
            let base = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
            if prefix > 0 { header.withUnsafeBytes { base.update(from: $0.baseAddress!.assumingMemoryBound(to: UInt8.self), count: prefix) } }
            plain.withUnsafeBytes { input in
                _ = crypto_secretstream_xchacha20poly1305_push(&state, base + prefix, nil,
                                                               input.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plain.count),
                                                               associatedData, UInt64(associatedData.count), tag)
            }
        }
        next += 1
        return chunk
    }
}

/// Opens the messages of one sealed asset in order. Wipes its state when released.
final class AssetOpenStream {
    private var state = crypto_secretstream_xchacha20poly1305_state()
    private let associatedData: [UInt8]
    private let messages: Int
    private var next = 0

    /// A stream for the sealed asset whose chunk 0 is `first` (the header is its first 24 bytes); `nil` when it is
    /// too short to hold one.
    init?(streamKey: UnsafeRawBufferPointer, first: Data, associatedData: [UInt8], messages: Int) {
        guard first.count >= AssetSealing.headerLength + AssetSealing.overhead else { return nil }
        self.associatedData = associatedData
        self.messages = messages
        let ok = first.prefix(AssetSealing.headerLength).withUnsafeBytes { header in
            crypto_secretstream_xchacha20poly1305_init_pull(&state, header.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                                            streamKey.baseAddress!.assumingMemoryBound(to: UInt8.self)) == 0
        }
        if !ok { return nil }
    }

    deinit { sodium_memzero(&state, MemoryLayout.size(ofValue: state)) }

    /// Opens cloud chunk `chunk` (the next one in order); `nil` when it fails authentication, or carries the
    /// `FINAL` tag anywhere but in the last message (or lacks it there).
    func open(_ chunk: Data) -> Data? {
        let offset = next == 0 ? AssetSealing.headerLength : 0
        guard chunk.count >= offset + AssetSealing.overhead else { return nil }
        var plain = Data(count: chunk.count - offset - AssetSealing.overhead)
        var tag: UInt8 = 0
        let result = chunk.withUnsafeBytes { input in
            plain.withUnsafeMutableBytes { out in
                crypto_secretstream_xchacha20poly1305_pull(&state, out.baseAddress?.assumingMemoryBound(to: UInt8.self), nil, &tag,
                                                           input.baseAddress!.assumingMemoryBound(to: UInt8.self) + offset,
                                                           UInt64(chunk.count - offset), associatedData, UInt64(associatedData.count))
            }
        }
        let isLast = next == messages - 1
        next += 1
        guard result == 0, (tag == crypto_secretstream_xchacha20poly1305_tag_final()) == isLast else { return nil }
        return plain
    }
}

extension Array where Element == UInt8 {
    mutating func appendBigEndianBytes<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }
}
