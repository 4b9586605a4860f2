import CCrypto
import Foundation

// The asset references a replicated record's fields hold (external storage in sync, R19 and "Sealed assets" in
// Specs/external-storage.md): a plain asset's (`CloudAssetReference`, with the SHA-256 that names it) and a sealed
// asset's (`SealedAssetReference`), and the assets a record references. Value formats, shared by the cloud databases
// (Cloud/), the sealing of assets (Crypto/), external storage (Store/) and the engine (Sync/).

/// An asset as the cloud names it (CloudKit's `CKAsset`): the SHA-256 of its bytes and its size. Large values of
/// attributes marked ``Schema/Attribute/Options/externalStorage`` travel as assets, outside the record: the record's
/// field holds the reference's ``fieldValue``, and the bytes move in chunks of ``chunkSize`` bytes through
/// ``CloudDatabase/uploadAssetChunk(_:index:bytes:in:)`` and ``CloudDatabase/downloadAssetChunk(_:index:in:)``.
///
/// An asset belongs to a zone: a zone holds each hash once (uploading it again finds it complete: deduplication),
/// and deleting the zone deletes its assets. For an asset sealed on the device (an encrypted attribute's), the hash
/// and size are those of the sealed bytes.
///
/// See `Specs/external-storage.md` ("Assets in sync").
public struct CloudAssetReference: Hashable, Sendable, Codable, Comparable, CustomStringConvertible {
    /// The lowercase hexadecimal SHA-256 of the asset's bytes (64 characters).
    public let hash: String
    /// The asset's size in bytes (≥ 0).
    public let size: Int64

    /// The size of every chunk but the last, in bytes: 1 MiB. Chunk `i` holds bytes `i * chunkSize ..< min(size,
    /// (i + 1) * chunkSize)`.
    public static let chunkSize = 1 << 20

    /// The largest asset a cloud accepts unless configured otherwise, in bytes: 256 MiB.
    public static let defaultMaximumSize: Int64 = 256 << 20

    /// The prefix of ``fieldValue``: the text form of a local row's reference (`AssetReference`, Model/), which a
    /// cloud asset's reference shares.
    static let fieldPrefix = AssetReference.prefix

    /// A reference; `nil` when `hash` is not 64 lowercase hexadecimal digits or `size` is negative.
    /// - Parameters:
    ///   - hash: the lowercase hexadecimal SHA-256 of the bytes.
    ///   - size: the size in bytes.
    public init?(hash: String, size: Int64) {
        guard size >= 0, Self.isHexDigest(hash) else { return nil }
        self.hash = hash
        self.size = size
    }

    /// The reference of `data` (hashes it: O(`data.count`)).
    public init(of data: Data) {
        hash = Self.sha256Hex(data)
        size = Int64(data.count)
    }

    /// The reference a record field holds, `replica-asset:sha256:<hash>:<size>` (the same text a local store's row
    /// holds for a value kept in a file); `nil` when `text` is not one.
    public init?(fieldValue text: String) {
        guard text.hasPrefix(Self.fieldPrefix) else { return nil }
        let rest = text.utf8.dropFirst(Self.fieldPrefix.utf8.count)
        guard rest.count > 65, let colon = rest.firstIndex(of: UInt8(ascii: ":")),
              rest.distance(from: rest.startIndex, to: colon) == 64 else { return nil }
        let hash = String(decoding: rest[rest.startIndex..<colon], as: UTF8.self)
        let digits = rest[rest.index(after: colon)...]
        guard digits.count <= 18, digits.allSatisfy({ (48...57).contains($0) }),
              let size = Int64(String(decoding: digits, as: UTF8.self)) else { return nil }
        self.init(hash: hash, size: size)
    }

    /// The text a record field (and a local row) holds for this asset.
    public var fieldValue: String { Self.fieldPrefix + hash + ":" + String(size) }

    /// The number of chunks (0 for an empty asset).
    public var chunkCount: Int { Int((size + Int64(Self.chunkSize) - 1) / Int64(Self.chunkSize)) }

    /// The byte range of chunk `index` within the asset (empty when `index` is out of range).
    public func chunkRange(_ index: Int) -> Range<Int64> {
        guard index >= 0, index < chunkCount else { return 0..<0 }
        let start = Int64(index) * Int64(Self.chunkSize)
        return start..<min(size, start + Int64(Self.chunkSize))
    }

    public var description: String { "asset \(hash.prefix(12))… (\(size) bytes)" }

    public static func < (a: CloudAssetReference, b: CloudAssetReference) -> Bool {
        (a.hash, a.size) < (b.hash, b.size)
    }

    /// Whether `text` is 64 lowercase hexadecimal digits.
    static func isHexDigest(_ text: String) -> Bool { AssetReference.isHexDigest(text) }

    /// The lowercase hexadecimal SHA-256 of `data` (`SHA256Hasher`).
    static func sha256Hex(_ data: Data) -> String {
        var hasher = SHA256Hasher()
        hasher.update(data)
        return hasher.finalizeHex()
    }
}

/// An incremental SHA-256, for hashing an asset chunk by chunk: OpenSSL's EVP digest (libcrypto), which uses the
/// CPU's SHA extensions where it has them — about 1.5 GB/s on the CI machine against 0.2 GB/s for libsodium's portable
/// `crypto_hash_sha256`, which made hashing 94% of saving a large value (B16). The digest is the same SHA-256
/// (FIPS 180-4). Internal; not to be copied (copies share one digest context).
struct SHA256Hasher {
    /// The digest context, freed with the hasher.
    private final class Context {
        let pointer: OpaquePointer
        init() {
            // Allocation fails only when memory is exhausted; SHA-256 is always available in libcrypto.
            guard let pointer = EVP_MD_CTX_new() else { fatalError("SHA256Hasher: EVP_MD_CTX_new failed (out of memory)") }
            guard EVP_DigestInit_ex(pointer, EVP_sha256(), nil) == 1 else { fatalError("SHA256Hasher: libcrypto has no SHA-256") }
            self.pointer = pointer
        }
        deinit { EVP_MD_CTX_free(pointer) }
    }

    private let context = Context()

    init() {}

    mutating func update(_ data: Data) {
        data.withUnsafeBytes { buffer in
            if let base = buffer.baseAddress { update(base, count: buffer.count) }
        }
    }

    mutating func update(_ pointer: UnsafeRawPointer, count: Int) {
        guard count > 0 else { return }
        _ = EVP_DigestUpdate(context.pointer, pointer, count)
    }

    /// The digest as lowercase hexadecimal; the hasher must not be used afterwards.
    mutating func finalizeHex() -> String {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        _ = EVP_DigestFinal_ex(context.pointer, &digest, &length)
        let digits = Array("0123456789abcdef".utf8)
        var text = [UInt8]()
        text.reserveCapacity(digest.count * 2)
        for byte in digest {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}

/// The reference a record field holds for a sealed asset — the value of an attribute marked both
/// ``Schema/Attribute/Options/externalStorage`` and ``Schema/Attribute/Options/allowsCloudEncryption``:
/// `replica-asset:sealed:<key version>:<hash>:<size>`, where the hash (SHA-256) and size are those of the **sealed**
/// bytes, so the cloud never holds the plaintext or a hash of it. The field keeps ``CloudField/isEncrypted``.
public struct SealedAssetReference: Hashable, Sendable, CustomStringConvertible {
    /// The zone key version the asset was sealed with.
    public let keyVersion: UInt32
    /// The sealed bytes as the cloud stores them (their hash and size).
    public let sealed: CloudAssetReference

    static let prefix = "replica-asset:sealed:"

    /// - Parameters:
    ///   - keyVersion: the zone key version it was sealed with.
    ///   - sealed: the sealed bytes' hash and size.
    public init(keyVersion: UInt32, sealed: CloudAssetReference) {
        self.keyVersion = keyVersion
        self.sealed = sealed
    }

    /// The reference in `text`, or `nil` when `text` is not one.
    public init?(fieldValue text: String) {
        guard text.hasPrefix(Self.prefix) else { return nil }
        let parts = text.dropFirst(Self.prefix.count).split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count <= 10, parts[0].allSatisfy(\.isASCII), let version = UInt32(parts[0]),
              let sealed = CloudAssetReference(fieldValue: CloudAssetReference.fieldPrefix + parts[1] + ":" + parts[2]) else { return nil }
        self.init(keyVersion: version, sealed: sealed)
    }

    /// The text a record field holds.
    public var fieldValue: String { Self.prefix + String(keyVersion) + ":" + sealed.hash + ":" + String(sealed.size) }

    public var description: String { "sealed \(sealed) (key version \(keyVersion))" }
}

extension CloudRecord {
    /// The assets this record's fields reference: every text value that is an asset reference
    /// (``CloudAssetReference/fieldValue``) or a sealed asset's reference (``SealedAssetReference/fieldValue``, which
    /// names the sealed bytes), sorted by hash, each once. Empty for a tombstone: a deleted record's preserved values
    /// need no bytes to be read back, and its assets may already be gone.
    ///
    /// A cloud database refuses to save a live record that references an asset the zone does not hold complete
    /// (``CloudError/assetNotFound(hash:)`` for that record alone), as CloudKit saves a record and its `CKAsset`s
    /// together: no device can ever fetch a record whose bytes it cannot download (`Specs/external-storage.md`, R19).
    /// A value of a text attribute that happens to read as a reference is treated as one. O(fields).
    public var assetReferences: [CloudAssetReference] {
        guard isAlive else { return [] }
        var found: [String: CloudAssetReference] = [:]
        for field in fields.values {
            guard case let .text(text) = field.value, text.hasPrefix("replica-asset:") else { continue }
            if let asset = CloudAssetReference(fieldValue: text) ?? SealedAssetReference(fieldValue: text)?.sealed {
                found[asset.hash] = asset
            }
        }
        return found.values.sorted()
    }
}
