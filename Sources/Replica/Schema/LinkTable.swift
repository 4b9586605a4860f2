import Foundation

/// The link table of one many-to-many relationship pair. Internal.
///
/// A many-to-many relationship is two to-many relationships that are each other's inverse. Their links live in one
/// table, `replica_link_<Entity>_<relationship>`, named after the pair's *owner* side: the smaller of
/// (entity name, relationship name) of the two sides. Columns: `owner` (ID of the owner side's record) and `member`
/// (ID of the other side's record), primary key `(owner, member)`, `WITHOUT ROWID`, with an index on
/// `(member, owner)` for the other direction. A relationship that is its own inverse stores each link once, from
/// the record that holds it.
struct LinkTable: Equatable {
    let name: String
    let ownerEntity: String
    let ownerRelationship: String
    let memberEntity: String
    let memberRelationship: String

    /// The link table of `relationship` of `entity`, when it is many-to-many (`destination` is its target entity).
    static func of(_ relationship: Schema.Relationship, in entity: String, destination: Schema.Entity) -> LinkTable? {
        guard relationship.isToMany, let inverseName = relationship.inverse,
              let inverse = destination.relationship(named: inverseName), inverse.isToMany else { return nil }
        let this = (entity, relationship.name)
        let other = (destination.name, inverseName)
        let (owner, member) = this <= other ? (this, other) : (other, this)
        return LinkTable(name: "replica_link_\(owner.0)_\(owner.1)", ownerEntity: owner.0, ownerRelationship: owner.1,
                         memberEntity: member.0, memberRelationship: member.1)
    }

    /// The column holding the ID of a record of `entity` seen through `relationship`, and the column of the
    /// records it links to.
    func columns(entity: String, relationship: String) -> (this: String, other: String) {
        entity == ownerEntity && relationship == ownerRelationship ? ("owner", "member") : ("member", "owner")
    }

    var quotedName: String { quoted(name) }

    /// The name of the index on `(member, owner)`.
    var indexName: String { name + "_member" }

    /// Every link table of the given entities (each once, in declaration order).
    static func all(in entities: [Schema.Entity]) -> [LinkTable] {
        var result: [LinkTable] = []
        for entity in entities {
            for relationship in entity.relationships where relationship.isToMany {
                guard let destination = entities.first(where: { $0.name == relationship.destination }),
                      let table = of(relationship, in: entity.name, destination: destination),
                      !result.contains(table) else { continue }
                result.append(table)
            }
        }
        return result
    }

    /// Whether the pair is one relationship that is its own inverse (`Person.friends` ↔ `Person.friends`).
    var isOwnInverse: Bool { ownerEntity == memberEntity && ownerRelationship == memberRelationship }
}
