import Foundation

/// Loads the target of a ``Reference`` on demand, for the context that handed the reference out. Internal.
///
/// Declared here so that `Reference` need not know the context: Context/ implements it (`ReferenceLoader`, one per
/// context), and the unresolved references a context hands out carry it.
protocol ReferenceLoading: AnyObject, Sendable {
    /// The target `id` of `type`, or `nil` when no such record exists.
    /// - Throws: ``ReplicaError/noContextForReference(_:)`` once the owning context is gone; storage errors of the read.
    func target<T: PersistentModel>(_ type: T.Type, id: UUID) throws -> T?
}
