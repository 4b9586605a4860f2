import CSQLite
import Foundation

/// SQL functions Replica registers on the connections it queries with, so that SQL evaluates exactly what Swift
/// evaluates where SQLite has no equivalent. Internal.
///
/// - `replica_unhex(text)`: the blob a hex string spells (`NULL` for malformed input). SQLite 3.41 has `unhex`;
///   this works on older libraries. Used to pass ID lists as one JSON parameter.
/// - `replica_fold(text)`: ``ReplicaText/fold(_:)`` (case- and diacritic-insensitive form).
/// - `replica_unwrap(x)`: `x`, or an error when `x` is `NULL` (a force unwrap of `nil` in a predicate).
enum SQLFunctions {
    /// The message `replica_unwrap` fails with; mapped back to `PredicateError.forceUnwrapFailure`.
    static let unwrapFailureMessage = "replica: force unwrap of nil in a predicate"

    /// Registers the functions on `connection` (idempotent per connection; SQLite replaces a definition).
    static func register(on connection: Connection) throws {
        try connection.createFunction(name: "replica_unhex", arguments: 1) { context, _, arguments in
            guard let argument = arguments?[0], sqlite3_value_type(argument) == SQLITE_TEXT,
                  let text = sqlite3_value_text(argument) else { sqlite3_result_null(context); return }
            let count = Int(sqlite3_value_bytes(argument))
            guard count % 2 == 0 else { sqlite3_result_null(context); return }
            var bytes = [UInt8](repeating: 0, count: count / 2)
            func nibble(_ c: UInt8) -> UInt8? {
                switch c {
                case 48...57: return c - 48
                case 65...70: return c - 55
                case 97...102: return c - 87
                default: return nil
                }
            }
            for i in 0..<(count / 2) {
                guard let high = nibble(text[2 * i]), let low = nibble(text[2 * i + 1]) else { sqlite3_result_null(context); return }
                bytes[i] = high << 4 | low
            }
            bytes.withUnsafeBytes { buffer in
                sqlite3_result_blob(context, buffer.baseAddress, Int32(buffer.count), Connection.sqliteTransient)
            }
        }

        try connection.createFunction(name: "replica_fold", arguments: 1) { context, _, arguments in
            guard let argument = arguments?[0], sqlite3_value_type(argument) != SQLITE_NULL,
                  let text = sqlite3_value_text(argument) else { sqlite3_result_null(context); return }
            let count = Int(sqlite3_value_bytes(argument))
            let folded = ReplicaText.fold(String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self))
            var utf8 = folded
            utf8.withUTF8 { buffer in
                buffer.withMemoryRebound(to: CChar.self) { chars in
                    if let base = chars.baseAddress {
                        sqlite3_result_text(context, base, Int32(chars.count), Connection.sqliteTransient)
                    } else {
                        sqlite3_result_text(context, "", 0, Connection.sqliteTransient)
                    }
                }
            }
        }

        try connection.createFunction(name: "replica_unwrap", arguments: 1) { context, _, arguments in
            guard let argument = arguments?[0], sqlite3_value_type(argument) != SQLITE_NULL else {
                sqlite3_result_error(context, SQLFunctions.unwrapFailureMessage, -1)
                return
            }
            sqlite3_result_value(context, argument)
        }
    }
}

/// Text folding shared by SQL and Swift evaluation, so that both agree exactly.
public enum ReplicaText {
    /// The case- and diacritic-insensitive form of `text` (Foundation's folding with no locale, so the result does
    /// not depend on the device's settings): "Ça Va" and "ca va" fold to the same string.
    public static func fold(_ text: String) -> String {
        text.folding(options: [.caseInsensitive, .diacriticInsensitive], locale: nil)
    }

    /// Whether the folded form of `text` contains the folded form of `other` (by Unicode scalars, as SQLite's
    /// `instr` compares). An empty `other` is not contained, as with `String.contains` in a predicate.
    /// Complexity: O(n·m) in the lengths.
    public static func foldedContains(_ text: String, _ other: String) -> Bool {
        let needle = Array(fold(other).utf8)
        guard !needle.isEmpty else { return false }
        let haystack = Array(fold(text).utf8)
        guard haystack.count >= needle.count else { return false }
        for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
            if haystack[start..<(start + needle.count)].elementsEqual(needle) { return true }
        }
        return false
    }
}

// MARK: - localizedStandardContains in predicates

#if !canImport(Darwin)
extension PredicateExpressions {
    /// Makes `#Predicate { $0.name.localizedStandardContains(text) }` compile on Linux, where Foundation does not
    /// provide it. Replica evaluates it as ``ReplicaText/foldedContains(_:_:)`` (case- and diacritic-insensitive
    /// containment), in SQL and in Swift alike.
    public static func build_localizedStandardContains<Root, Other>(_ root: Root, _ other: Other)
        -> ReplicaPredicateExpressions.LocalizedStandardContains<Root, Other>
    where Root: PredicateExpression, Other: PredicateExpression, Root.Output: StringProtocol, Other.Output: StringProtocol {
        ReplicaPredicateExpressions.LocalizedStandardContains(root: root, other: other)
    }
}
#endif

/// Predicate expressions Replica adds to Foundation's.
public enum ReplicaPredicateExpressions {
    /// Case- and diacritic-insensitive containment (`localizedStandardContains`), evaluated as
    /// ``ReplicaText/foldedContains(_:_:)``.
    public struct LocalizedStandardContains<Root, Other>: PredicateExpression
    where Root: PredicateExpression, Other: PredicateExpression, Root.Output: StringProtocol, Other.Output: StringProtocol {
        public typealias Output = Bool
        public let root: Root
        public let other: Other

        public init(root: Root, other: Other) {
            self.root = root
            self.other = other
        }

        public func evaluate(_ bindings: PredicateBindings) throws -> Bool {
            ReplicaText.foldedContains(String(try root.evaluate(bindings)), String(try other.evaluate(bindings)))
        }
    }
}

extension ReplicaPredicateExpressions.LocalizedStandardContains: StandardPredicateExpression
where Root: StandardPredicateExpression, Other: StandardPredicateExpression {}

extension ReplicaPredicateExpressions.LocalizedStandardContains: Codable where Root: Codable, Other: Codable {}

extension ReplicaPredicateExpressions.LocalizedStandardContains: Sendable where Root: Sendable, Other: Sendable {}
