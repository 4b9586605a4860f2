import Foundation

/// What a cloud holds of an asset being uploaded (``CloudDatabase/prepareAssetUpload(_:in:)``): the chunks it has,
/// so that an interrupted upload resumes with the missing ones.
public struct CloudAssetUploadState: Hashable, Sendable, Codable {
    /// The asset.
    public var asset: CloudAssetReference
    /// The indices of the chunks the cloud holds, ascending (every index once the asset is complete).
    public var receivedChunks: [Int]
    /// `true` once the cloud holds every chunk and checked that they hash to the asset's name: records may
    /// reference it, and devices may download it.
    public var isComplete: Bool

    /// - Parameters:
    ///   - asset: the asset.
    ///   - receivedChunks: the chunk indices the cloud holds, ascending.
    ///   - isComplete: whether the cloud holds the whole asset, checked.
    public init(asset: CloudAssetReference, receivedChunks: [Int], isComplete: Bool) {
        self.asset = asset
        self.receivedChunks = receivedChunks
        self.isComplete = isComplete
    }

    /// The chunk indices still to upload, ascending (empty once complete). O(chunks).
    public var missingChunks: [Int] {
        guard !isComplete else { return [] }
        let received = Set(receivedChunks)
        return (0..<asset.chunkCount).filter { !received.contains($0) }
    }
}

/// The asset rules every cloud database applies, so the three behave alike. Internal.
enum CloudAssetRules {
    /// The hash of no bytes.
    static let emptyHash = CloudAssetReference.sha256Hex(Data())

    /// Whether `asset` is the empty asset, which every zone holds without an upload.
    static func isEmpty(_ asset: CloudAssetReference) -> Bool { asset.size == 0 && asset.hash == emptyHash }

    /// Refuses an asset larger than `limit` bytes.
    static func check(_ asset: CloudAssetReference, limit: Int64) throws(CloudError) {
        if asset.size > limit { throw .assetTooLarge(size: asset.size, limit: limit) }
    }

    /// Refuses a chunk whose index is outside the asset or whose length is not the chunk's.
    static func check(_ asset: CloudAssetReference, index: Int, length: Int) throws(CloudError) {
        guard index >= 0, index < asset.chunkCount else {
            throw .invalidAsset(reason: "chunk \(index) is outside \(asset) (\(asset.chunkCount) chunks)")
        }
        let range = asset.chunkRange(index)
        guard Int64(length) == range.upperBound - range.lowerBound else {
            throw .invalidAsset(reason: "chunk \(index) of \(asset) holds \(length) bytes, not \(range.upperBound - range.lowerBound)")
        }
    }

    /// Refuses a download of chunk `index` outside the asset.
    static func checkIndex(_ asset: CloudAssetReference, _ index: Int) throws(CloudError) {
        guard index >= 0, index < asset.chunkCount else {
            throw .invalidAsset(reason: "chunk \(index) is outside \(asset) (\(asset.chunkCount) chunks)")
        }
    }
}
