import Foundation

/// What to fetch: a predicate, a sort order, paging and loading options (SwiftData's `FetchDescriptor`), over
/// Foundation's own `#Predicate` and `SortDescriptor`.
///
/// The predicate and sort run in SQL (see ``ModelContext/queryPlan(for:)-(FetchDescriptor<Model>)``). Parts that have no SQL form are
/// evaluated in memory after the SQL part, with the same results, unless ``allowsInMemoryEvaluation`` is `false`.
public struct FetchDescriptor<Model: PersistentModel>: @unchecked Sendable {
    // @unchecked: key paths are immutable; predicates and sort descriptors are Sendable.

    /// Only models for which this evaluates to `true` are returned; `nil` returns every model.
    public var predicate: Predicate<Model>?
    /// Sort keys, most significant first. `nil` sorts first in forward order and last in reverse order (as
    /// Foundation sorts optionals). Records that compare equal are ordered by ID (creation order), so results are
    /// always deterministic.
    ///
    /// Key paths to attributes and to members of composite attributes sort in SQL. Others (through relationships,
    /// like `\.trip?.name`, or with a string comparator) sort in memory, after resolving to-one relationships two
    /// levels deep.
    public var sortBy: [SortDescriptor<Model>]
    /// At most this many models are returned.
    public var fetchLimit: Int?
    /// This many models (after sorting) are skipped.
    public var fetchOffset: Int?
    /// Whether unsaved inserts, updates and deletes of the context are reflected in the result, members of to-many
    /// relationships included (default `true`). They take part in the SQL (predicate, sort, paging, relationships)
    /// through temporary tables.
    public var includePendingChanges: Bool
    /// Attributes and relationships to read (default: all). Others get their declared default value, or `nil`;
    /// attributes without a default and required relationships are always read.
    ///
    /// Models fetched this way are partial. Updating one writes only the fields the app changed (field-level change
    /// tracking), so the properties that were not read keep their stored values.
    public var propertiesToFetch: [PartialKeyPath<Model>]
    /// Relationships whose targets are loaded with the models (one query per relationship, not one per model) and
    /// attached as resolved ``Reference``s, so that `model.trip?.resolved` and `model.trip?.name` work.
    public var relationshipKeyPathsForPrefetching: [PartialKeyPath<Model>]
    /// Whether parts of the predicate or sort that have no SQL form may be evaluated in memory (default `true`).
    /// When `false`, such a fetch throws ``FetchError/unsupportedPredicate(reasons:)`` or
    /// ``FetchError/unsupportedSortDescriptor(reasons:)`` instead.
    public var allowsInMemoryEvaluation: Bool

    public init(predicate: Predicate<Model>? = nil, sortBy: [SortDescriptor<Model>] = []) {
        self.predicate = predicate
        self.sortBy = sortBy
        self.fetchLimit = nil
        self.fetchOffset = nil
        self.includePendingChanges = true
        self.propertiesToFetch = []
        self.relationshipKeyPathsForPrefetching = []
        self.allowsInMemoryEvaluation = true
    }
}
