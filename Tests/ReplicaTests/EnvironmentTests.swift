// ReplicaEnvironment: the seeded clock, random source and identifier generator the tests rely on.
import Foundation
import Testing
@testable import Replica

@Suite("Environment")
struct EnvironmentTests {
    let directory = TestDirectory()

    @Test func seededEnvironmentsAreDeterministic() {
        let a = ReplicaEnvironment.seeded(seed: 5, directory: directory.url)
        let b = ReplicaEnvironment.seeded(seed: 5, directory: directory.url)
        let c = ReplicaEnvironment.seeded(seed: 6, directory: directory.url)
        let first = (0..<10).map { _ in a.makeIdentifier() }
        #expect((0..<10).map { _ in b.makeIdentifier() } == first)
        #expect((0..<10).map { _ in c.makeIdentifier() } != first)
        #expect(a.now() == Date(timeIntervalSince1970: 1_767_225_600))
        #expect(a.defaultStoreDirectory == directory.url)
        #expect(a.appGroupDirectory("group.x").path == directory.url.appendingPathComponent("app-groups/group.x").path)
        #expect(a.processIdentity == ProcessIdentity(bundleIdentifier: "com.example.replica", processName: "app", processID: 1))
    }

    @Test func identifiersWithinOneMillisecondAreIncreasing() {
        let environment = ReplicaEnvironment.seeded(seed: 1, directory: directory.url)
        let ids = (0..<1_000).map { _ in environment.makeIdentifier() }
        #expect(Set(ids).count == ids.count)
        let outOfOrder = zip(ids, ids.dropFirst()).filter { !$0.bytes.lexicographicallyPrecedes($1.bytes) }.count
        #expect(outOfOrder == 0)
        // Every one is still a version-7, RFC 9562 variant UUID with the clock's milliseconds.
        for id in ids {
            #expect(id.bytes[6] >> 4 == 7)
            #expect(id.bytes[8] >> 6 == 0b10)
            #expect(id.bytes.prefix(6) == ids[0].bytes.prefix(6))
        }
    }

    @Test func identifiersFollowTheClock() throws {
        let clock = ManualClock(milliseconds: 1_000)
        var environment = ReplicaEnvironment.seeded(seed: 1, directory: directory.url)
        environment.clock = clock
        let first = environment.makeIdentifier()
        clock.advance(by: 1)
        let second = environment.makeIdentifier()
        let third = environment.makeIdentifier()
        clock.advance(by: 1_000)
        let fourth = environment.makeIdentifier()
        let ids = [first, second, third, fourth]
        #expect(ids.map { $0.bytes.prefix(6).reduce(UInt64(0)) { $0 << 8 | UInt64($1) } } == [1_000, 1_001, 1_001, 2_001])
        #expect(ids == ids.sorted { $0.bytes.lexicographicallyPrecedes($1.bytes) })
        // Copies of an environment share its clock, random source and identifier sequence.
        let copy = environment
        let fromCopy = copy.makeIdentifier()
        #expect(fourth.bytes.lexicographicallyPrecedes(fromCopy.bytes))
    }

    @Test func seededRandomSourceRepeatsAndFills() {
        let a = SeededRandomSource(seed: 9)
        let b = SeededRandomSource(seed: 9)
        #expect((0..<5).map { _ in a.next() } == (0..<5).map { _ in b.next() })
        var bytes = [UInt8](repeating: 0, count: 13)
        bytes.withUnsafeMutableBytes { a.fill($0) }
        var again = [UInt8](repeating: 0, count: 13)
        again.withUnsafeMutableBytes { b.fill($0) }
        #expect(bytes == again)
        #expect(bytes.contains { $0 != 0 })
    }
}

@Suite("Environment: identifier monotonicity")
struct EnvironmentIdentifierTests {
    @Test("identifiers are UUIDv7, strictly increasing within one millisecond and when the clock goes backwards")
    func monotonicIdentifiers() {
        let environment = ReplicaEnvironment.seeded(seed: 7, directory: FileManager.default.temporaryDirectory)
        let clock = environment.clock as! ManualClock
        var ids: [UUID] = []
        for step in 0..<300 {
            if step == 100 { clock.advance(by: 5) }
            if step == 200 { clock.advance(by: -60_000) }  // a clock jump backwards
            ids.append(environment.makeIdentifier())
        }
        for (a, b) in zip(ids, ids.dropFirst()) {
            #expect(a.bytes.lexicographicallyPrecedes(b.bytes))
        }
        #expect(ids.allSatisfy { $0.uuidString.dropFirst(14).first == "7" })
        #expect(Set(ids).count == ids.count)
    }

    @Test("the same seed gives the same identifiers")
    func deterministic() {
        let a = ReplicaEnvironment.seeded(seed: 9, directory: FileManager.default.temporaryDirectory)
        let b = ReplicaEnvironment.seeded(seed: 9, directory: FileManager.default.temporaryDirectory)
        #expect((0..<10).map { _ in a.makeIdentifier() } == (0..<10).map { _ in b.makeIdentifier() })
    }
}
