import Foundation

/// A value as SQLite stores it: one of its five storage classes.
///
/// This is the one dynamic value form that storage, history and sync share (see ``Snapshot``). Attribute types map
/// onto it as documented on ``Schema/AttributeType``.
///
/// Source: <https://www.sqlite.org/datatype3.html>
public enum SQLiteValue: Hashable, Sendable, Codable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob(Data)

    /// `true` for `.null`.
    @inlinable public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// A total order used wherever values must be ordered deterministically (SQLite's own cross-type order:
    /// NULL < numbers < text < blob; numbers compare numerically, text by bytes, blobs with memcmp).
    public static func storageOrder(_ lhs: SQLiteValue, _ rhs: SQLiteValue) -> Bool {
        func rank(_ value: SQLiteValue) -> Int {
            switch value {
            case .null: return 0
            case .integer, .real: return 1
            case .text: return 2
            case .blob: return 3
            }
        }
        let (l, r) = (rank(lhs), rank(rhs))
        if l != r { return l < r }
        switch (lhs, rhs) {
        case let (.integer(a), .integer(b)): return a < b
        case let (.integer(a), .real(b)): return Double(a) < b
        case let (.real(a), .integer(b)): return a < Double(b)
        case let (.real(a), .real(b)): return a < b
        case let (.text(a), .text(b)): return Array(a.utf8).lexicographicallyPrecedes(Array(b.utf8))
        case let (.blob(a), .blob(b)): return a.lexicographicallyPrecedes(b)
        default: return false
        }
    }
}

extension SQLiteValue: CustomStringConvertible {
    /// A short description that never shows the value itself (values may be secrets): only its storage class and size.
    public var description: String {
        switch self {
        case .null: return "NULL"
        case .integer: return "INTEGER"
        case .real: return "REAL"
        case let .text(s): return "TEXT(\(s.utf8.count) bytes)"
        case let .blob(d): return "BLOB(\(d.count) bytes)"
        }
    }
}

extension SQLiteValue: CustomReflectable {
    /// Reflection (`dump`, `Mirror`, debuggers' summaries) shows only the redacted ``description``, never the value.
    public var customMirror: Mirror { Mirror(self, children: [:]) }
}
