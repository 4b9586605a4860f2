import Foundation
import Testing
@testable import Replica
import ReplicaTesting

/// The example app's PostgreSQL mode, as a user runs it: `replica-cloud add-user`, then `trips-example --cloud URL`
/// (or `REPLICA_CLOUD_URL`), and one device per machine with `--device NAME --store DIR`.
@Suite("trips-example through PostgreSQL", .enabled(if: PostgresTestServer.shouldRun, Comment(rawValue: PostgresTestServer.skipMessage)))
struct PostgresTripsExampleTests {
    static func example(_ arguments: [String], url: String? = nil) async throws -> (Int32, String) {
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("REPLICA_CLOUD_") }
        if let url { environment["REPLICA_CLOUD_URL"] = url }
        let (status, output, error) = try await SoakRun.run(packageExecutable("trips-example"), arguments, environment: environment)
        return (status, output + error)
    }

    @Test("two device directories sync a trip through PostgreSQL; devices with stores of their own see each other's trips")
    func throughPostgres() async throws {
        let server = try PostgresTestServer.get()
        let user = try server.makeUser("traveller")
        // A role of the user's own, with its password, over TCP: as on a second machine.
        let url = server.connectionString(role: user.name, password: user.password)
        let (status, output) = try await Self.example([], url: url)
        #expect(status == 0, "\(output)")
        #expect(output.contains("two devices sync through PostgreSQL"))
        #expect(output.contains("laptop synced: up to date = true, sees the phone's trip Kyoto (1 item); 1 trip(s) in all"), "\(output)")
        #expect(!output.contains(user.password))

        let root = FileManager.default.temporaryDirectory.appendingPathComponent("replica-trips-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: root) }
        let mac = root.appendingPathComponent("mac").path, pc = root.appendingPathComponent("pc").path
        let first = try await Self.example(["--cloud", url, "--device", "mac", "--store", mac])
        #expect(first.0 == 0, "\(first.1)")
        #expect(first.1.contains("mac holds 2 trip(s): Kyoto, mac trip 1"), "\(first.1)")
        let second = try await Self.example(["--cloud", url, "--device", "pc", "--store", pc])
        #expect(second.1.contains("pc holds 3 trip(s): Kyoto, mac trip 1, pc trip 1"), "\(second.1)")
        let third = try await Self.example(["--cloud", url, "--device", "mac", "--store", mac])
        #expect(third.1.contains("mac added 'mac trip 2'"))
        #expect(third.1.contains("mac holds 4 trip(s): Kyoto, mac trip 1, mac trip 2, pc trip 1"), "\(third.1)")
        #expect(![first.1, second.1, third.1].contains { $0.contains(user.password) })
    }
}
