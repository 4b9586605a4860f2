import Foundation
import Synchronization

/// Loads the targets of the references one context hands out, on demand (see ``Reference``). Internal.
///
/// Owned by its context (``ModelContext/handoutLoader``); every unresolved reference the context hands out carries
/// it. Models are `Sendable` values that may be read on any task, so the loader never touches its context: it loads
/// through a private context of its own (its own connections), and all its state is behind one lock — a read
/// through a reference is safe from any thread. Loaded targets are cached until the owning context saves
/// (``invalidate()``); when the owning context goes away the loader is closed (``close()``): it frees its
/// connections and cache, and further loads throw ``ReplicaError/noContextForReference(_:)``.
final class ReferenceLoader: ReferenceLoading, Sendable {
    private struct State {
        /// `nil` once closed.
        var container: ModelContainer?
        /// Made on first load; loads read the store's saved state through it.
        var context: ModelContext?
        /// Loaded targets by identifier.
        var cache: [PersistentIdentifier: Cached] = [:]
    }

    private enum Cached {
        case found(any Sendable)
        case missing
    }

    private let state: Mutex<State>

    init(container: ModelContainer) {
        state = Mutex(State(container: container))
    }

    /// The target `id` of `type`: cached, else read by ID (one query, plus one per to-many relationship of `type`).
    /// - Returns: the model, or `nil` when no such record exists.
    /// - Throws: ``ReplicaError/noContextForReference(_:)`` once closed; ``SQLiteError`` and
    ///   ``ReplicaError/valueConversion(_:)`` from the read.
    func target<T: PersistentModel>(_ type: T.Type, id: UUID) throws -> T? {
        let key = PersistentIdentifier(entityName: T.entity.name, id: id)
        return try state.withLock { state throws -> T? in
            guard let container = state.container else { throw ReplicaError.noContextForReference(key) }
            switch state.cache[key] {
            case let .found(model)?: return model as? T
            case .missing?: return nil
            case nil: break
            }
            let context: ModelContext
            if let existing = state.context {
                context = existing
            } else {
                context = ModelContext(container)
                context.lendHandoutLoader(self)
                state.context = context
            }
            let model = try context.loadTarget(T.self, id: id)
            state.cache[key] = model.map { .found($0) } ?? .missing
            return model
        }
    }

    /// Forgets every loaded target (the owning context saved: targets may have changed).
    func invalidate() {
        state.withLock { $0.cache.removeAll() }
    }

    /// Frees the loader's connections and cache; later loads throw. Called when the owning context goes away.
    func close() {
        // Releasing the private context gives its connections back to their stores; it never calls this loader.
        state.withLock { $0 = State(container: nil) }
    }
}
