import CSodium
import Foundation

/// Seals and opens the encrypted fields of cloud records with XChaCha20-Poly1305 (libsodium's
/// `crypto_aead_xchacha20poly1305_ietf`), under a ring of versioned 32-byte field keys held in guarded memory.
///
/// **Which fields.** Every field of an attribute marked ``Schema/Attribute/Options/allowsCloudEncryption`` (given at
/// initialization as `encryptedFields`), and every other field whose ``CloudField/isEncrypted`` flag is set (fields
/// of a newer schema that this one does not know). Sealing never changes a field's stamp.
///
/// **Sealed value** (stored as a BLOB with ``CloudField/isEncrypted`` = `true`):
///
/// | bytes | content |
/// |---|---|
/// | 1 | format version, `0x01` |
/// | 4 | key version, UInt32 big-endian |
/// | 24 | nonce, from the environment's random source |
/// | n + 16 | ciphertext of the plaintext, then the Poly1305 tag |
///
/// The plaintext is a 1-byte storage class (`0` NULL, `1` INTEGER, `2` REAL, `3` TEXT, `4` BLOB) then the value
/// (INTEGER: 8 bytes big-endian two's complement; REAL: the 8-byte IEEE 754 bit pattern big-endian; TEXT: UTF-8;
/// BLOB: the bytes), so NULL is sealed too and the cloud cannot tell a null from a value.
///
/// **Associated data** (authenticated, not stored): the record ID (16 bytes), then the zone, the record type and
/// the field name (each as a UInt32 big-endian byte length and UTF-8), then the field stamp (incarnation UInt64,
/// physical milliseconds UInt64, logical counter UInt32, all big-endian, and the 16-byte replica ID), then the
/// format version and key version exactly as in the header. A sealed value therefore opens only in the zone, record,
/// field and write it was made for: moving it to another field, record or zone, replaying an older ciphertext
/// under a newer stamp, or editing its key version all fail authentication.
///
/// **Keys.** ``setKey(version:_:)`` loads keys; new values are sealed with the highest version
/// (``currentKeyVersion``), and any loaded version opens. Keys live in one `sodium_malloc` region that is readable
/// only while a batch is being sealed or opened (`sodium_mprotect_readonly`, then `_noaccess`), and wiped when the
/// cipher is released. The per-field path allocates nothing but the output value: scratch buffers and the
/// associated-data prefix are reused.
///
/// A cipher is not thread-safe: confine it to one task (the ``SyncEngine`` that owns it does).
///
/// Sources: <https://doc.libsodium.org/secret-key_cryptography/aead/chacha20-poly1305/xchacha20-poly1305_construction>,
/// <https://doc.libsodium.org/memory_management>
public final class FieldCipher: CustomStringConvertible {
    /// The sealed-value format this library writes.
    public static let formatVersion: UInt8 = 1
    /// Length of a field key: `crypto_aead_xchacha20poly1305_ietf_KEYBYTES` = 32.
    public static let keyLength = 32
    /// Nonce length: `crypto_aead_xchacha20poly1305_ietf_NPUBBYTES` = 24.
    static let nonceLength = 24
    /// Tag length: `crypto_aead_xchacha20poly1305_ietf_ABYTES` = 16.
    static let tagLength = 16
    /// Format byte, key version, nonce.
    static let headerLength = 1 + 4 + nonceLength
    /// Bytes a sealed value adds to its plaintext (header and tag; the plaintext adds its 1-byte storage class).
    public static let overhead = headerLength + tagLength + 1

    /// The zone whose records this cipher seals (bound into every sealed value).
    public let zone: String
    private let zoneBytes: [UInt8]
    private let random: any RandomSource
    /// Record type -> names of its encrypted attributes, sorted (so nonces are drawn in a deterministic order).
    private let encryptedFields: [String: [String]]
    private var slots: GuardedBuffer
    /// `versions[i]` is the key version held in slot `i`.
    private var versions: [UInt32] = []
    private var currentSlot = -1
    /// Reused buffers: associated data and plaintext.
    private var ad: [UInt8] = []
    private var scratch: [UInt8] = []

    /// Creates a cipher with no keys.
    /// - Parameters:
    ///   - zone: the zone name bound into every sealed value.
    ///   - encryptedFields: record type -> names of its attributes marked ``Schema/Attribute/Options/allowsCloudEncryption``
    ///     (see ``encryptedFields(of:)``).
    ///   - random: the source of nonces (``ReplicaEnvironment/random``: libsodium's `randombytes` in production).
    /// - Throws: ``FieldEncryptionError/outOfGuardedMemory``.
    public init(zone: String, encryptedFields: [String: Set<String>], random: any RandomSource) throws(FieldEncryptionError) {
        SodiumRuntime.ensureInitialized()
        self.zone = zone
        self.zoneBytes = Array(zone.utf8)
        self.random = random
        var sorted: [String: [String]] = [:]
        for (type, names) in encryptedFields where !names.isEmpty { sorted[type] = names.sorted() }
        self.encryptedFields = sorted
        self.slots = try GuardedBuffer(count: 4 * Self.keyLength)
        ad.reserveCapacity(256)
        scratch.reserveCapacity(256)
    }

    /// Record type -> encrypted attribute names of `entities` (the attributes marked
    /// ``Schema/Attribute/Options/allowsCloudEncryption``); entities without any are left out.
    public static func encryptedFields(of entities: [Schema.Entity]) -> [String: Set<String>] {
        var result: [String: Set<String>] = [:]
        for entity in entities {
            let names = entity.attributes.filter { $0.options.contains(.allowsCloudEncryption) }.map(\.name)
            if !names.isEmpty { result[entity.name] = Set(names) }
        }
        return result
    }

    /// Never shows keys.
    public var description: String { "FieldCipher(zone: \(zone), key versions: \(keyVersions))" }

    // MARK: Keys

    /// The loaded key versions, ascending.
    public var keyVersions: [UInt32] { versions.sorted() }

    /// The version new values are sealed with (the highest loaded), or `nil` when no key is loaded.
    public var currentKeyVersion: UInt32? { currentSlot >= 0 ? versions[currentSlot] : nil }

    /// Loads (or replaces) the key of `version`, copying `key` into guarded memory.
    /// - Parameters:
    ///   - version: the key version (any UInt32; higher is newer).
    ///   - key: exactly ``keyLength`` bytes. The caller should wipe its copy.
    /// - Throws: ``FieldEncryptionError/invalidKey(reason:)`` for another length, ``FieldEncryptionError/outOfGuardedMemory``.
    public func setKey(version: UInt32, _ key: UnsafeRawBufferPointer) throws(FieldEncryptionError) {
        guard key.count == Self.keyLength else { throw .invalidKey(reason: "a field key must be \(Self.keyLength) bytes") }
        try setKey(version: version) { $0.copyMemory(from: key) }
    }

    /// Loads the key of `version` by letting `fill` write its 32 bytes straight into guarded memory (used to unwrap
    /// keys without an unguarded copy). If `fill` throws, the version is not loaded.
    func setKey(version: UInt32, fill: (UnsafeMutableRawBufferPointer) throws(FieldEncryptionError) -> Void) throws(FieldEncryptionError) {
        let slot: Int
        if let existing = versions.firstIndex(of: version) {
            slot = existing
        } else {
            if (versions.count + 1) * Self.keyLength > slots.count {
                let bigger = try GuardedBuffer(count: slots.count * 2)
                let old = slots
                old.withReadOnlyBytes { source in bigger.withWritableBytes { $0.copyMemory(from: source) } }
                slots = bigger
            }
            slot = versions.count
        }
        try slots.withWritableBytes { (all) throws(FieldEncryptionError) in
            let target = UnsafeMutableRawBufferPointer(rebasing: all[slot * Self.keyLength ..< (slot + 1) * Self.keyLength])
            do throws(FieldEncryptionError) {
                try fill(target)
            } catch {
                sodium_memzero(target.baseAddress, target.count)
                throw error
            }
        }
        if slot == versions.count { versions.append(version) }
        currentSlot = versions.indices.max { versions[$0] < versions[$1] } ?? -1
    }

    /// Forgets every key (the guarded region is wiped).
    public func removeAllKeys() {
        slots.wipe()
        versions.removeAll()
        currentSlot = -1
    }

    // MARK: Records

    /// Seals the encrypted fields of every record in place, under ``currentKeyVersion``. One guarded-memory unlock
    /// for the whole batch.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` when no key is loaded.
    public func seal(_ records: inout [CloudRecord]) throws(FieldEncryptionError) {
        guard records.contains(where: needsCipher) else { return }
        guard currentSlot >= 0 else { throw .noKey(zone: zone) }
        try slots.withReadOnlyBytes { (keys) throws(FieldEncryptionError) in
            for index in records.indices { try seal(&records[index], keys: keys) }
        }
    }

    /// `record` with its encrypted fields sealed under ``currentKeyVersion``.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` when no key is loaded.
    public func sealed(_ record: CloudRecord) throws(FieldEncryptionError) -> CloudRecord {
        var records = [record]
        try seal(&records)
        return records[0]
    }

    /// `record` with its sealed fields opened (plaintext values, ``CloudField/isEncrypted`` still `true`, stamps
    /// unchanged).
    /// - Throws: ``FieldEncryptionError/undecryptable(entity:field:recordID:keyVersion:failure:)`` for the first
    ///   field (in name order) that fails; the record is then unusable as a whole.
    public func opened(_ record: CloudRecord) throws(FieldEncryptionError) -> CloudRecord {
        var record = record
        _ = try slots.withReadOnlyBytes { (keys) throws(FieldEncryptionError) in try open(&record, keys: keys) }
        return record
    }

    /// Opens every record; one guarded-memory unlock for the batch.
    /// - Returns: per record, the opened record and the oldest key version among its sealed fields (`nil` when it
    ///   has none), or the error of its first failing field.
    public func open(_ records: [CloudRecord]) -> [Result<(record: CloudRecord, oldestKeyVersion: UInt32?), FieldEncryptionError>] {
        slots.withReadOnlyBytes { keys in
            records.map { record in
                var record = record
                do throws(FieldEncryptionError) {
                    let oldest = try open(&record, keys: keys)
                    return .success((record, oldest))
                } catch {
                    return .failure(error)
                }
            }
        }
    }

    /// `true` when sealing or opening `record` has anything to do.
    func needsCipher(_ record: CloudRecord) -> Bool {
        encryptedFields[record.recordType] != nil || record.fields.values.contains { $0.isEncrypted }
    }

    /// Names of fields of `record` flagged encrypted but not declared so (unknown fields of a newer schema), sorted.
    private func flaggedFields(of record: CloudRecord, declared: [String]) -> [String] {
        var names: [String] = []
        for (name, field) in record.fields where field.isEncrypted && !declared.contains(name) { names.append(name) }
        return names.sorted()
    }

    private func seal(_ record: inout CloudRecord, keys: UnsafeRawBufferPointer) throws(FieldEncryptionError) {
        let declared = encryptedFields[record.recordType] ?? []
        let flagged = record.fields.values.contains { $0.isEncrypted } ? flaggedFields(of: record, declared: declared) : []
        guard !declared.isEmpty || !flagged.isEmpty else { return }
        let version = versions[currentSlot]
        let key = keys.baseAddress! + currentSlot * Self.keyLength
        let prefix = beginRecord(record)
        for name in declared {
            guard let index = record.fields.index(forKey: name) else { continue }
            let field = record.fields.values[index]
            setField(name, stamp: field.stamp, version: version, prefix: prefix)
            let sealed = seal(field.value, version: version, key: key)
            record.fields.values[index] = CloudField(value: .blob(sealed), stamp: field.stamp, isEncrypted: true)
        }
        for name in flagged {
            guard let index = record.fields.index(forKey: name) else { continue }
            let field = record.fields.values[index]
            // Kept from a time this device had no key: already sealed for exactly this place, so send it unchanged.
            if case let .blob(bytes) = field.value,
               (try? openValue(bytes, record: record, field: name, stamp: field.stamp, prefix: prefix, keys: keys)) != nil {
                continue
            }
            setField(name, stamp: field.stamp, version: version, prefix: prefix)
            let sealed = seal(field.value, version: version, key: key)
            record.fields.values[index] = CloudField(value: .blob(sealed), stamp: field.stamp, isEncrypted: true)
        }
    }

    /// Opens the sealed fields of `record` in place; returns the oldest key version used.
    private func open(_ record: inout CloudRecord, keys: UnsafeRawBufferPointer) throws(FieldEncryptionError) -> UInt32? {
        let declared = encryptedFields[record.recordType] ?? []
        let flagged = record.fields.values.contains { $0.isEncrypted } ? flaggedFields(of: record, declared: declared) : []
        guard !declared.isEmpty || !flagged.isEmpty else { return nil }
        let prefix = beginRecord(record)
        var oldest: UInt32?
        for name in (flagged.isEmpty ? declared : (declared + flagged).sorted()) {
            guard let index = record.fields.index(forKey: name) else { continue }
            let field = record.fields.values[index]
            func failure(_ kind: FieldEncryptionError.DecryptionFailure, _ version: UInt32? = nil) -> FieldEncryptionError {
                .undecryptable(entity: record.recordType, field: name, recordID: record.recordID, keyVersion: version, failure: kind)
            }
            guard field.isEncrypted else { throw failure(.notSealed) }
            guard case let .blob(bytes) = field.value else { throw failure(.malformed) }
            let value: SQLiteValue
            let version: UInt32
            do {
                (value, version) = try openValue(bytes, record: record, field: name, stamp: field.stamp, prefix: prefix, keys: keys)
            } catch let error {
                throw failure(error.failure, error.version)
            }
            oldest = min(oldest ?? version, version)
            record.fields.values[index] = CloudField(value: value, stamp: field.stamp, isEncrypted: true)
        }
        return oldest
    }

    // MARK: Values

    /// Starts the associated data of `record`: ID, zone, record type. Returns the prefix length.
    private func beginRecord(_ record: CloudRecord) -> Int {
        ad.removeAll(keepingCapacity: true)
        withUnsafeBytes(of: record.recordID.uuid) { ad.append(contentsOf: $0) }
        appendLength(zoneBytes.count)
        ad.append(contentsOf: zoneBytes)
        appendLength(record.recordType.utf8.count)
        ad.append(contentsOf: record.recordType.utf8)
        return ad.count
    }

    /// Completes the associated data for one field after the record prefix: name, stamp, format and key version.
    private func setField(_ name: String, stamp: FieldStamp, version: UInt32, prefix: Int) {
        ad.removeLast(ad.count - prefix)
        appendLength(name.utf8.count)
        ad.append(contentsOf: name.utf8)
        appendBigEndian(UInt64(max(0, stamp.incarnation)), bytes: 8)
        appendBigEndian(UInt64(max(0, stamp.clock.physical)), bytes: 8)
        appendBigEndian(UInt64(max(0, stamp.clock.logical)), bytes: 4)
        withUnsafeBytes(of: stamp.clock.replica.uuid) { ad.append(contentsOf: $0) }
        ad.append(Self.formatVersion)
        appendBigEndian(UInt64(version), bytes: 4)
    }

    @inline(__always) private func appendLength(_ count: Int) { appendBigEndian(UInt64(count), bytes: 4) }

    @inline(__always) private func appendBigEndian(_ value: UInt64, bytes: Int) {
        var shift = (bytes - 1) * 8
        while shift >= 0 {
            ad.append(UInt8(truncatingIfNeeded: value >> UInt64(shift)))
            shift -= 8
        }
    }

    /// Writes the plaintext form of `value` into `scratch`.
    private func encodePlaintext(_ value: SQLiteValue) {
        scratch.removeAll(keepingCapacity: true)
        func append64(_ v: UInt64) { for shift in stride(from: 56, through: 0, by: -8) { scratch.append(UInt8(truncatingIfNeeded: v >> UInt64(shift))) } }
        switch value {
        case .null: scratch.append(0)
        case let .integer(v): scratch.append(1); append64(UInt64(bitPattern: v))
        case let .real(v): scratch.append(2); append64(v.bitPattern)
        case let .text(s): scratch.append(3); scratch.append(contentsOf: s.utf8)
        case let .blob(d): scratch.append(4); scratch.append(contentsOf: d)
        }
    }

    /// Seals `value` with the key at `key` under the current associated data.
    private func seal(_ value: SQLiteValue, version: UInt32, key: UnsafeRawPointer) -> Data {
        encodePlaintext(value)
        let count = scratch.count
        var out = Data(count: Self.headerLength + count + Self.tagLength)
        out.withUnsafeMutableBytes { raw in
            let o = raw.baseAddress!.assumingMemoryBound(to: UInt8.self)
            o[0] = Self.formatVersion
            o[1] = UInt8(truncatingIfNeeded: version >> 24)
            o[2] = UInt8(truncatingIfNeeded: version >> 16)
            o[3] = UInt8(truncatingIfNeeded: version >> 8)
            o[4] = UInt8(truncatingIfNeeded: version)
            random.fill(UnsafeMutableRawBufferPointer(start: o + 5, count: Self.nonceLength))
            scratch.withUnsafeMutableBufferPointer { m in
                ad.withUnsafeBufferPointer { a in
                    _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                        o + Self.headerLength, nil, m.baseAddress, UInt64(count), a.baseAddress, UInt64(a.count),
                        nil, o + 5, key.assumingMemoryBound(to: UInt8.self))
                }
                sodium_memzero(m.baseAddress, count)
            }
        }
        return out
    }

    struct OpenFailure: Error {
        var failure: FieldEncryptionError.DecryptionFailure
        var version: UInt32?
    }

    /// Opens one sealed value of field `field` of `record` (the associated-data prefix of `record` must be current).
    private func openValue(_ sealed: Data, record: CloudRecord, field: String, stamp: FieldStamp, prefix: Int,
                           keys: UnsafeRawBufferPointer) throws(OpenFailure) -> (SQLiteValue, UInt32) {
        guard sealed.count >= Self.headerLength + Self.tagLength + 1 else { throw OpenFailure(failure: .malformed) }
        let (format, version) = sealed.withUnsafeBytes { raw -> (UInt8, UInt32) in
            let high = UInt32(raw[1]) << 24 | UInt32(raw[2]) << 16
            let low = UInt32(raw[3]) << 8 | UInt32(raw[4])
            return (raw[0], high | low)
        }
        guard format == Self.formatVersion else { throw OpenFailure(failure: .unsupportedFormat, version: version) }
        guard let slot = versions.firstIndex(of: version) else { throw OpenFailure(failure: .unknownKeyVersion, version: version) }
        setField(field, stamp: stamp, version: version, prefix: prefix)
        let count = sealed.count - Self.headerLength - Self.tagLength
        if scratch.count < count { scratch.append(contentsOf: repeatElement(0, count: count - scratch.count)) }
        let key = keys.baseAddress! + slot * Self.keyLength
        let (status, result): (Int32, SQLiteValue?) = sealed.withUnsafeBytes { raw in
            let c = raw.baseAddress!.assumingMemoryBound(to: UInt8.self)
            return scratch.withUnsafeMutableBufferPointer { m in
                defer { sodium_memzero(m.baseAddress, count) }
                let status = ad.withUnsafeBufferPointer { a in
                    crypto_aead_xchacha20poly1305_ietf_decrypt(
                        m.baseAddress, nil, nil, c + Self.headerLength, UInt64(count + Self.tagLength),
                        a.baseAddress, UInt64(a.count), c + 5, key.assumingMemoryBound(to: UInt8.self))
                }
                guard status == 0 else { return (status, nil) }
                return (status, Self.decodePlaintext(UnsafeBufferPointer(start: m.baseAddress, count: count)))
            }
        }
        guard status == 0 else { throw OpenFailure(failure: .authenticationFailed, version: version) }
        guard let result else { throw OpenFailure(failure: .malformed, version: version) }
        return (result, version)
    }

    /// The value of a plaintext form, or `nil` for a malformed one (cannot happen for an authenticated value this
    /// library sealed).
    private static func decodePlaintext(_ bytes: UnsafeBufferPointer<UInt8>) -> SQLiteValue? {
        guard let tag = bytes.first else { return nil }
        let body = UnsafeBufferPointer(rebasing: bytes[1...])
        func read64() -> UInt64? {
            guard body.count == 8 else { return nil }
            return body.reduce(0) { $0 << 8 | UInt64($1) }
        }
        switch tag {
        case 0: return body.isEmpty ? .null : nil
        case 1: return read64().map { .integer(Int64(bitPattern: $0)) }
        case 2: return read64().map { .real(Double(bitPattern: $0)) }
        case 3: return .text(String(decoding: body, as: UTF8.self))
        case 4: return .blob(Data(buffer: body))
        default: return nil
        }
    }
}
