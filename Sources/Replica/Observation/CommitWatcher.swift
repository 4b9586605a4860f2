import Dispatch
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Wakes a container's ``ChangeHub`` when another process may have committed to a watched store file, so that the
/// hub reads the new history transactions. Internal.
///
/// With ``OtherProcessCommits/fileEvents(fallbackPollingMilliseconds:)`` on Linux: one inotify instance
/// (<https://man7.org/linux/man-pages/man7/inotify.7.html>) watching each store's directory for writes to, and the
/// creation of, the store's `-wal` file — every commit in WAL mode appends to it; watching the directory rather than
/// the file also survives the file being deleted and created again when the last connection closes. A read source
/// on a private queue reads the events and catches the hub up at once. SQLite updates the WAL index (in the `-shm`
/// file, written through a memory map, which raises no event) just after the last WAL write of a commit, so a
/// reader woken by that write may not see the commit yet: after every burst of events the hub checks again 2, 10
/// and 40 ms later. Nothing runs while nothing is written. Without inotify, or with
/// ``OtherProcessCommits/polling(milliseconds:)``, a task polls instead; each check is one `PRAGMA data_version`.
/// Waiting goes through the environment's sleep.
final class CommitWatcher: Sendable {
    private weak let hub: ChangeHub?
    private let mode: OtherProcessCommits
    private let sleep: @Sendable (Int64) async throws -> Void
    private let state = Mutex(State())

    private struct State {
        var watched: [Int: URL] = [:]
        var events: FileEvents?
        /// Polling, or the re-checks after file events.
        var task: Task<Void, Never>?
        var recheck: AsyncStream<Void>.Continuation?
        var stopped = false
    }

    /// Re-checks after a burst of file events, in milliseconds after the previous check.
    static let recheckDelays: [Int64] = [2, 8, 30]

    init(hub: ChangeHub, mode: OtherProcessCommits, sleep: @escaping @Sendable (Int64) async throws -> Void) {
        self.hub = hub
        self.mode = mode
        self.sleep = sleep
    }

    /// Starts watching the store files of `stores` (store index, file URL).
    func watch(_ stores: [(Int, URL)]) {
        state.withLock { state in
            guard !state.stopped else { return }
            for (index, url) in stores { state.watched[index] = url }
            switch mode {
            case .disabled:
                return
            case let .polling(milliseconds):
                startPolling(&state, every: milliseconds)
            case let .fileEvents(fallback):
                if state.task != nil && state.events == nil { return }  // already polling
                if state.events == nil { state.events = FileEvents(onEvent: { [weak self] in self?.fileEvent() }) }
                guard let events = state.events, stores.allSatisfy({ events.watch($0.1) }) else {
                    state.events?.stop()
                    state.events = nil
                    state.task?.cancel()
                    state.task = nil
                    startPolling(&state, every: fallback)
                    return
                }
                if state.task == nil { startRechecks(&state) }
            }
        }
    }

    /// Stops watching the store files of `indices`; with none left, the watcher goes idle (no task, no events).
    func unwatch(_ indices: [Int]) {
        state.withLock { state in
            for index in indices {
                if let url = state.watched.removeValue(forKey: index) { state.events?.unwatch(url) }
            }
            if state.watched.isEmpty { Self.idle(&state) }
        }
    }

    /// Ends every task and closes the inotify instance.
    func stop() {
        state.withLock { state in
            state.stopped = true
            state.watched.removeAll()
            Self.idle(&state)
        }
    }

    private static func idle(_ state: inout State) {
        state.task?.cancel()
        state.task = nil
        state.recheck?.finish()
        state.recheck = nil
        state.events?.stop()
        state.events = nil
    }

    private func startPolling(_ state: inout State, every milliseconds: Int64) {
        guard state.task == nil else { return }
        let interval = max(1, milliseconds)
        let sleep = self.sleep
        state.task = Task { [weak hub] in
            while !Task.isCancelled {
                guard let hub else { return }
                hub.catchUpWatchedStores()
                do { try await sleep(interval) } catch { return }
            }
        }
    }

    private func startRechecks(_ state: inout State) {
        let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        state.recheck = continuation
        let sleep = self.sleep
        state.task = Task { [weak hub] in
            for await _ in stream {
                for delay in Self.recheckDelays {
                    do { try await sleep(delay) } catch { return }
                    guard let hub, !Task.isCancelled else { return }
                    hub.catchUpWatchedStores()
                }
            }
        }
    }

    /// A watched file changed: catch up now, and again a little later (see the type's documentation).
    private func fileEvent() {
        hub?.catchUpWatchedStores()
        _ = state.withLock { $0.recheck }?.yield()
    }
}

/// One inotify instance and its read source. Internal.
///
/// `@unchecked Sendable`: the descriptor is immutable, the watch tables are behind their lock, and a dispatch source
/// may be cancelled from any thread.
private final class FileEvents: @unchecked Sendable {
    #if os(Linux)
    private let descriptor: Int32
    private let source: DispatchSourceRead
    /// Watch descriptor per directory, and the file names of interest in it.
    private let watches = Mutex<[String: (descriptor: Int32, names: Set<String>)]>([:])
    /// The file names of interest per watch descriptor (what the event handler matches).
    private let namesByDescriptor = Mutex<[Int32: Set<String>]>([:])
    #endif

    /// `nil` when file events are unavailable here.
    init?(onEvent: @escaping @Sendable () -> Void) {
        #if os(Linux)
        let descriptor = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard descriptor >= 0 else { return nil }
        self.descriptor = descriptor
        let queue = DispatchQueue(label: "replica.commit-watcher")
        source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
        source.setEventHandler { [weak self] in
            if self?.drain() == true { onEvent() }
        }
        source.setCancelHandler { [descriptor] in _ = close(descriptor) }
        source.resume()
        #else
        return nil
        #endif
    }

    /// Watches the directory of store file `url` for its `-wal` file. Returns `false` when inotify refuses.
    func watch(_ url: URL) -> Bool {
        #if os(Linux)
        let directory = url.deletingLastPathComponent().path
        let names: Set<String> = [url.lastPathComponent + "-wal", url.lastPathComponent]
        return watches.withLock { watches in
            var entry = watches[directory]
            if entry == nil {
                let mask = UInt32(IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE)
                let wd = inotify_add_watch(descriptor, directory, mask)
                guard wd >= 0 else { return false }
                entry = (wd, [])
            }
            entry!.names.formUnion(names)
            watches[directory] = entry
            let (wd, all) = entry!
            namesByDescriptor.withLock { $0[wd] = all }
            return true
        }
        #else
        return false
        #endif
    }

    /// Stops watching for store file `url` (the directory's watch goes with its last store).
    func unwatch(_ url: URL) {
        #if os(Linux)
        let directory = url.deletingLastPathComponent().path
        watches.withLock { watches in
            guard var entry = watches[directory] else { return }
            entry.names.subtract([url.lastPathComponent + "-wal", url.lastPathComponent])
            if entry.names.isEmpty {
                _ = inotify_rm_watch(descriptor, entry.descriptor)
                watches[directory] = nil
                namesByDescriptor.withLock { $0[entry.descriptor] = nil }
            } else {
                watches[directory] = entry
                namesByDescriptor.withLock { $0[entry.descriptor] = entry.names }
            }
        }
        #endif
    }

    func stop() {
        #if os(Linux)
        source.cancel()
        #endif
    }

    #if os(Linux)
    /// Reads every pending event; returns whether one concerns a watched file.
    private func drain() -> Bool {
        var relevant = false
        let capacity = 4096
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 8)
        defer { buffer.deallocate() }
        let names = namesByDescriptor.withLock { $0 }
        while true {
            let count = read(descriptor, buffer, capacity)
            guard count > 0 else { break }
            var offset = 0
            let header = MemoryLayout<inotify_event>.size
            while offset + header <= count {
                let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                let length = Int(event.len)
                if length > 0, let wanted = names[event.wd] {
                    let start = buffer.advanced(by: offset + header).assumingMemoryBound(to: CChar.self)
                    let name = String(cString: start)
                    if wanted.contains(name) { relevant = true }
                } else if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                    relevant = true
                }
                offset += header + length
            }
        }
        return relevant
    }
    #endif
}
