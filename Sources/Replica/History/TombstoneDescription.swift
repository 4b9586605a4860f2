import Foundation

// Tombstone values as a person reads them: each preserved value in the form of its attribute's type, encrypted
// attributes never. The types come from the store's entities when history is read.

extension HistoryTombstone: CustomStringConvertible {
    /// The preserved values by attribute name, in the order of the names' UTF-8 bytes — e.g.
    /// `HistoryTombstone(done: false, due: 2026-12-01T10:00:00Z, photo: <12 bytes>, secret: <encrypted>, title: "Buy milk")`.
    /// Encrypted attributes show `<encrypted>`; values whose type is unknown show their storage class and size only.
    public var description: String {
        let names = values.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        return "HistoryTombstone(" + names.map { "\($0): \(readableValue(of: $0))" }.joined(separator: ", ") + ")"
    }

    /// The value of `attribute` as a person reads it (see ``description``).
    func readableValue(of attribute: String) -> String {
        guard let value = values[attribute] else { return "nil" }
        if encryptedAttributes.contains(attribute) { return "<encrypted>" }
        guard let type = attributeTypes[attribute] else { return value.description }
        switch (type, value) {
        case (_, .null): return "nil"
        case (.string, let .text(text)), (.url, let .text(text)), (.composite, let .text(text)):
            return String(reflecting: text)
        case (.integer, let .integer(number)): return String(number)
        case (.bool, let .integer(number)): return number != 0 ? "true" : "false"
        case (.double, let .real(number)): return String(number)
        case (.double, let .integer(number)): return String(number)
        case (.date, let .real(seconds)) where seconds.isFinite && abs(seconds) < 1e15:
            return Self.iso8601(seconds: seconds)
        case (.date, let .integer(seconds)) where abs(seconds) < 1_000_000_000_000_000:
            return Self.iso8601(seconds: Double(seconds))
        case (.uuid, let .blob(bytes)) where bytes.count == 16:
            return UUID(uuid: bytes.withUnsafeBytes { $0.loadUnaligned(as: uuid_t.self) }).uuidString
        case (.data, let .blob(bytes)): return "<\(bytes.count) bytes>"
        default: return value.description
        }
    }

    /// `seconds` since 1970 as ISO-8601 UTC, with milliseconds only when there are any: `2026-12-01T10:00:00Z`.
    static func iso8601(seconds: Double) -> String {
        let text = HLC.iso8601(milliseconds: Int64((seconds * 1000).rounded(.down)))
        return text.hasSuffix(".000Z") ? String(text.dropLast(5)) + "Z" : text
    }

    /// This tombstone, with the types and encryption options `entity` declares for its attributes.
    func describing(_ entity: Schema.Entity) -> HistoryTombstone {
        var copy = self
        for attribute in entity.attributes where values[attribute.name] != nil {
            copy.attributeTypes[attribute.name] = attribute.type
            if attribute.options.contains(.allowsCloudEncryption) { copy.encryptedAttributes.insert(attribute.name) }
        }
        return copy
    }
}

extension HistoryChange {
    /// This change, its tombstone described with the attribute types of `entities` (the store's).
    /// With `assets` (the reader of a store that keeps external-storage values in files: a reference's bytes, e.g.
    /// `AssetStore.read`), preserved values that reference a file read as its bytes; a file that cannot be read
    /// leaves the reference (TEXT `replica-asset:sha256:…`).
    func describingTombstone(with entities: [Schema.Entity], assets: ((String) throws -> Data)? = nil) -> HistoryChange {
        guard case .delete(let id, var tombstone) = self, !tombstone.values.isEmpty,
              let entity = entities.first(where: { $0.name == id.entityName }) else { return self }
        if let assets {
            var values = tombstone.values
            for attribute in entity.attributes where attribute.options.contains(.externalStorage) {
                if case let .text(reference)? = values[attribute.name], let data = try? assets(reference) {
                    values[attribute.name] = .blob(data)
                }
            }
            if values != tombstone.values { tombstone = HistoryTombstone(values: values) }
        }
        return .delete(id, tombstone: tombstone.describing(entity))
    }
}

extension [HistoryChange] {
    /// Whether a delete among the changes preserved values.
    var hasTombstoneValues: Bool {
        contains { change in
            if case let .delete(_, tombstone) = change { return !tombstone.values.isEmpty }
            return false
        }
    }

    /// The changes, tombstones described with the attribute types of `entities`; unchanged (no copy) without
    /// preserved values. Complexity: O(changes).
    func describingTombstones(with entities: [Schema.Entity], assets: ((String) throws -> Data)? = nil) -> [HistoryChange] {
        hasTombstoneValues ? map { $0.describingTombstone(with: entities, assets: assets) } : self
    }
}

extension HistoryTransaction {
    /// This transaction, its tombstones described with the attribute types of `entities` (the store's).
    func describingTombstones(with entities: [Schema.Entity], assets: ((String) throws -> Data)? = nil) -> HistoryTransaction {
        guard changes.hasTombstoneValues else { return self }
        return HistoryTransaction(token: token, storeName: storeName, author: author, timestamp: timestamp,
                                  bundleIdentifier: bundleIdentifier, processName: processName, processID: processID,
                                  changes: changes.describingTombstones(with: entities, assets: assets))
    }
}
