/// Deliberate bugs that the simulator switches on (`replica-sim --canary NAME`) to prove that its invariants catch
/// real sync defects. Each canary disables one rule of the replication contract.
///
/// Never enable a canary outside tests and simulations: each one loses or corrupts data by design.
public enum Canary: String, CaseIterable, Sendable, Hashable, Codable {
    /// Field stamps use the device's wall clock only (no HLC): an edit made after seeing another can lose to it.
    case lwwByWallClock = "lww-by-wall-clock"
    /// The server change token is committed before the fetched batch is merged, in its own transaction: a crash in
    /// between loses the batch for good.
    case tokenBeforeApply = "token-before-apply"
    /// Merging the same record twice bumps its causal length again: duplicates flip a record between alive and dead.
    case nonIdempotentApply = "non-idempotent-apply"
    /// Fields missing from an incoming record are treated as explicit nulls.
    case absentAsNull = "absent-as-null"
    /// The ledger forgets a tombstone as soon as the cloud acknowledges it: a stale copy resurrects the record.
    case tombstonesDroppedEarly = "tombstones-dropped-early"
    /// A local cascade deletes children but does not emit their tombstones: other devices keep orphans.
    case cascadeForgetsChildTombstones = "child-tombstones-forgotten"
    /// Duplicates of unique keys created on different devices are not resolved: both stay alive.
    case dedupSkipped = "dedup-skipped"
    /// On a save conflict the local record overwrites the server's without merging: other devices' writes are lost.
    case conflictClobbers = "conflict-clobbers"
    /// A save acknowledgement clears the outbox flag even when the record changed locally after the upload was built:
    /// the newer local edit is never uploaded.
    case staleAckClearsPending = "stale-ack-clears-pending"
    /// Sync imports change rows without recording a history transaction: other processes and history readers miss
    /// them.
    case importSkipsHistory = "import-skips-history"
    /// Attributes marked for cloud encryption are uploaded without being sealed: their plaintext reaches the cloud.
    case plaintextUploaded = "plaintext-uploaded"
    /// `update(_:)` writes every field of the copy that differs from the stored row, without comparing it with the
    /// versions the context handed out: of two copies edited in one context the last wins whole, and a stale copy
    /// reverts an edit the context saved (R3a).
    case lastCopyWins = "last-copy-wins"
    /// Remote stamps are merged however far ahead of this device's clock they are: a broken clock elsewhere drags
    /// every later stamp of every device that merges it along (R2).
    case unboundedRemoteClock = "unbounded-remote-clock"
    /// The schema gate compares attribute types but not the options that change what the cloud holds (cloud
    /// encryption, external storage): app versions that disagree on them both sync (R13).
    case gateIgnoresOptions = "gate-ignores-options"
    /// An engine builds uploads of records of entities its schema does not declare (queued by another app version's
    /// process sharing the store file), finds no row it can read and refuses them for good (P6).
    case unknownEntityRefused = "unknown-entity-refused"
    /// Records kept as of an unknown type are never merged once the schema declares the type: a newer process
    /// sharing the file with the older one that fetched them never shows them (R9).
    case unknownTypesNeverAdopted = "unknown-types-never-adopted"
    /// A store that erases its synced data because its zone was deleted (``ZoneDeletionResponse/eraseLocalData``)
    /// deletes the records but leaves their many-to-many link rows behind (R18).
    case eraseLeavesLinkRows = "erase-leaves-link-rows"
    /// An attribute declared with an original name (``Schema/Attribute/originalName``) gets a new column instead of the
    /// renamed old one when a local store opens: after the app update every value of the attribute is gone (the
    /// empty headings of issue 23).
    case renameAddsColumn = "rename-adds-column"
    /// ``ModelUndoManager/undo()`` with an edit pending applies the newest saved group's inverse on top of it and saves
    /// both, instead of saving the edit first as its own group and undoing that: the edit is overwritten or saved
    /// with the undo, and the save before it is undone instead (the behaviour before the fix of issue 23's trial).
    case undoDropsPendingEdit = "undo-drops-pending-edit"
    /// A local write the cloud did not hold that a remote delete or a remote cascade removed is not logged: only
    /// overwritten values reach the conflict log (the false negatives of issue 21's trial; R16).
    case conflictLogMissesDeletes = "conflict-log-misses-deletes"
    /// A record the cloud refuses because its zone lacks an asset the record references (``CloudError/assetNotFound(hash:)``,
    /// after a zone reset the engine saved across) is rejected instead of its asset going up again: no device ever
    /// gets the value (R19).
    case missingAssetRefusalRejects = "missing-asset-refusal-rejects"
    /// A version of a record waiting for an asset keeps waiting when a newer version of the record (a tombstone, or a
    /// value that replaces the asset) merges: after a zone reset the older value's asset is gone for good, and the
    /// device waits for ever (R19).
    case waitingVersionOutlivesNewer = "waiting-version-outlives-newer"
    /// When a fetched version of a record is joined with a version of it waiting for an asset, the waiting value wins
    /// a tie: the same write sealed again under the key set a zone reset made names other sealed bytes, and the
    /// waiting one's went with the old zone — "asset not found" for ever, or an image going back (R19).
    case waitingValueWinsTie = "waiting-value-wins-tie"
    /// A local write the cloud did not hold to a field this app version does not declare but whose column another
    /// version sharing the app-group store file added is not logged when a remote write or delete replaces it: an
    /// older extension merging a newer app's unsynced edit away leaves no entry (issue 21's item 4, found by seed 34 of
    /// `app-group-two-app-versions`; R16).
    case conflictLogMissesStoreColumns = "conflict-log-misses-store-columns"
    /// A migration plan starts where the store's tables are, even at a recorded version whose tables and columns the
    /// store all still has: after a container of a later schema opened the store without the plan (a widget, adding
    /// its columns), the plan skips the stages from the recorded version, and their code never runs (issue 23's R2).
    case layoutOutranksRecordedVersion = "layout-outranks-recorded-version"
    /// A container without the migration plan (a widget's, with an unversioned schema of the updated models) renames
    /// the columns of a store a plan manages through original names: its tables move past the recorded version and the
    /// plan then skips the custom stage's code (issue 23's R2, by a rename).
    case renameOutsidePlan = "rename-outside-plan"
    /// A store without a recorded version whose tables several schemas of the plan share across a custom stage is
    /// refused even when it holds no row: an app whose widget created the store first cannot launch (issue 23's R3 cost).
    case emptyAmbiguousStoreRefused = "empty-ambiguous-store-refused"
    /// An explicit ``CloudSync/syncNow(timeoutMilliseconds:)`` waits out the backoff the engine chose itself after a
    /// transient failure instead of trying at once (P7: the runtime defect of new-user trial F10, before its fix): with
    /// the network back, the call returns at its bound with nothing done, or minutes late.
    case syncNowWaitsForBackoff = "sync-now-waits-for-backoff"
    /// A bounded pass (``CloudSync/syncNow(timeoutMilliseconds:)``, ``SyncDriver/syncUntilIdle(_:with:maxRequests:timeoutMilliseconds:isolation:)``)
    /// waits for the answer to its request in flight however long past its bound it comes, instead of abandoning the
    /// request at the bound (the runtime defect of issue 21's trial, before its fix: a stalled request took 20 s for a
    /// bound of 1 s).
    case syncNowWaitsForRequest = "sync-now-waits-for-request"
    /// A pass ignores the cancellation of the task that awaits it (``CloudSync/syncNow(timeoutMilliseconds:)`` of a view
    /// that went away) and goes on sending until its work or its bound is done (the gap the runtime scenarios had
    /// until issue 21 gave the simulator cancellation).
    case cancelledSyncNowGoesOn = "cancelled-sync-now-goes-on"
    /// A custom migration stage's code that changes, in place, an attribute the stage's old schema has in a synced store
    /// is not refused (the migration defect of issue 23's trials, before its fix): every device runs the stage on the
    /// values it holds, values other devices already migrated and synced among them, so the change applies more than
    /// once (100 became 10000).
    case syncedStageInPlace = "synced-stage-in-place"
    /// A version that does not open although it holds nothing the device lacks — in practice a write sealed under a
    /// key set the zone no longer has, uploaded by a device that read the zone's keys before another device reset
    /// and re-created the zone — is held as undecryptable on that device too, instead of being sealed again under
    /// the zone's keys (E5, E6; the bug of `encrypted-zone-reset-left-undecryptable`, hunted by
    /// `encrypted-zone-reset`): no device can read the record, and it never syncs again.
    case staleKeySetWritesHeld = "stale-key-set-writes-held"
    /// The uniqueness check and the upsert of a save compare an external-storage value's bytes with the rows, which
    /// hold the reference to its file: an insert of a unique external value another record holds is neither an
    /// upsert nor refused, and two records hold it (the bug fixed in 60bf88d, found by a person, not a seed).
    case uniqueExternalComparedAsBytes = "unique-external-compared-as-bytes"
}
