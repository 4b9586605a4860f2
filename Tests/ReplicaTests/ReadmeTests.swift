// The README's usage block is the example host app's code, verbatim.
import Foundation
import Testing

@Suite("README")
struct ReadmeTests {
    /// The package root: this file is <root>/Tests/ReplicaTests/ReadmeTests.swift.
    static let packageRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The text of the first ```swift block after the "## Usage" heading, without the fences.
    static func usageBlock(of readme: String) throws -> String {
        let usage = try #require(readme.range(of: "\n## Usage\n"), "README.md has no '## Usage' section")
        let afterHeading = readme[usage.upperBound...]
        let open = try #require(afterHeading.range(of: "```swift\n"), "no ```swift block after '## Usage'")
        let body = afterHeading[open.upperBound...]
        let close = try #require(body.range(of: "\n```"), "the ```swift block after '## Usage' is not closed")
        return String(body[..<close.lowerBound])
    }

    /// The lines strictly between the `// README:begin` and `// README:end` marker lines.
    static func markedRegion(of source: String) throws -> String {
        let begin = try #require(source.range(of: "// README:begin\n"), "no '// README:begin' marker")
        let rest = source[begin.upperBound...]
        let end = try #require(rest.range(of: "\n// README:end"), "no '// README:end' marker after the begin marker")
        return String(rest[..<end.lowerBound])
    }

    @Test func usageBlockEqualsTheExampleApp() throws {
        let readme = try String(contentsOf: Self.packageRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let example = try String(contentsOf: Self.packageRoot.appendingPathComponent("Sources/trips-example/main.swift"),
                                 encoding: .utf8)
        let block = try Self.usageBlock(of: readme)
        let region = try Self.markedRegion(of: example)
        #expect(!block.isEmpty)
        #expect(block.contains("ModelContainer"))
        if block != region {
            let blockLines = block.split(separator: "\n", omittingEmptySubsequences: false)
            let regionLines = region.split(separator: "\n", omittingEmptySubsequences: false)
            let first = zip(blockLines, regionLines).enumerated().first { $0.element.0 != $0.element.1 }?.offset
                ?? min(blockLines.count, regionLines.count)
            Issue.record("""
                README.md's usage block differs from Sources/trips-example/main.swift (between the README markers) \
                at line \(first + 1) of the block:
                README:  \(first < blockLines.count ? String(blockLines[first]) : "<end>")
                example: \(first < regionLines.count ? String(regionLines[first]) : "<end>")
                """)
        }
    }

    @Test func extractionFindsExactlyTheBlockAndTheRegion() throws {
        let readme = "# T\n\n## Usage\n\nText.\n\n```swift\nlet a = 1\n\nlet b = 2\n```\n\n## Next\n\n```swift\nother\n```\n"
        #expect(try Self.usageBlock(of: readme) == "let a = 1\n\nlet b = 2")
        let source = "import X\n// README:begin\nlet a = 1\n\nlet b = 2\n// README:end\nmain()\n"
        #expect(try Self.markedRegion(of: source) == "let a = 1\n\nlet b = 2")
        #expect(try Self.usageBlock(of: readme) == Self.markedRegion(of: source))
        // A change on either side is noticed.
        #expect(try Self.markedRegion(of: source.replacingOccurrences(of: "b = 2", with: "b = 3")) != Self.usageBlock(of: readme))
    }
}
