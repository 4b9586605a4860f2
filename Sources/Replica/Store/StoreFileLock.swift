import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The advisory lock beside a store file (`<store file>-lock`) by which the processes that open one store —
/// those of an app group, perhaps of several app versions, and several containers of one process — learn whether
/// another one has it open. Internal.
///
/// Every open store holds the lock shared until it goes away. Changing the store in a way an open one cannot follow
/// needs it exclusively, taken without waiting: running a migration stage, which replaces the store file (a process
/// that kept the old file open would go on writing into the replaced file, and its writes would be lost), and renaming
/// tables or columns through original names, which breaks the statements of a process on the older schema.
///
/// Between processes the lock is a POSIX record lock on the whole lock file (`fcntl(F_SETLK)`, `F_RDLCK` or
/// `F_WRLCK`): the kernel drops it when its holder exits or crashes, so a crash never leaves the store locked, and a
/// child process does not inherit it. (An `flock(2)` lock belongs to an open file description, which a child started
/// with `fork`/`posix_spawn` shares until its `exec` closes it: a lock given up meanwhile stayed held, and the next
/// open of the store was refused as "migrating" — a host process that starts helper processes, or the test suite.)
/// A record lock belongs to the process, so within one the holders — containers, and the simulator's processes — are
/// kept in a table per lock file that refuses conflicting modes as the kernel does between processes; the process
/// holds the strongest mode any of its holders has. Closing any descriptor of a file drops the process's record locks
/// on it, so the descriptors of a lock file stay open while one of its holders exists. The lock file is never deleted
/// (a process could be holding a lock on the deleted one); the store file may be replaced beside it.
///
/// Source: fcntl(2), "Advisory record locking" — "record locks are not inherited by a child created via fork(2)";
/// "if a process closes any file descriptor referring to a file, then all of the process's locks on that file are
/// released"; flock(2) — locks are "associated with an open file description".
final class StoreFileLock: Sendable {
    /// How a lock is held.
    enum Mode: Int, Sendable, Comparable {
        case shared, exclusive

        static func < (a: Mode, b: Mode) -> Bool { a.rawValue < b.rawValue }
    }

    /// Why a lock could not be taken.
    enum Failure: Error, Sendable {
        /// Another holder has it in a conflicting mode.
        case held
        /// The lock file cannot be opened or locked (`errno`).
        case unavailable(path: String, errno: Int32)
    }

    /// A lock file as this process holds it: its descriptors (all open while a holder exists) and its holders' modes.
    private struct LockFile {
        var descriptors: [Int32]
        var holders: [Int: Mode?] = [:]
        /// The mode of the record lock this process holds (`nil`: none).
        var applied: Mode?

        /// The strongest mode of the holders other than `holder`.
        func others(than holder: Int) -> Mode? {
            holders.filter { $0.key != holder }.values.compactMap { $0 }.max()
        }
    }

    /// A lock file's identity: its device and inode (one file may be reached through several paths).
    private struct FileKey: Hashable {
        let device: UInt64, inode: UInt64
    }

    private static let files = Mutex<(next: Int, byKey: [FileKey: LockFile])>((0, [:]))

    private let key: FileKey
    private let holder: Int

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
            // A lock file of another user, or in a read-only directory: a read-only descriptor takes a shared lock.
            descriptor = open(path, O_RDONLY | O_CLOEXEC)
            if descriptor < 0 && errno == ENOENT && !create { return nil }
        }
        guard descriptor >= 0 else { throw .unavailable(path: path, errno: errno) }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else {
            let code = errno
            close(descriptor)
            throw .unavailable(path: path, errno: code)
        }
        let key = FileKey(device: UInt64(status.st_dev), inode: UInt64(status.st_ino))
        // A descriptor of a file this process already holds is kept with the others: closing it would drop their locks.
        let holder = files.withLock { files in
            files.next += 1
            files.byKey[key, default: LockFile(descriptors: [])].descriptors.append(descriptor)
            files.byKey[key]?.holders[files.next] = .some(nil)
            return files.next
        }
        let lock = StoreFileLock(key: key, holder: holder)
        try lock.change(to: mode)
        return lock
    }

    private init(key: FileKey, holder: Int) {
        self.key = key
        self.holder = holder
    }

    /// Changes the mode of the lock without waiting. A refused change leaves it in the old mode.
    /// - Throws: ``Failure/held`` when another holder (of this process or another) has it in a conflicting mode.
    func change(to mode: Mode) throws(Failure) {
        try set(mode)
    }

    /// Gives the lock up, keeping the holder (what the kernel does for a process that crashed; the simulator's crashed
    /// processes keep their connections open, but not their locks).
    func unlock() {
        try? set(nil)
    }

    deinit {
        let (key, holder) = (key, holder)
        Self.files.withLock { files in
            guard var file = files.byKey[key] else { return }
            file.holders[holder] = nil
            if file.holders.isEmpty {
                // The last holder: closing the descriptors drops the record lock.
                for descriptor in file.descriptors { close(descriptor) }
                files.byKey[key] = nil
            } else {
                let wanted = file.others(than: holder)
                if wanted != file.applied, Self.apply(wanted, file.descriptors) == nil {
                    file.applied = wanted
                }
                files.byKey[key] = file
            }
        }
    }

    /// Sets this holder's mode, and the process's record lock to the strongest mode of its holders.
    private func set(_ mode: Mode?) throws(Failure) {
        let (key, holder) = (key, holder)
        let failure: Failure? = Self.files.withLock { files in
            guard var file = files.byKey[key] else { return .held }
            let others = file.others(than: holder)
            // Within the process: shared beside shared only, as between processes.
            if let mode, let others, mode == .exclusive || others == .exclusive { return .held }
            let wanted = [mode, others].compactMap { $0 }.max()
            if wanted != file.applied {
                if let code = Self.apply(wanted, file.descriptors) {
                    return code == EACCES || code == EAGAIN ? .held : .unavailable(path: "lock file", errno: code)
                }
                file.applied = wanted
            }
            file.holders[holder] = .some(mode)
            files.byKey[key] = file
            return nil
        }
        if let failure { throw failure }
    }

    /// Sets the process's record lock on the whole lock file without waiting, through the first of its `descriptors`
    /// that can (an exclusive lock needs one opened for writing); the `errno` of a failure.
    private static func apply(_ mode: Mode?, _ descriptors: [Int32]) -> Int32? {
        var failure: Int32 = EBADF
        for descriptor in descriptors {
            guard let code = apply(mode, descriptor) else { return nil }
            failure = code
            if code != EBADF { break }
        }
        return failure
    }

    private static func apply(_ mode: Mode?, _ descriptor: Int32) -> Int32? {
        let type: Int32 = switch mode {
        case nil: F_UNLCK
        case .shared?: F_RDLCK
        case .exclusive?: F_WRLCK
        }
        var region = flock()
        region.l_type = Int16(type)
        region.l_whence = Int16(SEEK_SET)
        region.l_start = 0
        region.l_len = 0   // to the end of the file, however long it grows
        while fcntl(descriptor, F_SETLK, &region) != 0 {
            if errno == EINTR { continue }
            return errno
        }
        return nil
    }
}
