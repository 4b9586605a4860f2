import Foundation

/// Which entities a query reads: what decides which committed changes can change its result. Internal (live
/// queries and their change filter use it).
extension ModelContext {
    /// The entities a fetch of `descriptor` reads: its own; those its predicate and sort reach through relationships
    /// (joins, subqueries and link tables, recorded while planning it); the destinations of the to-many members it
    /// loads; and the relationships it prefetches or resolves for an in-memory predicate or sort, with their own
    /// to-many members, level by level. A change to any other entity cannot change the result. Plans the query
    /// without running it.
    /// - Throws: as ``queryPlan(for:)``.
    func entitiesRead<Model: PersistentModel>(by descriptor: FetchDescriptor<Model>) throws -> Set<String> {
        let engine = try queryEngine(Model.self, includePendingChanges: false)
        engine.readEntities = [Model.entity.name]
        let plan = try engine.plan(descriptor)
        var entities = engine.readEntities ?? []
        var tree = plan.prefetchTree
        tree.merge(plan.residualTree)
        addReads(of: Model.entity.schemaEntity, toMany: plan.toManyNames, tree: tree, into: &entities)
        return entities
    }

    /// The entities one record of `entityName` read by ID reads (its own and its to-many members' destinations).
    func entitiesRead(byIdentifierOf entity: Schema.Entity) -> Set<String> {
        var entities: Set<String> = [entity.name]
        addReads(of: entity, toMany: nil, tree: PrefetchTree(), into: &entities)
        return entities
    }

    /// Adds what loading records of `entity` reads: the destinations of its to-many relationships in `toMany` (all
    /// when `nil`), and for each relationship of `tree`, the destination and what loading it reads (every to-many
    /// member: targets are loaded whole).
    private func addReads(of entity: Schema.Entity, toMany: Set<String>?, tree: PrefetchTree, into entities: inout Set<String>) {
        for relationship in entity.relationships where relationship.isToMany && (toMany?.contains(relationship.name) ?? true) {
            entities.insert(relationship.destination)
        }
        for (name, subtree) in tree.children {
            guard let relationship = entity.relationship(named: name),
                  let destination = container.schema.entity(named: relationship.destination) else { continue }
            entities.insert(destination.name)
            addReads(of: destination, toMany: nil, tree: subtree, into: &entities)
        }
    }
}
