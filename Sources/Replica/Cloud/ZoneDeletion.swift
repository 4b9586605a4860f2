import Foundation
import Synchronization

/// Why a zone that existed is gone, as the cloud reports it (``CloudError/zoneDeleted(reason:)``): CloudKit's reasons
/// for a zone deletion.
///
/// Source: <https://developer.apple.com/documentation/cloudkit/ckdatabase/databasechange/deletion/reason>
public enum ZoneDeletionReason: String, Sendable, Hashable, Codable, CaseIterable, CustomStringConvertible {
    /// The zone was deleted on purpose: by an app (``CloudDatabase/deleteZone(_:)``), or by the user's "delete my
    /// cloud data".
    case deleted
    /// The user purged the account's data for the app (CloudKit: "Delete data from iCloud" in Settings). CloudKit
    /// advises deleting the local copy too.
    case purged
    /// The zone's encrypted data was reset (the user reset their end-to-end encrypted data, or a device reset the
    /// zone's field keys, ``SyncEngine/resetEncryption(keyProvider:)``): the data is gone but the user did not
    /// ask for it to be deleted. CloudKit advises uploading the local copy again.
    case encryptedDataReset

    public var description: String {
        switch self {
        case .deleted: return "deleted"
        case .purged: return "purged"
        case .encryptedDataReset: return "encrypted data reset"
        }
    }
}

/// A zone deletion a synced store learned of, for the policy that decides what the store does about it
/// (``ZoneDeletionPolicy``).
public struct ZoneDeletion: Sendable, Hashable, Codable {
    /// The store's configuration name.
    public var storeName: String
    /// The zone that is gone.
    public var zone: String
    /// Why the cloud says it is gone.
    public var reason: ZoneDeletionReason

    public init(storeName: String, zone: String, reason: ZoneDeletionReason) {
        self.storeName = storeName
        self.zone = zone
        self.reason = reason
    }
}

/// What a synced store does when its zone was deleted (``ZoneDeletionPolicy``).
public enum ZoneDeletionResponse: String, Sendable, Hashable, Codable {
    /// Keep every local record, create the zone again and upload everything (tombstones included): the store's data
    /// goes back to the cloud. The default, and what the engine does for a zone that is merely missing
    /// (``CloudError/zoneNotFound``).
    case keepAndReupload
    /// Erase the store's synced data — every record of the store, and its sync bookkeeping (outbox, tombstones,
    /// held, rejected and unknown records, the change token) — as one transaction recorded in history with the
    /// sync author (``HistoryTransaction/syncAuthor``), so it is not uploaded, while contexts, live queries and other
    /// processes see the deletions. Then the zone is created again, empty, and the store syncs from there: records
    /// other devices upload again arrive as new. The conflict log and the store's clock are kept.
    case eraseLocalData
}

/// Decides what a synced store does when the cloud reports its zone deleted (``CloudError/zoneDeleted(reason:)``),
/// **before** anything changes locally. Set it in ``SyncEngine/Options/zoneDeletionPolicy`` (or
/// ``CloudSync/Options/zoneDeletionPolicy``).
///
/// A zone that is only missing (``CloudError/zoneNotFound``: never created, or gone for a reason the cloud does not
/// know) and a deletion this engine made itself (a key reset) never reach the policy: the store keeps its data and
/// uploads it again.
///
/// Two policies are equal when they are the same built-in one, or the same ``deciding(_:)`` value.
public struct ZoneDeletionPolicy: Sendable, Hashable {
    enum Kind: Sendable, Hashable {
        case keep
        case erase(Set<ZoneDeletionReason>)
        case ask
        case decide(Decider)
    }

    final class Decider: Sendable, Hashable {
        let decide: @Sendable (ZoneDeletion) -> ZoneDeletionResponse
        init(_ decide: @escaping @Sendable (ZoneDeletion) -> ZoneDeletionResponse) { self.decide = decide }
        static func == (a: Decider, b: Decider) -> Bool { a === b }
        func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
    }

    let kind: Kind

    /// Keep the local data and upload it again, whatever the reason (the default; the behaviour before reasons
    /// existed).
    public static let keepAndReupload = ZoneDeletionPolicy(kind: .keep)

    /// Erase the local synced data (``ZoneDeletionResponse/eraseLocalData``) when the zone was deleted for one of
    /// `reasons`; keep and upload again otherwise. By default an encrypted-data reset keeps the data (DESIGN.md: a key
    /// reset never wipes local data); pass every reason to erase for it too.
    /// - Parameter reasons: the reasons that erase (default: deleted and purged).
    public static func eraseLocalData(for reasons: Set<ZoneDeletionReason> = [.deleted, .purged]) -> ZoneDeletionPolicy {
        ZoneDeletionPolicy(kind: .erase(reasons))
    }

    /// Erase the local synced data when the zone was deleted or purged; keep it for an encrypted-data reset.
    public static let eraseLocalData = eraseLocalData()

    /// Decide later: the engine stops syncing the store (``SyncEngine/nextRequest()`` returns `nil`,
    /// ``SyncStatus/zoneDeletion`` names the deletion) and nothing changes locally until the app answers with
    /// ``SyncEngine/resolveZoneDeletion(_:)`` (or ``CloudSync/resolveZoneDeletion(_:)``) — e.g. after asking the user.
    /// The question is kept in the store: an engine opened after a restart (or in another process of an app group)
    /// waits for the same answer.
    public static let ask = ZoneDeletionPolicy(kind: .ask)

    /// Decide with `decide`, called synchronously on the engine's task when the deletion is noticed, before anything
    /// changes locally. It must not call back into the engine.
    /// - Parameter decide: returns the response for a deletion.
    public static func deciding(_ decide: @escaping @Sendable (ZoneDeletion) -> ZoneDeletionResponse) -> ZoneDeletionPolicy {
        ZoneDeletionPolicy(kind: .decide(Decider(decide)))
    }

    /// The response this policy gives to `deletion` — what the engine does (``SyncEngine`` consults the policy through
    /// this function) — or `nil` when the app is to be asked (``ask``). A ``deciding(_:)`` policy calls its closure.
    /// - Parameter deletion: the zone deletion to answer.
    /// - Returns: keep and upload again, erase, or `nil` for ``ask``.
    public func response(to deletion: ZoneDeletion) -> ZoneDeletionResponse? {
        switch kind {
        case .keep: return .keepAndReupload
        case let .erase(reasons): return reasons.contains(deletion.reason) ? .eraseLocalData : .keepAndReupload
        case .ask: return nil
        case let .decide(decider): return decider.decide(deletion)
        }
    }
}
