import Foundation
import Synchronization

/// What a sync runtime (``CloudSync``) is doing, as its events report it (``CloudSyncEvent/stateChanged(_:)``).
public enum CloudSyncState: Sendable, Hashable {
    /// Nothing to do until a local save, a cloud announcement or the timer.
    case idle
    /// Requests are being performed.
    case syncing
    /// The last request failed for want of a network: the runtime retries after the engine's backoff (doubling up to
    /// ``SyncEngine/Options/maxBackoffMilliseconds``) and resumes as soon as a request succeeds.
    case waitingForNetwork
    /// The cloud asked to wait (rate limit, quota, busy zone, service unavailable) or another process holds the
    /// upload lease: the runtime retries when the wait ends.
    case waitingToRetry
    /// Automatic syncing is paused (``CloudSync/pause()``).
    case paused
    /// The engine refuses to sync until something changes: an incompatible schema (``SyncStatus/blockedBy``), an
    /// encryption key that is missing or wrong (``SyncStatus/encryptionError``), a zone deletion waiting for the
    /// app's answer (``SyncStatus/zoneDeletion``), or a store that cannot be read.
    case blocked
    /// ``CloudSync/stop()`` was called.
    case stopped
}

extension CloudSyncState: CustomStringConvertible {
    /// The state's name as the Swift case is spelled (`waitingForNetwork`), for logs.
    public var description: String {
        switch self {
        case .idle: "idle"
        case .syncing: "syncing"
        case .waitingForNetwork: "waitingForNetwork"
        case .waitingToRetry: "waitingToRetry"
        case .paused: "paused"
        case .blocked: "blocked"
        case .stopped: "stopped"
        }
    }
}

/// The records one import from the cloud changed in the store (the cloud's changes merged, and what they caused
/// locally: delete rules, resolved duplicates). Identifiers only, never values.
public struct CloudSyncChanges: Sendable, Hashable {
    public var inserted: [PersistentIdentifier]
    public var updated: [PersistentIdentifier]
    public var deleted: [PersistentIdentifier]

    public init(inserted: [PersistentIdentifier] = [], updated: [PersistentIdentifier] = [], deleted: [PersistentIdentifier] = []) {
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
    }

    /// `true` when the import changed nothing.
    public var isEmpty: Bool { inserted.isEmpty && updated.isEmpty && deleted.isEmpty }
}

/// One record the cloud refused for good (it stays queued in the ledger as rejected, with the reason).
public struct CloudSyncRecordFailure: Sendable, Hashable {
    /// The record (entity name from the record type sent).
    public var id: PersistentIdentifier
    /// Why the cloud refused it.
    public var error: CloudError

    public init(id: PersistentIdentifier, error: CloudError) {
        self.id = id
        self.error = error
    }
}

/// What a sync runtime (``CloudSync``) did, in the spirit of CloudKit's `CKSyncEngine.Event`: for UIs and logs.
///
/// Events carry identifiers, entity and zone names, states and errors — never field values, keys or passwords
/// (Principle 7 of DESIGN.md).
public enum CloudSyncEvent: Sendable, Hashable {
    /// The runtime's state changed.
    case stateChanged(CloudSyncState)
    /// Changes fetched from the cloud (or merged from a conflicting save) were applied to the store.
    case fetchedChanges(CloudSyncChanges)
    /// The cloud saved these records (their local changes are uploaded; deletions included).
    case sentChanges([PersistentIdentifier])
    /// The cloud refused these records for good; they stay queued as rejected (``LedgerState/rejected(reason:)``).
    case failedRecords([CloudSyncRecordFailure])
    /// A whole request failed; `operation` names it (``CloudOperation/name``). Transient errors are retried after the
    /// engine's backoff.
    case requestFailed(operation: String, error: CloudError)
    /// The zone was not found (deleted or reset in the cloud). `reason` is the cloud's reason
    /// (``CloudError/zoneDeleted(reason:)``), `nil` when it named none (``CloudError/zoneNotFound``). Emitted when the
    /// deletion is noticed, before any local change it leads to: by the ``CloudSync/Options/zoneDeletionPolicy``
    /// (the default: keep, create the zone again and upload everything the store holds, tombstones included; or
    /// erase the store's synced data, reported next as ``fetchedChanges(_:)`` deletions; or wait for
    /// ``CloudSync/resolveZoneDeletion(_:)``, the state then ``CloudSyncState/blocked``).
    case zoneDeleted(zone: String, reason: ZoneDeletionReason?)
    /// The server no longer accepts the store's change token: a full, idempotent refetch of the zone follows.
    case changeTokenExpired(zone: String)
    /// Field encryption cannot go on without a (different) key: the error names the zone, never the key.
    case encryptionKeyNeeded(FieldEncryptionError)
    /// The zone's field keys changed (a key was adopted, rotated or reset).
    case encryptionKeyChanged(zone: String)
    /// Merge decisions in which a local, not yet uploaded value lost, as the conflict log records them (oldest first).
    case conflictsResolved([ConflictLogEntry])
}

extension CloudSyncEvent: CustomStringConvertible {
    /// One line for logs: the event's kind with identifiers, names, states and errors (never values or secrets), e.g.
    /// `sentChanges [Note/0190…]`, `stateChanged waitingForNetwork`.
    public var description: String {
        func ids(_ list: [PersistentIdentifier]) -> String { "[" + list.map(\.description).joined(separator: ", ") + "]" }
        switch self {
        case let .stateChanged(state): return "stateChanged \(state)"
        case let .fetchedChanges(changes):
            return "fetchedChanges inserted \(ids(changes.inserted)) updated \(ids(changes.updated)) deleted \(ids(changes.deleted))"
        case let .sentChanges(list): return "sentChanges \(ids(list))"
        case let .failedRecords(failures):
            return "failedRecords [" + failures.map { "\($0.id): \($0.error)" }.joined(separator: ", ") + "]"
        case let .requestFailed(operation, error): return "requestFailed \(operation): \(error)"
        case let .zoneDeleted(zone, reason): return "zoneDeleted '\(zone)'" + (reason.map { " (\($0))" } ?? "")
        case let .changeTokenExpired(zone): return "changeTokenExpired '\(zone)'"
        case let .encryptionKeyNeeded(error): return "encryptionKeyNeeded: \(error)"
        case let .encryptionKeyChanged(zone): return "encryptionKeyChanged '\(zone)'"
        case let .conflictsResolved(entries): return "conflictsResolved [" + entries.map(\.description).joined(separator: "; ") + "]"
        }
    }
}

/// Hands every event to every subscriber of a runtime's ``CloudSync/events``. Internal.
final class CloudSyncEventBroadcaster: Sendable {
    private struct State {
        var next = 0
        var continuations: [Int: AsyncStream<CloudSyncEvent>.Continuation] = [:]
        var finished = false
    }
    private let state = Mutex(State())
    let bufferLimit: Int

    init(bufferLimit: Int) { self.bufferLimit = bufferLimit }

    func subscribe() -> AsyncStream<CloudSyncEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: CloudSyncEvent.self, bufferingPolicy: .bufferingNewest(bufferLimit))
        let id: Int? = state.withLock { state in
            guard !state.finished else { return nil }
            state.next += 1
            state.continuations[state.next] = continuation
            return state.next
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLock { _ = $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    /// Whether anything listens (events are not built when nothing does).
    var hasSubscribers: Bool { state.withLock { !$0.continuations.isEmpty } }

    func emit(_ event: CloudSyncEvent) {
        let targets = state.withLock { state in state.continuations.keys.sorted().compactMap { state.continuations[$0] } }
        for continuation in targets { continuation.yield(event) }
    }

    func finish() {
        let targets = state.withLock { state -> [AsyncStream<CloudSyncEvent>.Continuation] in
            state.finished = true
            defer { state.continuations = [:] }
            return Array(state.continuations.values)
        }
        for continuation in targets { continuation.finish() }
    }
}
