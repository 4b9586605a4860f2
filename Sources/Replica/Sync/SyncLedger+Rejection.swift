import Foundation

extension SyncLedger {
    /// Why `stamp` of `remote` cannot be merged, if it cannot.
    @inline(__always)
    private static func stampProblem(_ stamp: FieldStamp, of remote: CloudRecord, _ site: @autoclosure () -> RecordRejection.StampSite) -> RecordRejection? {
        if stamp.incarnation < 0 || stamp.incarnation > remote.causalLength { return .incarnationBeyondCausalLength(site()) }
        if !stamp.clock.isEncodable { return .clockBeyondEncoding(site()) }
        if stamp.clock.physical > ReplicationBounds.maxRemotePhysical { return .clockAtEdge(site()) }
        return nil
    }

    /// Whether `remote`, a record of the entity of `statements`, passes every check of ``rejectionReason(_:store:db:)``
    /// that needs no database (then only its ownership check remains). Decides the common case without sorting field
    /// names or formatting reasons; when it returns `false`, ``rejectionReason(_:store:db:)`` finds the reason.
    /// Whether `value` is an asset reference in a field of an external-storage data attribute (R19): such a field
    /// holds the reference (TEXT) rather than the bytes.
    static func isAssetReference(_ value: SQLiteValue, of attribute: Schema.Attribute) -> Bool {
        guard attribute.isExternalData, case let .text(text) = value else { return false }
        return CloudAssetReference(fieldValue: text) != nil
    }

    static func fits(_ remote: CloudRecord, _ remoteFields: [CloudField?], _ statements: EntityStatements) -> Bool {
        guard (1...maxCausalLength).contains(remote.causalLength), remote.recordID != .unassigned else { return false }
        func fits(_ stamp: FieldStamp) -> Bool {
            stamp.incarnation >= 0 && stamp.incarnation <= remote.causalLength && stamp.clock.isEncodable
                && stamp.clock.physical <= ReplicationBounds.maxRemotePhysical
        }
        guard fits(remote.created) else { return false }
        for field in remote.fields.values where !fits(field.stamp) { return false }
        var known = 0
        for (index, field) in remoteFields.enumerated() {
            guard let field else { continue }
            known += 1
            if let attribute = statements.attributes[index] {
                if case let .real(v) = field.value, v.isNaN { return false }
                if !SchemaValidator.value(field.value, fits: attribute) && !isAssetReference(field.value, of: attribute) { return false }
            } else if !field.value.isNull {
                guard case let .blob(bytes) = field.value, bytes.count == 16 else { return false }
            }
        }
        // Fields this schema does not store: a many-to-many link field must hold a link set (R17).
        if remote.fields.count > known {
            for (name, field) in remote.fields where LinkReplication.isLinkField(name) && LinkSet(value: field.value) == nil { return false }
        }
        return true
    }

    /// Why `remote` cannot be applied here, or `nil` when it can: a causal length out of range, the nil record ID, a stamp whose clock
    /// does not fit its fixed-width text form (48-bit milliseconds, 16-bit counter) or lies at the edge of that
    /// range, or whose incarnation is beyond the record's, an ID that belongs to a local record of another entity,
    /// or a known field whose value does not have the attribute's type (or is NaN, or is a reference that is not a
    /// record ID). Reasons name fields, never values.
    static func rejectionReason(_ remote: CloudRecord, store: Store, db: Connection) throws -> RecordRejection? {
        guard (1...maxCausalLength).contains(remote.causalLength) else { return .causalLengthOutOfRange(remote.causalLength) }
        guard remote.recordID != .unassigned else { return .nilRecordID }
        if let problem = stampProblem(remote.created, of: remote, .creation) { return problem }
        let names = remote.fields.keys.sorted()
        for name in names {
            if let problem = stampProblem(remote.fields[name]!.stamp, of: remote, .field(name)) { return problem }
        }
        for name in names where LinkReplication.isLinkField(name) && LinkSet(value: remote.fields[name]!.value) == nil {
            return .malformedLinkSet(field: name)
        }
        guard let entity = store.entity(named: remote.recordType) else { return nil }
        if case let .text(owner)? = try db.scalar(SyncLedger.entityOfRecordSQL, [remote.recordID.sqliteValue]),
           owner != entity.name {
            return .idOfAnotherEntity(owner)
        }
        for name in names {
            let value = remote.fields[name]!.value
            if let attribute = entity.attribute(named: name) {
                if case let .real(v) = value, v.isNaN { return .notANumber(field: name) }
                if !SchemaValidator.value(value, fits: attribute) && !isAssetReference(value, of: attribute) {
                    return .wrongType(field: name, value: value.description, type: attribute.type.rawValue, optional: attribute.isOptional)
                }
            } else if let relationship = entity.relationship(named: name), !relationship.isToMany, !value.isNull {
                guard case let .blob(bytes) = value, bytes.count == 16 else { return .notARecordID(reference: name, value: value.description) }
            }
        }
        return nil
    }

    /// Keeps a record that cannot be applied, with the reason (reported by the ledger and counted by the status as
    /// rejected). A local record with changes to upload takes its change tag: its upload then replaces the version
    /// no device can read instead of conflicting with it forever. The next version of the record that can be applied
    /// clears the entry, and so does a full read of the zone that no longer returns it (e.g. after a zone reset).
    /// A version whose stamps do not fit the text form cannot be written as JSON: it is kept as its ID, type and
    /// reason.
    static func reject(_ remote: CloudRecord, reason: RecordRejection, _ db: Connection) throws {
        let json = (try? ReplicaJSON.string(remote)) ?? ""
        try db.run("""
            INSERT INTO replica_sync_rejected (id, record_type, record, reason) VALUES (?, ?, ?, ?)
            ON CONFLICT (id, record_type) DO UPDATE SET record = excluded.record, reason = excluded.reason
            """, [remote.recordID.sqliteValue, .text(remote.recordType), .text(json), .text(reason.description)])
        if let tag = remote.changeTag { try adoptChangeTag(tag, of: remote.recordID, db) }
    }

    /// A local record with changes to upload takes `tag`, the change tag of a version of it kept aside, so that its
    /// upload replaces that version instead of conflicting with it forever. Written directly (nothing of the row is
    /// decoded): the row may be one whose bookkeeping cannot be read.
    static func adoptChangeTag(_ tag: String, of id: UUID, _ db: Connection) throws {
        try db.run("UPDATE replica_sync_record SET change_tag = ?1 WHERE id = ?2 AND pending = 1 AND change_tag IS NOT ?1",
                   [.text(tag), id.sqliteValue])
    }
}

extension SyncLedger {
    /// Keeps the records a fetched page reports as unreadable by the cloud (``ZoneChangeBatch/unreadable``) aside as
    /// rejected, with the cloud's reason, as for a version that cannot be applied (P4): the record is this device's
    /// problem report, the rest of the page merges as usual. A local record with changes to upload takes the stored
    /// version's change tag, so its upload replaces the version no device can read. The type, when the cloud could
    /// not read it either, is the local record's (else empty); an entry without a record ID is kept under an empty ID.
    static func keepUnreadable(_ entries: [UnreadableCloudRecord], _ db: Connection) throws {
        for entry in entries {
            var type = entry.recordType
            if type == nil, let id = entry.recordID, case let .text(local)? = try db.scalar(SyncLedger.entityOfRecordSQL, [id.sqliteValue]) {
                type = local
            }
            try db.run("""
                INSERT INTO replica_sync_rejected (id, record_type, record, reason) VALUES (?, ?, '', ?)
                ON CONFLICT (id, record_type) DO UPDATE SET record = excluded.record, reason = excluded.reason
                """, [entry.recordID?.sqliteValue ?? .blob(Data()), .text(type ?? ""), .text(RecordRejection.unreadable(entry.reason).description)])
            if let id = entry.recordID, let tag = entry.changeTag { try adoptChangeTag(tag, of: id, db) }
        }
    }
}
