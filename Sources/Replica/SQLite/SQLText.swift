import Foundation

/// Quotes an SQL identifier. Names are validated identifiers, so this never needs escaping, but it is done anyway.
func quoted(_ identifier: String) -> String {
    // Identifiers rarely contain a quote: skip Foundation's search-and-replace (it dominated building query text).
    guard identifier.utf8.contains(UInt8(ascii: "\"")) else { return "\"" + identifier + "\"" }
    return "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\""
}
