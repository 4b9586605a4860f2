// Saving failing tapes so the next run replays them first.

import Foundation

/// A folder of failing tapes, one file per property.
///
/// Each file is named after the property (a readable slug plus a stable hash of the full name)
/// and holds one shrunk tape per line in the form `[1,0,2]`; lines starting with `#` are
/// comments. Tapes are kept after they start passing, so they keep guarding against
/// regressions; delete a file (or the folder) to forget them.
public struct PropertyFailureStore: Sendable, Hashable {
    /// The folder holding the files.
    public var directory: String

    /// Creates a store over `directory` (created on the first save).
    public init(directory: String) {
        self.directory = directory
    }

    /// The file used for the property called `name`.
    public func path(for name: String) -> String {
        var slug = ""
        for scalar in name.unicodeScalars {
            if slug.count >= 60 { break }
            if CharacterSet.alphanumerics.contains(scalar) && scalar.isASCII {
                slug.unicodeScalars.append(scalar)
            } else if slug.last != "-" {
                slug.append("-")
            }
        }
        let hash = String(PropertyHashing.fnv1a64(name), radix: 16)
        let trimmed = slug.trimmingCharacters(in: CharacterSet(charactersIn: "-"))
        let fileName = (trimmed.isEmpty ? "property" : trimmed) + "-" + hash + ".tapes"
        return (directory as NSString).appendingPathComponent(fileName)
    }

    /// The saved tapes for `name`, oldest first. Unreadable files or lines are ignored.
    public func load(_ name: String) -> [ChoiceTape] {
        guard let text = try? String(contentsOfFile: path(for: name), encoding: .utf8) else { return [] }
        var tapes: [ChoiceTape] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            if let tape = ChoiceTape(encoded: trimmed), !tapes.contains(tape) { tapes.append(tape) }
        }
        return tapes
    }

    /// Appends `tape` to the file for `name` unless it is already there.
    /// - Returns: The file's path.
    /// - Throws: File-system errors (creating the folder, writing the file).
    @discardableResult
    public func save(_ tape: ChoiceTape, for name: String) throws -> String {
        let file = path(for: name)
        let plain = ChoiceTape(choices: tape.choices)
        if load(name).contains(plain) { return file }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var text = (try? String(contentsOfFile: file, encoding: .utf8)) ?? "# Failing tapes of property: \(name.replacingOccurrences(of: "\n", with: " "))\n"
        if !text.hasSuffix("\n") { text.append("\n") }
        text.append(plain.description + "\n")
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        return file
    }

    /// Deletes the file for `name`, if any.
    public func remove(_ name: String) {
        try? FileManager.default.removeItem(atPath: path(for: name))
    }
}
