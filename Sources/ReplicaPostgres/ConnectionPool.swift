import Dispatch
import Foundation
import Replica
import Synchronization

/// A small pool of libpq connections: up to `capacity` requests run at once, each on a connection of its own;
/// further requests wait (suspended, holding no thread) for one to come back.
///
/// libpq calls block, so they never run on Swift's cooperative thread pool: each slot has a serial dispatch queue
/// of its own, and a request's libpq calls run there. Connections open lazily and are reused most-recently-used
/// first, so light use keeps one connection open. A connection found broken — before a request (it was dropped
/// while idle) or after one (it broke mid-request) — is closed; the next request on that slot connects again.
final class ConnectionPool: Sendable {
    private struct State {
        /// Slots not in use, most recently used last.
        var free: [Int]
        var waiters: [CheckedContinuation<Int, Never>] = []
        /// Each slot's open connection, if any. Touched only by the request holding the slot.
        var connections: [PGConnection?]
    }

    private let state: Mutex<State>
    private let queues: [DispatchQueue]
    let options: PGConnectionOptions
    let capacity: Int

    init(options: PGConnectionOptions, capacity: Int) {
        precondition(capacity >= 1, "a connection pool needs at least one connection")
        self.options = options
        self.capacity = capacity
        state = Mutex(State(free: Array((0..<capacity).reversed()), connections: Array(repeating: nil, count: capacity)))
        queues = (0..<capacity).map { DispatchQueue(label: "replica.postgres.connection.\($0)") }
    }

    /// Runs `body` on a pooled connection (connecting first when the slot has none or its connection broke) and
    /// returns its result; a failure comes back as the ``CloudError`` it amounts to.
    func run<T: Sendable>(_ body: @escaping @Sendable (PGConnection) throws(PGFailure) -> T) async throws(CloudError) -> T {
        let slot = await acquire()
        let result: Result<T, PGFailure> = await withCheckedContinuation { continuation in
            queues[slot].async {
                var connection = self.state.withLock { state in
                    defer { state.connections[slot] = nil }
                    return state.connections[slot]
                }
                let outcome: Result<T, PGFailure>
                do throws(PGFailure) {
                    if connection?.isUsable != true { connection = try PGConnection.open(self.options) }
                    outcome = .success(try body(connection!))
                } catch {
                    outcome = .failure(error)
                }
                let keep = connection?.isHealthyAfterRequest == true ? connection : nil
                self.state.withLock { $0.connections[slot] = keep }
                continuation.resume(returning: outcome)
            }
        }
        release(slot)
        switch result {
        case let .success(value): return value
        case let .failure(failure): throw PostgresErrorMapping.cloudError(for: failure)
        }
    }

    /// Closes every idle connection (the next request connects again).
    func closeIdleConnections() {
        state.withLock { state in
            for slot in state.free { state.connections[slot] = nil }
        }
    }

    private func acquire() async -> Int {
        await withCheckedContinuation { continuation in
            let slot: Int? = state.withLock { state in
                if let slot = state.free.popLast() { return slot }
                state.waiters.append(continuation)
                return nil
            }
            if let slot { continuation.resume(returning: slot) }
        }
    }

    private func release(_ slot: Int) {
        let waiter: CheckedContinuation<Int, Never>? = state.withLock { state in
            if !state.waiters.isEmpty { return state.waiters.removeFirst() }
            state.free.append(slot)
            return nil
        }
        waiter?.resume(returning: slot)
    }
}
