import Foundation

/// Reading by ``PersistentIdentifier``: how models are handed between actors and tasks (SwiftData's
/// `model(for:)` / `registeredModel(for:)`). Models are `Sendable` values and identifiers are `Sendable`, so either can
/// cross an isolation boundary; a context cannot (see ``ModelContext``), so the receiving side reads the record
/// through its own context.
extension ModelContext {
    /// The record `id` as this context sees it (its unsaved changes included), following this context's upserts
    /// (see ``resolvedIdentifier(for:)``), or `nil` when there is no such record.
    ///
    /// SwiftData's `model(for:)` returns a model of whichever class the identifier names; Replica's models are value
    /// types read by type, so the caller names it. Registers the model as a base of change tracking, as a fetch does.
    /// - Parameters:
    ///   - id: the record's identifier (from ``PersistentModel/persistentModelID``, a fetch of identifiers, history or
    ///     the change stream).
    ///   - type: the model type of `id`'s entity.
    /// - Returns: the model, or `nil` when no record `id` exists or `id` names another entity than `Model`'s.
    /// - Throws: ``SQLiteError``, ``ReplicaError/valueConversion(_:)``.
    /// - Complexity: one query by ID, plus one per to-many relationship.
    public func model<Model: PersistentModel>(for id: PersistentIdentifier, as type: Model.Type = Model.self) throws -> Model? {
        let resolved = resolvedIdentifier(for: id)
        guard resolved.entityName == Model.entity.name else { return nil }
        return try model(Model.self, id: resolved.id)
    }

    /// The record `id` if this context holds it without reading the store: a pending insert or update (its pending
    /// values), and `nil` otherwise — also for a pending delete. SwiftData's `registeredModel(for:)`: a value-type
    /// model has no registered instance, so "registered" means "changed and not yet saved here".
    /// - Throws: ``ValueConversionError`` when the pending values do not decode as `Model`.
    /// - Complexity: O(1) lookup, O(fields) decoding.
    public func registeredModel<Model: PersistentModel>(for id: PersistentIdentifier, as type: Model.Type = Model.self) throws -> Model? {
        let resolved = resolvedIdentifier(for: id)
        guard resolved.entityName == Model.entity.name, let snapshot = pendingSnapshot(of: resolved) else { return nil }
        return try Model.entity.model(from: snapshot)
    }
}
