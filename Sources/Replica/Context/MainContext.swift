import Foundation

/// The main actor's context of a container, made on first use. Main-actor isolated (so `Sendable`), which keeps the
/// non-`Sendable` context it holds on the main actor.
@MainActor
final class MainContextSlot {
    var context: ModelContext?
    nonisolated init() {}
}

extension ModelContainer {
    /// The context bound to the main actor (SwiftData's `mainContext`): one per container, made on first use, for the
    /// UI's reads and writes. Unlike contexts made with ``ModelContext/init(_:isolation:)``, it saves by itself
    /// (``ModelContext/autosaveEnabled`` is on). Background work uses a ``ModelActor`` with a context of its own.
    ///
    /// The main context and the container keep each other alive (the context holds its container): a container
    /// whose main context was used lives until the process ends, as an app's container does.
    @MainActor
    public var mainContext: ModelContext {
        if let context = mainContextSlot.context { return context }
        let context = ModelContext(self)
        context.bindAutosave(enabled: true) { [weak self] in
            guard let container = self else { return }
            Task { @MainActor in container.mainContextSlot.context?.runScheduledAutosave() }
        }
        mainContextSlot.context = context
        return context
    }
}
