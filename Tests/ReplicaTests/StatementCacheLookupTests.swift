// The connection's statement lookups that avoid hashing SQL text: keyed statements found by key identity (many keys,
// the table growing), and statements whose text is built from a few numbers (an UPDATE of a set of columns).
import Foundation
import Testing
@testable import Replica

@Suite("Statement cache lookups")
struct StatementCacheLookupTests {
    @Test func manyKeysEachFindTheirOwnStatement() throws {
        let db = try Connection(location: .memory(name: "statement-lookup-\(UUID().uuidString)"))
        try db.execute("CREATE TABLE t (x INTEGER)")
        let baseline = db.cachedStatementCount
        // Enough keys to grow the identity table several times.
        let keys = (0..<300).map { StatementKey("SELECT \($0) FROM t") }
        var statements: [Statement] = []
        for key in keys { statements.append(try db.cachedStatement(key)) }
        #expect(db.cachedStatementCount == baseline + keys.count)
        for (index, key) in keys.enumerated() {
            #expect(try db.cachedStatement(key) === statements[index])
            #expect(statements[index].sql == "SELECT \(index) FROM t")
        }
        // A new key with a known text still finds the statement of that text.
        #expect(try db.cachedStatement(StatementKey("SELECT 17 FROM t")) === statements[17])
        #expect(db.cachedStatementCount == baseline + keys.count)
        #expect(db.liveStatements.value == db.cachedStatementCount)
    }

    @Test func variantStatementsAreTheTextCachesStatements() throws {
        let db = try Connection(location: .memory(name: "statement-variant-\(UUID().uuidString)"))
        try db.execute("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)")
        final class Owner {}
        let owner = Owner(), other = Owner()
        let names = ["a", "b", "c"]
        var built = 0
        func update(_ owner: Owner, kind: Int, _ columns: [Int]) throws -> Statement {
            try db.cachedStatement(owner: owner, kind: kind, variant: columns) {
                built += 1
                return "UPDATE t SET " + columns.map { "\(names[$0]) = ?" }.joined(separator: ", ")
            }
        }
        let baseline = db.cachedStatementCount
        let ab = try update(owner, kind: 0, [0, 1])
        #expect(built == 1)
        #expect(try update(owner, kind: 0, [0, 1]) === ab)
        #expect(built == 1)
        // The same statement as the text cache's (counted once, so the connection stays reusable).
        #expect(try db.cachedStatement("UPDATE t SET a = ?, b = ?") === ab)
        #expect(db.cachedStatementCount == baseline + 1)
        // Another column set, kind or owner is looked up (and its text built) on its own.
        let b = try update(owner, kind: 0, [1])
        #expect(b !== ab)
        #expect(try update(owner, kind: 1, [0, 1]) === ab)
        #expect(try update(other, kind: 0, [0, 1]) === ab)
        #expect(built == 4)
        #expect(db.cachedStatementCount == baseline + 2)
        #expect(db.liveStatements.value == db.cachedStatementCount)
        #expect(db.resetForReuse())
    }

        /// History field lists split as `String.split(separator: ",")` splits them, for ASCII text and other text.
    @Test func historyFieldListsSplitLikeCharacters() {
        for text in ["a", "a,b", "name,count,note", ",a,,b,", "", ",", "caf\u{E9},na\u{EF}ve", "a,\u{301}b,c", "x,\u{1F600},y"] {
            #expect(HistoryLog.splitFieldList(text) == text.split(separator: ",").map(String.init))
        }
    }

    /// Updates of changing column sets write what they should (the statement of each set is reused).
    @Test func updatesOfChangingColumnSets() throws {
        let container = try ModelContainer(for: LookupItem.self, configurations: ModelConfiguration("lookup", isStoredInMemoryOnly: true))
        let context = ModelContext(container)
        var item = context.insert(LookupItem(name: "a", count: 1, note: "x"))
        try context.save()
        for round in 0..<6 {
            guard var fetched = try context.model(LookupItem.self, id: item.id) else { Issue.record("missing"); return }
            if round % 2 == 0 { fetched.name = "name \(round)" }
            if round % 3 == 0 { fetched.count = round }
            fetched.note = round % 2 == 1 ? "note \(round)" : fetched.note
            context.update(fetched)
            try context.save()
            item = fetched
            let stored = try context.model(LookupItem.self, id: item.id)
            #expect(stored?.name == item.name)
            #expect(stored?.count == item.count)
            #expect(stored?.note == item.note)
        }
    }
}

private struct LookupItem: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var count: Int = 0
    var note: String = ""
    static let entity = ModelEntity<LookupItem>([
        .attribute("name", \.name, default: ""),
        .attribute("count", \.count, default: 0),
        .attribute("note", \.note, default: ""),
    ])
}
