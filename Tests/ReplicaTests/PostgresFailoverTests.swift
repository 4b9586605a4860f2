import Foundation
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// Failover and epochs: a promoted standby that lost writes the old primary acknowledged shows every zone under
/// other epochs (the server's lineage is part of them), so every device's token expires, each device re-reads its
/// zones and uploads what only it holds, and no change tag repeats (`Specs/cloud-postgres.md` §12).
@Suite("PostgreSQL failover and epochs", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresFailoverTests {
    /// Syncs every device in turn, `rounds` times (backoffs are skipped by moving the devices' clocks).
    static func settle(_ devices: [(Device, PostgresCloudDatabase)], rounds: Int = 2) async throws {
        for _ in 0..<rounds {
            for (device, cloud) in devices { _ = try await drive(device, cloud, maxRequests: 400) }
        }
    }

    static func summary(_ device: Device) throws -> [String] { try device.notes().map { "\($0.title) \($0.rating)" }.sorted() }

    static func add(_ device: Device, _ titles: [String]) throws {
        for title in titles { device.context.insert(SyncNote(title: title, rating: 1)) }
        try device.context.save()
    }

    @Test("an asynchronous standby promoted after the primary died lost acknowledged writes: devices re-upload them and converge")
    func promotedStandby() async throws {
        let primary = try PostgresCluster.start(durable: true, name: "primary")
        try primary.makeCloudDatabase()
        let standby = try primary.standby(name: "standby")

        // Devices name both servers: libpq connects to the one that accepts writes (the primary, then the promoted one).
        let url = "host='\(primary.directory.path),\(standby.directory.path)' port='\(primary.port),\(standby.port)' "
            + "dbname='replica_cloud' user='backend' target_session_attrs='read-write' connect_timeout='3'"
        func device(_ name: String, seed: UInt64) throws -> (Device, PostgresCloudDatabase) {
            (try Device(name, seed: seed), try PostgresCloudDatabase(connectionString: url, owner: "traveller", maximumConnections: 1))
        }
        let phone = try device("phone", seed: 31), laptop = try device("laptop", seed: 32), tablet = try device("tablet", seed: 33)
        let all = [phone, laptop, tablet]

        // Replicated: three notes every device holds, on both servers.
        try Self.add(phone.0, ["a", "b", "c"])
        try await Self.settle(all)
        #expect(try Self.summary(tablet.0) == ["a 1", "b 1", "c 1"])
        let before = try await tablet.1.fetchZoneChanges("notes", since: nil, limit: 100).token
        let lsn = try primary.value("SELECT pg_catalog.pg_current_wal_lsn()::text") ?? ""
        var caughtUp = false
        for _ in 0..<500 where !caughtUp {
            caughtUp = try standby.value("SELECT (pg_catalog.pg_last_wal_replay_lsn() >= '\(lsn)'::pg_lsn)::text") == "true"
            if !caughtUp { try await Task.sleep(nanoseconds: 10_000_000) }
        }
        #expect(caughtUp, "the standby did not catch up")


        // Acknowledged by the primary only: the standby is down meanwhile, and the primary dies before it comes back.
        try standby.stop()
        try Self.add(phone.0, ["d", "e"])
        var edited = try phone.0.notes().first { $0.title == "a" }!
        edited.rating = 9
        phone.0.context.update(edited)
        try phone.0.context.save()
        _ = try await drive(phone.0, phone.1)
        try Self.add(laptop.0, ["f"])
        _ = try await drive(laptop.0, laptop.1)
        #expect(try Self.summary(laptop.0) == ["a 9", "b 1", "c 1", "d 1", "e 1", "f 1"])
        #expect(try phone.0.engine.status().pendingRecords == 0 && laptop.0.engine.status().pendingRecords == 0)
        try primary.stop("immediate")
        try standby.launch()
        try standby.promote()

        // The new primary lacks d, e, f and the edit of a. The tablet (which never saw them) writes first: the zone's
        // sequence on the new primary passes the tokens the phone and laptop hold.
        try Self.add(tablet.0, ["t1", "t2", "t3", "t4", "t5", "t6"])
        _ = try await drive(tablet.0, tablet.1, maxRequests: 400)
        let after = try await tablet.1.fetchZoneChanges("notes", since: nil, limit: 100).token
        #expect(after.epoch >> 16 != before.epoch >> 16, "the promoted server kept the zone's epoch")
        await #expect(throws: CloudError.changeTokenExpired) { try await tablet.1.fetchZoneChanges("notes", since: before, limit: 100) }

        try await Self.settle(all, rounds: 3)
        let expected = ["a 9", "b 1", "c 1", "d 1", "e 1", "f 1", "t1 1", "t2 1", "t3 1", "t4 1", "t5 1", "t6 1"]
        for (device, _) in all {
            #expect(try Self.summary(device) == expected, "\(device.name)")
            #expect(try device.engine.status().isUpToDate, "\(device.name)")
        }
        let cloud = try await PostgresCloudDatabase(connectionString: standby.connectionString(database: "replica_cloud", role: "backend"),
                                                    owner: "traveller").fetchZoneChanges("notes", since: nil, limit: 100)
        #expect(cloud.records.count == 12)
        #expect(cloud.records.filter(\.isAlive).count == 12)
        // No change tag of the lost lineage is reused: every record's tag is from the epoch of the new one or of the
        // replicated history.
        #expect(cloud.records.allSatisfy { $0.changeTag?.hasPrefix("\(after.epoch).") == true || $0.changeTag?.hasPrefix("\(before.epoch).") == true })
    }

    @Test("replica-cloud failover gives every zone new epochs: tokens of before expire, a full re-read works, tags do not repeat")
    func failoverCommand() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase()
        let cloud = try server.cloud(owner: "renewed", database: database)
        try await cloud.createZone("z")
        let saved = try await cloud.modifyRecords([CloudDatabaseTests.record(1)], in: "z")
        let token = try await cloud.fetchZoneChanges("z", since: nil, limit: 10).token
        let result = try replicaCloud(["failover", "--url", server.connectionString(["dbname": database])])
        #expect(result.status == 0, "\(result.all)")
        #expect(result.output.contains("new epochs"))
        await #expect(throws: CloudError.changeTokenExpired) { try await cloud.fetchZoneChanges("z", since: token, limit: 10) }
        let reread = try await cloud.fetchZoneChanges("z", since: nil, limit: 10)
        #expect(reread.records.count == 1)
        #expect(reread.token.epoch >> 16 != token.epoch >> 16)
        #expect(reread.token.epoch & 0x7FFF_0000_0000_FFFF == token.epoch & 0x7FFF_0000_0000_FFFF, "the shard and prune generation stay")
        // The record keeps its tag (a device holding it saves on top of it); the next save's tag is of the new epoch.
        #expect(reread.records[0].changeTag == CloudDatabaseTests.tags(saved)[0])
        let next = try await cloud.modifyRecords([CloudDatabaseTests.record(1, tag: CloudDatabaseTests.tags(saved)[0])], in: "z")
        #expect(CloudDatabaseTests.tags(next)[0]?.hasPrefix("\(reread.token.epoch).") == true)
        // Only administrators may: an app backend's role is refused.
        let refused = try replicaCloud(["failover", "--url", server.connectionString(role: PostgresTestServer.appRole, database: database)])
        #expect(refused.status == 1)
    }

    @Test("upgrading a database to the lineage step (and past it: PL/pgSQL lineage and mix) keeps every token valid: its epochs are the stored ones on the lineage it was made on")
    func upgradeKeepsTokens() async throws {
        let server = try PostgresTestServer.get()
        let database = try server.freshDatabase(installing: false)
        let admin = try server.administration(database: database)
        try admin.install(upTo: 2)
        let cloud = try PostgresCloudDatabase(connectionString: server.connectionString(["dbname": database]), owner: "upgraded")
        try await cloud.createZone("z")
        // A client of step 2 saves (this client speaks step 7's modify_records, which a step-2 server lacks).
        let body = try CloudRecordBody.encode(CloudDatabaseTests.record(1), includingChangeTag: false)
        #expect(try server.rawConnection(role: "postgres", database: database).integer("""
            SELECT pg_catalog.count(*) FROM replica.modify_records('upgraded', 'z', ARRAY[$1::uuid], ARRAY[NULL::text], ARRAY[true], ARRAY[$2::bytea])
            WHERE out_saved
            """, [.text(CloudDatabaseTests.record(1).recordID.uuidString), .bytea(Data(body))]) == 1)
        let token = try await cloud.fetchZoneChanges("z", since: nil, limit: 10).token
        #expect(try admin.install().stepsRun.prefix(3) == ["3: the server's lineage in every epoch; the shard directory", "4: zone deletion reasons",
                                                           "5: lineage() and epoch_mix() planned once per session"])
        let later = try await cloud.fetchZoneChanges("z", since: token, limit: 10)
        #expect(later.token == token)
        // On the lineage the database was made on, the mix is 0: clients see the stored epochs.
        #expect(try server.rawConnection(role: "postgres", database: database).integer("SELECT replica.epoch_mix()") == 0)
    }
}
