import CLibpq
import Dispatch
import Foundation
import Replica
import Synchronization

extension PostgresCloudDatabase {
    /// The names of this owner's zones as the server announces changes to them: a hint to fetch, sent by every
    /// transaction that saves records, changes metadata, or creates or deletes a zone — on commit only
    /// (`pg_notify` inside the write transaction). It carries the zone name and nothing else (never record data).
    ///
    /// Each sequence listens on a connection of its own (not one of the pool's: a listening session must stay
    /// with the server, so it connects directly even where requests go through a transaction-mode pooler). A
    /// dispatch source on the connection's socket wakes it when the server writes (`PQconsumeInput`,
    /// `PQnotifies`): no polling. When the connection breaks it reconnects, waiting 0.1 s doubling to 30 s between
    /// attempts (through the environment's `sleep`), and then announces every zone of the owner once: a
    /// notification missed while disconnected costs latency, never data, because the announcement only asks the
    /// device to fetch, and the fetch reads from its token.
    ///
    /// Notifications reach only the owner's own listeners: each owner has a random channel name, kept in a table
    /// under row-level security, so another user can neither find nor listen on it.
    ///
    /// The sequence ends when iteration is cancelled or the sequence is dropped (the connection closes).
    /// Buffers the newest 1,024 announcements when the consumer is slow (older ones are dropped: a later one for
    /// the same zone asks for the same fetch).
    ///
    /// Source: <https://www.postgresql.org/docs/current/libpq-notify.html>, <https://www.postgresql.org/docs/current/sql-notify.html>
    public func zoneChanges() -> AsyncStream<String> { zoneChanges(onListening: nil) }

    /// ``zoneChanges()``: the sync runtime (`CloudSync` in `Replica`) fetches when its zone is announced.
    public func changeNotifications() -> AsyncStream<String>? { zoneChanges() }

    /// ``zoneChanges()``, calling `onListening` each time its connection starts listening: first, and after each
    /// reconnection. A caller that must not miss a commit waits for the first call before relying on the sequence
    /// (commits before it are not announced; a fetch reads them).
    /// - Parameter onListening: called on the listener's queue, never concurrently with itself.
    public func zoneChanges(onListening: (@Sendable () -> Void)?) -> AsyncStream<String> {
        let (stream, continuation) = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingNewest(1024))
        let listener = ZoneChangeListener(options: options, owner: owner, environment: environment, continuation: continuation,
                                          onListening: onListening)
        continuation.onTermination = { _ in listener.stop() }
        listener.start()
        return stream
    }
}

/// The listening connection behind one ``PostgresCloudDatabase/zoneChanges()`` sequence.
final class ZoneChangeListener: Sendable {
    private struct State {
        var stopped = false
        var source: SocketSource?
        var task: Task<Void, Never>?
    }

    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "replica.postgres.listener")
    private let options: PGConnectionOptions
    private let owner: String?
    private let environment: ReplicaEnvironment
    private let continuation: AsyncStream<String>.Continuation
    private let onListening: (@Sendable () -> Void)?

    init(options: PGConnectionOptions, owner: String?, environment: ReplicaEnvironment,
         continuation: AsyncStream<String>.Continuation, onListening: (@Sendable () -> Void)?) {
        self.options = options
        self.owner = owner
        self.environment = environment
        self.continuation = continuation
        self.onListening = onListening
    }

    func start() {
        let task = Task { await self.run() }
        state.withLock { $0.task = task }
    }

    func stop() {
        let (source, task) = state.withLock { state in
            state.stopped = true
            return (state.source, state.task)
        }
        source?.source.cancel()
        task?.cancel()
    }

    private var isStopped: Bool { state.withLock { $0.stopped } }

    private func run() async {
        var delay: Int64 = 100
        var missedAny = false
        while !isStopped {
            if let (connection, channel, zones) = await connect(announcingZones: missedAny) {
                delay = 100
                for zone in zones { continuation.yield(zone) }
                onListening?()
                await watch(connection, channel: channel)
            }
            missedAny = true
            if isStopped { break }
            do {
                try await environment.sleep(delay)
            } catch {
                break
            }
            delay = min(delay * 2, 30_000)
        }
        continuation.finish()
    }

    /// Connects and listens on the owner's channel; with `announcingZones`, also reads the owner's zone names.
    private func connect(announcingZones: Bool) async -> (PGConnection, String, [String])? {
        let options = options, owner = owner
        return await withCheckedContinuation { continuation in
            queue.async {
                do throws(PGFailure) {
                    let connection = try PGConnection.open(options)
                    let listened = try connection.query(PostgresCloudDatabase.SQL.listen, [.text(owner)], prepare: false)
                    guard let channel = listened.string(0, 0) else {
                        continuation.resume(returning: nil)
                        return
                    }
                    var zones: [String] = []
                    if announcingZones {
                        let names = try connection.query(PostgresCloudDatabase.SQL.zoneNames, [.text(owner)], prepare: false)
                        zones = (0..<names.count).compactMap { names.string($0, 0) }
                    }
                    continuation.resume(returning: (connection, channel, zones))
                } catch {
                    continuation.resume(returning: nil)
                }
            }
        }
    }

    /// Yields the zones announced on `channel` until the connection breaks or the listener stops.
    private func watch(_ connection: PGConnection, channel: String) async {
        let yield = continuation
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            queue.async {
                @Sendable func drain() {
                    while let notification = PQnotifies(connection.handle) {
                        let name = String(cString: notification.pointee.relname)
                        let payload = String(cString: notification.pointee.extra)
                        PQfreemem(notification)
                        if name == channel { yield.yield(payload) }
                    }
                }
                // Notifications that arrived with the LISTEN's answer are already in libpq's buffer.
                drain()
                let source = DispatchSource.makeReadSource(fileDescriptor: PQsocket(connection.handle), queue: self.queue)
                source.setEventHandler {
                    let open = connection.consumeWaitingInput()
                    drain()
                    if !open || connection.sessionEnded { source.cancel() }
                }
                source.setCancelHandler {
                    // Keeps the connection open until the source is gone: its socket belongs to libpq.
                    withExtendedLifetime(connection) {}
                    done.resume()
                }
                let stopped = self.state.withLock { state in
                    if !state.stopped { state.source = SocketSource(source) }
                    return state.stopped
                }
                source.resume()
                if stopped { source.cancel() }
            }
        }
        state.withLock { $0.source = nil }
    }
}

/// A dispatch source, shared with ``ZoneChangeListener/stop()``: cancelling a source is thread-safe.
private final class SocketSource: @unchecked Sendable {
    let source: any DispatchSourceRead
    init(_ source: any DispatchSourceRead) { self.source = source }
}
