import Foundation
import Synchronization

/// The value of a ``Schema/Attribute/Options/externalStorage`` attribute as a handle: a fetched model holds the
/// file's size and content hash, not its bytes, until the app reads them — whole (``data()``), by range
/// (``read(_:)``), in chunks (``forEachChunk(size:_:)``) or into a file of its own (``write(to:)``).
///
/// Declare the property as `ExternalData` (or `ExternalData?`) instead of `Data` to read lazily; the stored form is
/// the same, so a store written with `Data` reads with `ExternalData` and back:
///
/// ```swift
/// struct Photo: PersistentModel, Codable {
///     var id = UUID.unassigned
///     var title = ""
///     var image: ExternalData?
///
///     static let entity = ModelEntity<Photo>([
///         .attribute("title", \.title, default: ""),
///         .attribute("image", \.image, options: .externalStorage),
///     ])
/// }
///
/// var photo = context.insert(Photo(title: "beach", image: ExternalData(jpegBytes)))  // written to a file at save
/// photo.image = try ExternalData(contentsOf: cameraFileURL)  // streamed: the save copies the file in 1 MiB chunks
/// context.update(photo)
/// try context.save()
/// let fetched = try context.fetch(FetchDescriptor<Photo>())  // handles: no file is opened
/// let bytes = try fetched.first?.image?.data()                // reads the file now, checked against its hash
/// ```
///
/// Declaring `ExternalData` on an attribute without ``Schema/Attribute/Options/externalStorage`` is a programmer
/// error: building the entity traps with a message naming the attribute.
///
/// A store file keeps the value in a file beside the store (`<store file>-assets/<sha256>`); a fetch of a model with an
/// `ExternalData` property opens no file (O(1) per row). An in-memory store keeps the bytes in its row, and its
/// fetched handles hold them: the same API either way (``isLoaded`` tells which).
///
/// A handle read from a store names that store's file: saving it unchanged writes nothing, saving it into another
/// record of the same store shares the file, and saving it into another store copies the file there in 1 MiB chunks.
/// The file stays while a committed row (or a history tombstone) references it; once the record was deleted or its
/// value replaced and that save committed, reading a handle fetched before can throw
/// ``ExternalStorageError/Problem/missingFile`` (fetch the model again). Reads never return bytes that do not hash
/// to the handle's name: a damaged file throws ``ExternalStorageError/Problem/hashMismatch``.
///
/// Equality compares content (size and SHA-256), whether the bytes are loaded or in a file.
public struct ExternalData: AttributeValue, Hashable, Codable, CustomStringConvertible {
    /// Where the bytes are.
    enum Content: Sendable {
        /// In memory.
        case bytes(Data)
        /// In a file: a store's asset file or a file the app imported, with its size and SHA-256.
        case file(FileHandleForm)
    }

    let content: Content

    /// Creates a value from bytes in memory. The save writes them to a file beside a store file (an in-memory store
    /// keeps them in its row).
    /// - Parameter data: the bytes.
    public init(_ data: Data) {
        content = .bytes(data)
    }

    /// Creates a value from the file at `url` without reading it into memory: the file is read once now, in 1 MiB
    /// chunks, to learn its size and SHA-256; the save that stores the value copies it into the store's asset
    /// directory the same way (checking the hash again: a file changed in between fails that save with
    /// ``ExternalStorageError/Problem/hashMismatch``). Keep the file until the save.
    /// - Parameter url: a regular file.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when the file cannot be opened or read, or is not a regular file
    ///   (the error's store names the file's last path component).
    /// - Complexity: O(size) time, O(1 MiB) memory.
    public init(contentsOf url: URL) throws {
        // A relative URL (`URL(string:)`) is pinned to the working directory now: the stored form names an absolute
        // path, and the save must read the file this hashed.
        var path = url.standardizedFileURL.path
        if !path.hasPrefix("/") { path = FileManager.default.currentDirectoryPath + "/" + path }
        let origin = ExternalDataOrigin(store: "imported file '\(url.lastPathComponent)'", entity: "", recordID: nil, attribute: "")
        do {
            let (hash, size) = try ExternalFileIO.hashFile(atPath: path)
            content = .file(FileHandleForm(hash: hash, size: size, storeName: origin.store, path: path))
        } catch let problem as ExternalStorageError.Problem {
            throw ReplicaError.externalStorage(origin.error(problem))
        }
    }

    /// The size of the value in bytes. O(1).
    public var count: Int {
        switch content {
        case let .bytes(data): return data.count
        case let .file(file): return file.size
        }
    }

    /// Whether the bytes are in memory (a value made from `Data`, or read from an in-memory store) rather than in a
    /// file that each read opens.
    public var isLoaded: Bool {
        if case .bytes = content { return true }
        return false
    }

    /// The lowercase hexadecimal SHA-256 of the bytes: the name of the value's file, and (for a plain attribute) of
    /// its cloud asset. O(1) for a file; hashes the bytes of a loaded value (O(``count``)).
    public var sha256: String {
        switch content {
        case let .bytes(data): return CloudAssetReference.sha256Hex(data)
        case let .file(file): return file.hash
        }
    }

    /// The bytes, whole: read from the file now and checked against the size and SHA-256 (a loaded value returns
    /// its bytes).
    /// - Throws: ``ReplicaError/externalStorage(_:)`` — ``ExternalStorageError/Problem/missingFile`` (the record's
    ///   value was replaced or deleted since the fetch), `sizeMismatch`, `hashMismatch` (a damaged file) or a failed
    ///   file operation.
    /// - Complexity: O(``count``) time and memory.
    public func data() throws -> Data {
        switch content {
        case let .bytes(data): return data
        case let .file(file):
            var data = Data()
            data.reserveCapacity(file.size)
            try forEachChunk { data.append($0) }
            return data
        }
    }

    /// Bytes `range` of the value (clamped to ``count``). Not checked against the hash: use ``forEachChunk(size:_:)``
    /// or ``data()`` to read checked bytes.
    /// - Parameter range: byte offsets.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when the file is missing, shorter than recorded, or unreadable.
    /// - Complexity: O(`range.count`).
    public func read(_ range: Range<Int>) throws -> Data {
        let clamped = range.clamped(to: 0..<count)
        switch content {
        case let .bytes(data): return data.subdata(in: (data.startIndex + clamped.lowerBound)..<(data.startIndex + clamped.upperBound))
        case let .file(file):
            do throws(ExternalStorageError.Problem) {
                return try ExternalFileIO.read(path: file.path, range: Int64(clamped.lowerBound)..<Int64(clamped.upperBound), size: Int64(file.size))
            } catch {
                throw ReplicaError.externalStorage(origin.error(error))
            }
        }
    }

    /// Reads the bytes in order, `size` bytes at a time (the last chunk may be shorter; an empty value calls `body`
    /// never), hashing them on the way: memory stays at one chunk whatever the value's size.
    /// - Parameters:
    ///   - size: the chunk size in bytes (> 0); 1 MiB by default.
    ///   - body: called with each chunk; what it throws ends the read and is rethrown.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when the file is missing, unreadable or of another size, and
    ///   `hashMismatch` **after the last chunk** when the bytes read do not hash to the value's name (a damaged file:
    ///   discard what `body` received).
    /// - Complexity: O(``count``) time, O(`size`) memory.
    public func forEachChunk(size: Int = 1 << 20, _ body: (Data) throws -> Void) throws {
        precondition(size > 0, "ExternalData.forEachChunk: the chunk size must be positive")
        switch content {
        case let .bytes(data):
            var offset = data.startIndex
            while offset < data.endIndex {
                let end = offset + min(size, data.endIndex - offset)  // no overflow for a size near Int.max
                try body(data.subdata(in: offset..<end))
                offset = end
            }
        case let .file(file):
            do {
                // The buffer is one chunk: never larger than the value (`size: .max` means one chunk, not Int.max bytes).
                try ExternalFileIO.forEachChunk(path: file.path, size: Int64(file.size), hash: file.hash,
                                                chunkSize: min(size, max(file.size, 1)), body)
            } catch let problem as ExternalStorageError.Problem {
                throw ReplicaError.externalStorage(origin.error(problem))
            }
        }
    }

    /// Writes the bytes to a new file at `url`, streamed in 1 MiB chunks and checked against the hash, for sharing or
    /// handing to an API that takes a file. The file appears complete or not at all (written beside `url` under a
    /// temporary name of its own, synced, and renamed into place with `rename(2)`); an existing file at `url` is
    /// replaced (of two writes at once, the later rename wins).
    /// - Parameter url: the destination file.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when reading fails (nothing is left at `url`), or a
    ///   `CocoaError` from `FileManager` when the destination cannot be written.
    /// - Complexity: O(``count``) time, O(1 MiB) memory.
    public func write(to url: URL) throws {
        // A temporary name of this call's own: two writes of one destination at once must not share (and rename) one
        // half-written file. The process ID and a per-process counter make it unique without randomness (DESIGN.md
        // principle 1).
        let serial = ExternalData.temporaryFileSerial.add(1, ordering: .relaxed).newValue
        let temporary = url.deletingLastPathComponent().appendingPathComponent(
            "." + url.lastPathComponent + ".\(getpid()).\(serial).replica-tmp")
        guard FileManager.default.createFile(atPath: temporary.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: temporary.path])
        }
        do {
            let handle = try FileHandle(forWritingTo: temporary)
            do {
                try forEachChunk { try handle.write(contentsOf: $0) }
                try handle.synchronize()
                try handle.close()
            } catch {
                try? handle.close()
                throw error
            }
            guard rename(temporary.path, url.path) == 0 else {
                throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: url.path, NSUnderlyingErrorKey: POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)])
            }
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            throw error
        }
    }

    /// Numbers the temporary files of ``write(to:)`` in this process.
    private static let temporaryFileSerial = Atomic<UInt64>(0)

    // MARK: AttributeValue

    public static var attributeType: Schema.AttributeType { .data }

    /// The stored form: a loaded value's bytes (a BLOB: the save writes the file), or, for a value in a file, a
    /// description of the file that a save reads it from (internal: only Replica's writer and this type read it).
    public var sqliteValue: SQLiteValue {
        switch content {
        case let .bytes(data): return .blob(data)
        case let .file(file): return .text(file.text)
        }
    }

    /// Reads a value from its stored form: bytes (a BLOB), or the file description a fetch produces.
    /// - Throws: ``ValueConversionError`` for any other value — in particular a bare reference to a store's file,
    ///   which only a fetch can resolve to its file.
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) {
        switch sqliteValue {
        case let .blob(data): content = .bytes(data)
        case let .text(text):
            guard let file = FileHandleForm(text: text) else {
                var error = ValueConversionError(expected: "ExternalData", found: sqliteValue)
                if AssetReference.parse(text) != nil {
                    error.cause = "a reference to an external-storage file read outside a fetch (only a fetch knows the store's asset directory)"
                }
                throw error
            }
            content = .file(file)
        default: throw ValueConversionError(expected: "ExternalData", found: sqliteValue)
        }
    }

    /// Decodes the field, remembering the record and attribute for the errors of later reads.
    public static func decode(from row: ModelRow, at index: Int) throws(ValueConversionError) -> ExternalData {
        var value = try ExternalData(sqliteValue: row[index])
        if case var .file(file) = value.content {
            file.entity = row.layout.entityName
            file.attribute = row.layout.fieldName(index)
            file.recordID = row.id
            value = ExternalData(content: .file(file))
        }
        return value
    }

    init(content: Content) {
        self.content = content
    }

    // MARK: Equality, Codable, description

    public static func == (a: ExternalData, b: ExternalData) -> Bool {
        switch (a.content, b.content) {
        case let (.bytes(x), .bytes(y)): return x == y
        case let (.file(x), .file(y)): return x.size == y.size && x.hash == y.hash
        default: return a.count == b.count && a.sha256 == b.sha256
        }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
    }

    /// Encodes the bytes (reading the file: O(``count``)), as `Data` encodes.
    /// - Throws: ``ReplicaError/externalStorage(_:)`` when the file cannot be read.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(try data())
    }

    /// Decodes bytes encoded as `Data`.
    public init(from decoder: any Decoder) throws {
        content = .bytes(try decoder.singleValueContainer().decode(Data.self))
    }

    /// The size, and whether the bytes are loaded — never the bytes.
    public var description: String {
        "ExternalData(\(count) bytes, \(isLoaded ? "loaded" : "in a file"))"
    }

    /// The record and attribute a fetched handle came from, for its errors.
    private var origin: ExternalDataOrigin {
        guard case let .file(file) = content else { return ExternalDataOrigin(store: "", entity: "", recordID: nil, attribute: "") }
        return ExternalDataOrigin(store: file.storeName, entity: file.entity, recordID: file.recordID, attribute: file.attribute)
    }
}

/// Where a handle's file came from, for errors.
struct ExternalDataOrigin {
    let store: String
    let entity: String
    let recordID: UUID?
    let attribute: String

    func error(_ problem: ExternalStorageError.Problem) -> ExternalStorageError {
        ExternalStorageError(store: store, entity: entity, recordID: recordID, attribute: attribute, problem: problem)
    }
}

// `ExternalDataAttribute` is declared in Model/ (ModelEntity reads it); the type lives here, beside the asset store
// whose files it reads.
extension ExternalData: ExternalDataAttribute {}
extension Optional: ExternalDataAttribute where Wrapped == ExternalData {}

/// A value in a file, as `ExternalData` holds it and as its stored form describes it:
/// `replica-asset-file:<sha256 hex>:<size>:<UTF-8 length of the store name>:<store name><absolute path>`. Queries
/// produce it from a row's reference (`replica_asset_file`); the store writer reads it to reuse or copy the file.
struct FileHandleForm: Sendable, Hashable {
    static let prefix = "replica-asset-file:"

    let hash: String
    let size: Int
    let storeName: String
    let path: String
    // Set by a fetch, for errors; not part of the stored form.
    var entity = ""
    var attribute = ""
    var recordID: UUID?

    init(hash: String, size: Int, storeName: String, path: String) {
        self.hash = hash
        self.size = size
        self.storeName = storeName
        self.path = path
    }

    /// Parses the stored form; `nil` when `text` is not one. Reads UTF-8 bytes, not `Character`s: a store name that
    /// begins with a combining mark (or a ZWJ) would join the colon before it into one grapheme, which a
    /// `Character` search for ":" does not find.
    init?(text: String) {
        guard text.hasPrefix(Self.prefix) else { return nil }
        var rest = text.utf8.dropFirst(Self.prefix.utf8.count)
        func field() -> String? {
            guard let colon = rest.firstIndex(of: UInt8(ascii: ":")) else { return nil }
            let value = String(decoding: rest[rest.startIndex..<colon], as: UTF8.self)
            rest = rest[rest.index(after: colon)...]
            return value
        }
        guard let hash = field(), AssetReference.isHexDigest(hash),
              let sizeText = field(), sizeText.utf8.count <= 18, sizeText.utf8.allSatisfy({ (48...57).contains($0) }),
              let size = Int(sizeText),
              let lengthText = field(), lengthText.utf8.count <= 9, lengthText.utf8.allSatisfy({ (48...57).contains($0) }),
              let length = Int(lengthText), rest.count > length else { return nil }
        let nameEnd = rest.index(rest.startIndex, offsetBy: length)
        guard let name = String(rest[rest.startIndex..<nameEnd]), let path = String(rest[nameEnd...]),
              path.hasPrefix("/") else { return nil }
        self.init(hash: hash, size: size, storeName: name, path: path)
    }

    /// The stored form.
    var text: String {
        Self.prefix + hash + ":" + String(size) + ":" + String(storeName.utf8.count) + ":" + storeName + path
    }

    /// The reference a store's row holds for these bytes.
    var reference: String { AssetReference.prefix + hash + ":" + String(size) }

    var asset: CloudAssetReference { CloudAssetReference(hash: hash, size: Int64(size))! }
}

/// Streamed reads of a value's file with POSIX calls (no `FileHandle`: its errors would name the path). Internal.
enum ExternalFileIO {
    /// The SHA-256 and size of the regular file at `path`, read in 1 MiB chunks.
    /// - Throws: `ExternalStorageError.Problem`.
    static func hashFile(atPath path: String) throws -> (hash: String, size: Int) {
        var hasher = SHA256Hasher()
        var total = 0
        try stream(path: path, expectedSize: nil, chunkSize: 1 << 20) { pointer, count in
            hasher.update(pointer, count: count)
            total += count
        }
        return (hasher.finalizeHex(), total)
    }

    /// Bytes `range` of the file at `path`, which must hold `size` bytes.
    static func read(path: String, range: Range<Int64>, size: Int64) throws(ExternalStorageError.Problem) -> Data {
        let fd = try openRegular(path, size: size)
        defer { close(fd) }
        let count = Int(range.upperBound - range.lowerBound)
        var data = Data(count: count)
        var failure: ExternalStorageError.Problem?
        data.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < count {
                let read = pread(fd, buffer.baseAddress! + offset, count - offset, off_t(range.lowerBound) + off_t(offset))
                if read < 0 && errno == EINTR { continue }
                guard read > 0 else {
                    failure = read == 0 ? .sizeMismatch(expected: Int(size), found: Int(range.lowerBound) + offset)
                        : .fileOperationFailed(operation: "reading the file", code: errno)
                    return
                }
                offset += read
            }
        }
        if let failure { throw failure }
        return data
    }

    /// Calls `body` with the file's bytes in chunks of `chunkSize`, then checks that they hash to `hash`.
    /// - Throws: `ExternalStorageError.Problem` (missing file, wrong size, `hashMismatch` after the last chunk), or
    ///   what `body` throws.
    static func forEachChunk(path: String, size: Int64, hash: String, chunkSize: Int, _ body: (Data) throws -> Void) throws {
        var hasher = SHA256Hasher()
        try stream(path: path, expectedSize: size, chunkSize: chunkSize) { pointer, count in
            hasher.update(pointer, count: count)
            try body(Data(bytes: pointer, count: count))
        }
        guard hasher.finalizeHex() == hash else { throw ExternalStorageError.Problem.hashMismatch }
    }

    /// Opens the regular file at `path` for reading, checking its size when `size` is given.
    private static func openRegular(_ path: String, size: Int64?) throws(ExternalStorageError.Problem) -> Int32 {
        // O_NONBLOCK: opening a FIFO without a writer would block; it is refused below as not a regular file (the
        // flag changes nothing for a regular file's reads).
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw errno == ENOENT ? .missingFile : .fileOperationFailed(operation: "opening the file", code: errno) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            close(fd)
            throw .fileOperationFailed(operation: "reading the file's size", code: code)
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            close(fd)
            throw .notRegularFile
        }
        if let size, Int64(info.st_size) != size {
            close(fd)
            throw .sizeMismatch(expected: Int(size), found: Int(info.st_size))
        }
        return fd
    }

    /// Reads the whole file in chunks of at most `chunkSize` into one reused buffer, calling `body` with each.
    private static func stream(path: String, expectedSize: Int64?, chunkSize: Int,
                               _ body: (UnsafeRawPointer, Int) throws -> Void) throws {
        let fd = try openRegular(path, size: expectedSize)
        defer { close(fd) }
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        var total: Int64 = 0
        while true {
            // Fill the buffer (a short read is not the end of the file).
            var filled = 0
            while filled < chunkSize {
                let count = Foundation.read(fd, buffer + filled, chunkSize - filled)
                if count < 0 && errno == EINTR { continue }
                guard count >= 0 else { throw ExternalStorageError.Problem.fileOperationFailed(operation: "reading the file", code: errno) }
                if count == 0 { break }
                filled += count
            }
            if filled == 0 { break }
            total += Int64(filled)
            if let expectedSize, total > expectedSize {
                throw ExternalStorageError.Problem.sizeMismatch(expected: Int(expectedSize), found: Int(total))
            }
            try body(UnsafeRawPointer(buffer), filled)
            if filled < chunkSize { break }
        }
        if let expectedSize, total != expectedSize {
            throw ExternalStorageError.Problem.sizeMismatch(expected: Int(expectedSize), found: Int(total))
        }
    }
}
