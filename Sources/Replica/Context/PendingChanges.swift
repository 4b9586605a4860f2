import Foundation

/// A context's unsaved changes in first-registration order, with lookup by ID.
///
/// Changes live in an array in registration order and a dictionary maps each ID to its position, so a save walks the
/// changes in order without looking any up, and growing the dictionary moves small entries. Removing a change leaves
/// an empty slot (order is kept; a later change of the same ID goes to the end, as a new registration).
struct PendingChanges {
    /// One registered ID and its change (`nil`: removed). A struct rather than a tuple: copying a tuple of this
    /// shape goes through the runtime's generic value witnesses (about 300 instructions per copy).
    struct Entry {
        let id: PersistentIdentifier
        var change: ModelContext.PendingChange?
    }

    private(set) var entries: [Entry] = []
    private var positions: [PersistentIdentifier: Int] = [:]

    var isEmpty: Bool { positions.isEmpty }
    var count: Int { positions.count }

    subscript(id: PersistentIdentifier) -> ModelContext.PendingChange? {
        get { positions[id].flatMap { entries[$0].change } }
        set {
            if let position = positions[id] {
                entries[position].change = newValue
                if newValue == nil { positions[id] = nil }
            } else if let newValue {
                positions[id] = entries.count
                entries.append(Entry(id: id, change: newValue))
            }
        }
    }

    /// Registers `change` for `id` and returns the change it replaces (`nil` for a new registration, which goes to
    /// the end of the order). One dictionary operation for a new ID.
    @discardableResult
    mutating func updateValue(_ change: ModelContext.PendingChange, forKey id: PersistentIdentifier) -> ModelContext.PendingChange? {
        if let position = positions.updateValue(entries.count, forKey: id) {
            positions[id] = position
            let previous = entries[position].change
            entries[position].change = change
            return previous
        }
        entries.append(Entry(id: id, change: change))
        return nil
    }

    /// The IDs with a change, in registration order.
    var order: [PersistentIdentifier] { entries.compactMap { $0.change == nil ? nil : $0.id } }

    /// Removes the changes of the IDs for which `shouldRemove` is true.
    mutating func removeAll(where shouldRemove: (PersistentIdentifier) -> Bool) {
        for index in entries.indices where entries[index].change != nil && shouldRemove(entries[index].id) {
            positions[entries[index].id] = nil
            entries[index].change = nil
        }
    }

    mutating func removeAll() {
        entries.removeAll()
        positions.removeAll()
    }
}
