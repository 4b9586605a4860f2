// The observers-agree invariant: every process observes one live query per entity of each of its stores, from the
// moment it starts, through every save, sync import, crash and other-process commit of the run; at every quiescent
// point (each time the run settles) and at every state digest (every `digestEvery` steps of chaos) each live query,
// caught up, must equal a fresh fetch. Checking mid-chaos too keeps the queries' values moving with the run, so that
// a change they fail to notice (say, the last imports after heal) leaves them stale at the end.
//
// The live queries are Replica's synchronous observers (`SynchronousLiveQuery`, SPI): they fetch through the
// process's own context on the simulator's thread and read other processes' commits only when asked, so the run stays
// single-threaded and deterministic. They add no trace line unless the invariant fails.

import Foundation
@_spi(Simulation) import Replica

/// One live query of all records of one entity, in ID order.
protocol EntityObserver: AnyObject {
    /// Catches up with the store's commits and fetches again if one concerned the query.
    func refresh() throws
    /// The query's current value, as (ID, field values) in ID order.
    var records: [(id: UUID, values: [SQLiteValue])] { get }
    /// A fresh fetch of the same query through `context`.
    func fresh(_ context: ModelContext) throws -> [(id: UUID, values: [SQLiteValue])]
}

private final class TypedEntityObserver<S: EntitySlot>: EntityObserver {
    let query: SynchronousLiveQuery<[DynamicRecord<S>]>
    init(_ query: SynchronousLiveQuery<[DynamicRecord<S>]>) { self.query = query }
    func refresh() throws { try query.refresh() }
    var records: [(id: UUID, values: [SQLiteValue])] { query.value.map { ($0.id, $0.values) } }
    func fresh(_ context: ModelContext) throws -> [(id: UUID, values: [SQLiteValue])] {
        try context.fetch(TypedEntityObserver.descriptor).map { ($0.id, $0.values) }
    }

    /// Every record, committed state only (a workload step's unsaved changes are no commit).
    static var descriptor: FetchDescriptor<DynamicRecord<S>> {
        var descriptor = FetchDescriptor<DynamicRecord<S>>()
        descriptor.includePendingChanges = false
        return descriptor
    }
}

/// Makes the live query of an entity shape (through its typed accessor).
protocol ObservableEntityAccess {
    func observer(in container: ModelContainer, context: ModelContext) throws -> any EntityObserver
}

extension TypedEntityAccess: ObservableEntityAccess {
    func observer(in container: ModelContainer, context: ModelContext) throws -> any EntityObserver {
        TypedEntityObserver<S>(try SynchronousLiveQuery(container.observe(TypedEntityObserver<S>.descriptor), context: context))
    }
}

/// The live queries of every process, by process. Replaced when a process starts again.
struct ProcessObservers {
    struct Observed {
        /// The context the queries fetch through (the process's context when they were made).
        let context: ModelContext
        var queries: [(store: String, entity: String, observer: any EntityObserver)]
    }

    var byProcess: [ObjectIdentifier: Observed] = [:]
}

extension SimulationRun {
    /// Starts the live queries of `process` (just started, or started again after a crash): one per entity of each of
    /// its stores, through its context.
    func observeStores(of process: SimProcess) throws {
        guard let container = process.container, let context = process.context else { return }
        var observed = ProcessObservers.Observed(context: context, queries: [])
        for store in process.stores {
            // The process's own app version: an app-group extension may run another one than its app.
            for entity in process.view.entities(of: store) {
                guard let access = process.view.info(entity).access as? ObservableEntityAccess else { continue }
                observed.queries.append((store.name, entity.name, try access.observer(in: container, context: context)))
            }
        }
        observers.byProcess[ObjectIdentifier(process)] = observed
    }

    /// The observers-agree invariant (at a quiescent point or a state digest): every running process's live queries,
    /// caught up, equal a fresh fetch through the same context.
    func checkObservers() throws {
        for device in devices {
            for process in device.processes where process.isUp {
                guard let context = process.context, let observed = observers.byProcess[ObjectIdentifier(process)],
                      observed.context === context else { continue }
                for (store, entityName, observer) in observed.queries {
                    try observer.refresh()
                    let live = observer.records
                    let fresh = try observer.fresh(context)
                    guard !live.elementsEqual(fresh, by: { $0.id == $1.id && $0.values == $1.values }) else { continue }
                    let liveIDs = Set(live.map(\.id)), freshIDs = Set(fresh.map(\.id))
                    let detail: String
                    if let missing = fresh.first(where: { !liveIDs.contains($0.id) }) {
                        detail = "it lacks \(alias(missing.id))"
                    } else if let extra = live.first(where: { !freshIDs.contains($0.id) }) {
                        detail = "it still holds \(alias(extra.id))"
                    } else if let stale = zip(live, fresh).first(where: { $0.values != $1.values }) {
                        detail = "its copy of \(alias(stale.0.id)) is stale"
                    } else {
                        detail = "its order differs"
                    }
                    throw InvariantViolation(.observersAgree, "\(process.label) store '\(store)': the live query of \(entityName) "
                        + "(\(live.count) records) differs from a fresh fetch (\(fresh.count)): \(detail)")
                }
            }
        }
    }
}
