import Foundation

/// What to fetch: a predicate, a sort order and paging (SwiftData's `FetchDescriptor`), over Foundation's own
/// `#Predicate` and `SortDescriptor`.
public struct FetchDescriptor<Model: PersistentModel>: Sendable {
    /// Only models for which this evaluates to `true` are returned; `nil` returns every model.
    public var predicate: Predicate<Model>?
    /// Sort keys, most significant first. Records that compare equal are ordered by ID (creation order), so results
    /// are always deterministic.
    public var sortBy: [SortDescriptor<Model>]
    /// At most this many models are returned.
    public var fetchLimit: Int?
    /// This many models (after sorting) are skipped.
    public var fetchOffset: Int?
    /// Whether unsaved inserts, updates and deletes of the context are reflected in the result, members of to-many
    /// relationships included (default `true`).
    public var includePendingChanges: Bool

    public init(predicate: Predicate<Model>? = nil, sortBy: [SortDescriptor<Model>] = []) {
        self.predicate = predicate
        self.sortBy = sortBy
        self.fetchLimit = nil
        self.fetchOffset = nil
        self.includePendingChanges = true
    }
}
