import CSodium
import Foundation

/// The encryption metadata of a zone, stored in the cloud under zone metadata key ``key`` as JSON (sorted keys).
/// Nothing in it is secret: a key-set ID, how the root key is derived (salt, Argon2id limits), a key-check value and
/// the field keys, each wrapped (sealed) under the root key.
///
/// - `keyCheck` = BLAKE2b-256 keyed with the root key (`crypto_generichash`) over `"replica.key-check.v1"` and the
///   key-set ID: a wrong passphrase or key is detected before anything is decrypted or uploaded, and the value
///   reveals nothing about the key.
/// - `keys[i].sealed` = nonce (24) || XChaCha20-Poly1305 ciphertext of the 32-byte field key || tag (16), under the
///   root key, with associated data `"replica.field-key.v1"` || key-set ID || version (UInt32 big-endian), so a
///   wrapped key cannot be moved to another version or key set.
///
/// A zone reset (or a reset after a lost key) creates a new key set with a new ID; devices that knew the old ID
/// upload their local data again.
///
/// Sources: <https://doc.libsodium.org/hashing/generic_hashing>,
/// <https://doc.libsodium.org/secret-key_cryptography/aead/chacha20-poly1305/xchacha20-poly1305_construction>
struct ZoneEncryptionMetadata: Codable, Hashable {
    /// The zone metadata key.
    static let key = "replica.encryption"
    static let currentFormat = 1
    static let keySetLength = 16
    static let keyCheckLength = 32
    static let wrappedKeyLength = FieldCipher.nonceLength + FieldCipher.keyLength + FieldCipher.tagLength

    struct WrappedKey: Codable, Hashable {
        var version: UInt32
        var sealed: Data
    }

    var format: Int
    /// Random; identifies this key set (new on every reset).
    var keySet: Data
    var derivation: KeyDerivation
    var keyCheck: Data
    /// Ascending by version.
    var keys: [WrappedKey]

    var encoded: Data { Data(ReplicaJSON.stamplessString(self).utf8) }

    /// Parses and checks the shape of `data`.
    static func decode(_ data: Data, zone: String) throws(FieldEncryptionError) -> ZoneEncryptionMetadata {
        guard let metadata = try? JSONDecoder().decode(ZoneEncryptionMetadata.self, from: data) else {
            throw .invalidZoneMetadata(zone: zone, reason: "unreadable")
        }
        guard metadata.format == currentFormat else { throw .invalidZoneMetadata(zone: zone, reason: "unsupported format \(metadata.format)") }
        guard metadata.keySet.count == keySetLength, metadata.keyCheck.count == keyCheckLength, !metadata.keys.isEmpty,
              Set(metadata.keys.map(\.version)).count == metadata.keys.count,
              metadata.keys.allSatisfy({ $0.sealed.count == wrappedKeyLength }) else {
            throw .invalidZoneMetadata(zone: zone, reason: "malformed key set")
        }
        return metadata
    }
}

/// The keys of one zone on this device: the key provider, the root key it yields (cached in guarded memory for the
/// zone's current derivation, so Argon2id runs once per key set, not once per sync) and the ``FieldCipher`` loaded
/// with the zone's field keys. Internal; confined to its engine.
final class ZoneKeyring {
    let zone: String
    private(set) var provider: any FieldKeyProvider
    let cipher: FieldCipher
    private let random: any RandomSource
    private let root: GuardedBuffer
    /// The derivation `root` currently holds the result of; `nil` when it holds nothing.
    private var rootDerivation: KeyDerivation?
    /// 32 bytes of guarded memory for a field key in transit (generated, then wrapped).
    private let transit: GuardedBuffer
    /// The metadata bytes last verified and loaded into `cipher`.
    private(set) var adopted: Data?
    private(set) var adoptedMetadata: ZoneEncryptionMetadata?

    init(zone: String, provider: any FieldKeyProvider, encryptedFields: [String: Set<String>], random: any RandomSource) throws(FieldEncryptionError) {
        self.zone = zone
        self.provider = provider
        self.random = random
        self.cipher = try FieldCipher(zone: zone, encryptedFields: encryptedFields, random: random)
        self.root = try GuardedBuffer(count: FieldCipher.keyLength)
        self.transit = try GuardedBuffer(count: FieldCipher.keyLength)
    }

    /// Replaces the key provider and forgets every key.
    func replaceProvider(_ provider: any FieldKeyProvider) {
        self.provider = provider
        forget()
    }

    /// Forgets the root key, the field keys and the adopted metadata.
    func forget() {
        root.wipe()
        rootDerivation = nil
        cipher.removeAllKeys()
        adopted = nil
        adoptedMetadata = nil
    }

    // MARK: Metadata

    /// What adopting metadata changed.
    struct Adoption {
        /// The key versions loaded changed (new versions can open records that failed before).
        var keysChanged: Bool
        /// The key-set ID this device held before, when it differs from the new one.
        var replacedKeySet: Data?
    }

    /// Verifies `data` (shape, key check) and loads its field keys into the cipher.
    /// - Throws: ``FieldEncryptionError/wrongKey(zone:)``, ``FieldEncryptionError/invalidZoneMetadata(zone:reason:)``,
    ///   or the provider's errors. On error no key is loaded.
    func adopt(_ data: Data) throws(FieldEncryptionError) -> Adoption {
        if data == adopted { return Adoption(keysChanged: false, replacedKeySet: nil) }
        let metadata = try ZoneEncryptionMetadata.decode(data, zone: zone)
        let before = cipher.keyVersions
        let previousKeySet = adoptedMetadata?.keySet
        do throws(FieldEncryptionError) {
            try deriveRoot(metadata.derivation)
            guard try keyCheck(keySet: metadata.keySet, matches: metadata.keyCheck) else { throw FieldEncryptionError.wrongKey(zone: zone) }
            cipher.removeAllKeys()
            try root.withReadOnlyBytes { (rootKey) throws(FieldEncryptionError) in
                for wrapped in metadata.keys {
                    try cipher.setKey(version: wrapped.version) { (target) throws(FieldEncryptionError) in
                        guard unwrap(wrapped, keySet: metadata.keySet, rootKey: rootKey, into: target) else {
                            throw FieldEncryptionError.invalidZoneMetadata(zone: zone, reason: "key version \(wrapped.version) failed to verify")
                        }
                    }
                }
            }
        } catch {
            cipher.removeAllKeys()
            adopted = nil
            adoptedMetadata = nil
            throw error
        }
        adopted = data
        adoptedMetadata = metadata
        let replaced = previousKeySet.flatMap { $0 != metadata.keySet ? $0 : nil }
        return Adoption(keysChanged: before != cipher.keyVersions, replacedKeySet: replaced)
    }

    /// Fresh metadata for a zone that has none: a new key-set ID, the provider's derivation (new salt), the key check
    /// and one field key, version 1. Not adopted yet (the compare-and-swap may lose to another device).
    func makeInitialMetadata() throws(FieldEncryptionError) -> Data {
        var keySet = Data(count: ZoneEncryptionMetadata.keySetLength)
        keySet.withUnsafeMutableBytes { random.fill($0) }
        let derivation = provider.makeKeyDerivation(random: random)
        try deriveRoot(derivation)
        let check = try makeKeyCheck(keySet: keySet)
        let first = wrapNewKey(version: 1, keySet: keySet)
        return ZoneEncryptionMetadata(format: ZoneEncryptionMetadata.currentFormat, keySet: keySet, derivation: derivation,
                                      keyCheck: check, keys: [first]).encoded
    }

    /// The adopted metadata plus a new field key whose version is one above the highest (key rotation).
    func makeRotatedMetadata() throws(FieldEncryptionError) -> Data {
        guard var metadata = adoptedMetadata else { throw .noKey(zone: zone) }
        let next = (metadata.keys.map(\.version).max() ?? 0) + 1
        metadata.keys.append(wrapNewKey(version: next, keySet: metadata.keySet))
        return metadata.encoded
    }

    // MARK: Root key

    private func deriveRoot(_ derivation: KeyDerivation) throws(FieldEncryptionError) {
        if rootDerivation == derivation { return }
        rootDerivation = nil
        try root.withWritableBytes { (key) throws(FieldEncryptionError) in
            try provider.deriveRootKey(for: derivation, zone: zone, into: key)
        }
        rootDerivation = derivation
    }

    private static let keyCheckLabel = Array("replica.key-check.v1".utf8)
    private static let wrapLabel = Array("replica.field-key.v1".utf8)

    private func makeKeyCheck(keySet: Data) throws(FieldEncryptionError) -> Data {
        var out = Data(count: ZoneEncryptionMetadata.keyCheckLength)
        let message = Self.keyCheckLabel + keySet
        root.withReadOnlyBytes { key in
            out.withUnsafeMutableBytes { o in
                message.withUnsafeBytes { m in
                    _ = crypto_generichash(o.baseAddress!.assumingMemoryBound(to: UInt8.self), o.count,
                                           m.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(m.count),
                                           key.baseAddress!.assumingMemoryBound(to: UInt8.self), key.count)
                }
            }
        }
        return out
    }

    /// Constant-time comparison (`sodium_memcmp`) of the expected key check with the one in the zone.
    private func keyCheck(keySet: Data, matches stored: Data) throws(FieldEncryptionError) -> Bool {
        let computed = try makeKeyCheck(keySet: keySet)
        guard computed.count == stored.count else { return false }
        return computed.withUnsafeBytes { a in stored.withUnsafeBytes { b in sodium_memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0 } }
    }

    private static func wrapAD(keySet: Data, version: UInt32) -> [UInt8] {
        wrapLabel + keySet + [UInt8(truncatingIfNeeded: version >> 24), UInt8(truncatingIfNeeded: version >> 16),
                              UInt8(truncatingIfNeeded: version >> 8), UInt8(truncatingIfNeeded: version)]
    }

    /// Generates a random field key (in guarded memory) and wraps it under the root key.
    private func wrapNewKey(version: UInt32, keySet: Data) -> ZoneEncryptionMetadata.WrappedKey {
        var sealed = Data(count: ZoneEncryptionMetadata.wrappedKeyLength)
        let ad = Self.wrapAD(keySet: keySet, version: version)
        transit.withWritableBytes { fieldKey in
            random.fill(fieldKey)
            root.withReadOnlyBytes { rootKey in
                sealed.withUnsafeMutableBytes { raw in
                    let o = raw.baseAddress!.assumingMemoryBound(to: UInt8.self)
                    random.fill(UnsafeMutableRawBufferPointer(start: o, count: FieldCipher.nonceLength))
                    ad.withUnsafeBufferPointer { a in
                        _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                            o + FieldCipher.nonceLength, nil, fieldKey.baseAddress!.assumingMemoryBound(to: UInt8.self),
                            UInt64(fieldKey.count), a.baseAddress, UInt64(a.count), nil, o,
                            rootKey.baseAddress!.assumingMemoryBound(to: UInt8.self))
                    }
                }
            }
            sodium_memzero(fieldKey.baseAddress, fieldKey.count)
        }
        return ZoneEncryptionMetadata.WrappedKey(version: version, sealed: sealed)
    }

    /// Unwraps `wrapped` straight into `target` (guarded memory). `false` when it fails to verify.
    private func unwrap(_ wrapped: ZoneEncryptionMetadata.WrappedKey, keySet: Data, rootKey: UnsafeRawBufferPointer,
                        into target: UnsafeMutableRawBufferPointer) -> Bool {
        let ad = Self.wrapAD(keySet: keySet, version: wrapped.version)
        return wrapped.sealed.withUnsafeBytes { raw in
            let c = raw.baseAddress!.assumingMemoryBound(to: UInt8.self)
            return ad.withUnsafeBufferPointer { a in
                crypto_aead_xchacha20poly1305_ietf_decrypt(
                    target.baseAddress!.assumingMemoryBound(to: UInt8.self), nil, nil, c + FieldCipher.nonceLength,
                    UInt64(raw.count - FieldCipher.nonceLength), a.baseAddress, UInt64(a.count), c,
                    rootKey.baseAddress!.assumingMemoryBound(to: UInt8.self)) == 0
            }
        }
    }
}
