import Synchronization
import Testing
@testable import ReplicaTesting

@Suite("Shrinking to known minimal counterexamples")
struct PropertyShrinkingTests {
    @Test("'No list has 3 consecutive equal elements' shrinks to [0, 0, 0]")
    func threeConsecutiveEqual() throws {
        let result = checkProperty(
            "no three consecutive equal", configuration: PropertyFixtures.engineConfiguration(),
            Gen.array(of: Gen.int(in: 0 ... 3), maxLength: 30)
        ) { list in
            for index in list.indices.dropFirst(2) {
                try Property.require(!(list[index - 2] == list[index - 1] && list[index - 1] == list[index]))
            }
        }
        let example = try #require(result.counterexample)
        #expect(example.value == [0, 0, 0])
        #expect(example.tape.choices == [1, 0, 1, 0, 1, 0, 0])
        #expect(example.shrinkStopReason == .localMinimum)
    }

    @Test("'All ints < 1000' shrinks to exactly 1000")
    func intsBelowThousand() throws {
        let result = checkProperty("ints below 1000", configuration: PropertyFixtures.engineConfiguration(), Gen.int) { value in
            try Property.require(value < 1000)
        }
        let example = try #require(result.counterexample)
        #expect(example.value == 1000)
        #expect(example.tape.choices == [1000, 0])
        #expect(example.valueDescription == "1000")
    }

    @Test("'Sum of list < 100' shrinks to the single element [100]")
    func sumBelowHundred() throws {
        for seed in [UInt64(1), 2, 3, 0x5EED] {
            let result = checkProperty(
                "sum below 100", configuration: PropertyFixtures.engineConfiguration(seed: seed),
                Gen.array(of: Gen.int(in: 0 ... 1000), maxLength: 20)
            ) { list in
                try Property.require(list.reduce(0, +) < 100)
            }
            let example = try #require(result.counterexample)
            #expect(example.value == [100], "seed \(seed)")
        }
    }

    @Test("Sum of elements of at most 60 shrinks to [40, 60] by moving value between elements")
    func sumOfSmallElements() throws {
        let result = checkProperty(
            "sum of small elements", configuration: PropertyFixtures.engineConfiguration(),
            Gen.array(of: Gen.int(in: 0 ... 60), maxLength: 20)
        ) { list in
            try Property.require(list.reduce(0, +) < 100)
        }
        let example = try #require(result.counterexample)
        #expect(example.value == [40, 60])
    }

    @Test("Sibling order is minimized: 'contains 5 and 7' shrinks to [5, 7]")
    func siblingsAreSorted() throws {
        for seed in [UInt64(11), 12, 13, 14] {
            let result = checkProperty(
                "contains 5 and 7", configuration: PropertyFixtures.engineConfiguration(seed: seed),
                Gen.array(of: Gen.int(in: 0 ... 9), maxLength: 20)
            ) { list in
                try Property.require(!(list.contains(5) && list.contains(7)))
            }
            let example = try #require(result.counterexample)
            #expect(example.value == [5, 7], "seed \(seed)")
        }
    }

    @Test("Strings, optionals, dictionaries and recursive values shrink to their minimal failing forms")
    func structuredValues() throws {
        let string = checkProperty("no b", configuration: PropertyFixtures.engineConfiguration(), Gen.string(maxLength: 20)) {
            try Property.require(!$0.contains("b"))
        }
        #expect(string.counterexample?.value == "b")
        #expect(string.counterexample?.valueDescription == "\"b\"")

        let optional = checkProperty("optional below 10", configuration: PropertyFixtures.engineConfiguration(), Gen.optional(Gen.int(in: 0 ... 500))) {
            try Property.require(($0 ?? 0) < 10)
        }
        #expect(optional.counterexample?.value == .some(10))

        let dictionary = checkProperty(
            "no key 3", configuration: PropertyFixtures.engineConfiguration(),
            Gen.dictionary(keys: Gen.int(in: 0 ... 9), values: Gen.int(in: 0 ... 9))
        ) { dictionary in
            try Property.require(dictionary[3] == nil)
        }
        #expect(dictionary.counterexample?.value == [3: 0])
        #expect(dictionary.counterexample?.valueDescription == "[3: 0]")

        let tree = checkProperty("small leaves", configuration: PropertyFixtures.engineConfiguration(), PropertyFixtures.treeGenerator) { tree in
            try Property.require(tree.leaves.allSatisfy { $0 < 5 })
        }
        #expect(tree.counterexample?.value == .leaf(5))

        let nested = checkProperty("shallow trees", configuration: PropertyFixtures.engineConfiguration(), PropertyFixtures.treeGenerator) { tree in
            try Property.require(tree.depth < 2)
        }
        #expect(nested.counterexample?.value == .node([.node([])]))
    }

    @Test("Only candidates that fail the same way are kept")
    func failureIdentityIsPreserved() throws {
        // 5001 fails the 'big' check first; smaller odd numbers would fail the 'odd' check.
        func property(_ value: Int) throws {
            try Property.require(value < 1000, kind: "big")
            try Property.require(value.isMultiple(of: 2) || value < 10, kind: "odd")
        }
        var configuration = PropertyFixtures.engineConfiguration()
        configuration.replay = ChoiceTape(choices: [5001])
        let sameWay = checkProperty("identity", configuration: configuration, Gen.int(in: 0 ... 10000), property)
        #expect(sameWay.counterexample?.value == 1000)
        #expect(sameWay.counterexample?.failureIdentity == "big")
        #expect(sameWay.counterexample?.origin == .replayed)

        configuration.failureIdentity = { _ in "any failure" }
        let anyWay = checkProperty("identity", configuration: configuration, Gen.int(in: 0 ... 10000), property)
        // Allowed to switch to the 'odd' failure, it leaves the 'big' region altogether.
        let other = try #require(anyWay.counterexample?.value)
        #expect(other < 1000 && !other.isMultiple(of: 2))
    }

    @Test("The default identity is the failing check's source location")
    func defaultIdentityIsLocation() throws {
        let result = checkProperty("location", configuration: PropertyFixtures.engineConfiguration(), Gen.int(in: 0 ... 100)) { value in
            try Property.require(value < 50)
        }
        let identity = try #require(result.counterexample?.failureIdentity)
        #expect(identity.hasPrefix("ReplicaTestingTests/PropertyShrinkingTests.swift:"))
        enum Boom: Error { case bang, crash(Int) }
        #expect(PropertyFailure.defaultIdentity(Boom.bang).hasSuffix("Boom.bang"))
        #expect(!PropertyFailure.defaultIdentity(Boom.crash(1)).contains("crash"))
    }

    @Test("The same seed gives the same cases and the same shrunk result")
    func determinism() throws {
        func run(seed: UInt64) -> (PropertyResult<[Int]>, [[Int]]) {
            var seen: [[Int]] = []
            let result = checkProperty(
                "determinism", configuration: PropertyFixtures.engineConfiguration(seed: seed),
                Gen.array(of: Gen.int(in: -1000 ... 1000), maxLength: 10)
            ) { list in
                seen.append(list)
                try Property.require(list.filter { $0 > 500 }.count < 2)
            }
            return (result, seen)
        }
        let (first, firstCases) = run(seed: 77)
        let (second, secondCases) = run(seed: 77)
        let (_, otherCases) = run(seed: 78)
        #expect(firstCases == secondCases)
        #expect(firstCases != otherCases)
        #expect(first.counterexample?.tape == second.counterexample?.tape)
        #expect(first.counterexample?.originalTape == second.counterexample?.originalTape)
        #expect(first.counterexample?.shrinkExecutions == second.counterexample?.shrinkExecutions)
        #expect(first.counterexample?.value == [501, 501])
    }

    @Test("The shrink budget is respected, counted in executions")
    func shrinkBudget() throws {
        let counter = PropertyFixtures.ExecutionCounter()
        let budget = ShrinkBudget(maxExecutions: 10, maxDuration: .seconds(60))
        let result = checkProperty("budget", configuration: PropertyFixtures.engineConfiguration(budget: budget), Gen.int) { value in
            counter.increment()
            try Property.require(value < 1000)
        }
        let example = try #require(result.counterexample)
        #expect(example.shrinkExecutions == 10)
        #expect(example.shrinkStopReason == .executionBudget)
        #expect(example.value >= 1000)
        // Cases run + shrink executions + one final replay: nothing else executed the body.
        #expect(counter.count == result.casesRun + example.shrinkExecutions + 1)

        let timed = checkProperty(
            "time budget", configuration: PropertyFixtures.engineConfiguration(budget: ShrinkBudget(maxExecutions: 1000, maxDuration: .zero)),
            Gen.int
        ) { value in
            try Property.require(value < 1000)
        }
        #expect(timed.counterexample?.shrinkStopReason == .timeLimit)
        #expect(timed.counterexample?.shrinkExecutions == 0)
    }

    @Test("Passing properties run every case; discards are counted and can make the run give up")
    func passingAndDiscards() {
        let passing = checkProperty("passes", configuration: PropertyFixtures.engineConfiguration(cases: 300), Gen.int(in: 0 ... 10)) { value in
            try Property.require(value <= 10)
        }
        #expect(passing.passed)
        #expect(passing.casesRun == 300)
        #expect(passing.counterexample == nil)

        let assuming = checkProperty("assumes", configuration: PropertyFixtures.engineConfiguration(cases: 100), Gen.int(in: 0 ... 9)) { value in
            try Property.assume(value != 3)
            try Property.require(value != 3)
        }
        #expect(assuming.passed)
        #expect(assuming.discarded > 0)

        var strict = PropertyFixtures.engineConfiguration(cases: 100)
        strict.maxDiscards = 5
        let hopeless = checkProperty("gives up", configuration: strict, Gen.int(in: 0 ... 9)) { _ in
            try Property.assume(false)
        }
        #expect(!hopeless.passed)
        #expect(hopeless.gaveUpReason != nil)
        #expect(hopeless.counterexample == nil)
    }

    @Test("Draw-as-you-go properties shrink too and report their notes")
    func interactiveDraws() throws {
        let result = checkProperty("interactive", configuration: PropertyFixtures.engineConfiguration()) { source in
            let count = try source.draw(Gen.int(in: 0 ... 10))
            let values = try source.draw(Gen.array(of: Gen.int(in: 0 ... 100), minLength: count, maxLength: count))
            source.note("count=\(count) values=\(values)")
            try Property.require(values.reduce(0, +) < 150)
        }
        let example = try #require(result.counterexample)
        #expect(example.notes == ["count=2 values=[50, 100]"])
        #expect(example.value == example.notes)
    }
}
