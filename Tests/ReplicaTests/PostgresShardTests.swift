import Foundation
import Testing
@testable import Replica
@testable import ReplicaPostgres

/// Shards: independent servers, each with a shard id in every epoch it issues, and a directory that tells a device
/// where its owner's zones live (`Specs/cloud-postgres.md` §13).
@Suite("PostgreSQL shards", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresShardTests {
    @Test("two users on two shards sync independently; a token of one shard is refused (expired) by the other; a moved user re-uploads")
    func twoShards() async throws {
        let one = try PostgresCluster.start(name: "one"), two = try PostgresCluster.start(name: "two")
        let password = ["REPLICA_CLOUD_PASSWORD": "backend-\(UUID().uuidString)"]
        for (cluster, shard) in [(one, 1), (two, 2)] {
            try cluster.sql("CREATE DATABASE replica_cloud")
            let url = cluster.connectionString(database: "replica_cloud")
            let installed = try replicaCloud(["init", url, "--shard", String(shard)])
            #expect(installed.status == 0, "\(installed.all)")
            #expect(installed.output.contains("shard id \(shard)"))
            #expect(try replicaCloud(["add-user", "backend", "--app", "--url", url], environment: password).status == 0)
        }
        // The directory is shard one's database: endpoints without credentials, and who lives where.
        let directoryURL = one.connectionString(database: "replica_cloud")
        let endpoint = [1: one.connectionString(database: "replica_cloud").replacingOccurrences(of: " user='postgres'", with: ""),
                        2: two.connectionString(database: "replica_cloud").replacingOccurrences(of: " user='postgres'", with: "")]
        for shard in [1, 2] {
            #expect(try replicaCloud(["shard", String(shard), endpoint[shard]!, "--url", directoryURL]).status == 0)
        }
        #expect(try replicaCloud(["shard", "3", "host=elsewhere password=secret", "--url", directoryURL]).status == 2)
        #expect(try replicaCloud(["place", "alice", "1", "--url", directoryURL]).status == 0)
        #expect(try replicaCloud(["place", "bob", "2", "--url", directoryURL]).status == 0)
        #expect(try replicaCloud(["place", "carol", "7", "--url", directoryURL]).status == 2)

        // Each backend request finds its user's shard through the directory, with its own credentials.
        let backendDirectory = one.connectionString(database: "replica_cloud", role: "backend")
        let aliceDirectory = try PostgresShardDirectory(connectionString: backendDirectory, owner: "alice")
        let bobDirectory = try PostgresShardDirectory(connectionString: backendDirectory, owner: "bob")
        #expect(try await aliceDirectory.locate() == PostgresShardLocation(shard: 1, connection: endpoint[1]!))
        #expect(try await bobDirectory.locate()?.shard == 2)
        #expect(try await PostgresShardDirectory(connectionString: backendDirectory, owner: "nobody").locate() == nil)
        await #expect(throws: CloudError.zoneNotFound) { try await PostgresShardDirectory(connectionString: backendDirectory, owner: "nobody").cloud() }
        let aliceCloud = try await aliceDirectory.cloud(), bobCloud = try await bobDirectory.cloud()
        #expect(aliceCloud.description.contains("role backend") && aliceCloud.description.contains(one.directory.path))
        #expect(bobCloud.description.contains(two.directory.path))

        let alicePhone = try Device("alice-phone", seed: 41), aliceLaptop = try Device("alice-laptop", seed: 42)
        let bobPhone = try Device("bob-phone", seed: 43), bobLaptop = try Device("bob-laptop", seed: 44)
        alicePhone.context.insert(SyncNote(title: "alice's", rating: 1))
        try alicePhone.context.save()
        bobPhone.context.insert(SyncNote(title: "bob's", rating: 2))
        try bobPhone.context.save()
        for _ in 0..<2 {
            for device in [alicePhone, aliceLaptop] { _ = try await drive(device, aliceCloud) }
            for device in [bobPhone, bobLaptop] { _ = try await drive(device, bobCloud) }
        }
        #expect(try aliceLaptop.notes().map(\.title) == ["alice's"])
        #expect(try bobLaptop.notes().map(\.title) == ["bob's"])
        #expect(try one.value("SELECT pg_catalog.string_agg(owner, ',' ORDER BY owner) FROM replica.zone", database: "replica_cloud") == "alice")
        #expect(try two.value("SELECT pg_catalog.string_agg(owner, ',' ORDER BY owner) FROM replica.zone", database: "replica_cloud") == "bob")
        let aliceToken = try await aliceCloud.fetchZoneChanges("notes", since: nil, limit: 10).token
        let bobToken = try await bobCloud.fetchZoneChanges("notes", since: nil, limit: 10).token
        #expect(aliceToken.epoch >> 48 == 1)
        #expect(bobToken.epoch >> 48 == 2)

        // Alice moves to shard two. Her old token is refused there — also by a zone of the same name — and her devices,
        // once they find the new shard, upload what they hold.
        #expect(try replicaCloud(["place", "alice", "2", "--url", directoryURL]).status == 0)
        let movedCloud = try await aliceDirectory.cloud()
        #expect(movedCloud.description.contains(two.directory.path))
        try await movedCloud.createZone("notes")
        await #expect(throws: CloudError.changeTokenExpired) { try await movedCloud.fetchZoneChanges("notes", since: aliceToken, limit: 10) }
        for _ in 0..<2 {
            for device in [aliceLaptop, alicePhone] { _ = try await drive(device, movedCloud) }
        }
        let moved = try await movedCloud.fetchZoneChanges("notes", since: nil, limit: 10)
        #expect(moved.records.map { $0.fields["title"]?.value } == [.text("alice's")])
        #expect(moved.token.epoch >> 48 == 2)
        #expect(try alicePhone.notes().map(\.title) == ["alice's"] && aliceLaptop.engine.status().isUpToDate)
        // Bob's zone on the same shard is untouched.
        #expect(try await bobCloud.fetchZoneChanges("notes", since: bobToken, limit: 10).records.isEmpty)
        // A shard's id is fixed once it keeps zones.
        let again = try replicaCloud(["init", two.connectionString(database: "replica_cloud"), "--shard", "5"])
        #expect(again.status == 2, "\(again.all)")
    }
}
