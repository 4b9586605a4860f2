import Foundation

extension Reference {
    /// The referenced model as `context` sees it (its unsaved changes included): the carried one when there is one,
    /// else `context.model(Target.self, id: id)`.
    /// - Returns: the target, or `nil` when no record `id` exists in `context`.
    /// - Throws: as ``ModelContext/model(_:id:)``.
    public func load(in context: ModelContext) throws -> Target? {
        if let resolved { return resolved }
        return try context.model(Target.self, id: id)
    }
}
