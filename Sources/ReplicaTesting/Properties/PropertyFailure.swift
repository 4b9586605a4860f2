// How property bodies report failures and discards.

/// A property failure thrown by ``Property/require(_:_:kind:fileID:line:)`` and friends.
///
/// Its ``identity`` decides what "failing the same way" means while shrinking: by default the
/// source location of the failing check, or the explicit `kind` when one is given (use a kind
/// when several call sites report the same logical failure).
public struct PropertyFailure: Error, CustomStringConvertible, Sendable {
    /// An optional stable name for the failure (e.g. `"invariant: balance"`).
    public var kind: String?
    /// Human-readable explanation; may contain values that change while shrinking.
    public var message: String
    /// File of the failing check (`#fileID`).
    public var fileID: String
    /// Line of the failing check.
    public var line: Int

    /// Creates a failure; `fileID` and `line` default to the caller's location.
    public init(kind: String? = nil, message: String, fileID: String = #fileID, line: Int = #line) {
        self.kind = kind
        self.message = message
        self.fileID = fileID
        self.line = line
    }

    /// The failure's identity for shrinking: `kind` if set, else `"fileID:line"`.
    public var identity: String { kind ?? "\(fileID):\(line)" }

    public var description: String {
        if let kind { return "\(kind): \(message)" }
        return "\(message) (\(fileID):\(line))"
    }
}

/// Thrown to discard a test case (an unmet assumption, an exhausted filter). Discarded cases
/// are neither passes nor failures and are never shrunk toward.
public struct PropertyDiscard: Error, CustomStringConvertible, Sendable {
    /// Why the case was discarded.
    public var reason: String
    /// Creates a discard with a reason.
    public init(reason: String) { self.reason = reason }
    public var description: String { "discarded: \(reason)" }
}

/// Helpers for writing property bodies.
///
/// Use these (they throw) rather than Swift Testing's `#expect` inside a property body: the
/// engine re-runs the body many times while shrinking and must see failures as thrown errors.
/// The Swift Testing glue (``propertyCheck(_:cases:seed:configuration:replay:_:fileID:function:sourceLocation:_:)``)
/// records one issue for the final, shrunk counterexample.
public enum Property {
    /// Fails the test case unless `condition` holds.
    /// - Parameters:
    ///   - condition: The property to check.
    ///   - message: Explanation, built only on failure.
    ///   - kind: Stable failure identity; defaults to the call site.
    /// - Throws: ``PropertyFailure`` when `condition` is false.
    public static func require(
        _ condition: Bool,
        _ message: @autoclosure () -> String = "requirement failed",
        kind: String? = nil,
        fileID: String = #fileID,
        line: Int = #line
    ) throws {
        if !condition {
            throw PropertyFailure(kind: kind, message: message(), fileID: fileID, line: line)
        }
    }

    /// Fails the test case unless `lhs == rhs`; the message shows both values.
    public static func requireEqual<T: Equatable>(
        _ lhs: T,
        _ rhs: T,
        _ message: @autoclosure () -> String = "",
        kind: String? = nil,
        fileID: String = #fileID,
        line: Int = #line
    ) throws {
        if lhs != rhs {
            let extra = message()
            throw PropertyFailure(
                kind: kind,
                message: "\(Property.describe(lhs)) != \(Property.describe(rhs))" + (extra.isEmpty ? "" : ": \(extra)"),
                fileID: fileID,
                line: line
            )
        }
    }

    /// Fails the test case unconditionally.
    public static func fail(
        _ message: String,
        kind: String? = nil,
        fileID: String = #fileID,
        line: Int = #line
    ) throws -> Never {
        throw PropertyFailure(kind: kind, message: message, fileID: fileID, line: line)
    }

    /// Discards the test case unless `condition` holds (like a precondition on the input).
    /// - Throws: ``PropertyDiscard`` when `condition` is false.
    public static func assume(_ condition: Bool, _ reason: @autoclosure () -> String = "assumption not met") throws {
        if !condition { throw PropertyDiscard(reason: reason()) }
    }
}

extension PropertyFailure {
    /// The default failure identity: a ``PropertyFailure``'s identity, otherwise the error's
    /// fully qualified type name plus, for enums and other values whose description is short and
    /// has no payload, that description (so `MyError.overflow` and `MyError.underflow` differ).
    public static func defaultIdentity(_ error: any Error) -> String {
        if let failure = error as? PropertyFailure { return failure.identity }
        let typeName = String(reflecting: type(of: error))
        let text = String(describing: error)
        if text.count <= 64, !text.contains("("), !text.contains(" ") {
            return "\(typeName).\(text)"
        }
        return typeName
    }
}

/// Implemented by values whose description must not depend on hash order.
protocol PropertySortedDescribable {
    var propertySortedDescription: String { get }
}

extension Dictionary: PropertySortedDescribable where Key: Comparable {
    var propertySortedDescription: String {
        if isEmpty { return "[:]" }
        let entries = sorted { $0.key < $1.key }.map { "\(Property.describe($0.key)): \(Property.describe($0.value))" }
        return "[" + entries.joined(separator: ", ") + "]"
    }
}

extension Set: PropertySortedDescribable where Element: Comparable {
    var propertySortedDescription: String {
        "Set([" + sorted().map { Property.describe($0) }.joined(separator: ", ") + "])"
    }
}

extension Property {
    /// Describes a value for reports: strings are quoted, dictionaries with comparable keys and
    /// sets with comparable elements are listed in sorted order (never in hash order).
    public static func describe<T>(_ value: T) -> String {
        if let string = value as? String { return String(reflecting: string) }
        if let sorted = value as? any PropertySortedDescribable { return sorted.propertySortedDescription }
        return String(describing: value)
    }
}
