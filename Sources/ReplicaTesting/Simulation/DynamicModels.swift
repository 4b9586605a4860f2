// Dynamic models: reading and writing records of any `Schema` (data, e.g. parsed from a scenario file) through the
// public, typed `ModelContext` API.
//
// `ModelContext` works on `PersistentModel` types, whose entity name and field layout are static. The simulator
// only knows its entities at run time, so it maps each entity *shape* (name and field names) to one of 4,096
// generic "slot" types, `DynamicRecord<Slot<A, B, C>>`, built from three type-level hex digits. The slot's static
// members read the shape from a process-wide, append-only registry; slots are never reused for another shape, so
// concurrent simulations (tests run in parallel) never disturb each other. Slot numbers never reach any output.

import Foundation
import Replica
import Synchronization

/// A type-level hexadecimal digit.
public protocol SimulationDigit { static var value: Int { get } }
// The sixteen digits (slot numbers are three of them).
/// Digit 0 (see ``SimulationDigit``); the other fifteen digits follow the same pattern.
public enum SimulationDigit0: SimulationDigit { public static var value: Int { 0 } }
public enum SimulationDigit1: SimulationDigit { public static var value: Int { 1 } }
public enum SimulationDigit2: SimulationDigit { public static var value: Int { 2 } }
public enum SimulationDigit3: SimulationDigit { public static var value: Int { 3 } }
public enum SimulationDigit4: SimulationDigit { public static var value: Int { 4 } }
public enum SimulationDigit5: SimulationDigit { public static var value: Int { 5 } }
public enum SimulationDigit6: SimulationDigit { public static var value: Int { 6 } }
public enum SimulationDigit7: SimulationDigit { public static var value: Int { 7 } }
public enum SimulationDigit8: SimulationDigit { public static var value: Int { 8 } }
public enum SimulationDigit9: SimulationDigit { public static var value: Int { 9 } }
public enum SimulationDigit10: SimulationDigit { public static var value: Int { 10 } }
public enum SimulationDigit11: SimulationDigit { public static var value: Int { 11 } }
public enum SimulationDigit12: SimulationDigit { public static var value: Int { 12 } }
public enum SimulationDigit13: SimulationDigit { public static var value: Int { 13 } }
public enum SimulationDigit14: SimulationDigit { public static var value: Int { 14 } }
public enum SimulationDigit15: SimulationDigit { public static var value: Int { 15 } }

nonisolated(unsafe) private let digitTypes: [any SimulationDigit.Type] = [
    SimulationDigit0.self, SimulationDigit1.self, SimulationDigit2.self, SimulationDigit3.self,
    SimulationDigit4.self, SimulationDigit5.self, SimulationDigit6.self, SimulationDigit7.self,
    SimulationDigit8.self, SimulationDigit9.self, SimulationDigit10.self, SimulationDigit11.self,
    SimulationDigit12.self, SimulationDigit13.self, SimulationDigit14.self, SimulationDigit15.self,
]

/// A slot: one of 4,096 types that can each stand for one entity shape.
public protocol EntitySlot { static var index: Int { get } }

/// The slot numbered `A·256 + B·16 + C`.
public enum Slot<A: SimulationDigit, B: SimulationDigit, C: SimulationDigit>: EntitySlot {
    public static var index: Int { A.value << 8 | B.value << 4 | C.value }
}

/// A stored field value passed through unchanged (the dynamic models' only attribute type).
public struct RawField: AttributeValue, Hashable {
    /// The stored value.
    public var value: SQLiteValue
    /// Wraps a stored value.
    public init(_ value: SQLiteValue) { self.value = value }
    public static var attributeType: Schema.AttributeType { .string }
    public var sqliteValue: SQLiteValue { value }
    public init(sqliteValue: SQLiteValue) throws(ValueConversionError) { value = sqliteValue }
}

/// A record of the entity shape registered for slot `S`: its ID and field values in the entity's
/// `Schema.Entity.fieldNames` order (attributes, then to-one references as 16-byte ID blobs).
public struct DynamicRecord<S: EntitySlot>: PersistentModel {
    /// The record ID (`UUID.unassigned` until inserted).
    public var id: UUID
    /// Field values in the entity's field order.
    public var values: [SQLiteValue]
    /// The members of each to-many relationship the shape declares (only shapes of entities with a many-to-many
    /// relationship declare their to-many relationships), in declaration order.
    public var members: [[UUID]]

    /// A record with these values (and no members).
    public init(id: UUID, values: [SQLiteValue]) {
        self.id = id
        self.values = values
        self.members = Array(repeating: [], count: EntityShapeRegistry.shared.toManyCount(S.index))
    }

    /// A record with these values and to-many members.
    public init(id: UUID, values: [SQLiteValue], members: [[UUID]]) {
        self.id = id
        self.values = values
        self.members = members
    }

    /// The name of the entity registered for the slot.
    public static var entityName: String { EntityShapeRegistry.shared.name(S.index) }

    /// Every field of the registered shape as a ``RawField`` attribute (built once per slot).
    public static var entity: ModelEntity<DynamicRecord<S>> {
        EntityShapeRegistry.shared.modelEntity(S.index) {
            let shape = EntityShapeRegistry.shared.shape(S.index)
            var members: [ModelEntity<DynamicRecord<S>>.Member] = shape.fieldNames.indices.map { index in
                .attribute(shape.fieldNames[index], \DynamicRecord<S>.[field: index])
            }
            for (slot, toMany) in shape.toMany.enumerated() {
                members.append(EntityShapeRegistry.shared.accessor(for: toMany.destination, in: shape.schema)
                    .toManyMember(of: S.self, relationship: toMany.relationship, slot: slot))
            }
            return ModelEntity<DynamicRecord<S>>(members)
        }
    }

    /// Reads the fields by position.
    public init(row: ModelRow) throws {
        id = row.id
        let count = EntityShapeRegistry.shared.fieldCount(S.index)
        values = (0..<count).map { row[$0] }
        members = Array(repeating: [], count: EntityShapeRegistry.shared.toManyCount(S.index))
    }

    /// The members of to-many relationship `slot` as references (key-path target for the dynamic entity description).
    public subscript<Target: PersistentModel>(references slot: Int) -> [Reference<Target>] {
        get { members[slot].map { Reference<Target>($0) } }
        set { members[slot] = newValue.map(\.id) }
    }

    /// Field `index` (key-path target for the dynamic entity description).
    public subscript(field index: Int) -> RawField {
        get { RawField(values[index]) }
        set { values[index] = newValue.value }
    }
}

/// The process-wide map from entity shapes to slots.
final class EntityShapeRegistry: Sendable {
    struct Shape: Sendable {
        let name: String
        let fieldNames: [String]
        /// The to-many relationships the model declares, with their destination entity: every to-many relationship
        /// of an entity that has a many-to-many one (so that the model's members line up with the schema's to-many
        /// relationships), none otherwise.
        var toMany: [(relationship: Schema.Relationship, destination: Schema.Entity)] = []
        /// The schema's entities (to resolve the destinations' own shapes), when `toMany` is not empty.
        var schema: [Schema.Entity] = []
    }

    static let shared = EntityShapeRegistry()

    private struct State {
        var slotByKey: [String: Int] = [:]
        var shapes: [Shape] = []
        /// Each slot's `ModelEntity`, boxed (`EntityBox`), by slot number.
        var entities: [(any AnyObject & Sendable)?] = []
        var accessors: [Int: any DynamicEntityAccess] = [:]
    }
    private let state = Mutex(State())

    /// The slot for entity `name` with `fieldNames`, registered on first use.
    /// With `toMany` (see ``Shape/toMany``), the shape also declares those relationships.
    func slot(name: String, fieldNames: [String], toMany: [(relationship: Schema.Relationship, destination: Schema.Entity)] = [],
              schema: [Schema.Entity] = []) -> Int {
        var key = name + "\u{1}" + fieldNames.joined(separator: "\u{1}")
        for (relationship, destination) in toMany {
            key += "\u{2}\(relationship.name)\u{1}\(destination.name)\u{1}\(relationship.inverse ?? "")\u{1}\(relationship.deleteRule)\u{1}"
                + destination.fieldNames.joined(separator: "\u{1}")
        }
        return state.withLock { state in
            if let slot = state.slotByKey[key] { return slot }
            precondition(state.shapes.count < 4096, "replica-sim: more than 4,096 distinct entity shapes in one process")
            let slot = state.shapes.count
            state.shapes.append(Shape(name: name, fieldNames: fieldNames, toMany: toMany, schema: toMany.isEmpty ? [] : schema))
            state.slotByKey[key] = slot
            return slot
        }
    }

    func shape(_ slot: Int) -> Shape { state.withLock { $0.shapes[slot] } }

    /// The entity name of `slot` (read on every query and decoded row: without copying the whole shape).
    func name(_ slot: Int) -> String { state.withLock { $0.shapes[slot].name } }

    /// The number of fields of `slot`.
    func fieldCount(_ slot: Int) -> Int { state.withLock { $0.shapes[slot].fieldNames.count } }

    /// The number of to-many relationships the model of `slot` declares.
    func toManyCount(_ slot: Int) -> Int { state.withLock { $0.shapes[slot].toMany.count } }

    /// The model entity of `slot`, made on first use. Read on every query of a dynamic model: an array index and a
    /// class cast (casting an existential to a generic struct cost more than the query's own Swift work).
    func modelEntity<M: PersistentModel>(_ slot: Int, make: () -> ModelEntity<M>) -> ModelEntity<M> {
        let cached = state.withLock { slot < $0.entities.count ? $0.entities[slot] : nil }
        if let box = cached as? EntityBox<M> { return box.entity }
        let made = make()
        state.withLock { state in
            if state.entities.count <= slot { state.entities += [(any AnyObject & Sendable)?](repeating: nil, count: slot + 1 - state.entities.count) }
            state.entities[slot] = EntityBox(made)
        }
        return made
    }

    /// The accessor for `entity`'s shape; given the schema's `entities`, one whose model declares the entity's to-many
    /// relationships when one of them is many-to-many (so that its links can be read and written).
    func accessor(for entity: Schema.Entity, in entities: [Schema.Entity] = []) -> any DynamicEntityAccess {
        var toMany: [(relationship: Schema.Relationship, destination: Schema.Entity)] = []
        let toManyRelationships = entity.relationships.filter(\.isToMany)
        let destinations = toManyRelationships.compactMap { relationship in entities.first { $0.name == relationship.destination } }
        if !toManyRelationships.isEmpty, destinations.count == toManyRelationships.count,
           zip(toManyRelationships, destinations).contains(where: { relationship, destination in
               relationship.inverse.flatMap(destination.relationship(named:))?.isToMany == true
           }) {
            toMany = Array(zip(toManyRelationships, destinations))
        }
        let slot = slot(name: entity.name, fieldNames: entity.fieldNames, toMany: toMany, schema: entities)
        if let cached = state.withLock({ $0.accessors[slot] }) { return cached }
        let made = makeAccessor(slot)
        state.withLock { $0.accessors[slot] = made }
        return made
    }

    private func makeAccessor(_ slot: Int) -> any DynamicEntityAccess {
        digitTypes[(slot >> 8) & 15].accept(VisitHigh(middle: digitTypes[(slot >> 4) & 15], low: digitTypes[slot & 15]))
    }
}

/// A model entity kept in the registry (immutable once made).
private final class EntityBox<M: PersistentModel>: @unchecked Sendable {
    let entity: ModelEntity<M>
    init(_ entity: ModelEntity<M>) { self.entity = entity }
}

/// Opens type-level digits one at a time (Swift cannot pass an existential metatype as a generic argument directly).
protocol DigitVisitor {
    func visit<D: SimulationDigit>(_ digit: D.Type) -> any DynamicEntityAccess
}

extension SimulationDigit {
    static func accept(_ visitor: some DigitVisitor) -> any DynamicEntityAccess { visitor.visit(Self.self) }
}

private struct VisitHigh: DigitVisitor {
    let middle: any SimulationDigit.Type
    let low: any SimulationDigit.Type
    func visit<A: SimulationDigit>(_: A.Type) -> any DynamicEntityAccess { middle.accept(VisitMiddle<A>(low: low)) }
}

private struct VisitMiddle<A: SimulationDigit>: DigitVisitor {
    let low: any SimulationDigit.Type
    func visit<B: SimulationDigit>(_: B.Type) -> any DynamicEntityAccess { low.accept(VisitLow<A, B>()) }
}

private struct VisitLow<A: SimulationDigit, B: SimulationDigit>: DigitVisitor {
    func visit<C: SimulationDigit>(_: C.Type) -> any DynamicEntityAccess { TypedEntityAccess<Slot<A, B, C>>() }
}

/// Reads and writes records of one entity shape through a `ModelContext`.
public protocol DynamicEntityAccess: Sendable {
    /// Registers an insert; with `id == .unassigned` a new ID is assigned. Returns the record's ID.
    func insert(_ context: ModelContext, id: UUID, values: [SQLiteValue]) -> UUID
    /// Registers new values for an existing record (`ModelContext.update(_:)`: the context tells the copy's edits
    /// from the versions it handed out).
    func update(_ context: ModelContext, id: UUID, values: [SQLiteValue])
    /// Registers new values for an existing record, edited from the copy `original` (`ModelContext.update(_:from:)`:
    /// exactly the fields that differ from it are changed).
    func update(_ context: ModelContext, id: UUID, values: [SQLiteValue], from original: [SQLiteValue])
    /// The record's stored values, or `nil` when there is no such live record.
    func values(_ context: ModelContext, id: UUID) throws -> [SQLiteValue]?
    /// Every live record, in ID order.
    func all(_ context: ModelContext) throws -> [(id: UUID, values: [SQLiteValue])]
    /// Registers `delete(model:where:)` of the records whose ID is in `ids` (pending inserts included); returns how
    /// many it selected.
    func batchDelete(_ context: ModelContext, ids: [UUID]) throws -> Int
    /// The members of every to-many relationship the model declares (see `EntityShapeRegistry.Shape.toMany`) of the
    /// live record `id`, or `nil` when there is none.
    func members(_ context: ModelContext, id: UUID) throws -> [[UUID]]?
    /// Every live record with the members of every to-many relationship the model declares, in ID order.
    func allMembers(_ context: ModelContext) throws -> [(id: UUID, members: [[UUID]])]
    /// Registers new members of the model's to-many relationship `slot` for the live record `id`; `false` when there
    /// is no such record.
    func setMembers(_ context: ModelContext, id: UUID, slot: Int, members: [UUID]) throws -> Bool
    /// The to-many member of a model of `Owner`'s shape whose targets are records of this accessor's shape.
    func toManyMember<Owner: EntitySlot>(of owner: Owner.Type, relationship: Schema.Relationship, slot: Int)
        -> ModelEntity<DynamicRecord<Owner>>.Member
}

struct TypedEntityAccess<S: EntitySlot>: DynamicEntityAccess {
    func insert(_ context: ModelContext, id: UUID, values: [SQLiteValue]) -> UUID {
        context.insert(DynamicRecord<S>(id: id, values: values)).id
    }

    func update(_ context: ModelContext, id: UUID, values: [SQLiteValue]) {
        context.update(DynamicRecord<S>(id: id, values: values, members: currentMembers(context, id: id)))
    }

    func update(_ context: ModelContext, id: UUID, values: [SQLiteValue], from original: [SQLiteValue]) {
        let members = currentMembers(context, id: id)
        context.update(DynamicRecord<S>(id: id, values: values, members: members),
                       from: DynamicRecord<S>(id: id, values: original, members: members))
    }

    /// The record's members as this context reads them now, so that an update of its values keeps its links; none
    /// for a shape without to-many members (or a record that cannot be read: the save reports what is wrong).
    private func currentMembers(_ context: ModelContext, id: UUID) -> [[UUID]] {
        let count = EntityShapeRegistry.shared.toManyCount(S.index)
        guard count > 0 else { return [] }
        return ((try? context.model(DynamicRecord<S>.self, id: id))?.members) ?? Array(repeating: [], count: count)
    }

    func members(_ context: ModelContext, id: UUID) throws -> [[UUID]]? {
        try context.model(DynamicRecord<S>.self, id: id)?.members
    }

    func allMembers(_ context: ModelContext) throws -> [(id: UUID, members: [[UUID]])] {
        try context.fetch(DynamicRecord<S>.self).map { ($0.id, $0.members) }
    }

    func setMembers(_ context: ModelContext, id: UUID, slot: Int, members: [UUID]) throws -> Bool {
        guard var record = try context.model(DynamicRecord<S>.self, id: id) else { return false }
        let original = record
        record.members[slot] = members
        context.update(record, from: original)
        return true
    }

    func toManyMember<Owner: EntitySlot>(of owner: Owner.Type, relationship: Schema.Relationship, slot: Int)
        -> ModelEntity<DynamicRecord<Owner>>.Member {
        let keyPath: WritableKeyPath<DynamicRecord<Owner>, [Reference<DynamicRecord<S>>]> = \DynamicRecord<Owner>.[references: slot]
        return .toMany(relationship.name, keyPath, inverse: relationship.inverse ?? "", deleteRule: relationship.deleteRule)
    }

    func values(_ context: ModelContext, id: UUID) throws -> [SQLiteValue]? {
        try context.model(DynamicRecord<S>.self, id: id)?.values
    }

    func all(_ context: ModelContext) throws -> [(id: UUID, values: [SQLiteValue])] {
        try context.fetch(DynamicRecord<S>.self).map { ($0.id, $0.values) }
    }

    func batchDelete(_ context: ModelContext, ids: [UUID]) throws -> Int {
        try context.delete(model: DynamicRecord<S>.self, where: #Predicate<DynamicRecord<S>> { ids.contains($0.id) })
    }
}
