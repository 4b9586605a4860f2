// README.md's code is compiled code: every ```swift block is a marked region of the example app or of the README
// tour's tests (ReadmeExampleTests.swift), the package snippet names real products, and the example app prints what
// README says it prints.
import Foundation
import Testing
import ReplicaTesting

@Suite("README")
struct ReadmeTests {
    /// The package root: this file is <root>/Tests/ReplicaTests/ReadmeTests.swift.
    static let packageRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The sources whose marked regions README quotes.
    static let quotedSources = ["Sources/trips-example/main.swift", "Tests/ReplicaTests/ReadmeExampleTests.swift"]

    static func read(_ path: String) throws -> String {
        try String(contentsOf: packageRoot.appendingPathComponent(path), encoding: .utf8)
    }

    /// The bodies of the fenced blocks whose opening fence is exactly "```" + `language`, in order, without fences.
    static func blocks(of markdown: String, language: String) -> [String] {
        var result: [String] = [], current: [Substring]?
        for line in markdown.split(separator: "\n", omittingEmptySubsequences: false) {
            if var body = current {
                if line == "```" { result.append(body.joined(separator: "\n")); current = nil } else { body.append(line); current = body }
            } else if line == "```" + language {
                current = []
            }
        }
        return result
    }

    /// `text` with the indentation its non-empty lines share removed.
    static func dedented(_ text: String) -> String {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        let indent = lines.filter { !$0.allSatisfy(\.isWhitespace) }.map { $0.prefix { $0 == " " }.count }.min() ?? 0
        return lines.map { $0.allSatisfy(\.isWhitespace) ? "" : String($0.dropFirst(indent)) }.joined(separator: "\n")
    }

    /// The regions strictly between `// README:begin[ NAME]` and `// README:end` marker lines (markers may be
    /// indented), dedented, keyed by name ("" for an unnamed region).
    static func markedRegions(of source: String) throws -> [(name: String, text: String)] {
        var result: [(String, String)] = [], open: (name: String, lines: [Substring])?
        for line in source.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.drop { $0 == " " }
            if trimmed.hasPrefix("// README:begin") {
                try #require(open == nil, "a README:begin marker inside the region '\(open?.name ?? "")'")
                open = (trimmed.dropFirst("// README:begin".count).trimmingCharacters(in: .whitespaces), [])
            } else if trimmed == "// README:end" {
                let region = try #require(open, "a README:end marker without a begin marker")
                result.append((region.name, dedented(region.lines.joined(separator: "\n"))))
                open = nil
            } else if open != nil {
                open!.lines.append(line)
            }
        }
        try #require(open == nil, "the region '\(open?.name ?? "")' is not closed")
        return result
    }

    /// Where `block` and `region` first differ, for a message a person can act on.
    static func firstDifference(_ block: String, _ region: String) -> String {
        let a = block.split(separator: "\n", omittingEmptySubsequences: false)
        let b = region.split(separator: "\n", omittingEmptySubsequences: false)
        let index = zip(a, b).enumerated().first { $0.element.0 != $0.element.1 }?.offset ?? min(a.count, b.count)
        return "line \(index + 1): README: \(index < a.count ? String(a[index]) : "<end>") | source: \(index < b.count ? String(b[index]) : "<end>")"
    }

    @Test("every swift block of README is a marked region of compiled code, and every region is in README")
    func swiftBlocksAreCompiledCode() throws {
        let readme = try Self.read("README.md")
        let blocks = Self.blocks(of: readme, language: "swift")
        var regions: [(source: String, name: String, text: String)] = []
        for source in Self.quotedSources {
            regions += try Self.markedRegions(of: Self.read(source)).map { (source, $0.name, $0.text) }
        }
        #expect(blocks.count >= 7)
        #expect(regions.contains { $0.text.contains("ModelContainer(for:") && $0.source.hasPrefix("Sources/trips-example") })
        for block in blocks where !regions.contains(where: { $0.text == Self.dedented(block) }) {
            let firstLine = block.split(separator: "\n").first.map(String.init) ?? ""
            if let near = regions.first(where: { $0.text.hasPrefix(firstLine) }) {
                Issue.record("README's swift block differs from the region '\(near.name)' of \(near.source): \(Self.firstDifference(Self.dedented(block), near.text))")
            } else {
                Issue.record("README's swift block starting '\(firstLine)' is no marked region of \(Self.quotedSources.joined(separator: " or "))")
            }
        }
        for region in regions where !blocks.contains(where: { Self.dedented($0) == region.text }) {
            Issue.record("the region '\(region.name)' of \(region.source) is quoted by no swift block of README")
        }
    }

    @Test("the package snippet names library products Package.swift declares")
    func packageSnippetNamesRealProducts() throws {
        let readme = try Self.read("README.md"), manifest = try Self.read("Package.swift")
        let snippet = try #require(Self.blocks(of: readme, language: "").first { $0.contains(".product(name:") },
                                   "README has no plain block with the package dependency")
        let names = snippet.components(separatedBy: ".product(name: \"").dropFirst().map { $0.prefix { $0 != "\"" } }
        #expect(!names.isEmpty)
        for name in names {
            #expect(manifest.contains(".library(name: \"\(name)\""), "README's snippet names the product \(name), which Package.swift lacks")
        }
        #expect(snippet.contains("package: \"replica\""))
    }

    @Test("trips-example prints what README says it prints")
    func exampleOutput() async throws {
        let readme = try Self.read("README.md")
        let expected = try #require(Self.blocks(of: readme, language: "").first { $0.hasPrefix("trips-example: ") },
                                    "README has no block of the example's output")
        let (status, output, error) = try await SoakRun.run(packageExecutable("trips-example"), [], environment: [:])
        #expect(status == 0, "\(error)")
        let printed = output.split(separator: "\n").map(String.init)
        let lines = expected.split(separator: "\n").map(String.init)
        #expect(printed.count == lines.count, "\(output)")
        for (want, got) in zip(lines, printed) {
            // A line ending in "…" stands for any ending (the example's temporary directory).
            if want.hasSuffix("…") { #expect(got.hasPrefix(String(want.dropLast())), "\(got)") } else { #expect(got == want) }
        }
    }

    @Test("the extraction finds exactly the blocks and the regions")
    func extraction() throws {
        let readme = "# T\n\n```swift\nlet a = 1\n\nlet b = 2\n```\n\n```sh\nmake\n```\n\n```swift\nother\n```\n"
        #expect(Self.blocks(of: readme, language: "swift") == ["let a = 1\n\nlet b = 2", "other"])
        #expect(Self.blocks(of: readme, language: "sh") == ["make"])
        let source = "import X\n// README:begin\nlet a = 1\n\nlet b = 2\n// README:end\nfunc f() {\n    // README:begin two\n    other\n    // README:end\n}\n"
        let regions = try Self.markedRegions(of: source)
        #expect(regions.map(\.name) == ["", "two"])
        #expect(regions.map(\.text) == Self.blocks(of: readme, language: "swift"))
        // A change on either side is noticed.
        #expect(try Self.markedRegions(of: source.replacingOccurrences(of: "b = 2", with: "b = 3"))[0].text != Self.blocks(of: readme, language: "swift")[0])
        #expect(Self.dedented("    a\n\n      b") == "a\n\n  b")
    }
}
