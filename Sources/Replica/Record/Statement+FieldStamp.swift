import Foundation

extension Statement {
    /// Binds the 64-digit text form of `stamp` to the parameter at 0-based `index` from a stack buffer, and runs
    /// `body` (see ``Statement/withStaticText(_:at:_:)``). Here rather than in SQLite/, which knows no replication type.
    @inline(__always)
    func withStaticStamp<R>(_ stamp: FieldStamp, at index: Int32, _ body: () throws -> R) throws -> R {
        guard stamp.fitsHex else { return try withStaticText(stamp.description, at: index, body) }
        return try withStaticText(count: 64, writing: { stamp.writeHex(into: $0, at: 0) }, at: index, body)
    }
}
