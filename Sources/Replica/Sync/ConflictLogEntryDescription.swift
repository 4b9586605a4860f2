import Foundation

extension ConflictLogEntry: CustomStringConvertible {
    /// What lost to what, with both stamps as time and replica (never a value: the log holds none, so nothing
    /// encrypted can appear) — e.g. `Note/1f…: title written 2026-12-01T10:00:00.000Z by A… lost to the write of
    /// 2026-12-01T10:00:05.000Z by B…`.
    public var description: String {
        if let winner = duplicateOf {
            return "\(id): a duplicate created \(localStamp.readableDescription), merged into \(winner) created "
                + winningStamp.readableDescription
        }
        switch kind {
        case .deleted:
            return "\(id): \(field) written \(localStamp.readableDescription) lost to a delete of the record made after "
                + winningStamp.readableDescription
        case .cascaded:
            return "\(id): \(field) written \(localStamp.readableDescription) lost to the cascade of a remote delete, applied "
                + winningStamp.readableDescription
        case .overwritten, .duplicate:
            return "\(id): \(field) written \(localStamp.readableDescription) lost to the write of "
                + winningStamp.readableDescription
        }
    }
}
