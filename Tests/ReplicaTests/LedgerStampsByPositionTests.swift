// The merge and local updates read the ledger's `stamps` column by storage position (no map). Whatever the column
// holds — the one-stamp form, the compact form with any subset of the entity's names and names it does not store,
// unsorted or repeated names, non-ASCII names, the old JSON form, NULL, garbage — the positions and count must be
// exactly what the map `readStamps` reads says, looked up by the entity's field names.
import Foundation
import Testing
@testable import Replica

@Suite("Ledger stamps by position")
struct LedgerStampsByPositionTests {
    static func stamp(_ seed: UInt64) -> FieldStamp {
        var uuid = UUID.unassigned.uuid
        withUnsafeMutableBytes(of: &uuid) { $0.storeBytes(of: seed &* 0x9E37_79B9_7F4A_7C15, toByteOffset: 0, as: UInt64.self) }
        return FieldStamp(incarnation: Int64(seed % 3) + 1, clock: HLC(physical: Int64(seed % 1_000), logical: Int32(seed % 7), replica: UUID(uuid: uuid)))
    }

    /// Reads `column` (a stamps column value) both ways and compares.
    static func check(_ column: SQLiteValue, _ statements: EntityStatements, _ db: Connection, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let statement = try db.cachedStatement("SELECT ?")
        defer { statement.reset() }
        try statement.bind(column, at: 0)
        #expect(try statement.step())
        let map = SyncLedger.readStamps(statement, 0) ?? [:]
        let positional = SyncLedger.readStampsByPosition(statement, 0, statements)
        #expect(positional.stamps == statements.fieldNames.map { map[$0] }, sourceLocation: sourceLocation)
        #expect(positional.count == map.count, sourceLocation: sourceLocation)
    }

    @Test("every form of the stamps column reads by position as the map does")
    func positionsMatchTheMap() throws {
        let db = try Connection(location: .memory(name: "stamps-by-position-1"))
        let names = ["title", "body", "rating", "Zeta", "a_b", "a", "ab", "b"]
        let entity = Schema.Entity(name: "Item", attributes: names.map { Schema.Attribute(name: $0, type: .string, isOptional: true) })
        let statements = EntityStatements(entity)
        let others = ["zz", "A", "aa", "", "é", "e\u{301}", "title2", "tit"]
        var random = SplitMix(seed: 11)
        for _ in 0..<400 {
            var map: [String: FieldStamp] = [:]
            let distinct = 1 + Int(random.next() % 3)
            for name in names + others where random.next() % 3 != 0 {
                map[name] = Self.stamp(random.next() % UInt64(distinct) + 1)
            }
            try Self.check(.blob(SyncLedger.encodeStamps(map)), statements, db)
            try Self.check(.text(LedgerCodingTests.slowJSON(map)), statements, db)
            let known = map.filter { names.contains($0.key) }
            try Self.check(.blob(SyncLedger.encodeStamps(known)), statements, db)
        }
        // The one-stamp form, and an empty map.
        let one = SyncLedger.encodeStamps(every: Self.stamp(5), oneStampTail: statements.oneStampTail)
        try Self.check(.blob(one), statements, db)
        try Self.check(.blob(SyncLedger.encodeStamps([:])), statements, db)
        // Names out of order (the map still reads them), a name twice, and malformed bytes (no stamps).
        let s = Self.stamp(9)
        // (Version, one stamp, its 36 bytes, two fields: length 4, "aaaa", index, length 4, "body", index.)
        var unsorted = SyncLedger.encodeStamps(["aaaa": s, "body": s])
        let a = 1 + 1 + 36 + 1 + 1, b = a + 4 + 1 + 1
        #expect(unsorted[a] == UInt8(ascii: "a") && unsorted[b] == UInt8(ascii: "b"))
        for offset in 0..<4 { (unsorted[a + offset], unsorted[b + offset]) = (unsorted[b + offset], unsorted[a + offset]) }
        #expect(LedgerCodingTests.decodeCompact(unsorted) == ["aaaa": s, "body": s])
        try Self.check(.blob(unsorted), statements, db)
        var twice = SyncLedger.encodeStamps(["body": s, "bodz": s])
        #expect(twice[b + 3] == UInt8(ascii: "z"))
        twice[b + 3] = UInt8(ascii: "y")
        try Self.check(.blob(twice), statements, db)
        let good = SyncLedger.encodeStamps(["title": s, "body": Self.stamp(10), "extra": s])
        for length in 0..<good.count { try Self.check(.blob(good.prefix(length)), statements, db) }
        try Self.check(.blob(good + [0]), statements, db)
        try Self.check(.null, statements, db)
        try Self.check(.text("not json"), statements, db)
        try Self.check(.integer(7), statements, db)
    }

    @Test("an entity whose names are not ASCII reads by position as the map does")
    func nonASCIIEntity() throws {
        let db = try Connection(location: .memory(name: "stamps-by-position-2"))
        // "K" (U+212A KELVIN SIGN) equals "K" as a String; "é" precomposed equals "e" + U+0301.
        let names = ["\u{212A}", "é", "plain"]
        let entity = Schema.Entity(name: "Item", attributes: names.map { Schema.Attribute(name: $0, type: .string, isOptional: true) })
        let statements = EntityStatements(entity)
        for map: [String: FieldStamp] in [["K": Self.stamp(1), "e\u{301}": Self.stamp(2), "plain": Self.stamp(3)], ["plain": Self.stamp(4)],
                                          ["\u{212A}": Self.stamp(5)], [:]] {
            try Self.check(.blob(SyncLedger.encodeStamps(map)), statements, db)
        }
    }
}

/// SplitMix64, for the cases above (deterministic).
private struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite("Ledger store statements")
struct LedgerStoreStatementTests {
    /// The single upsert `SyncLedger.store` ran before it became an UPDATE or an INSERT: the reference.
    static let upsert = """
        INSERT INTO replica_sync_record (id, entity, causal_length, created, stamps, unknown, tombstone, redirect,
                                         change_tag, local_version, pending, state)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (id) DO UPDATE SET entity = excluded.entity, causal_length = excluded.causal_length,
            created = excluded.created, stamps = excluded.stamps, unknown = excluded.unknown,
            tombstone = excluded.tombstone, redirect = excluded.redirect, change_tag = excluded.change_tag,
            local_version = excluded.local_version, pending = excluded.pending,
            state = CASE WHEN excluded.pending = 1 AND replica_sync_record.state NOT IN ('rejected', 'undecryptable')
                         THEN 'pending' WHEN excluded.pending = 0 THEN 'synced' ELSE replica_sync_record.state END
        """

    static func ledger(_ name: String) throws -> Connection {
        let db = try Connection(location: .memory(name: name))
        try db.execute(SyncLedger.createSQL)
        for (_, statement) in SyncLedger.addedColumns { try db.execute(statement) }
        return db
    }

    @Test("store writes what the upsert wrote, whichever statement the caller expects to apply")
    func storeMatchesTheUpsert() throws {
        let id = UUID(uuidString: "01900000-0000-7000-8000-000000000001")!
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: 5, logical: 0, replica: id))
        var index = 0
        for existing in [nil, "pending", "synced", "rejected", "undecryptable"] as [String?] {
            for pending in [false, true] {
                for exists in [false, true] {
                    index += 1
                    let actual = try Self.ledger("ledger-store-actual-\(index)"), expected = try Self.ledger("ledger-store-expected-\(index)")
                    for db in [actual, expected] {
                        if let existing {
                            try db.run("""
                                INSERT INTO replica_sync_record (id, entity, causal_length, created, stamps, state, reason, waiting_for, seen)
                                VALUES (?, 'Item', 1, ?, x'00', ?, 'why', ?, 3)
                                """, [id.sqliteValue, .text(stamp.description), .text(existing), id.sqliteValue])
                        }
                    }
                    let state = SyncLedger.RecordState(
                        id: id, entity: "Item", causalLength: 2, created: stamp, stamps: ["title": stamp],
                        unknown: ["extra": CloudField(value: .integer(1), stamp: stamp)], tombstone: [:], redirect: nil,
                        changeTag: "tag", localVersion: 4, pending: pending)
                    let stamps = SyncLedger.encodeStamps(state.stamps)
                    try SyncLedger.store(state, actual, stamps: stamps, exists: exists)
                    try expected.run(Self.upsert, [
                        id.sqliteValue, .text("Item"), .integer(2), .text(stamp.description), .blob(stamps),
                        .text(try ReplicaJSON.string(state.unknown)), .null, .null, .text("tag"), .integer(4),
                        .integer(pending ? 1 : 0), .text(pending ? "pending" : "synced"),
                    ])
                    let query = "SELECT * FROM replica_sync_record ORDER BY id"
                    #expect(try actual.rows(query) == expected.rows(query), "stored \(existing ?? "nothing"), pending \(pending), exists \(exists)")
                }
            }
        }
    }
}
