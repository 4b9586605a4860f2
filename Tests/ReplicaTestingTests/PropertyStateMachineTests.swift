import Synchronization
import Testing
@testable import ReplicaTesting

@Suite("Stateful testing")
struct PropertyStateMachineTests {
    @Test("A buggy key-value store shrinks to the minimal rule sequence, with no dangling references")
    func keyValueStoreShrinks() throws {
        let monitor = PropertyFixtures.ReferenceMonitor()
        let machine = PropertyFixtures.keyValueMachine(monitor: monitor)
        let result = machine.check(configuration: PropertyFixtures.engineConfiguration(cases: 200))
        let example = try #require(result.counterexample)
        #expect(example.value.lines == [
            "keys#0 = newKey()",
            "put(keys#0, 0)",
            "put(keys#0, 0)",
            "remove(keys#0)",
        ])
        #expect(example.failureIdentity == "invariant 'store matches model'")
        #expect(!example.value.hasDanglingReferences)
        #expect(example.value.steps.allSatisfy { step in step.references.allSatisfy { $0.createdAtStep < step.number } })
        // Every execution — generation and every shrink candidate — used only live keys.
        #expect(example.shrinkExecutions > 10)
        #expect(monitor.uses > 0)
        #expect(monitor.dangling == 0)
    }

    @Test("A correct key-value store passes, with thousands of reference uses and none dangling")
    func correctKeyValueStorePasses() {
        let monitor = PropertyFixtures.ReferenceMonitor()
        let result = PropertyFixtures.keyValueMachine(monitor: monitor, buggy: false).check(configuration: PropertyFixtures.engineConfiguration(cases: 150))
        #expect(result.passed)
        #expect(monitor.uses > 2000)
        #expect(monitor.dangling == 0)
    }

    @Test("Shrunk programs stay free of dangling references for many seeds")
    func noDanglingReferencesAcrossSeeds() throws {
        let monitor = PropertyFixtures.ReferenceMonitor()
        let machine = PropertyFixtures.keyValueMachine(monitor: monitor)
        for seed in UInt64(1) ... 8 {
            let result = machine.check(configuration: PropertyFixtures.engineConfiguration(cases: 100, seed: seed))
            let example = try #require(result.counterexample, "seed \(seed)")
            #expect(!example.value.hasDanglingReferences, "seed \(seed)")
            #expect(example.value.rules == ["newKey", "put", "put", "remove"], "seed \(seed)")
        }
        #expect(monitor.dangling == 0)
    }

    @Test("A counter that wraps at 16 shrinks to add(6), add(10)")
    func counterShrinks() throws {
        let result = PropertyFixtures.counterMachine().check(configuration: PropertyFixtures.engineConfiguration(cases: 200))
        let example = try #require(result.counterexample)
        #expect(example.value.lines == ["add(6)", "add(10)"])
        #expect(example.tape.choices == [1, 1, 5, 1, 1, 9])
        #expect(example.failureIdentity == "invariant 'value matches model'")
    }

    @Test("Preconditions are always respected and weights shape the rule mix")
    func preconditionsAndWeights() throws {
        struct Tally: Sendable {
            var counts: [String: Int] = [:]
        }
        let tally = Mutex(Tally())
        var machine = StateMachine<Int, Void>("weights", maxSteps: 30, initialModel: { 0 }, makeSystem: { () })
        machine.rule("rare") { context in
            tally.withLock { $0.counts["rare", default: 0] += 1 }
            context.model += 1
        }
        machine.rule("common", weight: 9) { _ in
            tally.withLock { $0.counts["common", default: 0] += 1 }
        }
        machine.rule("guarded", weight: 5, when: { $0 >= 2 }) { context in
            try Property.require(context.model >= 2, kind: "precondition violated")
            tally.withLock { $0.counts["guarded", default: 0] += 1 }
        }
        let result = machine.check(configuration: PropertyFixtures.engineConfiguration(cases: 200))
        #expect(result.passed)
        let counts = tally.withLock { $0.counts }
        let rare = counts["rare", default: 0], common = counts["common", default: 0]
        #expect(rare > 0 && common > 4 * rare)
        #expect(counts["guarded", default: 0] > 0)
    }

    @Test("Rules that throw, postconditions and initial-state invariants have distinct identities")
    func failureKinds() throws {
        struct Overflow: Error {}
        var throwing = StateMachine<Int, Void>("throwing", initialModel: { 0 }, makeSystem: { () })
        throwing.rule("grow") { context in
            context.model += try context.draw(Gen.int(in: 0 ... 5))
            if context.model > 7 { throw Overflow() }
        }
        let thrown = throwing.check(configuration: PropertyFixtures.engineConfiguration())
        #expect(thrown.counterexample?.failureIdentity.hasPrefix("rule 'grow' threw ") == true)
        #expect(thrown.counterexample?.value.lines == ["grow(3)", "grow(5)"])

        var initial = StateMachine<Int, Void>("initial", initialModel: { -1 }, makeSystem: { () })
        initial.rule("noop") { _ in }
        initial.invariant("non-negative", holds: { model, _ in model >= 0 })
        let broken = initial.check(configuration: PropertyFixtures.engineConfiguration())
        #expect(broken.counterexample?.value.steps.isEmpty == true)
        #expect(broken.counterexample?.tape.choices == [])
        #expect("\(broken.counterexample!.error)".contains("initial state"))
    }

    @Test("A 3-device × 50-step machine runs fast enough for long runs")
    func stepThroughput() {
        struct Device { var log: [Int] = [] }
        var machine = StateMachine<[[Int]], [Device]>(
            "three devices", maxSteps: 50, averageSteps: 1000,
            initialModel: { [[], [], []] }, makeSystem: { [Device(), Device(), Device()] }
        )
        machine.rule("write", weight: 3) { context in
            let device = try context.draw(Gen.int(in: 0 ... 2))
            let value = try context.draw(Gen.int(in: 0 ... 1000))
            context.system[device].log.append(value)
            context.model[device].append(value)
        }
        machine.rule("sync") { context in
            let from = try context.draw(Gen.int(in: 0 ... 2))
            let to = try context.draw(Gen.int(in: 0 ... 2))
            context.system[to].log = context.system[from].log
            context.model[to] = context.model[from]
        }
        machine.invariant("devices match model", holds: { model, devices in devices.map(\.log) == model })
        let clock = ContinuousClock()
        var result: PropertyResult<StateMachineProgram>?
        let elapsed = clock.measure {
            result = machine.check(configuration: PropertyFixtures.engineConfiguration(cases: 300))
        }
        #expect(result?.passed == true)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        let casesPerSecond = 300 / max(seconds, 1e-9)
        #expect(casesPerSecond > 100, "\(casesPerSecond) cases/s")
    }
}
