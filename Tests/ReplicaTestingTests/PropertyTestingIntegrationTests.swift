import Foundation
import Testing
@testable import ReplicaTesting

@Suite("Swift Testing integration, persistence and environment")
struct PropertyTestingIntegrationTests {
    @Test("A failing propertyCheck records one issue with seed, counterexample and replay line")
    func failingPropertyRecordsIssue() {
        var result: PropertyResult<Int>?
        withKnownIssue {
            result = propertyCheck(
                "integration: ints below 1000", seed: 42,
                configuration: PropertyConfiguration(persistence: .disabled, environmentOverride: [:]),
                Gen.int(in: 0 ... 100_000)
            ) { value in
                try Property.require(value < 1000, "too big")
            }
        } matching: { issue in
            let text = issue.comments.map(\.rawValue).joined(separator: "\n")
            return text.contains("Counterexample: 1000")
                && text.contains("seed 0x000000000000002a")
                && text.contains("REPLICA_PROPERTY_SEED=0x000000000000002a swift test --filter failingPropertyRecordsIssue")
                && text.contains("replay: \"1000\"")
                && text.contains("too big")
        }
        #expect(result?.counterexample?.value == 1000)
        #expect(result?.seed == 42)
    }

    @Test("A passing propertyCheck records nothing and runs every case")
    func passingPropertyRecordsNothing() {
        let result = propertyCheck(
            cases: 250, configuration: PropertyConfiguration(persistence: .disabled, environmentOverride: [:]),
            Gen.array(of: Gen.int(in: -100 ... 100))
        ) { list in
            try Property.requireEqual(list.sorted().sorted(), list.sorted())
        }
        #expect(result.passed)
        #expect(result.casesRun == 250)
        #expect(result.name == "ReplicaTestingTests/PropertyTestingIntegrationTests.passingPropertyRecordsNothing")
    }

    @Test("A failing state machine records its shrunk program in the issue")
    func failingMachineRecordsIssue() {
        withKnownIssue {
            propertyCheck(
                PropertyFixtures.counterMachine(), seed: 3,
                configuration: PropertyConfiguration(persistence: .disabled, environmentOverride: [:])
            )
        } matching: { issue in
            let text = issue.comments.map(\.rawValue).joined(separator: "\n")
            return text.contains("Counterexample:\n  1. add(6)\n  2. add(10)") && text.contains("replay: \"1,1,5,1,1,9\"")
        }
    }

    @Test("The replay argument runs exactly the given tape")
    func replayArgument() {
        let result = propertyCheck(
            configuration: PropertyConfiguration(persistence: .disabled, environmentOverride: [:]),
            replay: "1,2,1,2,1,2,0",
            Gen.array(of: Gen.int(in: 0 ... 3))
        ) { list in
            #expect(list == [2, 2, 2])
        }
        #expect(result.passed)
        #expect(result.casesRun == 1)

        // A state machine replays the program printed in its report.
        let program = propertyCheck(
            PropertyFixtures.counterMachine(),
            configuration: PropertyConfiguration(persistence: .disabled, environmentOverride: [:]),
            replay: "1,1,5,1,1,4"
        )
        #expect(program.passed)
        withKnownIssue {
            let failing = propertyCheck(
                PropertyFixtures.counterMachine(),
                configuration: PropertyConfiguration(persistence: .disabled, environmentOverride: [:]),
                replay: "1,1,5,1,1,9"
            )
            #expect(failing.counterexample?.origin == .replayed)
            #expect(failing.counterexample?.value.lines == ["add(6)", "add(10)"])
        }
    }

    @Test("Failing tapes are saved and replayed first on the next run")
    func failuresArePersistedAndReplayedFirst() throws {
        let directory = PropertyFixtures.temporaryDirectory("persist")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = PropertyConfiguration(
            cases: 100, seed: 1, persistence: .directory(directory), environmentOverride: [:]
        )
        let generator = Gen.array(of: Gen.int(in: 0 ... 3), maxLength: 30)
        func property(_ list: [Int]) throws {
            for index in list.indices.dropFirst(2) {
                try Property.require(!(list[index - 2] == list[index - 1] && list[index - 1] == list[index]))
            }
        }
        let first = checkProperty("persisted property", configuration: configuration, generator, property)
        #expect(first.counterexample?.origin == .generated(caseIndex: first.casesRun - 1))
        let path = try #require(first.savedFailurePath)
        let saved = try String(contentsOfFile: path, encoding: .utf8)
        #expect(saved.contains("[1,0,1,0,1,0,0]"))
        #expect(PropertyFailureStore(directory: directory).load("persisted property").map(\.choices) == [[1, 0, 1, 0, 1, 0, 0]])

        // A different seed would need its own search; the saved tape fails first.
        var again = configuration
        again.seed = 999
        let counter = PropertyFixtures.ExecutionCounter()
        let second = checkProperty("persisted property", configuration: again, generator) { list in
            counter.increment()
            try property(list)
        }
        #expect(second.counterexample?.origin == .persisted)
        #expect(second.counterexample?.value == [0, 0, 0])
        #expect(second.persistedTapesReplayed == 1)
        #expect(second.casesRun == 0)

        // Saving is idempotent.
        _ = checkProperty("persisted property", configuration: configuration, generator, property)
        #expect(PropertyFailureStore(directory: directory).load("persisted property").count == 1)

        // Once fixed, the saved tape is replayed and passes, then generation runs as usual.
        let fixed = checkProperty("persisted property", configuration: configuration, generator) { _ in }
        #expect(fixed.passed)
        #expect(fixed.persistedTapesReplayed == 1)
        #expect(fixed.casesRun == 100)
    }

    @Test("REPLICA_PROPERTY_FAILURES_DIR chooses the folder for automatic persistence")
    func failuresDirectoryFromEnvironment() {
        let directory = PropertyFixtures.temporaryDirectory("environment")
        let configuration = PropertyConfiguration(environmentOverride: ["REPLICA_PROPERTY_FAILURES_DIR": directory])
        #expect(configuration.resolvedFailureStore?.directory == directory)
        #expect(PropertyConfiguration(environmentOverride: [:]).resolvedFailureStore?.directory == ".replica-property-failures")
        #expect(PropertyConfiguration(persistence: .disabled).resolvedFailureStore == nil)
    }

    @Test("REPLICA_PROPERTY_SCALE multiplies the number of cases; REPLICA_PROPERTY_SEED sets the seed")
    func environmentScalingAndSeed() {
        let scaled = checkProperty(
            "scaled",
            configuration: PropertyConfiguration(
                cases: 10, persistence: .disabled,
                environmentOverride: ["REPLICA_PROPERTY_SCALE": "3", "REPLICA_PROPERTY_SEED": "0x2a"]
            ),
            Gen.bool
        ) { _ in }
        #expect(scaled.casesRequested == 30)
        #expect(scaled.casesRun == 30)
        #expect(scaled.seed == 42)

        let explicit = PropertyConfiguration(cases: 10, seed: 7, scale: 0.5, environmentOverride: ["REPLICA_PROPERTY_SEED": "1"])
        #expect(explicit.resolvedCases == 5)
        #expect(explicit.resolvedSeed(for: "x") == 7)
    }

    @Test("Without a seed, the seed is a fixed function of the property name")
    func defaultSeedIsStable() {
        let configuration = PropertyConfiguration(environmentOverride: [:])
        #expect(configuration.resolvedSeed(for: "ints below 1000") == configuration.resolvedSeed(for: "ints below 1000"))
        #expect(configuration.resolvedSeed(for: "a") != configuration.resolvedSeed(for: "b"))
        // Pinned so that a change to the derivation (which would change every default run) is noticed.
        #expect(PropertyConfiguration.formatSeed(configuration.resolvedSeed(for: "ints below 1000")) == "0xe6c137a9359cf60d")
    }
}
