import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The advisory lock beside a store file (`<store file>-lock`) by which the processes that open one store —
/// those of an app group, perhaps of several app versions, and several containers of one process — learn whether
/// another one has it open. Internal.
///
/// Every open store holds the lock shared (`flock(2)`, `LOCK_SH`) until it goes away. Changing the store in a way an
/// open one cannot follow needs it exclusively (`LOCK_EX`), taken without waiting: running a migration stage, which
/// replaces the store file (a process that kept the old file open would go on writing into the replaced file, and
/// its writes would be lost), and renaming tables or columns through original names, which breaks the statements of
/// a process on the older schema. `flock` locks belong to an open file description, so two containers of one process
/// conflict as two processes do; the kernel drops a lock when its holder exits or crashes, so a crash never leaves
/// the store locked. The lock file is never deleted (a process could be holding a lock on the deleted one); the store
/// file may be replaced beside it.
///
/// Source: flock(2) — "a call to flock() may block if an incompatible lock is held by another process"; locks are
/// "associated with an open file description", and "converting a lock (shared to exclusive, or vice versa)" replaces
/// it.
final class StoreFileLock: Sendable {
    /// How a lock is held.
    enum Mode: Sendable {
        case shared, exclusive
    }

    /// Why a lock could not be taken.
    enum Failure: Error, Sendable {
        /// Another holder has it in a conflicting mode.
        case held
        /// The lock file cannot be opened or locked (`errno`).
        case unavailable(path: String, errno: Int32)
    }

    private let descriptor: Int32

    /// The lock file of the store file at `store`.
    /// (No longer than SQLite's `-journal`, so every name a valid configuration name gives fits the file-name limit.)
    static func lockPath(of store: URL) -> String { store.path + "-lock" }

    /// Takes the lock of the store file at `store` in `mode`, without waiting.
    /// - Parameter create: whether to create the lock file when missing (a read-only store's directory may be
    ///   read-only; then `nil` is returned when there is none, as no process can have changed the store).
    /// - Throws: ``Failure/held`` when another holder has it in a conflicting mode; ``Failure/unavailable(path:errno:)``
    ///   when the file cannot be opened or locked.
    static func take(_ mode: Mode, of store: URL, create: Bool = true) throws(Failure) -> StoreFileLock? {
        let path = lockPath(of: store)
        var descriptor = create ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644) : -1
        if descriptor < 0 && (!create || errno == EACCES || errno == EROFS) {
            // A lock file of another user, or in a read-only directory: a read-only descriptor locks as well.
            descriptor = open(path, O_RDONLY | O_CLOEXEC)
            if descriptor < 0 && errno == ENOENT && !create { return nil }
        }
        guard descriptor >= 0 else { throw .unavailable(path: path, errno: errno) }
        let lock = StoreFileLock(descriptor: descriptor)
        try lock.change(to: mode)
        return lock
    }

    private init(descriptor: Int32) { self.descriptor = descriptor }

    /// Changes the mode of the lock without waiting. A refused change leaves it unlocked or in the old mode (flock
    /// converts by replacing): the caller gives it up either way.
    /// - Throws: ``Failure/held`` when another holder has it in a conflicting mode.
    func change(to mode: Mode) throws(Failure) {
        while flock(descriptor, (mode == .shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0 {
            if errno == EINTR { continue }
            if errno == EWOULDBLOCK { throw .held }
            throw .unavailable(path: "lock file", errno: errno)
        }
    }

    /// Gives the lock up while keeping the descriptor (what the kernel does for a process that crashed; the
    /// simulator's crashed processes keep their connections open, but not their locks).
    func unlock() {
        while flock(descriptor, LOCK_UN) != 0 && errno == EINTR {}
    }

    deinit { close(descriptor) }
}
