import CSodium
import Foundation
import Synchronization

/// How a zone's root key is derived from what a ``FieldKeyProvider`` holds. Stored, in the clear, in the zone's
/// encryption metadata: a salt and cost parameters are not secret.
public struct KeyDerivation: Hashable, Sendable, Codable {
    /// The derivation function.
    public enum Algorithm: String, Hashable, Sendable, Codable {
        /// Argon2id v1.3 over a passphrase (libsodium's `crypto_pwhash` with `crypto_pwhash_ALG_ARGON2ID13`).
        case argon2id13
        /// The root key is a raw 32-byte key held by the app.
        case raw
    }

    /// The derivation function.
    public var algorithm: Algorithm
    /// Argon2id salt (`crypto_pwhash_SALTBYTES` = 16 bytes), random per zone key set; `nil` for raw keys.
    public var salt: Data?
    /// Argon2id operations limit (passes over memory); `nil` for raw keys.
    public var opsLimit: UInt64?
    /// Argon2id memory limit, in bytes; `nil` for raw keys.
    public var memLimit: UInt64?

    public init(algorithm: Algorithm, salt: Data? = nil, opsLimit: UInt64? = nil, memLimit: UInt64? = nil) {
        self.algorithm = algorithm
        self.salt = salt
        self.opsLimit = opsLimit
        self.memLimit = memLimit
    }
}

/// Where the 32-byte root key of a zone comes from. The root key never encrypts fields itself: it verifies the
/// zone's key-check value and unwraps the zone's field keys (one per key version), which live, wrapped, in the
/// zone's metadata. So every device that can derive the root key can read every key version, and rotating field
/// keys needs no new passphrase.
///
/// Replica provides ``PassphraseKeyProvider`` (Argon2id) and ``RawKeyProvider``. A custom provider (e.g. one backed by
/// a platform keychain) implements the two requirements; it must never log, print or keep copies of key material.
public protocol FieldKeyProvider: Sendable {
    /// The derivation to record in a zone that has no encryption metadata yet.
    /// - Parameter random: the environment's random source, for salts.
    func makeKeyDerivation(random: any RandomSource) -> KeyDerivation

    /// Writes the 32-byte root key that `derivation` yields into `rootKey`.
    /// - Parameters:
    ///   - derivation: the zone's derivation (from its metadata, or from ``makeKeyDerivation(random:)``).
    ///   - zone: the zone name, for errors.
    ///   - rootKey: exactly 32 bytes of guarded memory, writable for the duration of the call.
    /// - Throws: ``FieldEncryptionError/keyProviderMismatch(zone:zoneDerivation:)`` when this provider cannot use
    ///   `derivation`, ``FieldEncryptionError/invalidZoneMetadata(zone:reason:)`` for out-of-range parameters,
    ///   ``FieldEncryptionError/keyDerivationFailed`` when the derivation itself fails.
    func deriveRootKey(for derivation: KeyDerivation, zone: String, into rootKey: UnsafeMutableRawBufferPointer) throws(FieldEncryptionError)
}

/// Argon2id cost parameters (`crypto_pwhash` limits).
///
/// Source: <https://doc.libsodium.org/password_hashing/default_phf>
public struct PasswordHashLimits: Hashable, Sendable {
    /// Operations limit: the number of passes over memory.
    public var opsLimit: UInt64
    /// Memory limit, in bytes.
    public var memLimit: UInt64

    public init(opsLimit: UInt64, memLimit: UInt64) {
        self.opsLimit = opsLimit
        self.memLimit = memLimit
    }

    /// `crypto_pwhash_OPSLIMIT_INTERACTIVE` / `MEMLIMIT_INTERACTIVE`: 2 passes, 64 MiB (about 0.1 s on a desktop CPU).
    public static var interactive: PasswordHashLimits {
        PasswordHashLimits(opsLimit: UInt64(crypto_pwhash_opslimit_interactive()), memLimit: UInt64(crypto_pwhash_memlimit_interactive()))
    }
    /// `crypto_pwhash_OPSLIMIT_MODERATE` / `MEMLIMIT_MODERATE`: 3 passes, 256 MiB (about 0.7 s). The default.
    public static var moderate: PasswordHashLimits {
        PasswordHashLimits(opsLimit: UInt64(crypto_pwhash_opslimit_moderate()), memLimit: UInt64(crypto_pwhash_memlimit_moderate()))
    }
    /// `crypto_pwhash_OPSLIMIT_SENSITIVE` / `MEMLIMIT_SENSITIVE`: 4 passes, 1 GiB (several seconds). Also the upper
    /// bound Replica accepts from a zone's metadata, so a hostile server cannot demand more.
    public static var sensitive: PasswordHashLimits {
        PasswordHashLimits(opsLimit: UInt64(crypto_pwhash_opslimit_sensitive()), memLimit: UInt64(crypto_pwhash_memlimit_sensitive()))
    }
    /// `crypto_pwhash_OPSLIMIT_MIN` / `MEMLIMIT_MIN`: 1 pass, 8 KiB. For tests only: offers no protection.
    public static var minimum: PasswordHashLimits {
        PasswordHashLimits(opsLimit: UInt64(crypto_pwhash_opslimit_min()), memLimit: UInt64(crypto_pwhash_memlimit_min()))
    }
}

/// Derives the root key from a passphrase with Argon2id (`crypto_pwhash`, `crypto_pwhash_ALG_ARGON2ID13`), using the
/// salt and limits stored in the zone; a zone created by this provider gets a random 16-byte salt and ``limits``.
///
/// The passphrase is copied into guarded memory at initialization and kept there (inaccessible except while deriving)
/// until the provider is released, when it is wiped. The caller's own `String` cannot be wiped by Replica: keep it
/// short-lived.
///
/// Source: <https://doc.libsodium.org/password_hashing/default_phf>
public final class PassphraseKeyProvider: FieldKeyProvider, CustomStringConvertible {
    /// The Argon2id limits written into zones this provider initializes.
    public let limits: PasswordHashLimits
    private let lock = Mutex(())
    private nonisolated(unsafe) let passphrase: GuardedBuffer
    private let length: Int

    /// - Parameters:
    ///   - passphrase: the user's passphrase (UTF-8, at least 1 byte).
    ///   - limits: Argon2id cost for zones this provider initializes; default ``PasswordHashLimits/moderate``.
    ///     Devices joining an existing zone use the zone's limits.
    /// - Throws: ``FieldEncryptionError/invalidKey(reason:)`` for an empty passphrase or limits outside libsodium's
    ///   range, ``FieldEncryptionError/outOfGuardedMemory``.
    public init(passphrase: String, limits: PasswordHashLimits = .moderate) throws(FieldEncryptionError) {
        SodiumRuntime.ensureInitialized()
        var bytes = Array(passphrase.utf8)
        defer { bytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        guard !bytes.isEmpty else { throw .invalidKey(reason: "the passphrase is empty") }
        guard Self.accepts(limits) else { throw .invalidKey(reason: "Argon2id limits out of range") }
        self.limits = limits
        length = bytes.count
        self.passphrase = try GuardedBuffer(count: bytes.count)
        self.passphrase.withWritableBytes { target in
            bytes.withUnsafeBytes { target.copyMemory(from: $0) }
        }
    }

    static func accepts(_ limits: PasswordHashLimits) -> Bool {
        let sensitive = PasswordHashLimits.sensitive, minimum = PasswordHashLimits.minimum
        return (minimum.opsLimit...sensitive.opsLimit).contains(limits.opsLimit)
            && (minimum.memLimit...sensitive.memLimit).contains(limits.memLimit)
    }

    public func makeKeyDerivation(random: any RandomSource) -> KeyDerivation {
        var salt = Data(count: Int(crypto_pwhash_saltbytes()))
        salt.withUnsafeMutableBytes { random.fill($0) }
        return KeyDerivation(algorithm: .argon2id13, salt: salt, opsLimit: limits.opsLimit, memLimit: limits.memLimit)
    }

    public func deriveRootKey(for derivation: KeyDerivation, zone: String, into rootKey: UnsafeMutableRawBufferPointer) throws(FieldEncryptionError) {
        guard derivation.algorithm == .argon2id13 else { throw .keyProviderMismatch(zone: zone, zoneDerivation: derivation.algorithm.rawValue) }
        guard let salt = derivation.salt, salt.count == Int(crypto_pwhash_saltbytes()),
              let ops = derivation.opsLimit, let mem = derivation.memLimit,
              Self.accepts(PasswordHashLimits(opsLimit: ops, memLimit: mem)) else {
            throw .invalidZoneMetadata(zone: zone, reason: "Argon2id salt or limits out of range")
        }
        let result = lock.withLock { _ in
            passphrase.withReadOnlyBytes { secret in
                salt.withUnsafeBytes { salt in
                    crypto_pwhash(rootKey.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(rootKey.count),
                                  secret.baseAddress!.assumingMemoryBound(to: CChar.self), UInt64(length),
                                  salt.baseAddress!.assumingMemoryBound(to: UInt8.self), ops, Int(mem),
                                  crypto_pwhash_alg_argon2id13())
                }
            }
        }
        guard result == 0 else {
            sodium_memzero(rootKey.baseAddress, rootKey.count)
            throw .keyDerivationFailed
        }
    }

    /// Never shows the passphrase.
    public var description: String { "PassphraseKeyProvider(<redacted>)" }
}

/// Uses a raw 32-byte key held by the app (e.g. from a platform keychain) as the zone's root key.
///
/// The key is copied into guarded memory at initialization and wiped when the provider is released. The caller
/// should wipe its own copy (e.g. with `sodium_memzero`).
///
/// Source: <https://doc.libsodium.org/memory_management>
public final class RawKeyProvider: FieldKeyProvider, CustomStringConvertible {
    /// The key length: 32 bytes.
    public static let keyLength = 32
    private let lock = Mutex(())
    private nonisolated(unsafe) let key: GuardedBuffer

    /// - Parameter key: exactly ``keyLength`` bytes, uniformly random.
    /// - Throws: ``FieldEncryptionError/invalidKey(reason:)`` for another length, ``FieldEncryptionError/outOfGuardedMemory``.
    public init(key: UnsafeRawBufferPointer) throws(FieldEncryptionError) {
        self.key = try Self.guardedCopy(of: key)
    }

    /// - Parameter key: exactly ``keyLength`` bytes, uniformly random.
    /// - Throws: as ``init(key:)-(UnsafeRawBufferPointer)``.
    public init(key: [UInt8]) throws(FieldEncryptionError) {
        let result = key.withUnsafeBytes { bytes in Result { () throws(FieldEncryptionError) in try Self.guardedCopy(of: bytes) } }
        self.key = try result.get()
    }

    private static func guardedCopy(of key: UnsafeRawBufferPointer) throws(FieldEncryptionError) -> GuardedBuffer {
        guard key.count == keyLength else { throw .invalidKey(reason: "a raw key must be \(keyLength) bytes") }
        let buffer = try GuardedBuffer(count: keyLength)
        buffer.withWritableBytes { $0.copyMemory(from: key) }
        return buffer
    }

    public func makeKeyDerivation(random: any RandomSource) -> KeyDerivation { KeyDerivation(algorithm: .raw) }

    public func deriveRootKey(for derivation: KeyDerivation, zone: String, into rootKey: UnsafeMutableRawBufferPointer) throws(FieldEncryptionError) {
        guard derivation.algorithm == .raw else { throw .keyProviderMismatch(zone: zone, zoneDerivation: derivation.algorithm.rawValue) }
        lock.withLock { _ in key.withReadOnlyBytes { rootKey.copyMemory(from: $0) } }
    }

    /// Never shows the key.
    public var description: String { "RawKeyProvider(<redacted>)" }
}
