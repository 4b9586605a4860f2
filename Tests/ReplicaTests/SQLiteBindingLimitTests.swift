import CSQLite
import Foundation
import Testing
@testable import Replica

/// A note with a large text field, for binding limits through a save.
private struct LimitNote: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var text: String = ""
    static let entity = ModelEntity<LimitNote>([.attribute("text", \.text, default: "")])
}

@Suite("SQLite binding limits")
struct SQLiteBindingLimitTests {
    /// A fresh in-memory connection whose SQLITE_LIMIT_LENGTH is `limit` bytes.
    private func connection(limit: Int32) throws -> Connection {
        let db = try Connection(location: .memory(name: "binding-limit-\(UUID().uuidString)"))
        sqlite3_limit(db.handle, SQLITE_LIMIT_LENGTH, limit)
        return db
    }

    @Test("text and blobs over the connection's length limit throw SQLITE_TOOBIG naming the parameter, never the value")
    func overTheLengthLimit() throws {
        let db = try connection(limit: 100)
        let secret = String(repeating: "secret-", count: 20)
        // Small rows bind from the statement's own buffer, rows over 64 kB with SQLite's copies: both paths.
        let values: [[SQLiteValue]] = [
            [.integer(1), .text(secret)],
            [.integer(1), .blob(Data(secret.utf8))],
            [.integer(1), .text(String(repeating: "x", count: 70_000))],
            [.integer(1), .blob(Data(count: 70_000))],
        ]
        for row in values {
            do {
                _ = try db.rows("SELECT ?, ?", row)
                Issue.record("binding \(row[1]) past the limit succeeded")
            } catch let error as SQLiteError {
                #expect(error.resultCode == SQLITE_TOOBIG)
                #expect(error.message.contains("parameter 2"), "\(error)")
                #expect(!error.description.contains("secret"))
            }
        }
        // The statement binds without a copy as well (`withStaticText`, `withStaticBlob`).
        let statement = try db.cachedStatement("SELECT ?")
        defer { statement.reset() }
        #expect(throws: SQLiteError.self) { try statement.withStaticText(secret, at: 0) { _ = try statement.step() } }
        do {
            try statement.withStaticBlob(Data(secret.utf8), at: 0) { _ = try statement.step() }
            Issue.record("a static blob past the limit bound")
        } catch let error as SQLiteError {
            #expect(error.resultCode == SQLITE_TOOBIG && error.message.contains("parameter 1"))
        }
        // Within the limit, everything binds.
        #expect(try db.rows("SELECT ?, ?", [.integer(1), .text("short")]) == [[.integer(1), .text("short")]])
    }

    @Test("a length past Int32 is passed whole to SQLite, which refuses it before reading a byte (no 2 GiB needed)")
    func lengthsPastInt32() throws {
        let db = try connection(limit: 1_000_000_000)
        let statement = try db.cachedStatement("SELECT ?")
        defer { statement.reset() }
        let past = Int(Int32.max) + 1
        #expect(Statement.byteCount(past) == 1 << 31)
        #expect(Statement.byteCount(Int(UInt32.max) + 7) == (1 << 32) + 6)
        #expect(Statement.byteCount(0) == 0)
        // One real byte, announced as 2^31 of them: SQLite's 64-bit binding checks the length first.
        var byte: UInt8 = 0x2A
        try withUnsafeBytes(of: &byte) { one in
            let claimed = UnsafeRawBufferPointer(start: one.baseAddress, count: past)
            #expect(statement.bindBlob(claimed, at: 0, copying: true) == SQLITE_TOOBIG)
            #expect(statement.bindText(claimed, at: 0, copying: true) == SQLITE_TOOBIG)
            do {
                try statement.check(statement.bindBlob(claimed, at: 0, copying: true), parameter: 0)
                Issue.record("a 2 GiB blob bound")
            } catch let error as SQLiteError {
                #expect(error.resultCode == SQLITE_TOOBIG && error.message.contains("parameter 1"))
            }
        }
        // Empty text is still TEXT, an empty blob still a BLOB.
        #expect(statement.bindText(UnsafeRawBufferPointer(start: nil, count: 0), at: 0, copying: false) == SQLITE_OK)
        #expect(try statement.step() && sqlite3_column_type(statement.handle, 0) == SQLITE_TEXT)
        statement.reset()
        #expect(statement.bindBlob(UnsafeRawBufferPointer(start: nil, count: 0), at: 0, copying: false) == SQLITE_OK)
        #expect(try statement.step() && sqlite3_column_type(statement.handle, 0) == SQLITE_BLOB)
    }

    @Test("a save whose value is over the store connection's limit throws SQLITE_TOOBIG and keeps its changes pending")
    func saveOverTheLimit() throws {
        let container = try inMemoryContainer(seed: 1, synced: false, models: [LimitNote.self])
        sqlite3_limit(try nextConnectionHandle(container), SQLITE_LIMIT_LENGTH, 1_000)
        let context = ModelContext(container)
        context.insert(LimitNote(text: String(repeating: "y", count: 5_000)))
        do {
            try context.save()
            Issue.record("the save bound a value past the limit")
        } catch let error as SQLiteError {
            #expect(error.resultCode == SQLITE_TOOBIG)
            #expect(error.message.contains("parameter"))
            #expect(!error.description.contains("yyyy"))
        }
        #expect(context.hasChanges)
    }
}
