import Foundation

extension AnyKeyPath {
    /// The key path as a person reads it in a message: `\Note.title` for a stored property, and "a computed String
    /// property of Note" for a computed one, which Swift can only print by address (`\Note.<computed 0x… (String)>`).
    /// Never includes a value.
    var readableDescription: String {
        let text = "\(self)"
        guard let start = text.range(of: "<computed ") else { return text }
        let root = String(describing: type(of: self).rootType)
        // The type Swift prints in parentheses after the address, when there is one.
        if let open = text[start.upperBound...].firstIndex(of: "("), let close = text[open...].firstIndex(of: ")") {
            return "a computed \(text[text.index(after: open)..<close]) property of \(root)"
        }
        return "a computed property of \(root)"
    }
}
