import Foundation
import Testing
@testable import Replica

@Suite("Environment")
struct EnvironmentTests {
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
