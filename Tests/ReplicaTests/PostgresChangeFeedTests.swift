import Foundation
import Synchronization
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// The PostgreSQL change feed under concurrent writers: a reader that follows its tokens never skips a change
/// (`Specs/cloud-postgres.md`, "The change feed").
@Suite("PostgreSQL change feed", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresChangeFeedTests {
    static func record(_ id: UUID, writer: Int, version: Int) -> CloudRecord {
        let stamp = FieldStamp(incarnation: 1, clock: HLC(physical: Int64(version + 1), logical: 0, replica: id))
        return CloudRecord(recordID: id, recordType: "Note", causalLength: 1, created: stamp,
                           fields: ["title": CloudField(value: .text("writer \(writer) version \(version)"), stamp: stamp)])
    }

    /// What the writers had acknowledged: each record's newest saved change tag.
    final class Acknowledged: Sendable {
        let tags = Mutex<[UUID: String]>([:])
        let writersDone = Atomic<Int>(0)
    }

    /// Runs `writers` writers and `readers` readers at once on one zone, each on a connection of its own, and
    /// returns, per reader, the newest tag it saw of each record.
    static func run(_ server: PostgresTestServer, owner: String, writers: Int, readers: Int, batches: Int,
                    database: String? = nil) async throws -> (acknowledged: [UUID: String], seen: [[UUID: String]]) {
        let setup = try server.cloud(owner: owner, database: database, maximumConnections: 1)
        try await setup.createZone("feed")
        let acknowledged = Acknowledged()
        let seen = try await withThrowingTaskGroup(of: [UUID: String]?.self) { group in
            for writer in 0..<writers {
                let cloud = try server.cloud(owner: owner, database: database, maximumConnections: 1)
                group.addTask {
                    var mine: [(id: UUID, tag: String)] = []
                    for batch in 0..<batches {
                        // Two new records, and (from the second batch on) a new version of an earlier one of this
                        // writer, so records also move within the feed.
                        var records = [UUID(), UUID()].map { Self.record($0, writer: writer, version: batch) }
                        if let earlier = mine.randomElement() {
                            var update = Self.record(earlier.id, writer: writer, version: batch)
                            update.changeTag = earlier.tag
                            records.append(update)
                        }
                        let results = try await cloud.modifyRecords(records, in: "feed")
                        for result in results {
                            guard case let .saved(id, tag) = result else {
                                Issue.record("writer \(writer): unexpected \(result)")
                                continue
                            }
                            mine.removeAll { $0.id == id }
                            mine.append((id, tag))
                            acknowledged.tags.withLock { $0[id] = tag }
                        }
                    }
                    acknowledged.writersDone.add(1, ordering: .sequentiallyConsistent)
                    return nil
                }
            }
            for _ in 0..<readers {
                let cloud = try server.cloud(owner: owner, database: database, maximumConnections: 1)
                group.addTask {
                    var seen: [UUID: String] = [:]
                    var token: ServerChangeToken?
                    while true {
                        let finished = acknowledged.writersDone.load(ordering: .sequentiallyConsistent) == writers
                        let batch = try await cloud.fetchZoneChanges("feed", since: token, limit: 7)
                        for record in batch.records { seen[record.recordID] = record.changeTag }
                        token = batch.token
                        // Caught up after every writer finished: nothing acknowledged can come later.
                        if finished && !batch.moreComing { return seen }
                    }
                }
            }
            var seen: [[UUID: String]] = []
            for try await result in group { if let result { seen.append(result) } }
            return seen
        }
        return (acknowledged.tags.withLock { $0 }, seen)
    }

    @Test("16 concurrent writers and readers on one zone: every acknowledged version reaches every token-following reader")
    func concurrentWritersAndReaders() async throws {
        let server = try PostgresTestServer.get()
        let (acknowledged, seen) = try await Self.run(server, owner: "feed-\(UUID().uuidString.lowercased())",
                                                      writers: 8, readers: 8, batches: 25)
        #expect(acknowledged.count == 8 * 25 * 2)
        #expect(seen.count == 8)
        for (index, reader) in seen.enumerated() {
            let missing = acknowledged.filter { reader[$0.key] != $0.value }
            #expect(missing.isEmpty, "reader \(index) missed \(missing.count) acknowledged versions")
        }
    }

    @Test("the check catches a feed whose sequence order is not commit order: a reader following tokens then misses changes")
    func checkCatchesOutOfOrderCommits() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        // A broken modify_records: sequences from a SEQUENCE object and no zone lock; a batch of several records waits,
        // before it commits, for an advisory lock the test holds — so a later sequence commits before an earlier one.
        try server.superuserSQL("""
            CREATE SEQUENCE replica.unlocked_sequence;
            GRANT USAGE ON SEQUENCE replica.unlocked_sequence TO replica_app;
            CREATE OR REPLACE FUNCTION replica.modify_records(p_owner text, p_zone text, p_ids uuid[], p_tags text[],
                p_alive boolean[], p_bodies bytea[], p_assets text[])
            RETURNS TABLE (out_saved boolean, out_change_tag text, out_body bytea, out_missing text) LANGUAGE plpgsql AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_zone bigint;
                v_sequence bigint;
            BEGIN
                SELECT z.id INTO v_zone FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone;
                FOR i IN 1 .. pg_catalog.array_length(p_ids, 1) LOOP
                    v_sequence := pg_catalog.nextval('replica.unlocked_sequence');
                    INSERT INTO replica.record AS r (zone_id, owner, id, sequence, change_tag, alive, body)
                        VALUES (v_zone, v_owner, p_ids[i], v_sequence, v_sequence::text, p_alive[i], p_bodies[i]);
                    out_saved := true;
                    out_change_tag := v_sequence::text;
                    RETURN NEXT;
                END LOOP;
                IF pg_catalog.array_length(p_ids, 1) > 1 THEN
                    PERFORM pg_catalog.pg_advisory_xact_lock(4242);
                END IF;
                UPDATE replica.zone SET sequence = GREATEST(sequence, v_sequence) WHERE id = v_zone;
            END
            $$;
            """, database: database)
        let slowWriter = try server.cloud(owner: "broken", database: database)
        let quickWriter = try server.cloud(owner: "broken", database: database)
        let reader = try server.cloud(owner: "broken", database: database)
        try await reader.createZone("feed")
        let admin = try server.rawConnection(role: "postgres", database: database)
        _ = try admin.query("SELECT pg_catalog.pg_advisory_lock(4242)", [], prepare: false)
        // Writer 1 numbers two records (sequences 1, 2) and waits before committing.
        let slow = Task { try await slowWriter.modifyRecords([Self.record(UUID(), writer: 1, version: 0),
                                                              Self.record(UUID(), writer: 1, version: 0)], in: "feed") }
        var paused = false
        for _ in 0..<1_000 where !paused {
            try await Task.sleep(nanoseconds: 10_000_000)
            paused = try admin.integer("""
                SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
                WHERE datname = pg_catalog.current_database() AND wait_event = 'advisory'
                """) == 1
        }
        #expect(paused)
        // Writer 2 saves sequence 3 and commits; the reader reads up to 3.
        let quick = try await quickWriter.modifyRecords([Self.record(UUID(), writer: 2, version: 0)], in: "feed")
        let first = try await reader.fetchZoneChanges("feed", since: nil, limit: 10)
        // Writer 1 commits; the reader goes on from its token.
        _ = try admin.query("SELECT pg_catalog.pg_advisory_unlock(4242)", [], prepare: false)
        let slowResults = try await slow.value
        #expect(slowResults.allSatisfy { if case .saved = $0 { true } else { false } })
        let later = try await reader.fetchZoneChanges("feed", since: first.token, limit: 10)
        let seen = Set((first.records + later.records).map(\.recordID))
        let acknowledged = (slowResults + quick).map(\.recordID)
        #expect(first.token.sequence == 3)
        // Writer 1's two acknowledged records lie below the reader's token: the reader never sees them.
        #expect(acknowledged.filter { !seen.contains($0) }.count == 2)
    }
}
