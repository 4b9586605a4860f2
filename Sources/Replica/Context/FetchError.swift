import Foundation

/// Errors of fetches and batch operations (SwiftData's fetch errors: `.unsupportedKeyPath`, `.unsupportedPredicate`,
/// `.unsupportedSortDescriptor`). Like ``ReplicaError``, no case carries attribute values.
public enum FetchError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A predicate, sort descriptor, `propertiesToFetch` or `relationshipKeyPathsForPrefetching` names a key path
    /// that is not an attribute or relationship of the entity (a computed property, say).
    case unsupportedKeyPath(entity: String, keyPath: String)
    /// The descriptor forbids in-memory evaluation (``FetchDescriptor/allowsInMemoryEvaluation`` is `false`) and
    /// these parts of the predicate cannot be translated to SQL (SwiftData's `preferInMemoryFilter`).
    case unsupportedPredicate(reasons: [String])
    /// The descriptor forbids in-memory evaluation and these sort descriptors cannot be translated to SQL
    /// (SwiftData's `preferInMemorySort`).
    case unsupportedSortDescriptor(reasons: [String])
    /// Evaluating part of a predicate in memory needs the target of a reference that does not exist (a dangling
    /// reference left by the `noAction` delete rule or by an outside writer).
    case unresolvableReference(PersistentIdentifier, relationship: String)
    /// A batch size or other numeric parameter is out of range.
    case invalidArgument(String)
    /// An ``EntityHierarchy`` is inconsistent: a member type is not a `Base`, lacks an inherited attribute, is not in
    /// the container, or the members live in different stores.
    case invalidHierarchy(String)

    public var description: String {
        switch self {
        case let .unsupportedKeyPath(entity, keyPath):
            return "\(keyPath) is not an attribute or relationship of \(entity)"
        case let .unsupportedPredicate(reasons):
            return "the predicate needs in-memory evaluation, which the descriptor forbids: " + reasons.joined(separator: "; ")
        case let .unsupportedSortDescriptor(reasons):
            return "the sort needs in-memory evaluation, which the descriptor forbids: " + reasons.joined(separator: "; ")
        case let .unresolvableReference(id, relationship):
            return "\(id): the target of '\(relationship)' does not exist, so the predicate cannot be evaluated in memory"
        case let .invalidArgument(text): return text
        case let .invalidHierarchy(text): return "invalid entity hierarchy: \(text)"
        }
    }
}
