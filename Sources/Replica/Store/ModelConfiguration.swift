import Foundation

/// Describes one store of a container: which entities it holds, where its SQLite file lives, and whether it is
/// synced, shared with an app group, kept in memory or read-only (SwiftData's `ModelConfiguration`).
///
/// Every configuration is one SQLite file (or one in-memory database), with its own replica identity.
public struct ModelConfiguration: Sendable, Hashable {
    /// Whether and where the store is synced (SwiftData's `ModelConfiguration.CloudKitDatabase`).
    public enum CloudKitDatabase: Sendable, Hashable {
        /// Local only: never leaves the device.
        case none
        /// Synced to the private database of the named cloud container (e.g. `iCloud.com.example.trips`).
        /// Entities of a synced store must follow the additive-only rules (optional or defaulted attributes,
        /// optional relationships, no deny rule).
        case `private`(String)
    }

    /// Whether the store lives in an app group's shared directory (SwiftData's `ModelConfiguration.GroupContainer`).
    public enum GroupContainer: Sendable, Hashable {
        /// Not shared.
        case none
        /// Shared between the processes of the named app group (e.g. `group.com.example.trips`). The directory comes
        /// from ``ReplicaEnvironment/appGroupDirectory``.
        case identifier(String)
    }

    /// The configuration name; also the store file's base name (`<name>.store`) when no URL is given: at most 241
    /// bytes of UTF-8, and at most 231 for a store a migration plan migrates (its working copy sits beside it).
    public var name: String
    /// The entities this store holds, or `nil` for "every entity of the container schema that no other
    /// configuration names".
    public var schema: Schema?
    /// Keep the store in memory only (it lives as long as its container).
    public var isStoredInMemoryOnly: Bool
    /// `false` opens the store read-only: saves touching it are refused with ``ReplicaError/readOnlyStore(configuration:)``.
    public var allowsSave: Bool
    /// App-group sharing.
    public var groupContainer: GroupContainer
    /// Cloud sync.
    public var cloudKitDatabase: CloudKitDatabase
    /// An explicit store file location, overriding the default directory and the app group.
    public var explicitURL: URL?
    /// Whether saves record history transactions (default `true`; Core Data's persistent history tracking).
    /// Turn it off for a local store whose history nobody reads (bulk imports, caches): saves then skip the history
    /// tables, and ``ModelContext/fetchHistory(_:)`` finds no transactions of this store. Synced and app-group
    /// stores need their history (sync imports and other processes are observed through it): a container refuses
    /// them with ``ReplicaError/loadIssueModelContainer(configuration:reason:)`` when it is off.
    public var tracksHistory = true
    /// Set by a migration stage on the configuration of the store copy it opens at the stage's new schema: the
    /// stage's old schema, by which renames through original names tell a swap to make from one made already (see
    /// ``StoreRenames``). Internal.
    var migrationSource: Schema?
    /// Set by a migration stage on the configuration of the store copy (`<store file>.migrating`) it works on: the
    /// copy shares the store's asset directory and never collects it (see ``AssetStore``). A store whose own file
    /// name ends in `.migrating` is not a copy. Internal.
    var isMigrationCopy = false

    /// A configuration whose file lives in the environment's default store directory or, with `groupContainer`,
    /// in the app group's shared directory.
    public init(
        _ name: String = "default",
        schema: Schema? = nil,
        isStoredInMemoryOnly: Bool = false,
        allowsSave: Bool = true,
        groupContainer: GroupContainer = .none,
        cloudKitDatabase: CloudKitDatabase = .none
    ) {
        self.name = name
        self.schema = schema
        self.isStoredInMemoryOnly = isStoredInMemoryOnly
        self.allowsSave = allowsSave
        self.groupContainer = groupContainer
        self.cloudKitDatabase = cloudKitDatabase
        self.explicitURL = nil
    }

    /// A configuration whose store file is at `url`.
    public init(_ name: String = "default", schema: Schema? = nil, url: URL, allowsSave: Bool = true,
                cloudKitDatabase: CloudKitDatabase = .none) {
        self.init(name, schema: schema, allowsSave: allowsSave, cloudKitDatabase: cloudKitDatabase)
        self.explicitURL = url
    }

    /// `true` when the store is synced to a cloud database.
    public var isSynced: Bool {
        if case .private = cloudKitDatabase { return true }
        return false
    }

    /// The store file this configuration resolves to in `environment` (`nil` for in-memory stores).
    public func url(in environment: ReplicaEnvironment) -> URL? {
        if isStoredInMemoryOnly { return nil }
        if let explicitURL { return explicitURL }
        switch groupContainer {
        case let .identifier(group):
            return environment.appGroupDirectory(group).appendingPathComponent("\(name).store")
        case .none:
            return environment.defaultStoreDirectory.appendingPathComponent("\(name).store")
        }
    }

    /// Whether `name` can be used as a store file's base name: `<name>.store` and the files SQLite keeps beside it
    /// (`-wal`, `-shm`, and `-journal`, the longest) must fit the usual 255-byte file-name limit, so at most 241 bytes.
    /// A store that a migration plan migrates needs at most 231 (its working copy `<name>.store.migrating-journal`
    /// must fit too); a longer one is a load issue when a migration is due, which changes nothing.
    static func isValidFileName(_ name: String) -> Bool { fileNameProblem(name) == nil }

    /// The longest configuration name in UTF-8 bytes: the store file `<name>.store` and SQLite's `-journal` beside it
    /// must fit a file name (255 bytes).
    static let fileNameLimit = 255 - ".store".utf8.count - "-journal".utf8.count

    /// Why `name` cannot name a store file, or `nil` when it can.
    static func fileNameProblem(_ name: String) -> String? {
        if name.isEmpty { return "it is empty" }
        if name == "." || name == ".." { return "'.' and '..' name directories" }
        if name.contains("/") { return "it contains '/'" }
        if name.contains("\0") { return "it contains a NUL character" }
        let bytes = name.utf8.count
        if bytes > fileNameLimit { return "it is \(bytes) bytes long in UTF-8, longer than the \(fileNameLimit) bytes a store file name leaves for it" }
        return nil
    }
}
