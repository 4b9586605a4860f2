import Foundation

/// The text form of a reference to an externally stored value: what the row's column of an
/// ``Schema/Attribute/Options/externalStorage`` attribute holds, `replica-asset:sha256:<hex>:<size>` (TEXT; a data
/// column otherwise only holds BLOBs or NULL). A value format, read by attribute values (a `Data` attribute that finds
/// a reference says why) and by Store's asset files (`AssetStore`, Specs/external-storage.md). Internal.
enum AssetReference {
    static let prefix = "replica-asset:sha256:"

    /// The hash and size a reference names, or `nil` when it is not a reference.
    static func parse(_ reference: String) -> (hash: String, size: Int)? {
        guard reference.hasPrefix(prefix) else { return nil }
        let rest = reference.utf8.dropFirst(prefix.utf8.count)
        guard rest.count > 65, let colon = rest.firstIndex(of: UInt8(ascii: ":")),
              rest.distance(from: rest.startIndex, to: colon) == 64 else { return nil }
        let hash = String(decoding: rest[rest.startIndex..<colon], as: UTF8.self)
        guard isHexDigest(hash), let size = Int(String(decoding: rest[rest.index(after: colon)...], as: UTF8.self)), size >= 0 else { return nil }
        return (hash, size)
    }

    /// Whether `name` is 64 lowercase hexadecimal digits (a SHA-256 as hex).
    static func isHexDigest(_ name: String) -> Bool {
        name.utf8.count == 64 && name.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }
}
