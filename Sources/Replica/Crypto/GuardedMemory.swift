import CSodium
import Foundation

/// A region of libsodium guarded memory for key material: allocated with `sodium_malloc` (guard pages before and
/// after, a canary, and an `mlock` so it is not swapped — best effort: libsodium ignores an `mlock` that fails, e.g.
/// beyond `RLIMIT_MEMLOCK`), kept inaccessible (`sodium_mprotect_noaccess`) except inside ``withReadOnlyBytes(_:)``
/// and ``withWritableBytes(_:)``, and wiped when freed (`sodium_free` zeroes it).
///
/// Allocate these rarely (one per key ring or per secret, not per operation): each costs at least three pages and
/// several system calls. Internal; not thread-safe by itself (owners confine or lock it).
///
/// Source: <https://doc.libsodium.org/memory_management>
final class GuardedBuffer {
    /// The first byte of the usable region.
    private let base: UnsafeMutableRawPointer
    /// The usable size in bytes.
    let count: Int
    /// Nesting depth of access scopes; protection changes only at the outermost one.
    private var depth = 0
    private var writable = false

    /// Allocates `count` bytes (at least 1) of guarded memory, zeroed and inaccessible.
    /// - Throws: ``FieldEncryptionError/outOfGuardedMemory`` when `sodium_malloc` fails (e.g. the `mlock` limit).
    init(count: Int) throws(FieldEncryptionError) {
        SodiumRuntime.ensureInitialized()
        let size = max(1, count)
        guard let pointer = sodium_malloc(size) else { throw .outOfGuardedMemory }
        base = pointer
        self.count = size
        sodium_memzero(pointer, size)
        sodium_mprotect_noaccess(pointer)
    }

    deinit {
        // sodium_free makes the region writable, wipes it with sodium_memzero and releases the guard pages.
        sodium_free(base)
    }

    /// Runs `body` with the region readable (`sodium_mprotect_readonly`), then makes it inaccessible again.
    func withReadOnlyBytes<T, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> T) throws(E) -> T {
        if depth == 0 { sodium_mprotect_readonly(base) }
        depth += 1
        defer {
            depth -= 1
            if depth == 0 { sodium_mprotect_noaccess(base); writable = false }
        }
        return try body(UnsafeRawBufferPointer(start: base, count: count))
    }

    /// Runs `body` with the region readable and writable (`sodium_mprotect_readwrite`), then makes it inaccessible.
    func withWritableBytes<T, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> T) throws(E) -> T {
        let wasWritable = writable
        if depth == 0 || !writable { sodium_mprotect_readwrite(base); writable = true }
        depth += 1
        defer {
            depth -= 1
            if depth == 0 {
                sodium_mprotect_noaccess(base)
                writable = false
            } else if !wasWritable {
                sodium_mprotect_readonly(base)
                writable = false
            }
        }
        return try body(UnsafeMutableRawBufferPointer(start: base, count: count))
    }

    /// Overwrites the whole region with zeros (`sodium_memzero`).
    func wipe() {
        withWritableBytes { sodium_memzero($0.baseAddress!, $0.count) }
    }
}
