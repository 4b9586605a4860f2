import CSQLite
import Foundation

/// The value of an attribute marked ``Schema/Attribute/Options/externalStorage`` could not be written to or read from
/// its file beside the store. Names the store, entity, record and attribute, never the value.
public struct ExternalStorageError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What went wrong.
    public enum Problem: Error, Sendable, Hashable, CustomStringConvertible {
        /// The row references a file that does not exist in the store's asset directory.
        case missingFile
        /// The file's bytes do not hash to the name the row references (the file was damaged or replaced).
        case hashMismatch
        /// The file's length is not the length the row records.
        case sizeMismatch(expected: Int, found: Int)
        /// The stored reference is not one Replica writes.
        case malformedReference
        /// A file operation failed with `errno` `code`.
        case fileOperationFailed(operation: String, code: Int32)
        /// The file's path names a directory or another kind of file, not a regular file.
        case notRegularFile

        public var description: String {
            switch self {
            case .missingFile: return "its file is missing"
            case .hashMismatch: return "its file's content does not match its SHA-256 name (damaged file)"
            case let .sizeMismatch(expected, found): return "its file holds \(found) bytes, the row records \(expected)"
            case .malformedReference: return "the stored reference is malformed"
            case let .fileOperationFailed(operation, code): return "\(operation) failed (errno \(code))"
            case .notRegularFile: return "its file's path is not a regular file (a directory or another kind of file is there)"
            }
        }
    }

    /// The store (configuration name).
    public let store: String
    /// The entity.
    public let entity: String
    /// The record, when known.
    public let recordID: UUID?
    /// The attribute.
    public let attribute: String
    /// What went wrong.
    public let problem: Problem

    public init(store: String, entity: String, recordID: UUID?, attribute: String, problem: Problem) {
        self.store = store
        self.entity = entity
        self.recordID = recordID
        self.attribute = attribute
        self.problem = problem
    }

    public var description: String {
        let record = recordID.map { " of record \($0.uuidString.lowercased())" } ?? ""
        return "external storage of \(entity).\(attribute)\(record) in store '\(store)': \(problem)"
    }
}

/// The files of a store's ``Schema/Attribute/Options/externalStorage`` attributes. Internal.
///
/// Layout and rules (Specs/external-storage.md): the directory `<store file>-assets/` beside the store holds one file
/// per distinct value, named by the lowercase hex SHA-256 of its bytes (`SHA256Hasher`: OpenSSL's EVP digest). The
/// row's column holds the reference `replica-asset:sha256:<hex>:<size>` as TEXT (a data column otherwise only holds
/// BLOBs or NULL, so a TEXT value is always a reference). Files are written inside the save's write transaction, before it
/// commits (`<hex>.tmp`, `fsync`, `rename`, `fsync` of the directory); the garbage collector removes, inside a write
/// transaction of its own, every file that no committed row or history tombstone references.
final class AssetStore: Sendable {
    /// `<store file>-assets/`.
    let directory: URL
    /// The store's configuration name (for errors).
    let storeName: String
    /// Whether the collector may remove files. Not for the copy a migration stage works on: the store it was copied
    /// from may still reference what the copy no longer does.
    let collects: Bool
    /// Whether a save reuses an existing file only once its bytes hash to its name (always, in the library; a
    /// parameter so that a future canary can bring back the old size-only check once the simulator has asset faults).
    let verifiesReuse: Bool

    /// The asset directory of the store file at `url`: `<url>-assets/`, or, for the copy a migration stage works on
    /// (`migrationCopy`: `<store file>.migrating`), the store's own, which the copy never collects. A store whose file
    /// name merely ends in `.migrating` has a directory of its own (before, the suffix alone decided, and such a store
    /// shared — and lost to — the directory of the file named without it).
    init(storeURL url: URL, storeName: String, verifiesReuse: Bool = true, migrationCopy: Bool = false) {
        var path = url.path
        if migrationCopy, path.hasSuffix(".migrating") { path.removeLast(".migrating".count) }
        directory = URL(fileURLWithPath: path + "-assets", isDirectory: true)
        self.storeName = storeName
        collects = !migrationCopy
        self.verifiesReuse = verifiesReuse
    }

    // MARK: References

    /// The reference to `data`'s file: its hash and size.
    static func reference(for data: Data) -> String {
        AssetReference.prefix + hexDigest(data) + ":" + String(data.count)
    }

    static func hexDigest(_ data: Data) -> String { CloudAssetReference.sha256Hex(data) }

    func path(ofHash hash: String) -> String { directory.appendingPathComponent(hash).path }

    // MARK: Writing

    /// Makes sure the file of `reference` (the reference of `data`) exists, durably: an existing file whose bytes
    /// hash to its name (and of the right size) is kept (content-addressed); otherwise — no file, or a damaged one,
    /// which this repairs for every row referencing it — the bytes go to `<hash>.tmp`, are synced, and renamed into
    /// place, and the directory is synced. Called inside the save's write transaction, so no collector runs
    /// meanwhile.
    /// - Throws: ``ExternalStorageError/Problem`` on a failed file operation, or when the path is not a regular
    ///   file (a directory there is not replaced).
    /// - Returns: whether a file was created.
    @discardableResult
    func write(_ data: Data, reference: String) throws(ExternalStorageError.Problem) -> Bool {
        guard let (hash, _) = AssetReference.parse(reference) else { throw .malformedReference }
        let final = path(ofHash: hash)
        var info = stat()
        if lstat(final, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFREG else { throw .notRegularFile }
            if Int(info.st_size) == data.count && (!verifiesReuse || fileHashes(final, to: hash)) { return false }
        }
        try makeDirectory()
        let temporary = final + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw .fileOperationFailed(operation: "creating the file", code: errno) }
        var failure: ExternalStorageError.Problem?
        data.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = posixWrite(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    failure = .fileOperationFailed(operation: "writing the file", code: errno)
                    return
                }
                offset += written
            }
        }
        if failure == nil, fsync(fd) != 0 { failure = .fileOperationFailed(operation: "syncing the file", code: errno) }
        close(fd)
        if let failure {
            unlink(temporary)
            throw failure
        }
        guard rename(temporary, final) == 0 else {
            let code = errno
            unlink(temporary)
            throw .fileOperationFailed(operation: "renaming the file into place", code: code)
        }
        try syncDirectory(directory.path)
        return true
    }

    // MARK: Assets in sync

    /// Makes sure this store holds the file an ``ExternalData`` handle names: this store's own file when the handle
    /// names it and it is there (O(1)), an existing file of that hash whose bytes hash to its name (as
    /// ``write(_:reference:)`` reuses one), or else a copy of the handle's file written in chunks and checked as
    /// ``write(_:chunks:)`` does. Called inside the save's write transaction.
    /// - Throws: ``ExternalStorageError/Problem`` — the handle's file is missing (its record's value was replaced or
    ///   deleted since the fetch), of another size or content, or a file operation failed.
    /// - Returns: whether a file was created.
    func adopt(_ file: FileHandleForm) throws -> Bool {
        let asset = file.asset
        if file.path == path(ofHash: file.hash), hasFile(asset) { return false }
        if hasFile(asset), !verifiesReuse || verifiesFile(asset) { return false }
        try write(asset, chunks: { index in try ExternalFileIO.read(path: file.path, range: asset.chunkRange(index), size: asset.size) })
        return true
    }

    /// Whether the asset's file is there: a regular file of the asset's size (its hash was checked when it was
    /// written). O(1).
    func hasFile(_ asset: CloudAssetReference) -> Bool {
        var info = stat()
        return lstat(path(ofHash: asset.hash), &info) == 0 && info.st_mode & S_IFMT == S_IFREG && Int64(info.st_size) == asset.size
    }

    /// Whether the asset's file is there and its bytes hash to its name (read in 1 MB chunks). O(size).
    func verifiesFile(_ asset: CloudAssetReference) -> Bool {
        hasFile(asset) && fileHashes(path(ofHash: asset.hash), to: asset.hash)
    }

    /// Chunk `index` of the asset's file (``CloudAssetReference/chunkRange(_:)``), read with `pread`.
    /// - Throws: ``ExternalStorageError/Problem`` when the file is missing, shorter, or cannot be read.
    func readChunk(_ asset: CloudAssetReference, index: Int) throws(ExternalStorageError.Problem) -> Data {
        try read(asset, range: asset.chunkRange(index))
    }

    /// Bytes `range` of the asset's file, read with `pread` (through ``ExternalFileIO``, as an ``ExternalData``
    /// handle reads its file).
    /// - Throws: ``ExternalStorageError/Problem`` when the file is missing, not a regular file, of another size than the
    ///   asset's, or cannot be read.
    func read(_ asset: CloudAssetReference, range: Range<Int64>) throws(ExternalStorageError.Problem) -> Data {
        try ExternalFileIO.read(path: path(ofHash: asset.hash), range: range, size: asset.size)
    }

    /// Writes the asset's file from its chunks (`chunk(i)` for each index, in order), durably, as ``write(_:reference:)``
    /// does — `<hash>.tmp`, `fsync`, `rename`, `fsync` of the directory — checking on the way that the bytes hash to
    /// the name and have the asset's size. Memory: one chunk at a time. Called inside a write transaction.
    /// - Throws: ``ExternalStorageError/Problem/hashMismatch`` or `sizeMismatch` (nothing is left behind), or a failed
    ///   file operation; whatever `chunk` throws.
    func write(_ asset: CloudAssetReference, chunks chunk: (Int) throws -> Data) throws {
        let final = path(ofHash: asset.hash)
        var info = stat()
        if lstat(final, &info) == 0, info.st_mode & S_IFMT != S_IFREG { throw ExternalStorageError.Problem.notRegularFile }
        try makeDirectory()
        let temporary = final + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw ExternalStorageError.Problem.fileOperationFailed(operation: "creating the file", code: errno) }
        var hasher = SHA256Hasher()
        var written: Int64 = 0
        do {
            for index in 0..<asset.chunkCount {
                let data = try chunk(index)
                hasher.update(data)
                var failure: ExternalStorageError.Problem?
                data.withUnsafeBytes { buffer in
                    var offset = 0
                    while offset < buffer.count {
                        let count = posixWrite(fd, buffer.baseAddress! + offset, buffer.count - offset)
                        if count < 0 {
                            if errno == EINTR { continue }
                            failure = .fileOperationFailed(operation: "writing the file", code: errno)
                            return
                        }
                        offset += count
                    }
                }
                if let failure { throw failure }
                written += Int64(data.count)
            }
            guard written == asset.size else { throw ExternalStorageError.Problem.sizeMismatch(expected: Int(asset.size), found: Int(written)) }
            guard hasher.finalizeHex() == asset.hash else { throw ExternalStorageError.Problem.hashMismatch }
            guard fsync(fd) == 0 else { throw ExternalStorageError.Problem.fileOperationFailed(operation: "syncing the file", code: errno) }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        guard rename(temporary, final) == 0 else {
            let code = errno
            unlink(temporary)
            throw ExternalStorageError.Problem.fileOperationFailed(operation: "renaming the file into place", code: code)
        }
        try syncDirectory(directory.path)
    }

    /// Writes a file from bytes whose hash is not known beforehand (an opened sealed asset): `produce` hands the
    /// bytes to its argument in order; the file is named by their SHA-256 once complete (durably, as ``write(_:reference:)``
    /// does: `.tmp`, `fsync`, `rename`, `fsync` of the directory). A file of that name and size that is there already
    /// is kept. Called inside a write transaction.
    /// - Returns: the written asset's reference.
    /// - Throws: a failed file operation, or what `produce` throws (nothing is left behind).
    func writeNew(_ produce: (_ sink: (Data) throws -> Void) throws -> Void) throws -> CloudAssetReference {
        try makeDirectory()
        let temporary = directory.appendingPathComponent("opening.tmp").path
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw ExternalStorageError.Problem.fileOperationFailed(operation: "creating the file", code: errno) }
        var hasher = SHA256Hasher()
        var size: Int64 = 0
        do {
            try produce { data in
                hasher.update(data)
                var failure: ExternalStorageError.Problem?
                data.withUnsafeBytes { buffer in
                    var offset = 0
                    while offset < buffer.count {
                        let count = posixWrite(fd, buffer.baseAddress! + offset, buffer.count - offset)
                        if count < 0 {
                            if errno == EINTR { continue }
                            failure = .fileOperationFailed(operation: "writing the file", code: errno)
                            return
                        }
                        offset += count
                    }
                }
                if let failure { throw failure }
                size += Int64(data.count)
            }
            guard fsync(fd) == 0 else { throw ExternalStorageError.Problem.fileOperationFailed(operation: "syncing the file", code: errno) }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        let asset = CloudAssetReference(hash: hasher.finalizeHex(), size: size)!
        if hasFile(asset) {
            unlink(temporary)
            return asset
        }
        guard rename(temporary, path(ofHash: asset.hash)) == 0 else {
            let code = errno
            unlink(temporary)
            throw ExternalStorageError.Problem.fileOperationFailed(operation: "renaming the file into place", code: code)
        }
        try syncDirectory(directory.path)
        return asset
    }

    /// Whether the regular file at `path` can be read whole and its bytes hash to `hash` (read in 1 MB chunks).
    private func fileHashes(_ path: String, to hash: String) -> Bool {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var hasher = SHA256Hasher()
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count = chunk.withUnsafeMutableBytes { posixRead(fd, $0.baseAddress!, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count >= 0 else { return false }
            if count == 0 { break }
            chunk.withUnsafeBytes { hasher.update($0.baseAddress!, count: count) }
        }
        return hasher.finalizeHex() == hash
    }

    private func makeDirectory() throws(ExternalStorageError.Problem) {
        var info = stat()
        if stat(directory.path, &info) == 0 { return }
        guard mkdir(directory.path, 0o755) == 0 || errno == EEXIST else {
            throw .fileOperationFailed(operation: "creating the asset directory", code: errno)
        }
        try syncDirectory(directory.deletingLastPathComponent().path)
    }

    private func syncDirectory(_ path: String) throws(ExternalStorageError.Problem) {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw .fileOperationFailed(operation: "opening the directory to sync it", code: errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw .fileOperationFailed(operation: "syncing the directory", code: errno) }
    }

    // MARK: Reading

    /// The bytes of the file `reference` names, checked against its size and hash, in a buffer from `malloc` that
    /// the caller owns (SQLite frees it: see ``AssetReader``). Read in chunks into one buffer of the recorded size.
    func readBuffer(_ reference: String) throws(ExternalStorageError.Problem) -> (UnsafeMutableRawPointer?, Int) {
        guard let (hash, size) = AssetReference.parse(reference) else { throw .malformedReference }
        let fd = open(path(ofHash: hash), O_RDONLY)
        guard fd >= 0 else {
            throw errno == ENOENT ? .missingFile : .fileOperationFailed(operation: "opening the file", code: errno)
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw .fileOperationFailed(operation: "reading the file's size", code: errno) }
        guard info.st_mode & S_IFMT == S_IFREG else { throw .notRegularFile }
        guard Int(info.st_size) == size else { throw .sizeMismatch(expected: size, found: Int(info.st_size)) }
        guard size > 0 else {
            if hash != Self.hexDigest(Data()) { throw .hashMismatch }
            return (nil, 0)
        }
        guard let buffer = malloc(size) else { throw .fileOperationFailed(operation: "allocating the read buffer", code: ENOMEM) }
        var hasher = SHA256Hasher()
        var offset = 0
        while offset < size {
            let count = posixRead(fd, buffer + offset, min(size - offset, 1 << 20))
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                let code = errno
                free(buffer)
                throw count == 0 ? .sizeMismatch(expected: size, found: offset) : .fileOperationFailed(operation: "reading the file", code: code)
            }
            hasher.update(buffer + offset, count: count)
            offset += count
        }
        guard hasher.finalizeHex() == hash else {
            free(buffer)
            throw .hashMismatch
        }
        return (buffer, size)
    }

    /// The bytes of the file `reference` names, checked (see ``readBuffer(_:)``).
    func read(_ reference: String) throws(ExternalStorageError.Problem) -> Data {
        let (buffer, count) = try readBuffer(reference)
        guard let buffer else { return Data() }
        return Data(bytesNoCopy: buffer, count: count, deallocator: .free)
    }

    // MARK: Garbage

    /// The hashes the committed state of the store references: every reference in a BLOB-declared column of every
    /// table of the store but SQLite's and Replica's own — the tables of `entities` and of entities this schema does
    /// not declare (another app version's, or a widget's subset schema opening the file), whose external-storage
    /// columns and columns of data attributes an earlier schema had keep their values, so their files are kept too —
    /// and every reference inside a history tombstone. A column a migration stage dropped is gone, and so are the
    /// references it held. (`entities` is not consulted: what the store holds decides.)
    static func referencedHashes(_ db: Connection, entities: [Schema.Entity]) throws -> Set<String> {
        var hashes = Set<String>()
        let tables = try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE 'replica\\_%' ESCAPE '\\' ORDER BY name",
                                 cache: false)
        for case let .text(table) in tables.map({ $0[0] }) {
            let columns = try db.rows("SELECT name FROM pragma_table_info(?) WHERE type = 'BLOB' AND name <> 'id' ORDER BY cid",
                                      [.text(table)], cache: false)
            for case let .text(name) in columns.map({ $0[0] }) {
                let column = quoted(name)
                for row in try db.rows("SELECT \(column) FROM \(quoted(table)) WHERE typeof(\(column)) = 'text'", cache: false) {
                    if case let .text(text) = row[0], let (hash, _) = AssetReference.parse(text) { hashes.insert(hash) }
                }
            }
        }
        var texts = try db.rows("SELECT tombstone FROM replica_history_change WHERE tombstone LIKE '%' || ? || '%'",
                                [.text(AssetReference.prefix)], cache: false)
        // A synced store's bookkeeping: tombstones the ledger keeps to upload, and versions waiting for their assets
        // (an asset downloaded for a record that still waits for another one stays).
        for (table, column) in [("replica_sync_record", "tombstone"), ("replica_sync_asset_wait", "record"), ("replica_sync_sealed_asset", "plain_ref")]
        where try db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(table)]) != nil {
            texts += try db.rows("SELECT \(column) FROM \(table) WHERE \(column) LIKE '%' || ? || '%'", [.text(AssetReference.prefix)], cache: false)
        }
        for row in texts {
            guard case let .text(json) = row[0] else { continue }
            var rest = Substring(json)
            while let range = rest.range(of: AssetReference.prefix) {
                let hash = String(rest[range.upperBound...].prefix(64))
                if AssetReference.isHexDigest(hash) { hashes.insert(hash) }
                rest = rest[range.upperBound...]
            }
        }
        return hashes
    }

    /// Removes every file of the directory that no committed row or history tombstone references (and leftover
    /// `.tmp` files), inside a write transaction: no save is between writing its files and committing meanwhile, in
    /// this process or another. Returns the names removed, in order.
    @discardableResult
    func collectGarbage(_ db: Connection, entities: [Schema.Entity]) throws -> [String] {
        guard collects, FileManager.default.fileExists(atPath: directory.path) else { return [] }
        return try db.transaction(.immediate) {
            let referenced = try Self.referencedHashes(db, entities: entities)
            let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).sorted()
            var removed: [String] = []
            for name in names where !referenced.contains(name) {
                if unlink(directory.appendingPathComponent(name).path) == 0 { removed.append(name) }
            }
            return removed
        }
    }
}

/// `write(2)` and `read(2)`, named apart from the methods of ``AssetStore`` that would hide them.
@inline(__always)
private func posixWrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int {
    write(fd, buffer, count)
}

@inline(__always)
private func posixRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int {
    read(fd, buffer, count)
}

/// The SQL function `replica_asset(value, id, attribute)` that queries read external-storage columns through: a
/// reference (TEXT) becomes the file's bytes (checked against size and hash); a BLOB (a value written before the
/// store kept files, or an unsaved value of the pending-changes overlay) or NULL passes through. A failure is kept
/// here, as a typed error, and the function fails with ``failureMessage``, which the query maps back. Internal.
final class AssetReader: ExternalValueReader {
    let assets: AssetStore
    /// The error of the last failed call.
    var lastError: ExternalStorageError?

    static let failureMessage = "replica: an external-storage file could not be read"

    init(assets: AssetStore) {
        self.assets = assets
    }

    /// Registers `replica_asset` on `connection` for `assets`; the connection keeps the reader.
    static func register(on connection: Connection, assets: AssetStore) throws {
        let reader = AssetReader(assets: assets)
        let pointer = Unmanaged.passRetained(reader).toOpaque()
        let code = sqlite3_create_function_v2(connection.handle, "replica_asset", 4, SQLITE_UTF8, pointer, { context, _, arguments in
            guard let arguments, let value = arguments[0] else { sqlite3_result_null(context); return }
            guard sqlite3_value_type(value) == SQLITE_TEXT else { sqlite3_result_value(context, value); return }
            let reader = Unmanaged<AssetReader>.fromOpaque(sqlite3_user_data(context)!).takeUnretainedValue()
            let reference = String(statementValue: value)
            do throws(ExternalStorageError.Problem) {
                let (buffer, count) = try reader.assets.readBuffer(reference)
                if let buffer {
                    sqlite3_result_blob64(context, buffer, sqlite3_uint64(count), { free($0) })
                } else {
                    sqlite3_result_zeroblob(context, 0)
                }
            } catch {
                func text(_ index: Int) -> String {
                    guard let argument = arguments[index], sqlite3_value_type(argument) == SQLITE_TEXT else { return "?" }
                    return String(statementValue: argument)
                }
                let id = arguments[1].flatMap { UUID(statementValue: $0) }
                reader.lastError = ExternalStorageError(store: reader.assets.storeName, entity: text(3), recordID: id,
                                                        attribute: text(2), problem: error)
                sqlite3_result_error(context, AssetReader.failureMessage, -1)
            }
        }, nil, nil, { pointer in
            if let pointer { Unmanaged<AssetReader>.fromOpaque(pointer).release() }
        })
        if code != SQLITE_OK { throw SQLiteError(code: code, connection: connection.handle) }
        try registerFileForm(on: connection, reader: reader)
        connection.assetReader = reader
    }

    /// Registers `replica_asset_file(value, id, attribute, entity)`, what queries read ``ExternalData`` attributes
    /// through: a reference (TEXT) becomes the description of its file (`FileHandleForm`) without opening it; the
    /// description of an unsaved value (pending changes), a BLOB or NULL passes through; anything else fails as
    /// `replica_asset` does (``ExternalStorageError/Problem/malformedReference``).
    private static func registerFileForm(on connection: Connection, reader: AssetReader) throws {
        let pointer = Unmanaged.passRetained(reader).toOpaque()
        let code = sqlite3_create_function_v2(connection.handle, "replica_asset_file", 4, SQLITE_UTF8 | SQLITE_DETERMINISTIC, pointer, { context, _, arguments in
            guard let arguments, let value = arguments[0] else { sqlite3_result_null(context); return }
            guard sqlite3_value_type(value) == SQLITE_TEXT else { sqlite3_result_value(context, value); return }
            let reader = Unmanaged<AssetReader>.fromOpaque(sqlite3_user_data(context)!).takeUnretainedValue()
            let text = String(statementValue: value)
            if text.hasPrefix(FileHandleForm.prefix) { sqlite3_result_value(context, value); return }
            guard let (hash, size) = AssetReference.parse(text) else {
                func argument(_ index: Int) -> String {
                    guard let argument = arguments[index], sqlite3_value_type(argument) == SQLITE_TEXT else { return "?" }
                    return String(statementValue: argument)
                }
                reader.lastError = ExternalStorageError(store: reader.assets.storeName, entity: argument(3),
                                                        recordID: arguments[1].flatMap { UUID(statementValue: $0) },
                                                        attribute: argument(2), problem: .malformedReference)
                sqlite3_result_error(context, AssetReader.failureMessage, -1)
                return
            }
            let form = FileHandleForm(hash: hash, size: size, storeName: reader.assets.storeName,
                                      path: reader.assets.path(ofHash: hash)).text
            sqlite3_result_text(context, form, -1, Connection.sqliteTransient)
        }, nil, nil, { pointer in
            if let pointer { Unmanaged<AssetReader>.fromOpaque(pointer).release() }
        })
        if code != SQLITE_OK { throw SQLiteError(code: code, connection: connection.handle) }
    }
}
