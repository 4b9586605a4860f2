import Dispatch
import Foundation

// Concurrency in SwiftData's shape: a context belongs to one isolation domain. The main actor has the container's
// `mainContext`; background work runs in an actor that adopts `ModelActor`, whose serial executor owns a context of
// its own. Work moves between them as `PersistentIdentifier`s (or `Sendable` model values), never as contexts:
// `ModelContext` is not `Sendable`.

/// Never `Sendable`: a context owns SQLite connections and unsaved changes and is used from one isolation domain (the
/// main actor for ``ModelContainer/mainContext``, a ``ModelActor`` for its ``ModelActor/modelContext``, or one task).
/// Hand records to another domain by ``PersistentIdentifier`` and read them there with ``ModelContext/model(for:as:)``.
@available(*, unavailable, message: "a ModelContext stays in one isolation domain; pass PersistentIdentifiers instead")
extension ModelContext: Sendable {}

/// An object that owns a model context and runs the work that uses it (SwiftData's `ModelExecutor`).
public protocol ModelExecutor: AnyObject, Sendable {
    /// The context; use it only on this executor.
    var modelContext: ModelContext { get }
}

/// A ``ModelExecutor`` that is a serial executor: an actor whose executor it is runs every job on it, one at a time,
/// so the context is only ever used from that actor's isolation (SwiftData's `SerialModelExecutor`).
public protocol SerialModelExecutor: ModelExecutor, SerialExecutor {}

/// The serial executor of a ``ModelActor`` and the owner of its context (SwiftData's `DefaultSerialModelExecutor`):
/// jobs run one at a time on a serial dispatch queue of its own, and ``modelContext`` traps when read anywhere else.
///
/// `@unchecked Sendable` because the context it holds is not `Sendable`; what makes sharing the executor safe is that
/// the context is reachable only from jobs running on the executor's queue (checked at run time).
public final class DefaultSerialModelExecutor: SerialModelExecutor, @unchecked Sendable {
    private let context: ModelContext
    private let queue: DispatchQueue
    private let onQueue = DispatchSpecificKey<ObjectIdentifier>()

    /// An executor owning `modelContext`, which nothing else may hold (the parameter is `sending`).
    public init(modelContext: sending ModelContext) {
        self.context = modelContext
        self.queue = DispatchQueue(label: "Replica.DefaultSerialModelExecutor")
        queue.setSpecific(key: onQueue, value: ObjectIdentifier(self))
        // Autosave (off by default, as in SwiftData) runs after the actor's current job, on the same queue.
        context.bindAutosave(enabled: false) { [weak self] in
            guard let self else { return }
            self.queue.async { [weak self] in self?.context.runScheduledAutosave() }
        }
    }

    /// An executor owning a new context on `modelContainer`.
    public convenience init(modelContainer: ModelContainer) {
        self.init(modelContext: ModelContext(modelContainer))
    }

    /// The executor's context. Traps when read off the executor (from outside the actor it serves): a programming error.
    public var modelContext: ModelContext {
        precondition(isCurrent, "Replica: a ModelActor's modelContext was used outside the actor; pass PersistentIdentifiers "
            + "across actors and read them with the receiving side's own context")
        return context
    }

    /// Whether the calling code runs on this executor.
    private var isCurrent: Bool { DispatchQueue.getSpecific(key: onQueue) == ObjectIdentifier(self) }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }

    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Lets `assumeIsolated` and isolation checks accept code running on this executor's queue.
    public func checkIsolated() {
        precondition(isCurrent, "Replica: not on the ModelActor's executor")
    }
}

/// An actor that reads and writes through a context of its own, on a serial executor that owns it (SwiftData's
/// `ModelActor`). Without the `@ModelActor` macro (no macro package here), write out the two properties and an init:
///
/// ```swift
/// actor Importer: ModelActor {
///     let modelContainer: ModelContainer
///     let modelExecutor: any ModelExecutor
///
///     init(modelContainer: ModelContainer) {
///         self.modelContainer = modelContainer
///         self.modelExecutor = DefaultSerialModelExecutor(modelContainer: modelContainer)
///     }
///
///     func rename(_ id: PersistentIdentifier, to name: String) throws {
///         guard var trip = try modelContext.model(for: id, as: Trip.self) else { return }
///         trip.name = name
///         modelContext.update(trip)
///         try modelContext.save()
///     }
/// }
/// ```
///
/// The actor runs on its ``modelExecutor`` (which must be a ``SerialModelExecutor``, as ``DefaultSerialModelExecutor``
/// is), so ``modelContext`` is used from the actor's isolation only. Its saves reach ``ModelContainer/changes`` like
/// any other; the main actor's ``ModelContainer/mainContext`` sees them on its next read.
public protocol ModelActor: Actor {
    /// The container the actor's context works on.
    nonisolated var modelContainer: ModelContainer { get }
    /// The executor that owns the actor's context and runs the actor's jobs.
    nonisolated var modelExecutor: any ModelExecutor { get }
}

extension ModelActor {
    /// The actor's executor: its ``modelExecutor``. Traps when that is not a ``SerialModelExecutor`` (a programming
    /// error: the context would not be bound to the actor).
    public nonisolated var unownedExecutor: UnownedSerialExecutor {
        guard let serial = modelExecutor as? any SerialModelExecutor else {
            preconditionFailure("Replica: a ModelActor's modelExecutor must be a SerialModelExecutor (DefaultSerialModelExecutor)")
        }
        return serial.asUnownedSerialExecutor()
    }

    /// The actor's context (its executor's).
    public var modelContext: ModelContext { modelExecutor.modelContext }
}
