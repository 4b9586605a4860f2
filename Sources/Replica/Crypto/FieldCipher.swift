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
/// cipher is released.
///
/// **Cost.** The per-field path allocates nothing but the output value: the associated data (its record prefix built
/// once per record, its zone and type part once per run of records of one type), the plaintext buffer (wiped after
/// each use), the nonce buffer and the buffer a sealed value is built in are preallocated and written through
/// pointers, and the nonces of a whole batch are drawn from the random source in one call (and all consumed by that
/// call, so none outlive it). A record's cipher fields are found in one pass over its fields (names compared, not
/// hashed) and sealed or opened in place, so no field or record is copied on the way.
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
    /// Record type -> names of its encrypted attributes, sorted (so nonces are used in a deterministic order).
    private let encryptedFields: [String: [String]]
    private var slots: GuardedBuffer
    /// `versions[i]` is the key version held in slot `i`.
    private var versions: [UInt32] = []
    private var currentSlot = -1
    /// Reused working memory (not secret except `plain`, which is wiped after every value).
    private var buffers = Buffers()

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
    }

    deinit {
        buffers.release()
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

    /// Runs `body` with the sealed-asset keys of key `version` (``AssetSealing``: the stream key, then the header key,
    /// 32 bytes each, derived from the field key), held in guarded memory for the call only.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` when `version` is not loaded; what `body` throws.
    func withAssetKeys<T>(version: UInt32, _ body: (_ streamKey: UnsafeRawBufferPointer, _ headerKey: UnsafeRawBufferPointer) throws -> T) throws -> T {
        guard let slot = versions.firstIndex(of: version) else { throw FieldEncryptionError.noKey(zone: zone) }
        let derived = try GuardedBuffer(count: 2 * AssetSealing.keyLength)
        slots.withReadOnlyBytes { all in
            let key = UnsafeRawBufferPointer(rebasing: all[slot * Self.keyLength ..< (slot + 1) * Self.keyLength])
            derived.withWritableBytes { AssetSealing.deriveKeys(fieldKey: key, into: $0) }
        }
        return try derived.withReadOnlyBytes { keys in
            try body(UnsafeRawBufferPointer(rebasing: keys[0..<AssetSealing.keyLength]),
                     UnsafeRawBufferPointer(rebasing: keys[AssetSealing.keyLength ..< 2 * AssetSealing.keyLength]))
        }
    }

    /// Forgets every key (the guarded region is wiped).
    public func removeAllKeys() {
        slots.wipe()
        versions.removeAll()
        currentSlot = -1
    }

    // MARK: Records

    /// Seals the encrypted fields of every record in place, under ``currentKeyVersion``. One guarded-memory unlock
    /// and one draw from the random source for the whole batch.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` when no key is loaded.
    public func seal(_ records: inout [CloudRecord]) throws(FieldEncryptionError) {
        var types = TypeCache(encryptedFields)
        var fieldCount = 0
        for index in records.indices {
            let declared = types.declared(records[index].recordType)
            if !declared.isEmpty || records[index].fields.values.contains(where: \.isEncrypted) { fieldCount += records[index].fields.count }
        }
        guard fieldCount > 0 else { return }
        guard currentSlot >= 0 else { throw .noKey(zone: zone) }
        var work = buffers
        defer { buffers = work }
        work.reserveNonces(fieldCount)
        random.fill(UnsafeMutableRawBufferPointer(start: work.nonces, count: fieldCount * Self.nonceLength))
        let versions = self.versions
        let slot = currentSlot
        slots.withReadOnlyBytes { keys in
            sealAll(&records, slot: slot, keys: keys, versions: versions, types: &types, work: &work)
        }
    }

    /// The loop of ``seal(_:)``, with the keys readable (the batch state is passed `inout`, not captured, so the
    /// per-field path touches only locals).
    private func sealAll(_ records: inout [CloudRecord], slot: Int, keys: UnsafeRawBufferPointer, versions: [UInt32],
                         types: inout TypeCache, work: inout Buffers) {
        let key = keys.baseAddress!.assumingMemoryBound(to: UInt8.self) + slot * Self.keyLength
        let version = versions[slot]
        var nonce = 0
        for index in records.indices {
            let declared = types.declared(records[index].recordType)
            seal(&records[index], declared: declared, version: version, key: key, keys: keys, versions: versions,
                 work: &work, nonce: &nonce)
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
        switch open([record])[0] {
        case let .success(opened): return opened.record
        case let .failure(error): throw error
        }
    }

    /// Opens every record; one guarded-memory unlock for the batch.
    /// - Returns: per record, the opened record and the oldest key version among its sealed fields (`nil` when it
    ///   has none), or the error of its first failing field.
    public func open(_ records: [CloudRecord]) -> [Result<(record: CloudRecord, oldestKeyVersion: UInt32?), FieldEncryptionError>] {
        var work = buffers
        defer { buffers = work }
        var types = TypeCache(encryptedFields)
        let versions = self.versions
        return slots.withReadOnlyBytes { keys in
            openAll(records, keys: keys, versions: versions, types: &types, work: &work)
        }
    }

    /// The loop of ``open(_:)``, with the keys readable.
    private func openAll(_ records: [CloudRecord], keys: UnsafeRawBufferPointer, versions: [UInt32], types: inout TypeCache,
                         work: inout Buffers) -> [Result<(record: CloudRecord, oldestKeyVersion: UInt32?), FieldEncryptionError>] {
        var results: [Result<(record: CloudRecord, oldestKeyVersion: UInt32?), FieldEncryptionError>] = []
        results.reserveCapacity(records.count)
        for index in records.indices {
            var record = records[index]
            do throws(FieldEncryptionError) {
                let declared = types.declared(record.recordType)
                let oldest = try open(&record, declared: declared, keys: keys, versions: versions, work: &work)
                results.append(.success((consume record, oldest)))
            } catch {
                results.append(.failure(error))
            }
        }
        return results
    }

    /// Opens every record, one guarded-memory unlock for the batch, for the sync engine: the records that opened
    /// (in order, each with the oldest key version among its sealed fields) and, for the others, their index in
    /// `records` and the error of their first failing field. Same work as ``open(_:)`` without a per-record `Result`
    /// to unpack and copy again.
    func openBatch(_ records: [CloudRecord])
        -> (opened: [CloudRecord], oldest: [UInt32?], failures: [(index: Int, error: FieldEncryptionError)]) {
        var work = buffers
        defer { buffers = work }
        var types = TypeCache(encryptedFields)
        let versions = self.versions
        return slots.withReadOnlyBytes { keys in
            var opened: [CloudRecord] = []
            var oldest: [UInt32?] = []
            var failures: [(index: Int, error: FieldEncryptionError)] = []
            opened.reserveCapacity(records.count)
            oldest.reserveCapacity(records.count)
            for index in records.indices {
                var record = records[index]
                do throws(FieldEncryptionError) {
                    let declared = types.declared(record.recordType)
                    oldest.append(try open(&record, declared: declared, keys: keys, versions: versions, work: &work))
                    opened.append(consume record)
                } catch {
                    failures.append((index, error))
                }
            }
            return (opened, oldest, failures)
        }
    }

    /// `true` when sealing or opening `record` has anything to do.
    func needsCipher(_ record: CloudRecord) -> Bool {
        needsCipher(record, encryptedFields[record.recordType] ?? [])
    }

    private func needsCipher(_ record: CloudRecord, _ declared: [String]) -> Bool {
        !declared.isEmpty || record.fields.values.contains { $0.isEncrypted }
    }

    /// The encrypted attributes of record types, looked up once per run of records of one type.
    private struct TypeCache {
        let table: [String: [String]]
        var type: String?
        var fields: [String] = []
        init(_ table: [String: [String]]) { self.table = table }
        mutating func declared(_ recordType: String) -> [String] {
            if recordType != type {
                type = recordType
                fields = table[recordType] ?? []
            }
            return fields
        }
    }

    /// The fields of `record` to seal or open, in name order: its type's encrypted attributes (`declared`), then
    /// (merged in order) fields flagged encrypted that the type does not declare (from a newer schema). Also writes
    /// the position of each in `fields` to `work.found` (`nil` for an absent one), to be released with
    /// ``Buffers/clearFound(_:)``. One pass over `fields`, comparing names instead of hashing them; only a record
    /// with fields its type does not declare takes the lookups of the general case.
    ///
    /// `fields` is `inout` only so that the flags of the other fields are read in place rather than copied out
    /// (nothing is changed; when `declared` is not empty the caller is about to write the dictionary anyway, so
    /// making it unique here costs nothing extra).
    private func cipherFields(of fields: inout [String: CloudField], declared: [String], work: inout Buffers) -> [String] {
        work.reserveFound(declared.count)
        work.found.initialize(repeating: nil, count: declared.count)
        var flagged = false
        var index = fields.startIndex
        while index != fields.endIndex {
            if let position = declared.firstIndex(of: fields.keys[index]) {
                work.found[position] = index
            } else if declared.isEmpty ? fields.values[index].isEncrypted : Self.isEncrypted(&fields.values[index]) {
                flagged = true
            }
            fields.formIndex(after: &index)
        }
        guard flagged else { return declared }
        work.clearFound(declared.count)
        var names = declared
        for (name, field) in fields where field.isEncrypted && !declared.contains(name) { names.append(name) }
        names.sort()
        work.reserveFound(names.count)
        for (position, name) in names.enumerated() { (work.found + position).initialize(to: fields.index(forKey: name)) }
        return names
    }

    @inline(__always)
    private static func isEncrypted(_ field: inout CloudField) -> Bool { field.isEncrypted }

    private func seal(_ record: inout CloudRecord, declared: [String], version: UInt32, key: UnsafePointer<UInt8>,
                      keys: UnsafeRawBufferPointer, versions: [UInt32], work: inout Buffers, nonce: inout Int) {
        let names = cipherFields(of: &record.fields, declared: declared, work: &work)
        defer { work.clearFound(names.count) }
        guard !names.isEmpty else { return }
        // Only the general case has fields the type does not declare.
        let mixed = names.count != declared.count
        let prefix = beginRecord(record.recordID, record.recordType, work: &work)
        for position in names.indices {
            guard let index = work.found[position] else { continue }
            let name = names[position]
            if mixed, !declared.contains(name) {
                let field = record.fields.values[index]
                if case let .blob(bytes) = field.value,
                   (try? openValue(bytes, field: name, stamp: field.stamp, prefix: prefix, keys: keys, versions: versions, work: &work)) != nil {
                    // Kept from a time this device had no key: already sealed for exactly this place; send it unchanged.
                    continue
                }
            }
            sealField(&record.fields.values[index], name: name, version: version, key: key,
                      nonce: work.nonces + nonce * Self.nonceLength, prefix: prefix, work: &work)
            nonce += 1
        }
    }

    /// Seals one field in place (its value becomes the sealed BLOB, its flag set, its stamp unchanged).
    private func sealField(_ field: inout CloudField, name: String, version: UInt32, key: UnsafePointer<UInt8>,
                           nonce: UnsafePointer<UInt8>, prefix: Int, work: inout Buffers) {
        let adCount = setField(name, stamp: field.stamp, version: version, prefix: prefix, work: &work)
        let sealed = Self.seal(field.value, version: version, key: key, nonce: nonce, ad: work.ad, adCount: adCount, work: &work)
        field.value = .blob(sealed)
        field.isEncrypted = true
    }

    /// Opens the sealed fields of `record` in place; returns the oldest key version used.
    private func open(_ record: inout CloudRecord, declared: [String], keys: UnsafeRawBufferPointer, versions: [UInt32],
                      work: inout Buffers) throws(FieldEncryptionError) -> UInt32? {
        let names = cipherFields(of: &record.fields, declared: declared, work: &work)
        defer { work.clearFound(names.count) }
        guard !names.isEmpty else { return nil }
        let prefix = beginRecord(record.recordID, record.recordType, work: &work)
        var oldest: UInt32?
        for position in names.indices {
            guard let index = work.found[position] else { continue }
            let name = names[position]
            let version: UInt32
            do throws(OpenFailure) {
                version = try openField(&record.fields.values[index], name: name, prefix: prefix, keys: keys, versions: versions, work: &work)
            } catch {
                throw .undecryptable(entity: record.recordType, field: name, recordID: record.recordID, keyVersion: error.version,
                                     failure: error.failure)
            }
            oldest = min(oldest ?? version, version)
        }
        return oldest
    }

    /// Opens one sealed field in place (the flag stays set and the stamp unchanged: only the value is replaced);
    /// returns its key version. On failure the field is left as it was.
    private func openField(_ field: inout CloudField, name: String, prefix: Int, keys: UnsafeRawBufferPointer, versions: [UInt32],
                           work: inout Buffers) throws(OpenFailure) -> UInt32 {
        guard field.isEncrypted else { throw OpenFailure(failure: .notSealed) }
        guard case let .blob(bytes) = field.value else { throw OpenFailure(failure: .malformed) }
        let (value, version) = try openValue(bytes, field: name, stamp: field.stamp, prefix: prefix, keys: keys, versions: versions, work: &work)
        field.value = value
        return version
    }

    // MARK: Values

    /// Writes the record part of the associated data (ID, zone, record type) into `work.ad`; returns its length.
    /// The zone and type part stays in place for the next record of the same type (only the ID is rewritten).
    private func beginRecord(_ recordID: UUID, _ recordType: String, work: inout Buffers) -> Int {
        // Byte equality, not `==`: Swift's String equality is canonical equivalence ("K" and KELVIN SIGN + "ey"
        // compare equal), while the associated data must hold this record's own type bytes.
        if let cached = work.adRecordType, cached.utf8.elementsEqual(recordType.utf8) {
            withUnsafeBytes(of: recordID.uuid) { work.ad.update(from: $0.baseAddress!.assumingMemoryBound(to: UInt8.self), count: 16) }
            return work.adRecordPrefix
        }
        var type = recordType
        let length = type.withUTF8 { typeBytes in
            zoneBytes.withUnsafeBufferPointer { zone in
                work.reserveAD(16 + 4 + zone.count + 4 + typeBytes.count + Self.maxFieldPart)
                var p = work.ad
                withUnsafeBytes(of: recordID.uuid) { p.update(from: $0.baseAddress!.assumingMemoryBound(to: UInt8.self), count: 16) }
                p += 16
                p = Self.putBytes(p, zone)
                p = Self.putBytes(p, typeBytes)
                return p - work.ad
            }
        }
        work.adRecordType = recordType
        work.adRecordPrefix = length
        return length
    }

    /// The field part of the associated data holds at most this much besides the field name.
    private static let maxFieldPart = 4 + 36 + 5

    /// Writes the field part of the associated data after the record prefix (name, stamp, format and key version);
    /// returns the total length.
    private func setField(_ name: String, stamp: FieldStamp, version: UInt32, prefix: Int, work: inout Buffers) -> Int {
        var name = name
        return name.withUTF8 { nameBytes in
            work.reserveAD(prefix + nameBytes.count + Self.maxFieldPart, keeping: prefix)
            var p = Self.putBytes(work.ad + prefix, nameBytes)
            p = Self.put(p, UInt64(max(0, stamp.incarnation)), 8)
            p = Self.put(p, UInt64(max(0, stamp.clock.physical)), 8)
            p = Self.put(p, UInt64(max(0, stamp.clock.logical)), 4)
            withUnsafeBytes(of: stamp.clock.replica.uuid) { p.update(from: $0.baseAddress!.assumingMemoryBound(to: UInt8.self), count: 16) }
            p += 16
            p.pointee = Self.formatVersion
            p = Self.put(p + 1, UInt64(version), 4)
            return p - work.ad
        }
    }

    /// Writes a UInt32 big-endian length, then `bytes`.
    @inline(__always)
    private static func putBytes(_ p: UnsafeMutablePointer<UInt8>, _ bytes: UnsafeBufferPointer<UInt8>) -> UnsafeMutablePointer<UInt8> {
        let q = put(p, UInt64(bytes.count), 4)
        if let base = bytes.baseAddress { q.update(from: base, count: bytes.count) }
        return q + bytes.count
    }

    /// Writes the low `width` (4 or 8) bytes of `value`, big-endian, with one unaligned store.
    @inline(__always)
    private static func put(_ p: UnsafeMutablePointer<UInt8>, _ value: UInt64, _ width: Int) -> UnsafeMutablePointer<UInt8> {
        if width == 8 {
            UnsafeMutableRawPointer(p).storeBytes(of: value.bigEndian, as: UInt64.self)
        } else {
            assert(width == 4)
            UnsafeMutableRawPointer(p).storeBytes(of: UInt32(truncatingIfNeeded: value).bigEndian, as: UInt32.self)
        }
        return p + width
    }

    /// Writes the plaintext form of `value` into `work.plain`; returns its length.
    private static func encodePlaintext(_ value: SQLiteValue, work: inout Buffers) -> Int {
        switch value {
        case .null:
            work.reservePlain(1)
            work.plain[0] = 0
            return 1
        case let .integer(v):
            work.reservePlain(9)
            work.plain[0] = 1
            _ = put(work.plain + 1, UInt64(bitPattern: v), 8)
            return 9
        case let .real(v):
            work.reservePlain(9)
            work.plain[0] = 2
            _ = put(work.plain + 1, v.bitPattern, 8)
            return 9
        case var .text(s):
            return s.withUTF8 { bytes in
                work.reservePlain(1 + bytes.count)
                work.plain[0] = 3
                if let base = bytes.baseAddress { (work.plain + 1).update(from: base, count: bytes.count) }
                return 1 + bytes.count
            }
        case let .blob(d):
            work.reservePlain(1 + d.count)
            work.plain[0] = 4
            d.copyBytes(to: work.plain + 1, count: d.count)
            return 1 + d.count
        }
    }

    /// Seals `value` with `key`, `nonce` and the associated data `ad[0..<adCount]`.
    private static func seal(_ value: SQLiteValue, version: UInt32, key: UnsafePointer<UInt8>, nonce: UnsafePointer<UInt8>,
                             ad: UnsafePointer<UInt8>, adCount: Int, work: inout Buffers) -> Data {
        let count = encodePlaintext(value, work: &work)
        let plain = work.plain
        defer { sodium_memzero(plain, count) }
        // Sealed into the reused output buffer (header, ciphertext, tag: nothing secret), then copied into the value
        // once: cheaper than a zero-filled `Data(count:)` written through `withUnsafeMutableBytes`.
        let total = headerLength + count + tagLength
        work.reserveOut(total)
        let o = work.out
        o[0] = formatVersion
        _ = put(o + 1, UInt64(version), 4)
        (o + 5).update(from: nonce, count: nonceLength)
        _ = crypto_aead_xchacha20poly1305_ietf_encrypt(o + headerLength, nil, plain, UInt64(count), ad, UInt64(adCount), nil, o + 5, key)
        return Data(UnsafeBufferPointer(start: o, count: total))
    }

    struct OpenFailure: Error {
        var failure: FieldEncryptionError.DecryptionFailure
        var version: UInt32?
    }

    /// Opens one sealed value of field `field` (the record prefix of the associated data must be in `work.ad`).
    private func openValue(_ sealed: Data, field: String, stamp: FieldStamp, prefix: Int, keys: UnsafeRawBufferPointer,
                           versions: [UInt32], work: inout Buffers) throws(OpenFailure) -> (SQLiteValue, UInt32) {
        // One access to the bytes for the whole value.
        try sealed.withUnsafeBytes { raw in
            openValue(raw, field: field, stamp: stamp, prefix: prefix, keys: keys, versions: versions, work: &work)
        }.get()
    }

    private func openValue(_ sealed: UnsafeRawBufferPointer, field: String, stamp: FieldStamp, prefix: Int, keys: UnsafeRawBufferPointer,
                           versions: [UInt32], work: inout Buffers) -> Result<(SQLiteValue, UInt32), OpenFailure> {
        guard sealed.count >= Self.headerLength + Self.tagLength + 1 else { return .failure(OpenFailure(failure: .malformed)) }
        let c = sealed.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let format = c[0]
        let version = UInt32(c[1]) << 24 | UInt32(c[2]) << 16 | UInt32(c[3]) << 8 | UInt32(c[4])
        guard format == Self.formatVersion else { return .failure(OpenFailure(failure: .unsupportedFormat, version: version)) }
        guard let slot = versions.firstIndex(of: version) else { return .failure(OpenFailure(failure: .unknownKeyVersion, version: version)) }
        let adCount = setField(field, stamp: stamp, version: version, prefix: prefix, work: &work)
        let count = sealed.count - Self.headerLength - Self.tagLength
        work.reservePlain(count)
        let plain = work.plain
        defer { sodium_memzero(plain, count) }
        let key = keys.baseAddress!.assumingMemoryBound(to: UInt8.self) + slot * Self.keyLength
        let status = crypto_aead_xchacha20poly1305_ietf_decrypt(plain, nil, nil, c + Self.headerLength, UInt64(count + Self.tagLength),
                                                                work.ad, UInt64(adCount), c + 5, key)
        guard status == 0 else { return .failure(OpenFailure(failure: .authenticationFailed, version: version)) }
        guard let value = Self.decodePlaintext(UnsafeBufferPointer(start: plain, count: count)) else {
            return .failure(OpenFailure(failure: .malformed, version: version))
        }
        return .success((value, version))
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

/// Working memory of a ``FieldCipher``: associated data (with the record type whose zone and type part it holds),
/// plaintext, nonces, the sealed value being built and the positions of a record's cipher fields, each grown on demand
/// and reused.
/// A value type of pointers, copied into a local for the duration of a batch so the hot loop touches no class
/// property.
struct Buffers {
    private(set) var ad = UnsafeMutablePointer<UInt8>.allocate(capacity: 256)
    private var adCapacity = 256
    /// The record type whose zone and type part of the associated data is in `ad` (`FieldCipher.beginRecord`), and
    /// the length of that record part; `nil` when none is.
    var adRecordType: String?
    var adRecordPrefix = 0
    private(set) var plain = UnsafeMutablePointer<UInt8>.allocate(capacity: 256)
    private var plainCapacity = 256
    private(set) var nonces = UnsafeMutablePointer<UInt8>.allocate(capacity: 24 * 256)
    private var nonceCapacity = 24 * 256
    /// A sealed value being built (not secret).
    private(set) var out = UnsafeMutablePointer<UInt8>.allocate(capacity: 256)
    private var outCapacity = 256
    /// Positions of the fields of the record being sealed or opened (see `FieldCipher.cipherFields`); initialized
    /// only while that record is processed.
    private(set) var found = UnsafeMutablePointer<Dictionary<String, CloudField>.Index?>.allocate(capacity: 8)
    private var foundCapacity = 8

    /// Makes room for `count` bytes of associated data, keeping the first `keeping` bytes.
    mutating func reserveAD(_ count: Int, keeping: Int = 0) {
        guard count > adCapacity else { return }
        let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: count * 2)
        bigger.update(from: ad, count: keeping)
        if keeping < adRecordPrefix { adRecordType = nil }
        ad.deallocate()
        ad = bigger
        adCapacity = count * 2
    }

    /// Makes room for `count` bytes of plaintext (the old buffer is wiped before it is freed).
    mutating func reservePlain(_ count: Int) {
        guard count > plainCapacity else { return }
        sodium_memzero(plain, plainCapacity)
        plain.deallocate()
        plain = UnsafeMutablePointer<UInt8>.allocate(capacity: count * 2)
        plainCapacity = count * 2
    }

    /// Makes room for `fields` nonces.
    mutating func reserveNonces(_ fields: Int) {
        guard fields * FieldCipher.nonceLength > nonceCapacity else { return }
        nonces.deallocate()
        nonceCapacity = fields * FieldCipher.nonceLength * 2
        nonces = UnsafeMutablePointer<UInt8>.allocate(capacity: nonceCapacity)
    }

    /// Makes room for a sealed value of `count` bytes.
    mutating func reserveOut(_ count: Int) {
        guard count > outCapacity else { return }
        out.deallocate()
        outCapacity = count * 2
        out = UnsafeMutablePointer<UInt8>.allocate(capacity: outCapacity)
    }

    /// Makes room for the positions of `count` fields (call only while none is initialized).
    mutating func reserveFound(_ count: Int) {
        guard count > foundCapacity else { return }
        found.deallocate()
        foundCapacity = count * 2
        found = UnsafeMutablePointer<Dictionary<String, CloudField>.Index?>.allocate(capacity: foundCapacity)
    }

    /// Deinitializes the first `count` field positions.
    func clearFound(_ count: Int) {
        found.deinitialize(count: count)
    }

    /// Frees everything (the plaintext buffer wiped first).
    func release() {
        sodium_memzero(plain, plainCapacity)
        ad.deallocate()
        plain.deallocate()
        nonces.deallocate()
        out.deallocate()
        found.deallocate()
    }
}
