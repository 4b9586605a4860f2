import Foundation
@testable import Replica

/// A container with one in-memory store "main" of `models` (synced unless `synced` is false), on a seeded environment.
func inMemoryContainer(seed: UInt64, synced: Bool = true, models: [any PersistentModel.Type]) throws -> ModelContainer {
    let environment = ReplicaEnvironment.seeded(seed: seed, directory: FileManager.default.temporaryDirectory
        .appendingPathComponent("replica-memory-\(UUID().uuidString)"))
    return try ModelContainer(for: Schema(models), configurations: [
        ModelConfiguration("main", isStoredInMemoryOnly: true, cloudKitDatabase: synced ? .private("iCloud.test") : .none),
    ], environment: environment)
}

/// The SQLite handle of the connection the container's first store hands out next (given back at once).
func nextConnectionHandle(_ container: ModelContainer) throws -> OpaquePointer {
    let store = container.stores[0]
    let connection = try store.openConnection()
    defer { store.reuse(connection) }
    return connection.handle
}
