import Foundation

extension SyncEngine {
    /// Tuning knobs.
    public struct Options: Sendable, Hashable {
        /// Records per modify request (values below 1 count as 1).
        public var uploadBatchSize = 200
        /// Records per fetch request (values below 1 count as 1).
        public var fetchLimit = 500
        /// First retry delay after a transient error without a server-given delay, in milliseconds (doubles per
        /// consecutive failure, plus up to 25% random jitter from the environment).
        public var baseBackoffMilliseconds: Int64 = 500
        /// Upper bound of the retry delay, in milliseconds (also of a delay the server asks for).
        public var maxBackoffMilliseconds: Int64 = 300_000
        /// How long the upload lease of an app-group store lasts without renewal, in milliseconds. A process that
        /// dies holding it is replaced once it expires.
        public var leaseDurationMilliseconds: Int64 = 30_000
        /// How far ahead of this device's wall clock a remote stamp may be, in milliseconds, and still be merged
        /// (R2; default ``ReplicationBounds/defaultMaxClockDriftMilliseconds``, 24 hours). A record with a stamp
        /// further ahead is not merged (it would drag this device's clock, and so every later stamp it makes, along):
        /// it is kept, reported as ``LedgerState/aheadOfClock(reason:retryAt:)`` and counted in
        /// ``SyncStatus/heldRecords``, and merged at the first fetch once the clock has caught up. Negative values
        /// count as 0; `Int64.max` turns the bound off.
        public var maxClockDriftMilliseconds: Int64 = ReplicationBounds.defaultMaxClockDriftMilliseconds
        /// What the store does when the cloud reports its zone deleted (``CloudError/zoneDeleted(reason:)``), decided
        /// before anything changes locally: keep the data and upload it again (the default), erase it, or ask the app
        /// (``ZoneDeletionPolicy``).
        public var zoneDeletionPolicy: ZoneDeletionPolicy = .keepAndReupload
        public init() {}
    }
}
