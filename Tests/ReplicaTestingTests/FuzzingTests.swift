import Foundation
import Replica
import ReplicaTesting
import Testing

/// Iterations per target: `REPLICA_FUZZ_ITERATIONS`, else a few seconds' worth in debug builds.
private func iterations(_ target: FuzzTarget) -> Int {
    if let text = ProcessInfo.processInfo.environment["REPLICA_FUZZ_ITERATIONS"], let value = Int(text) { return value }
    switch target {
    case .cloudRecord: return 400
    case .scenario: return 300
    case .trace: return 60
    case .storeFile: return 200
    }
}

@Suite("Fuzzing: inputs from outside")
struct FuzzingTests {
    @Test("an iteration's input is a function of the seed and the iteration alone", arguments: FuzzTarget.allCases)
    func inputsAreReproducible(target: FuzzTarget) {
        let inputs = (0..<20).map { Fuzzer.input(target, seed: 42, iteration: $0) }
        #expect(inputs == (0..<20).map { Fuzzer.input(target, seed: 42, iteration: $0) })
        #expect(Fuzzer.input(target, seed: 42, iteration: 7) == inputs[7])
        #expect(Set(inputs).count > 10, "mutations vary")
        #expect(inputs != (0..<20).map { Fuzzer.input(target, seed: 43, iteration: $0) })
        #expect(Fuzzer.bytes(hex: Fuzzer.hex(inputs[3])) == inputs[3])
    }

    @Test("most JSON inputs stay readable JSON, so they reach past the parser")
    func jsonMutationsKeepStructure() {
        let json = (0..<400).filter { !Fuzzer.binaryIteration(seed: 5, iteration: $0) }
        let readable = json.filter { iteration in
            let input = Fuzzer.input(.cloudRecord, seed: 5, iteration: iteration)
            return (try? JSONSerialization.jsonObject(with: Data(input), options: [.fragmentsAllowed])) != nil
        }.count
        #expect(json.count > 150 && json.count < 250, "\(json.count) of 400 iterations fuzz JSON")
        #expect(readable > json.count / 2, "\(readable) of \(json.count)")
    }

    @Test("half of the cloud-record inputs are binary bodies: some still decode, the rest are refused with a typed error")
    func binaryBodiesAreFuzzed() {
        let binary = (0..<400).filter { Fuzzer.binaryIteration(seed: 5, iteration: $0) }
        #expect(binary.count > 150 && binary.count < 250, "\(binary.count) of 400 iterations fuzz the binary form")
        var decoded = 0, refused = 0
        for iteration in binary {
            let input = Fuzzer.input(.cloudRecord, seed: 5, iteration: iteration)
            do {
                _ = try CloudRecordBody.decode(Data(input))
                decoded += 1
            } catch is CloudRecordBodyError {
                refused += 1
            } catch {
                // A mutated first byte makes it JSON (then a DecodingError); anything else is a bug.
                #expect(error is DecodingError, "iteration \(iteration): \(type(of: error))")
            }
        }
        #expect(decoded > binary.count / 10, "\(decoded) of \(binary.count) mutated binary bodies decode")
        #expect(refused > binary.count / 4, "\(refused) of \(binary.count) are refused as malformed")
    }

    /// Each target's loop runs in a child process: a trap fails this test instead of ending the test run.
    @Test("each target survives its seeded iterations: typed errors only, no trap (REPLICA_FUZZ_ITERATIONS)", arguments: FuzzTarget.allCases)
    func noTrap(target: FuzzTarget) async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) { [target] in
            let count = iterations(target)
            let report = Fuzzer.run(target, seed: 1, iterations: count) { iteration, _ in
                FileHandle.standardError.write(Data("\(target) iteration \(iteration)\n".utf8))
            }
            guard report.iterations == count else { exit(2) }
        }
        if let result, result.exitStatus != .exitCode(EXIT_SUCCESS) {
            let last = String(decoding: result.standardErrorContent, as: UTF8.self).split(separator: "\n").last { $0.contains("iteration") }
            Issue.record("\(target): the fuzz loop ended at \(last.map(String.init) ?? "?") (reproduce: replica-sim fuzz --target \(target) --seed 1 --iteration N)")
        }
    }
}
