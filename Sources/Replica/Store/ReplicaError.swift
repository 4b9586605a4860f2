import Foundation

/// Errors of containers, configurations and contexts, named as SwiftData names them (`SwiftDataError`).
///
/// No case carries attribute values: errors name entities, attributes, configurations and identifiers only, so
/// user data and encrypted values never leak through them.
public enum ReplicaError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Two configurations of one container share a name (or resolve to the same store file).
    case duplicateConfiguration(name: String)
    /// A configuration names entities that the container's schema does not have.
    case configurationSchemaNotFoundInContainerSchema(configuration: String, entities: [String])
    /// A configuration's name cannot be used as a file name (empty, `/`, NUL, `..`, or longer than 241 bytes,
    /// so that `<name>.store-journal` fits the 255-byte file-name limit).
    case configurationFileNameContainsInvalidCharacters(name: String)
    /// An entity of the container schema is in more than one configuration, or in none.
    case entityNotRoutable(entity: String, configurations: [String])
    /// A relationship crosses from one store to another; references must stay within one store.
    case crossStoreRelationship(entity: String, relationship: String)
    /// The schema, or a configuration's use of it, is invalid.
    case invalidSchema(SchemaValidationError)
    /// The entity descriptions of the model types the schema was built from (`Schema([Trip.self, …])`) disagree
    /// with the types: every mismatch found, each naming the entity's member and the Swift property. Found when the
    /// container opens, so that no store is opened and no read fails later.
    case invalidModelDeclaration([ModelDeclarationMismatch])
    /// A store could not be opened or prepared (missing read-only file, unreadable file, not a database, ...).
    case loadIssueModelContainer(configuration: String, reason: String)
    /// The store could not be opened because opening it needs the store to itself, and another process (of the app
    /// group, perhaps of an older app version) or another container of this process has it open; or another one is
    /// migrating it right now. Running a migration stage replaces the store file, and a rename through an original
    /// name changes its tables: a process that kept the store open would lose its writes or fail. Nothing was
    /// changed. Close the store in the other process or container (or update that app) and open it again; when the
    /// other one is migrating it, `reason` says so ("another process or container is migrating it right now; open it
    /// again when that migration has finished"): nothing is to be closed, open it again once it finished. `reason`
    /// says which case it is.
    case storeInUse(configuration: String, reason: String)
    /// A save was refused because models failed validation. Nothing was written.
    case modelValidationFailure([ModelValidationFailure])
    /// No configuration of the container has this name.
    case unknownStore(String)
    /// The configuration exists but is local-only: it has no sync engine.
    case storeNotSynced(String)
    /// A save touched a configuration opened with `allowsSave: false`. Nothing was written.
    case readOnlyStore(configuration: String)
    /// The model type's entity is not in the container's schema.
    case unknownEntity(String)
    /// An update or delete named a record that does not exist (any more) in its store.
    case recordNotFound(PersistentIdentifier)
    /// A stored value could not be read as the model's type.
    case valueConversion(ValueConversionError)
    /// A history token is older than the store's pruned history: the changes after it are gone. Start over from a
    /// full read (for sync: a full resync).
    case historyTokenExpired(HistoryToken)
    /// A history token belongs to a store this container does not have.
    case historyTokenFromAnotherStore(HistoryToken)
    /// This device's schema contradicts the union schema of the zone (something removed, renamed or retyped).
    /// The sync engine syncs nothing until the app's schema is fixed.
    case incompatibleSchema([SchemaDifference])
    /// A save failed while committing: the stores listed in `committed` were committed before the failure and keep
    /// their changes; the others were rolled back. See ``ModelContext/save()`` for the guarantee.
    case partialSave(committed: [String], failed: String, underlying: SQLiteError)
    /// Reading a target through a ``Reference`` that carries none and has no live context to load it from: it was
    /// made from an ID or decoded, or the context that fetched it is gone. Load it with ``Reference/load(in:)``.
    case noContextForReference(PersistentIdentifier)
    /// Observing store `store` failed while reading what was committed to it (its history could not be read).
    /// Observers of the store end with this error.
    case observationFailed(store: String, underlying: SQLiteError)
    /// Sync bookkeeping of a synced store cannot be read (see ``BookkeepingCorruption``).
    case corruptBookkeeping(BookkeepingCorruption)
    /// The store's hybrid logical clock reached the top of its encodable range (``HLC/maxPhysical``,
    /// ``HLC/maxLogical``): no later stamp exists, so the save is refused rather than stamped equal to an earlier one.
    /// Reaching it takes a wall clock past the year 10889 (remote stamps near the top are refused, R2).
    case clockExhausted(store: String)
    /// A record's causal length or local version (`counter`) reached its bound (``ReplicationBounds/maxCausalLength``,
    /// ``ReplicationBounds/maxLocalVersion``): the change that would pass it is refused rather than overflow. Takes a
    /// record deleted and re-inserted 2⁶² times, or a causal length received at the bound.
    case counterExhausted(store: String, recordID: UUID, counter: String)
    /// The file of an external-storage attribute could not be written or read (missing, damaged, or a failed file
    /// operation); see ``ExternalStorageError``.
    case externalStorage(ExternalStorageError)

    public var description: String {
        switch self {
        case let .duplicateConfiguration(name): return "duplicate configuration '\(name)'"
        case let .configurationSchemaNotFoundInContainerSchema(configuration, entities):
            return "configuration '\(configuration)' names entities not in the container schema: \(entities.joined(separator: ", "))"
        case let .configurationFileNameContainsInvalidCharacters(name):
            let shown = name.count > 40 ? "'\(name.prefix(40))…'" : "'\(name)'"
            return "configuration name \(shown) is not a valid file name: \(ModelConfiguration.fileNameProblem(name) ?? "it cannot name a store file")"
        case let .entityNotRoutable(entity, configurations):
            return configurations.isEmpty ? "entity '\(entity)' is in no configuration"
                : "entity '\(entity)' is in several configurations: \(configurations.joined(separator: ", "))"
        case let .crossStoreRelationship(entity, relationship): return "\(entity).\(relationship) points into another store"
        case let .invalidSchema(error): return error.description
        case let .invalidModelDeclaration(mismatches):
            return "model declarations do not match their types: " + mismatches.map(\.description).joined(separator: "; ")
        case let .loadIssueModelContainer(configuration, reason): return "cannot load store '\(configuration)': \(reason)"
        case let .storeInUse(configuration, reason): return "store '\(configuration)' is in use: \(reason)"
        case let .modelValidationFailure(failures): return "validation failed: " + failures.map(\.description).joined(separator: "; ")
        case let .readOnlyStore(configuration): return "store '\(configuration)' is read-only"
        case let .unknownStore(name): return "the container has no store (configuration) named '\(name)'"
        case let .storeNotSynced(name): return "store '\(name)' is local-only (its configuration has no cloudKitDatabase)"
        case let .unknownEntity(name): return "entity '\(name)' is not in the container's schema"
        case let .recordNotFound(id): return "no record \(id)"
        case let .valueConversion(error): return error.description
        case let .historyTokenExpired(token): return "history token \(token) is expired (history before it was pruned)"
        case let .historyTokenFromAnotherStore(token): return "history token \(token) belongs to a store this container does not have"
        case let .incompatibleSchema(differences):
            return "schema incompatible with the zone: " + differences.map(\.description).joined(separator: "; ")
        case let .partialSave(committed, failed, underlying):
            return "save committed \(committed.joined(separator: ", ")) but failed on '\(failed)': \(underlying)"
        case let .noContextForReference(id):
            return "the reference to \(id) carries no target and no live context to load it from"
        case let .observationFailed(store, underlying):
            return "observing store '\(store)' failed: \(underlying)"
        case let .corruptBookkeeping(corruption): return corruption.description
        case let .clockExhausted(store): return "the clock of store '\(store)' reached the top of its range: no later stamp exists"
        case let .counterExhausted(store, id, counter):
            return "the \(counter) of record \(id.uuidString.lowercased()) in store '\(store)' reached its bound"
        case let .externalStorage(error): return error.description
        }
    }
}

/// Why a model failed validation on save.
public enum ModelValidationFailure: Sendable, Hashable, CustomStringConvertible {
    /// Another live record of the entity already has these values for a unique attribute (or compound key).
    /// The values themselves are not included.
    case uniqueConstraintViolation(entity: String, attributes: [String], id: PersistentIdentifier)
    /// A record with this ID already exists.
    case duplicateIdentifier(PersistentIdentifier)
    /// A delete was refused by a deny rule: `count` records are still related through `relationship`.
    case deleteDenied(entity: String, relationship: String, count: Int)
    /// A value SQLite cannot store faithfully (a floating-point NaN, which SQLite turns into NULL).
    case unrepresentableValue(entity: String, attribute: String, id: PersistentIdentifier)
    /// A required to-one relationship has no value.
    case missingRequiredRelationship(entity: String, relationship: String, id: PersistentIdentifier)

    public var description: String {
        switch self {
        case let .uniqueConstraintViolation(entity, attributes, id):
            return "\(id): another \(entity) has the same \(attributes.joined(separator: " + "))"
        case let .duplicateIdentifier(id): return "\(id) already exists"
        case let .deleteDenied(entity, relationship, count):
            return "cannot delete \(entity): \(count) related record(s) through '\(relationship)' (deny rule)"
        case let .unrepresentableValue(entity, attribute, id):
            return "\(id): \(entity).\(attribute) holds a value SQLite cannot store (NaN)"
        case let .missingRequiredRelationship(entity, relationship, id):
            return "\(id): required relationship \(entity).\(relationship) has no value"
        }
    }
}
