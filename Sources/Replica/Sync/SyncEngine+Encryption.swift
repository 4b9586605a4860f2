import Foundation

/// How a ``SyncEngine`` encrypts the attributes marked ``Schema/Attribute/Options/allowsCloudEncryption``.
///
/// Every such field is sealed with XChaCha20-Poly1305 (see ``FieldCipher``) just before a record is uploaded and
/// opened just before a downloaded record is merged; the local store keeps plaintext, the cloud never sees it. The
/// zone's field keys are random, versioned, and kept in the zone's metadata wrapped under a root key that the
/// ``keyProvider`` derives (a passphrase through Argon2id, or a raw key). Before its first fetch or upload in each
/// sync cycle the engine reads the zone's encryption metadata and checks the key against its key-check value: with
/// a wrong key it stops with ``FieldEncryptionError/wrongKey(zone:)`` and uploads and merges nothing.
public struct FieldEncryption: Sendable {
    /// Where the zone's root key comes from.
    public var keyProvider: any FieldKeyProvider

    /// - Parameter keyProvider: e.g. a ``PassphraseKeyProvider`` or a ``RawKeyProvider``.
    public init(keyProvider: any FieldKeyProvider) {
        self.keyProvider = keyProvider
    }

    /// Encryption with a passphrase (Argon2id; see ``PassphraseKeyProvider``).
    /// - Parameters:
    ///   - passphrase: the user's passphrase (UTF-8, not empty).
    ///   - limits: Argon2id cost for a zone this device initializes (default ``PasswordHashLimits/moderate``: 3
    ///     passes over 256 MiB). Joining devices use the zone's stored limits.
    /// - Throws: ``FieldEncryptionError/invalidKey(reason:)``, ``FieldEncryptionError/outOfGuardedMemory``.
    public static func passphrase(_ passphrase: String, limits: PasswordHashLimits = .moderate) throws(FieldEncryptionError) -> FieldEncryption {
        FieldEncryption(keyProvider: try PassphraseKeyProvider(passphrase: passphrase, limits: limits))
    }

    /// Encryption with a raw 32-byte key (see ``RawKeyProvider``).
    /// - Throws: ``FieldEncryptionError/invalidKey(reason:)`` when `key` is not 32 bytes.
    public static func rawKey(_ key: [UInt8]) throws(FieldEncryptionError) -> FieldEncryption {
        FieldEncryption(keyProvider: try RawKeyProvider(key: key))
    }
}

/// A record whose incoming version could not be decrypted. Its local values are untouched; it neither merges nor
/// uploads until the keys change, a newer decryptable version arrives, or the zone is reset.
public struct UndecryptableRecord: Hashable, Sendable {
    /// The record ID.
    public var recordID: UUID
    /// The record type (entity name).
    public var entity: String
    /// Why (the ``FieldEncryptionError`` description: entity, field, record ID and key version, never values).
    public var reason: String
}

/// What the encryption layer needs before the engine may fetch or upload (see ``SyncEngine/encryptionGate(needsFetch:)``).
enum EncryptionGate {
    /// Perform this request first.
    case request(CloudOperation)
    /// Encryption is stopped by an error (e.g. a wrong key): send nothing.
    case blocked
}

/// The encryption state of one engine. Internal; confined to its engine.
final class FieldEncryptionController {
    enum Phase {
        /// The zone's metadata must be read before anything else.
        case needsMetadata
        /// A compare-and-swap of the zone's metadata is to be sent (a new key set, or a rotated one).
        case proposing(value: Data, ifCurrent: Data?)
        /// Keys verified and loaded.
        case ready
        /// Stopped until the key provider is replaced.
        case blocked(FieldEncryptionError)
        /// A reset: the cloud zone is to be deleted.
        case deletingZone
    }

    enum Rotation {
        /// Rotate once the zone's current metadata is read.
        case requested
        /// A new version above this one was proposed.
        case proposed(above: UInt32)
    }

    let keyring: ZoneKeyring
    var phase = Phase.needsMetadata
    /// The metadata was read during the current sync cycle (a cycle starts when the engine needs to fetch again).
    var metadataFresh = false
    var lastNeedsFetch = false
    var rotation: Rotation?
    /// The error of the last record that failed to open.
    var lastRecordError: FieldEncryptionError?
    /// A re-encrypt pass is running: records seen under an older key version go back to the outbox.
    var reencrypting = false
    var reencryptRefetchStarted = false
    var requeueAfterMerge: [UUID] = []

    static let keySetMetadataKey = "encryption_key_set"
    static let reencryptMetadataKey = "encryption_reencrypt"

    init(keyring: ZoneKeyring) {
        self.keyring = keyring
    }

    var blockingError: FieldEncryptionError? {
        if case let .blocked(error) = phase { return error }
        return nil
    }

    /// The controller for `encryption`, or `nil` without encryption.
    /// - Throws: ``FieldEncryptionError/encryptionNotConfigured(entity:field:)`` when `encryption` is `nil` but the
    ///   store has encrypted attributes (the engine would otherwise have to upload them in plaintext).
    static func make(_ encryption: FieldEncryption?, store: Store, zone: String, db: Connection,
                     random: any RandomSource) throws -> FieldEncryptionController? {
        let fields = FieldCipher.encryptedFields(of: store.entities)
        guard let encryption else {
            if let entity = fields.keys.sorted().first, let field = fields[entity]?.sorted().first {
                throw FieldEncryptionError.encryptionNotConfigured(entity: entity, field: field)
            }
            return nil
        }
        let controller = FieldEncryptionController(keyring: try ZoneKeyring(
            zone: zone, provider: encryption.keyProvider, encryptedFields: fields, random: random))
        if try db.scalar("SELECT value FROM replica_metadata WHERE key = ?", [.text(reencryptMetadataKey)]) != nil {
            controller.reencrypting = true
        }
        return controller
    }
}

// MARK: - Public API

extension SyncEngine {
    /// The key version new values are sealed with, once the zone's keys are loaded; `nil` before, or without
    /// encryption.
    public var encryptionKeyVersion: UInt32? { encryption?.keyring.cipher.currentKeyVersion }

    /// Replaces the key provider (e.g. after ``FieldEncryptionError/wrongKey(zone:)``, with the right passphrase),
    /// or turns encryption on. The zone's metadata is read and checked again before the next fetch or upload;
    /// records that failed to decrypt are fetched again once new keys load.
    /// - Throws: ``FieldEncryptionError/outOfGuardedMemory``.
    public func setEncryptionKeyProvider(_ provider: any FieldKeyProvider) throws {
        if let encryption {
            encryption.keyring.replaceProvider(provider)
            forgetSealedAssets()
            encryption.phase = .needsMetadata
            encryption.metadataFresh = false
        } else {
            encryption = try FieldEncryptionController.make(FieldEncryption(keyProvider: provider), store: store, zone: zone, db: db,
                                                            random: container.environment.random)
        }
    }

    /// Rotates the zone's field key: at the next opportunity the engine reads the zone's metadata, adds a key one
    /// version above the highest (wrapped under the same root key) with a compare-and-swap, and seals every new
    /// write with it. Older versions still open. Other devices load the new version at their next sync cycle.
    /// Use ``reencryptAllRecords()`` to move existing records to the new key.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` when the engine has no encryption.
    public func rotateEncryptionKey() throws {
        guard let encryption else { throw FieldEncryptionError.noKey(zone: zone) }
        encryption.rotation = .requested
        encryption.metadataFresh = false
    }

    /// Starts a re-encrypt pass: every local record with encrypted fields goes back to the outbox (so it is sealed
    /// again under the newest key version when uploaded), the zone is read again from the start, and until the pass
    /// ends every record seen under an older version goes back to the outbox too. The pass ends when that full
    /// read is done and the outbox is empty; it survives a restart.
    /// - Throws: ``FieldEncryptionError/noKey(zone:)`` without encryption; ``SQLiteError``.
    public func reencryptAllRecords() throws {
        guard let encryption else { throw FieldEncryptionError.noKey(zone: zone) }
        let encryptedTypes = FieldCipher.encryptedFields(of: store.entities).keys.sorted()
        let types = encryptedTypes.map { _ in "?" }.joined(separator: ", ")
        try db.transaction(.immediate) {
            try db.run("INSERT INTO replica_metadata (key, value) VALUES (?, '1') ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       [.text(FieldEncryptionController.reencryptMetadataKey)])
            try db.run("""
                UPDATE replica_sync_record SET pending = 1, local_version = local_version + 1,
                    state = CASE WHEN state IN ('rejected', 'undecryptable') THEN state ELSE 'pending' END
                WHERE causal_length > 0 AND (entity IN (\(types.isEmpty ? "NULL" : types))
                    OR unknown LIKE '%"isEncrypted":true%' OR tombstone LIKE '%"isEncrypted":true%')
                """, encryptedTypes.map(SQLiteValue.text))
        }
        encryption.reencrypting = true
        encryption.reencryptRefetchStarted = false
    }

    /// Resets the zone's encryption after a lost key: deletes the cloud zone, creates it again with a new key set
    /// from `keyProvider`, and uploads every local record (tombstones too) sealed under the new key. Local data is
    /// never deleted; records that could not be decrypted keep their local values and are uploaded with them.
    /// Other devices stop with ``FieldEncryptionError/wrongKey(zone:)`` until given the new key, then upload their
    /// own local data again.
    /// - Parameter keyProvider: the new key's provider.
    /// - Throws: ``FieldEncryptionError/outOfGuardedMemory``.
    public func resetEncryption(keyProvider: any FieldKeyProvider) throws {
        try setEncryptionKeyProvider(keyProvider)
        guard let encryption else { return }
        encryption.phase = .deletingZone
        encryption.rotation = nil
    }

    /// Replaces the unreadable cloud versions of undecryptable records with their local versions: every such record
    /// that exists locally (alive or deleted) goes back to the outbox, to overwrite the version it could not read
    /// (a save conflict instead means the cloud changed again, and that version is opened and merged as usual).
    /// Use it when the cloud copies are damaged or were tampered with and the local values are the ones to keep;
    /// the unreadable values are lost (no one could read them). Records never seen locally stay marked.
    /// - Returns: the number of records queued.
    /// - Throws: ``SQLiteError``.
    @discardableResult
    public func reuploadUndecryptableRecords() throws -> Int {
        try db.transaction(.immediate) {
            try db.run("""
                UPDATE replica_sync_record SET state = 'pending', reason = NULL, pending = 1, local_version = local_version + 1
                WHERE state = 'undecryptable' AND causal_length > 0
                """)
            return db.changes
        }
    }

    /// The records whose incoming version could not be decrypted, in ID order.
    /// - Throws: ``SQLiteError``.
    public func undecryptableRecords() throws -> [UndecryptableRecord] {
        try db.rows("SELECT id, entity, reason FROM replica_sync_record WHERE state = 'undecryptable' ORDER BY id").compactMap { row in
            guard let id = try? UUID(sqliteValue: row[0]), case let .text(entity) = row[1] else { return nil }
            let reason: String = if case let .text(text) = row[2] { text } else { "" }
            return UndecryptableRecord(recordID: id, entity: entity, reason: reason)
        }
    }
}

// MARK: - Engine hooks

extension SyncEngine {
    /// Called by ``nextRequest()`` once the zone exists, before it fetches or uploads: reads and checks the zone's
    /// keys once per sync cycle, proposes new metadata, deletes the zone for a reset, or blocks on a key error.
    /// - Returns: `nil` when the engine may go on with its own work.
    func encryptionGate(needsFetch: Bool) throws -> EncryptionGate? {
        guard let encryption else { return nil }
        if needsFetch && !encryption.lastNeedsFetch { encryption.metadataFresh = false }
        encryption.lastNeedsFetch = needsFetch
        switch encryption.phase {
        case .deletingZone:
            return .request(.resetZone(zone, reason: .encryptedDataReset))
        case .blocked:
            return .blocked
        case let .proposing(value, current):
            return .request(.setZoneMetadata(zone: zone, key: ZoneEncryptionMetadata.key, value: value, ifCurrent: current))
        case .needsMetadata:
            return .request(.fetchZoneMetadata(zone: zone))
        case .ready:
            if !encryption.metadataFresh { return .request(.fetchZoneMetadata(zone: zone)) }
        }
        if encryption.reencrypting {
            if !encryption.reencryptRefetchStarted {
                try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
                setNeedsFetch()
                encryption.reencryptRefetchStarted = true
            } else if !needsFetch,
                      try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_record WHERE pending = 1 AND state NOT IN ('rejected', 'undecryptable'))") == .integer(0) {
                try db.run("DELETE FROM replica_metadata WHERE key = ?", [.text(FieldEncryptionController.reencryptMetadataKey)])
                encryption.reencrypting = false
            }
        }
        return nil
    }

    /// Called by ``nextRequest()`` on an upload batch just before it is emitted: seals every encrypted field.
    /// `records` is taken over (the caller passes a fresh array), so sealing in place copies no array.
    func sealOutgoing(_ records: consuming [CloudRecord]) throws -> [CloudRecord] {
        guard let encryption else { return records }
        if container.environment.canaries.contains(.plaintextUploaded) { return records }
        // Sealed-asset references are sealed already (the asset is; the reference names only sealed bytes): set aside.
        let aside = Self.takeSealedAssetFields(&records)
        try encryption.keyring.cipher.seal(&records)
        Self.restore(aside, into: &records)
        return records
    }

    /// Called by ``handle(_:_:)`` on every successful response to `operation` before it is applied: takes in zone
    /// metadata (any fetch of it; a compare-and-swap only when it set the encryption key), and opens every
    /// downloaded record (fetched, or returned by a save conflict). Records that fail to open are left out of the
    /// result — so they are not merged and their local values stay untouched — and marked `undecryptable` in the
    /// ledger.
    func prepareIncoming(_ outcome: CloudOperationResult, for operation: CloudOperation) throws -> CloudOperationResult {
        guard let encryption else { return outcome }
        switch outcome {
        case let .metadata(values):
            try receiveZoneMetadata(values[ZoneEncryptionMetadata.key], encryption)
        case let .metadataValue(stored):
            if case let .setZoneMetadata(_, key, _, _) = operation, key == ZoneEncryptionMetadata.key, case .proposing = encryption.phase {
                try receiveZoneMetadata(stored, encryption)
            }
        case .assetUpload, .assetChunk:
            break
        case .zoneDeleted:
            if case .deletingZone = encryption.phase {
                // Reading the metadata of the deleted zone fails with zoneNotFound, and the engine's own zone reset
                // follows: create the zone, put every record back in the outbox.
                encryption.phase = .needsMetadata
                encryption.metadataFresh = false
            }
        case let .changes(batch):
            var batch = batch
            batch.records = try openIncoming(batch.records, encryption)
            return .changes(batch)
        case let .modified(results):
            let conflicts = results.compactMap { if case let .conflict(record) = $0 { record } else { nil } }
            guard !conflicts.isEmpty else { return outcome }
            var opened: [UUID: CloudRecord] = [:]
            for record in try openIncoming(conflicts, encryption) { opened[record.recordID] = record }
            return .modified(results.compactMap { result in
                guard case let .conflict(record) = result else { return result }
                return opened[record.recordID].map { .conflict(serverRecord: $0) }
            })
        case .zoneCreated:
            break
        }
        return outcome
    }

    /// Called by ``handle(_:_:)`` after a response was applied: during a re-encrypt pass, records merged from an
    /// older key version go back to the outbox.
    func didApplyIncoming() throws {
        guard let encryption, !encryption.requeueAfterMerge.isEmpty else { return }
        try db.transaction(.immediate) {
            for id in encryption.requeueAfterMerge {
                try db.run("""
                    UPDATE replica_sync_record SET pending = 1, local_version = local_version + 1,
                        state = CASE WHEN state IN ('rejected', 'undecryptable') THEN state ELSE 'pending' END
                    WHERE id = ? AND causal_length > 0
                    """, [id.sqliteValue])
            }
        }
        encryption.requeueAfterMerge.removeAll()
    }

    /// Called inside the engine's zone-reset transaction (zone not found), before every record re-enters the
    /// outbox: drops placeholders of records never decrypted (they hold no local data) and forgets the old keys.
    func encryptionZoneWasReset() throws {
        guard let encryption else { return }
        try db.run("DELETE FROM replica_sync_record WHERE causal_length = 0 AND state = 'undecryptable'")
        if case .blocked = encryption.phase {
            return  // still needs a new key provider
        }
        encryption.keyring.forget()
        forgetSealedAssets()
        encryption.phase = .needsMetadata
        encryption.metadataFresh = false
    }

    /// Forgets the sealed-asset references computed this session and the sealed uploads queued with them: they were
    /// sealed under keys this device no longer holds (a key set replaced by a zone reset has the same version numbers
    /// with other key material, so a reference cached by version would name bytes no stream makes any more, and its
    /// upload would fail "the bytes do not hash to its name" for ever). The next upload batch seals them again under
    /// the zone's current keys.
    func forgetSealedAssets() {
        assetTransfers.sealedReferences.removeAll()
        assetTransfers.uploads.removeAll { upload in
            if case .sealed = upload.source { return true }
            return false
        }
    }

    /// Adds the encryption error to ``status()`` (which already counts undecryptable records).
    func reportEncryption(into status: inout SyncStatus) {
        status.encryptionError = encryption?.blockingError ?? (status.undecryptableRecords > 0 ? encryption?.lastRecordError : nil)
    }

    // MARK: Internals

    private func receiveZoneMetadata(_ data: Data?, _ encryption: FieldEncryptionController) throws {
        // Fresh for the current sync cycle, whoever asked (another metadata user, such as the schema gate, may have).
        encryption.metadataFresh = true
        encryption.lastNeedsFetch = true
        guard let data, !data.isEmpty else {
            // The zone has no keys yet: propose a new key set (compare-and-swap from nothing; if another device wins,
            // its key set is checked and adopted instead).
            do {
                encryption.phase = .proposing(value: try encryption.keyring.makeInitialMetadata(), ifCurrent: nil)
            } catch {
                encryption.phase = .blocked(error)
            }
            return
        }
        let adoption: ZoneKeyring.Adoption
        do {
            adoption = try encryption.keyring.adopt(data)
        } catch {
            encryption.phase = .blocked(error)
            return
        }
        encryption.phase = .ready
        if adoption.keysChanged || adoption.replacedKeySet != nil { forgetSealedAssets() }
        guard let keySet = encryption.keyring.adoptedMetadata?.keySet else { return }
        let keySetText = keySet.map { String($0, radix: 16).leftPadded(to: 2) }.joined()
        let stored = try db.scalar("SELECT value FROM replica_metadata WHERE key = ?", [.text(FieldEncryptionController.keySetMetadataKey)])
        if stored != .text(keySetText) {
            try db.transaction(.immediate) {
                if stored != nil {
                    // The zone's key set was replaced (the zone was reset, e.g. after a lost key): this device's local
                    // data goes to the cloud again, under the new key, and the zone is read again from the start.
                    // (A stored value that cannot be read counts as another key set: the safe side, a re-upload.)
                    try db.run("DELETE FROM replica_sync_record WHERE causal_length = 0 AND state = 'undecryptable'")
                    try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
                    try db.run("""
                        UPDATE replica_sync_record SET pending = 1, change_tag = NULL, local_version = local_version + 1,
                            state = CASE WHEN state = 'rejected' THEN state ELSE 'pending' END
                        """)
                    setNeedsFetch()
                    // The reset zone holds none of the assets it held: they go up again before their records.
                    assetCycleEnded(zoneCreated: true)
                }
                try db.run("INSERT INTO replica_metadata (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                           [.text(FieldEncryptionController.keySetMetadataKey), .text(keySetText)])
            }
        }
        if adoption.keysChanged,
           try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_record WHERE state = 'undecryptable')") == .integer(1) {
            // New keys may open records that failed before: read the zone again (merging is idempotent).
            try db.run("DELETE FROM replica_metadata WHERE key = 'server_change_token'")
            setNeedsFetch()
        }
        let current = encryption.keyring.cipher.currentKeyVersion ?? 0
        switch encryption.rotation {
        case .requested?:
            encryption.rotation = .proposed(above: current)
            encryption.phase = .proposing(value: try encryption.keyring.makeRotatedMetadata(), ifCurrent: data)
        case let .proposed(above)? where current <= above:
            // Another device changed the metadata first: rotate from its version.
            encryption.phase = .proposing(value: try encryption.keyring.makeRotatedMetadata(), ifCurrent: data)
        case .proposed?:
            encryption.rotation = nil
        case nil:
            break
        }
    }

    /// Opens `records`; marks the ones that fail as undecryptable (and clears the mark of ones that open now).
    /// Removes the fields that hold a sealed-asset reference (``SealedAssetReference``, flagged encrypted) from
    /// `records`, returning them by record index, so the field cipher neither seals nor opens them.
    static func takeSealedAssetFields(_ records: inout [CloudRecord]) -> [Int: [String: CloudField]] {
        var aside: [Int: [String: CloudField]] = [:]
        for index in records.indices {
            for (name, field) in records[index].fields where field.isEncrypted {
                guard case let .text(text) = field.value, SealedAssetReference(fieldValue: text) != nil else { continue }
                aside[index, default: [:]][name] = field
            }
            for name in (aside[index] ?? [:]).keys { records[index].fields[name] = nil }
        }
        return aside
    }

    /// Puts fields taken by ``takeSealedAssetFields(_:)`` back.
    static func restore(_ aside: [Int: [String: CloudField]], into records: inout [CloudRecord]) {
        for (index, fields) in aside { for (name, field) in fields { records[index].fields[name] = field } }
    }

    /// Marks records whose incoming version could not be opened `undecryptable` in the ledger (their local values
    /// untouched; a placeholder for one never merged here), keeping the version's change tag (see
    /// ``reuploadUndecryptableRecords()``). Inside the caller's transaction.
    func markUndecryptable(_ failed: [(CloudRecord, FieldEncryptionError)]) throws {
        for (record, error) in failed {
            let reason = error.description
            // The server version seen (unread) is remembered, so `reuploadUndecryptableRecords()` can replace it.
            try db.run("UPDATE replica_sync_record SET state = 'undecryptable', reason = ?, change_tag = coalesce(?, change_tag) WHERE id = ?",
                       [.text(reason), record.changeTag.map(SQLiteValue.text) ?? .null, record.recordID.sqliteValue])
            if db.changes == 0 {
                // Never merged here: a placeholder (causal length 0, nothing to upload) carries the ledger state.
                try db.run("""
                    INSERT INTO replica_sync_record (id, entity, causal_length, created, stamps, pending, state, reason)
                    VALUES (?, ?, 0, ?, '{}', 0, 'undecryptable', ?)
                    """, [record.recordID.sqliteValue, .text(record.recordType), .text(record.created.description), .text(reason)])
            }
            // The zone does have this record: during a full resync it counts as seen, so it is not taken for one
            // the zone lost (see P4).
            try db.run("""
                UPDATE replica_sync_record SET seen = (SELECT value FROM replica_metadata WHERE key = 'resync_generation')
                WHERE id = ? AND EXISTS (SELECT 1 FROM replica_metadata WHERE key = 'resync_active')
                """, [record.recordID.sqliteValue])
        }
        if let last = failed.last?.1 { encryption?.lastRecordError = last }
    }

    private func openIncoming(_ records: [CloudRecord], _ encryption: FieldEncryptionController) throws -> [CloudRecord] {
        let cipher = encryption.keyring.cipher
        guard records.contains(where: cipher.needsCipher) else { return records }
        // Sealed-asset references are opened with their asset (`SyncEngine+Assets.swift`), not by the field cipher.
        let complete = records
        var records = records
        let aside = Self.takeSealedAssetFields(&records)
        let opened = try openIncomingFields(records, complete: complete, encryption)
        guard !aside.isEmpty else { return opened }
        var byID: [UUID: [String: CloudField]] = [:]
        for (index, fields) in aside { byID[records[index].recordID, default: [:]].merge(fields) { a, _ in a } }
        return opened.map { record in
            var record = record
            for (name, field) in byID[record.recordID] ?? [:] { record.fields[name] = field }
            return record
        }
    }

    /// Whether `remote`, a version that failed to open with `failure`, holds nothing the local record lacks — the
    /// local record is alive or deleted here (not a placeholder, not corrupt, not rejected) and its version covers
    /// `remote`'s: a higher causal length, or the same one with a creation stamp no later and, for every field of
    /// `remote`, a field here with the same or a newer stamp; no redirect or ended redirect that this one lacks.
    ///
    /// Such a version is, in practice, a write sealed under a key set the zone no longer has: a device that read the
    /// zone's keys, then uploaded after the zone was reset and re-created by another device with a new key set
    /// (E6). No device can open it, and merging it would change nothing here, so the device that holds it seals it
    /// again rather than holding it as undecryptable (which would hold it for ever: its writer is the only one that
    /// can fix it). Only authentication failures qualify: an unknown key version is first a key this device has not
    /// read yet (E4), and a version tampered with under newer stamps is not covered, so it stays undecryptable (E5).
    private func holdsEverything(of remote: CloudRecord, failure: FieldEncryptionError) throws -> Bool {
        guard case .undecryptable(_, _, _, _, .authenticationFailed) = failure,
              !container.environment.canaries.contains(.staleKeySetWritesHeld),
              let state = try SyncLedger.loadAsStored(remote.recordID, db), state.corruptColumns.isEmpty,
              state.causalLength > 0, state.entity == remote.recordType,
              ["pending", "synced", "undecryptable"].contains(state.storedState ?? ""),
              let local = try SyncLedger.outgoingRecord(state, store: store, db: db) else { return false }
        guard local.causalLength >= remote.causalLength,
              remote.redirect == nil || remote.redirect == local.redirect,
              Set(remote.endedRedirects).isSubset(of: local.endedRedirects) else { return false }
        if local.causalLength > remote.causalLength { return true }
        guard local.created <= remote.created else { return false }
        return remote.fields.allSatisfy { name, field in local.fields[name].map { field.stamp <= $0.stamp } ?? false }
    }

    /// Puts records whose unreadable cloud version ``holdsEverything(of:failure:)`` back in the outbox, to replace that
    /// version (its change tag the base of the upload) with the local one sealed under the zone's current keys.
    /// During a full resync they count as seen (the zone has them). Inside the caller's transaction.
    private func sealAgain(_ superseded: [CloudRecord]) throws {
        for record in superseded {
            try db.run("""
                UPDATE replica_sync_record SET pending = 1, local_version = local_version + 1, state = 'pending', reason = NULL,
                    change_tag = coalesce(?, change_tag)
                WHERE id = ?
                """, [record.changeTag.map(SQLiteValue.text) ?? .null, record.recordID.sqliteValue])
            try db.run("""
                UPDATE replica_sync_record SET seen = (SELECT value FROM replica_metadata WHERE key = 'resync_generation')
                WHERE id = ? AND EXISTS (SELECT 1 FROM replica_metadata WHERE key = 'resync_active')
                """, [record.recordID.sqliteValue])
        }
    }

    /// Opens the encrypted fields of `records`; `complete` is `records` as received, sealed-asset fields included
    /// (same order), for ``holdsEverything(of:failure:)``.
    private func openIncomingFields(_ records: [CloudRecord], complete: [CloudRecord], _ encryption: FieldEncryptionController) throws -> [CloudRecord] {
        let cipher = encryption.keyring.cipher
        let current = cipher.currentKeyVersion
        let (opened, oldest, failures) = cipher.openBatch(records)
        if encryption.reencrypting, let current {
            for index in opened.indices {
                if let version = oldest[index], version < current { encryption.requeueAfterMerge.append(opened[index].recordID) }
            }
        }
        var failed: [(CloudRecord, FieldEncryptionError)] = []
        var superseded: [CloudRecord] = []
        for (index, error) in failures {
            if try holdsEverything(of: complete[index], failure: error) {
                superseded.append(complete[index])
                continue
            }
            failed.append((records[index], error))
            if case .undecryptable(_, _, _, _, .unknownKeyVersion) = error {
                // Probably a key another device just added: read the zone's keys again before going on.
                encryption.metadataFresh = false
            }
        }
        var previouslyFailed: Set<UUID> = []
        if try db.scalar("SELECT EXISTS (SELECT 1 FROM replica_sync_record WHERE state = 'undecryptable')") == .integer(1) {
            for row in try db.rows("SELECT id FROM replica_sync_record WHERE state = 'undecryptable'") {
                if let id = try? UUID(sqliteValue: row[0]) { previouslyFailed.insert(id) }
            }
        }
        let recovered = previouslyFailed.isEmpty ? [] : opened.filter { previouslyFailed.contains($0.recordID) }
        guard !failed.isEmpty || !recovered.isEmpty || !superseded.isEmpty else { return opened }
        try db.transaction(.immediate) {
            try sealAgain(superseded)
            for record in recovered {
                try db.run("DELETE FROM replica_sync_record WHERE id = ? AND causal_length = 0 AND state = 'undecryptable'", [record.recordID.sqliteValue])
                // The tag kept is the version that failed, which the merge below has yet to apply: cleared (unless an
                // upload needs it as its base), so the merge does not take the version for one it holds already.
                try db.run("""
                    UPDATE replica_sync_record SET state = CASE WHEN pending = 1 THEN 'pending' ELSE 'synced' END, reason = NULL,
                        change_tag = CASE WHEN pending = 1 THEN change_tag END
                    WHERE id = ? AND state = 'undecryptable'
                    """, [record.recordID.sqliteValue])
            }
            try markUndecryptable(failed)
        }
        return opened
    }
}

private extension String {
    func leftPadded(to width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}
