import Foundation

/// A context's autosave settings and state.
struct AutosaveState {
    var isEnabled = false
    /// An autosave is scheduled and has not run yet.
    var isScheduled = false
    /// A save is running (an autosave waits for the next turn).
    var isSaving = false
    /// How the context gets a turn of its own after the current one: set for ``ModelContainer/mainContext`` (a main
    /// actor task) and for a ``DefaultSerialModelExecutor``'s context (a block on its queue); `nil` for other contexts.
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

extension ModelContext {
    /// Whether the context saves its changes by itself at the end of the current turn (see the comment in
    /// Autosave.swift): after a change is registered, the context saves once the code running in its isolation domain
    /// returns or suspends. On by default for ``ModelContainer/mainContext`` and off for other contexts, as in SwiftData.
    ///
    /// Only contexts that know their isolation domain can autosave: the main context and a ``ModelActor``'s context
    /// (made by a ``DefaultSerialModelExecutor``). Setting it on a context made with ``init(_:)``, which has no turn to
    /// save at, traps (a programming error). An autosave that fails is reported through ``autosaveError`` and
    /// ``autosaveErrorHandler``, and its changes stay pending.
    public var autosaveEnabled: Bool {
        get { autosave.isEnabled }
        set {
            precondition(!newValue || autosave.scheduler != nil, "Replica: autosaveEnabled needs a context bound to an isolation "
                + "domain (ModelContainer.mainContext, or a ModelActor's context through DefaultSerialModelExecutor); "
                + "a context made with ModelContext(_:) saves when you call save()")
            autosave.isEnabled = newValue
            if newValue && hasChanges { scheduleAutosave() }
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
