import Foundation

/// Errors of cloud field encryption. They name the zone, entity, field, record ID and key version at most, never a
/// value, a key, a passphrase or ciphertext bytes, so they are safe to log and to show.
public enum FieldEncryptionError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Why one sealed field could not be opened.
    public enum DecryptionFailure: String, Hashable, Sendable, Codable {
        /// The authentication tag did not verify: tampered bytes, a ciphertext moved from another field, record or
        /// zone, or a key that is not the one it was sealed with.
        case authenticationFailed
        /// The field was sealed with a key version this device does not hold (yet).
        case unknownKeyVersion
        /// The sealed value has a format version this library does not know.
        case unsupportedFormat
        /// The value is not a sealed value at all (wrong storage class, or too short).
        case malformed
        /// The attribute must be encrypted, but the cloud record carries it in plaintext.
        case notSealed
    }

    /// A synced entity has attributes marked ``Schema/Attribute/Options/allowsCloudEncryption`` but the sync engine was
    /// created without an encryption configuration, so it refuses to start rather than upload them in plaintext.
    case encryptionNotConfigured(entity: String, field: String)
    /// The key provider's key does not match the zone's key-check value (a wrong passphrase or raw key). Nothing was
    /// decrypted or uploaded.
    case wrongKey(zone: String)
    /// The zone's keys are derived in a way this key provider cannot reproduce (e.g. the zone uses a passphrase and
    /// the engine was given a raw key).
    case keyProviderMismatch(zone: String, zoneDerivation: String)
    /// The zone's encryption metadata is unreadable, uses unsupported parameters, or a wrapped key failed to verify.
    case invalidZoneMetadata(zone: String, reason: String)
    /// A key or passphrase given to a key provider is unusable (e.g. a raw key that is not 32 bytes).
    case invalidKey(reason: String)
    /// Argon2id could not derive the key (usually: not enough memory for the zone's memory limit).
    case keyDerivationFailed
    /// libsodium could not allocate guarded memory (`sodium_malloc`; often the process's `mlock` limit).
    case outOfGuardedMemory
    /// A value was to be sealed before the zone's keys were known.
    case noKey(zone: String)
    /// One field of a record could not be decrypted. The record's local values were left untouched and it is marked
    /// `undecryptable` in the sync ledger.
    case undecryptable(entity: String, field: String, recordID: UUID, keyVersion: UInt32?, failure: DecryptionFailure)

    public var description: String {
        switch self {
        case let .encryptionNotConfigured(entity, field):
            return "\(entity).\(field) allows cloud encryption but the sync engine has no encryption configured"
        case let .wrongKey(zone):
            return "the key does not match zone '\(zone)' (wrong passphrase or key)"
        case let .keyProviderMismatch(zone, derivation):
            return "zone '\(zone)' derives its key with \(derivation), which this key provider cannot do"
        case let .invalidZoneMetadata(zone, reason):
            return "zone '\(zone)' has invalid encryption metadata: \(reason)"
        case let .invalidKey(reason):
            return "invalid key: \(reason)"
        case .keyDerivationFailed:
            return "Argon2id key derivation failed (out of memory?)"
        case .outOfGuardedMemory:
            return "could not allocate guarded memory for key material"
        case let .noKey(zone):
            return "no key for zone '\(zone)' yet"
        case let .undecryptable(entity, field, id, version, failure):
            let key = version.map { " (key version \($0))" } ?? ""
            return "\(entity).\(field) of record \(id.uuidString) cannot be decrypted: \(failure.rawValue)\(key)"
        }
    }
}
