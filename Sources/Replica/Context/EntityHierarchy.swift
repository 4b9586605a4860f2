import Foundation

/// An entity hierarchy: SwiftData's model inheritance for value-type models.
///
/// Swift structs cannot subclass, so a hierarchy is a **base protocol** adopted by several model types: the base
/// entity's own model type and one model type per subentity, each declaring its entity as usual (inherited
/// attributes included). `Base` is the existential of that protocol (`any Media`), so fetched values keep their
/// concrete type and predicates can test it with `is` and `as?`:
///
/// ```swift
/// protocol Media: PersistentModel { var title: String { get set }; var year: Int { get set } }
/// struct MediaItem: Media { ... }                 // records of the base entity itself
/// struct Book: Media { ...; var pages: Int }      // a subentity
/// struct Movie: Media { ...; var minutes: Int }   // another subentity
///
/// let media = EntityHierarchy<any Media>(base: MediaItem.self, subentities: [Book.self, Movie.self],
///                                        inherited: [.id(\.id), .attribute("title", \.title), .attribute("year", \.year)])
/// let long = try context.fetch(HierarchyFetchDescriptor(media, predicate: #Predicate {
///     $0.year > 2000 && ($0 is Movie || (($0 as? Book)?.pages ?? 0) > 300)
/// }, sortBy: [SortDescriptor(\.title)]))          // [any Media]: MediaItems, Books and Movies
/// ```
///
/// **Storage layout: one table per concrete entity** ("concrete table inheritance"). Each member entity keeps its
/// own table with the inherited columns repeated, so fetching one concrete type reads one table with no joins and
/// no type column, and saving is unchanged. A fetch through the hierarchy is one `UNION ALL` query over the member
/// tables, sorted and paged in SQL; the predicate is translated once per member, so `$0 is Book` and
/// `$0 as? Book` become constants per table. A `FetchDescriptor<MediaItem>` returns only the base entity's own
/// records. Limits: uniqueness constraints hold per table, not across the hierarchy; a relationship points to one
/// concrete entity, not to the hierarchy; all members live in one store.
public struct EntityHierarchy<Base>: @unchecked Sendable {
    // @unchecked: metatypes and key paths are immutable.

    /// A member of the base protocol that every entity of the hierarchy stores under the same name.
    public struct Inherited: @unchecked Sendable {
        let name: String
        let keyPath: AnyKeyPath

        /// An inherited attribute or relationship named `name`, read through `keyPath` on `Base`.
        public static func attribute<Value>(_ name: String, _ keyPath: KeyPath<Base, Value>) -> Inherited {
            Inherited(name: name, keyPath: keyPath)
        }

        /// An inherited relationship (the same as ``attribute(_:_:)``; named for clarity).
        public static func relationship<Value>(_ name: String, _ keyPath: KeyPath<Base, Value>) -> Inherited {
            Inherited(name: name, keyPath: keyPath)
        }

        /// The record ID (`\.id`), so that predicates may compare `$0.id`.
        public static func id(_ keyPath: KeyPath<Base, UUID>) -> Inherited {
            Inherited(name: "id", keyPath: keyPath)
        }
    }

    /// The base entity's own model type.
    public let base: any PersistentModel.Type
    /// The subentities' model types.
    public let subentities: [any PersistentModel.Type]
    /// Inherited members by key path on `Base`.
    let inherited: [AnyKeyPath: String]

    /// Declares a hierarchy.
    /// - Parameters:
    ///   - base: the model type of the base entity's own records.
    ///   - subentities: the model types of the subentities; each must conform to the base protocol.
    ///   - inherited: the base protocol's members that predicates and sort descriptors may use, by stored name.
    public init(base: any PersistentModel.Type, subentities: [any PersistentModel.Type], inherited: [Inherited]) {
        self.base = base
        self.subentities = subentities
        var map: [AnyKeyPath: String] = [:]
        for member in inherited { map[member.keyPath] = member.name }
        self.inherited = map
    }

    /// The member types a fetch reads: the base, and the subentities when `includeSubentities`.
    func members(includeSubentities: Bool) -> [any PersistentModel.Type] {
        [base] + (includeSubentities ? subentities : [])
    }
}

/// What to fetch from an ``EntityHierarchy``: like ``FetchDescriptor``, over the base protocol's existential.
public struct HierarchyFetchDescriptor<Base>: @unchecked Sendable {
    // @unchecked: predicates and sort descriptors are Sendable; the hierarchy is immutable.

    /// The hierarchy to read.
    public var hierarchy: EntityHierarchy<Base>
    /// Only values for which this evaluates to `true` are returned; type checks (`$0 is Book`) and conditional
    /// casts (`($0 as? Book)?.pages`) against member types translate to SQL.
    public var predicate: Predicate<Base>?
    /// Sort keys over inherited members, most significant first; ties are ordered by ID.
    public var sortBy: [SortDescriptor<Base>]
    /// At most this many values are returned.
    public var fetchLimit: Int?
    /// This many values (after sorting) are skipped.
    public var fetchOffset: Int?
    /// Whether subentities' records are included (default `true`); `false` reads the base entity only.
    public var includeSubentities: Bool
    /// Whether unsaved changes of the context are reflected in the result (default `true`).
    public var includePendingChanges: Bool
    /// Whether parts without an SQL form may be evaluated in memory (default `true`).
    public var allowsInMemoryEvaluation: Bool

    public init(_ hierarchy: EntityHierarchy<Base>, predicate: Predicate<Base>? = nil, sortBy: [SortDescriptor<Base>] = [],
                includeSubentities: Bool = true) {
        self.hierarchy = hierarchy
        self.predicate = predicate
        self.sortBy = sortBy
        self.fetchLimit = nil
        self.fetchOffset = nil
        self.includeSubentities = includeSubentities
        self.includePendingChanges = true
        self.allowsInMemoryEvaluation = true
    }
}
