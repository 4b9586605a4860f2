import Foundation

/// Runs a ``SyncEngine`` against a ``CloudDatabase``: performs each request the engine emits, hands back the
/// response, and waits (through ``ReplicaEnvironment/sleep``) while the engine backs off.
public enum SyncDriver {
    /// Syncs until the engine has nothing left to do: the zone's changes are read and the outbox is empty, or only
    /// records the cloud rejected remain. Transient errors are retried after the engine's backoff.
    ///
    /// - Parameters:
    ///   - engine: the engine (confined to the calling task).
    ///   - database: the cloud database.
    ///   - maxRequests: a safety bound on the number of requests (guards against a cloud that never settles).
    /// - Returns: the engine's status at the end.
    /// - Throws: ``ReplicaError/incompatibleSchema(_:)`` when the zone's schema contradicts this device's (nothing
    ///   is sent; ``SyncEngine/status()`` reports it as `blockedBy`), ``SQLiteError`` from the local store, or
    ///   `CancellationError`.
    @discardableResult
    public static func syncUntilIdle(_ engine: SyncEngine, with database: any CloudDatabase, maxRequests: Int = 10_000) async throws -> SyncStatus {
        engine.setNeedsFetch()
        var performed = 0
        while performed < maxRequests {
            try Task.checkCancellation()
            if let request = try engine.nextRequest() {
                performed += 1
                let result = await database.perform(request.operation)
                try engine.handle(request.id, result)
                continue
            }
            guard let wake = engine.wakeTime else { break }
            try await engine.container.environment.sleep(max(1, wake - engine.container.environment.clock.nowMilliseconds()))
        }
        return try engine.status()
    }
}
