import Foundation

/// A context's autosave settings and state.
struct AutosaveState {
    var isEnabled = false
    /// An autosave is scheduled and has not run yet.
    var isScheduled = false
    /// A save is running (an autosave waits for the next turn).
    var isSaving = false
    /// How the context gets a turn of its own after the current one: for ``ModelContainer/mainContext`` a main actor
    /// task, for a ``DefaultSerialModelExecutor``'s context a block on its queue, for a context made on an actor a task
    /// on that actor; `nil` for a context made in nonisolated code.
    var scheduler: (@Sendable () -> Void)?
    var lastError: (any Error)?
    var errorHandler: ((any Error) -> Void)?
}

// Autosave (SwiftData's `autosaveEnabled`). **When it saves:** at the end of the current turn of the context's
// isolation domain — for the main context, in a main-actor task enqueued when the first change after a save is
// registered, so it runs once the code that registered the change (and everything else already enqueued on the main
// actor) returns or suspends; for a ModelActor's context, in a block on its executor's serial queue, after the actor's
// current job. So all the changes one synchronous stretch of code registers are saved together, in one save (one
// history transaction, one change-stream event), never part-way through it, and never inside another save. No timer and
// no clock are involved (a debounce would need one, and library code waits on no wall clock). Code that wants several
// turns' changes in one save turns autosave off for them, or calls `save()` itself.

/// A context and the actor it belongs to, held weakly for its autosave task. `@unchecked Sendable`: the context is
/// only touched in a job isolated to that actor, the context's own isolation domain.
final class AutosaveTarget: @unchecked Sendable {
    weak var context: ModelContext?
    weak var actor: (any Actor)?

    init(context: ModelContext, actor: any Actor) {
        self.context = context
        self.actor = actor
    }
}

extension ModelContext {
    /// Whether the context saves its changes by itself at the end of the current turn (see the comment in
    /// Autosave.swift): after a change is registered, the context saves once the code running in its isolation domain
    /// returns or suspends. On by default for ``ModelContainer/mainContext`` and off for other contexts, as in SwiftData.
    ///
    /// A context autosaves in its isolation domain: the main context on the main actor, a ``ModelActor``'s context
    /// on its executor, and a context made with ``init(_:isolation:)`` on the actor whose code made it (after that
    /// actor's current job, as for the main context). A context made in nonisolated code has no turn to save at:
    /// setting `autosaveEnabled` there has no effect (it stays `false`, nothing traps) and it saves when you call
    /// ``save()``. A context handed (`sending`) to another domain keeps the one it was made in: enable autosave
    /// only where the context was made. An autosave that fails is reported through ``autosaveError`` and
    /// ``autosaveErrorHandler``, and its changes stay pending.
    public var autosaveEnabled: Bool {
        get { autosave.isEnabled }
        set {
            autosave.isEnabled = newValue && autosave.scheduler != nil
            if autosave.isEnabled && hasChanges { scheduleAutosave() }
        }
    }

    /// The error of the last autosave, when it failed (its changes stay pending); `nil` after any successful save.
    public var autosaveError: (any Error)? { autosave.lastError }

    /// Called with the error of each autosave that fails, in the context's isolation domain (after ``autosaveError``
    /// is set). The changes stay pending: fix them (or ``rollback()``), and the next change or ``save()`` saves again.
    public var autosaveErrorHandler: ((any Error) -> Void)? {
        get { autosave.errorHandler }
        set { autosave.errorHandler = newValue }
    }

    /// Makes the context able to autosave through `scheduler`, which must run ``runScheduledAutosave()`` on the
    /// context's isolation domain after the current turn, and sets ``autosaveEnabled``.
    func bindAutosave(enabled: Bool, scheduler: @escaping @Sendable () -> Void) {
        autosave.scheduler = scheduler
        autosave.isEnabled = enabled
    }

    /// A scheduler that runs `context`'s scheduled autosave on `actor`, the isolation domain the context was made in,
    /// after the actor's current job. It holds neither weakly.
    static func autosaveScheduler(for context: ModelContext, on actor: any Actor) -> @Sendable () -> Void {
        let target = AutosaveTarget(context: context, actor: actor)
        return {
            guard let actor = target.actor else { return }
            Task { await runAutosave(of: target, on: actor) }
        }
    }

    private static func runAutosave(of target: AutosaveTarget, on actor: isolated any Actor) {
        target.context?.runScheduledAutosave()
    }

    /// Schedules one autosave at the end of the current turn (nothing when one is scheduled already).
    func scheduleAutosave() {
        guard autosave.isEnabled, !autosave.isScheduled, let scheduler = autosave.scheduler else { return }
        autosave.isScheduled = true
        scheduler()
    }

    /// Runs a scheduled autosave: saves pending changes, reporting an error through ``autosaveError`` and
    /// ``autosaveErrorHandler``.
    func runScheduledAutosave() {
        autosave.isScheduled = false
        guard autosave.isEnabled, hasChanges else { return }
        if autosave.isSaving {
            scheduleAutosave()
            return
        }
        do {
            try save()
        } catch {
            autosave.lastError = error
            autosave.errorHandler?(error)
        }
    }
}
