import Foundation
import Synchronization
import Testing
@testable import ReplicaTesting

/// Shared fixtures of the property-engine self-tests (namespaced so they cannot collide with
/// other tests in this target).
enum PropertyFixtures {
    /// Configuration for engine self-tests: fixed seed, no failure files.
    static func engineConfiguration(
        cases: Int = 200,
        seed: UInt64 = 0x5EED,
        budget: ShrinkBudget = ShrinkBudget()
    ) -> PropertyConfiguration {
        PropertyConfiguration(cases: cases, seed: seed, shrinkBudget: budget, persistence: .disabled, environmentOverride: [:])
    }


    /// Decodes `choices` with `generator` in replay mode.
    static func decode<T>(_ generator: Generator<T>, _ choices: [UInt64]) throws -> T {
        var source = ChoiceSource(replaying: choices)
        return try generator.generate(from: &source)
    }

    /// Draws `count` values from `generator` with fresh seeds.
    static func sample<T>(_ generator: Generator<T>, count: Int = 500, seed: UInt64 = 1) throws -> [T] {
        var seeds = SplitMix64(seed: seed)
        return try (0 ..< count).map { _ in
            var source = ChoiceSource(seed: seeds.next())
            return try generator.generate(from: &source)
        }
    }

    indirect enum Tree: Equatable, Sendable {
        case leaf(Int)
        case node([Tree])

        var depth: Int {
            switch self {
            case .leaf: 0
            case .node(let children): 1 + (children.map(\.depth).max() ?? 0)
            }
        }

        var leaves: [Int] {
            switch self {
            case .leaf(let value): [value]
            case .node(let children): children.flatMap(\.leaves)
            }
        }
    }

    static let treeGenerator = Gen.recursive(maxDepth: 3, base: Gen.int(in: 0 ... 20).map(Tree.leaf)) { child in
        Gen.array(of: child, maxLength: 3).map(Tree.node)
    }


    /// Counts executions from inside property bodies (bodies are non-escaping, but a shared
    /// counter keeps the tests honest even if that changes).
    final class ExecutionCounter: Sendable {
        private let value = Mutex(0)
        func increment() { value.withLock { $0 += 1 } }
        var count: Int { value.withLock { $0 } }
    }


    // MARK: - A key-value store with a bug after a specific sequence

    /// Hands out keys and stores values. Bug: `remove` after a key was overwritten restores the
    /// overwritten value instead of deleting the key (`put k; put k; remove k` leaves `k`).
    final class BuggyKeyValueStore {
        let buggy: Bool
        init(buggy: Bool = true) { self.buggy = buggy }
        private(set) var issued: Set<Int> = []
        private(set) var retired: Set<Int> = []
        private var nextKey = 100
        private var values: [Int: Int] = [:]
        private var overwritten: [Int: [Int]] = [:]

        func makeKey() -> Int {
            defer { nextKey += 1 }
            issued.insert(nextKey)
            return nextKey
        }

        func put(_ key: Int, _ value: Int) {
            if let old = values[key] { overwritten[key, default: []].append(old) }
            values[key] = value
        }

        func remove(_ key: Int) {
            if buggy, var stack = overwritten[key], let previous = stack.popLast() {
                values[key] = previous // BUG: should delete the key
                overwritten[key] = stack
            } else {
                values[key] = nil
            }
        }

        func get(_ key: Int) -> Int? { values[key] }

        func retire(_ key: Int) {
            retired.insert(key)
            values[key] = nil
            overwritten[key] = nil
        }

        var contents: [Int: Int] { values }
    }

    /// Counts uses of keys the store never issued in this case or already retired. Shared across
    /// every execution (generation and shrinking) of a machine.
    final class ReferenceMonitor: Sendable {
        private let state = Mutex((uses: 0, dangling: 0))

        func use(_ key: Int, in store: BuggyKeyValueStore) {
            let bad = !store.issued.contains(key) || store.retired.contains(key)
            state.withLock {
                $0.uses += 1
                if bad { $0.dangling += 1 }
            }
        }

        var uses: Int { state.withLock { $0.uses } }
        var dangling: Int { state.withLock { $0.dangling } }
    }

    static func keyValueMachine(monitor: ReferenceMonitor, buggy: Bool = true) -> StateMachine<[Int: Int], BuggyKeyValueStore> {
        var machine = StateMachine<[Int: Int], BuggyKeyValueStore>(
            buggy ? "buggy key-value store" : "key-value store", initialModel: { [:] }, makeSystem: { BuggyKeyValueStore(buggy: buggy) }
        )
        let keys = machine.pool("keys", of: Int.self)
        machine.rule("newKey", weight: 1) { context in
            context.add(context.system.makeKey(), to: keys)
        }
        machine.rule("put", weight: 4, requires: [keys]) { context in
            let key = context[try context.reference(from: keys)]
            let value = try context.draw(Gen.int(in: 0 ... 9))
            monitor.use(key, in: context.system)
            context.system.put(key, value)
            context.model[key] = value
        }
        machine.rule("remove", weight: 2, requires: [keys]) { context in
            let key = context[try context.reference(from: keys)]
            monitor.use(key, in: context.system)
            context.system.remove(key)
            context.model[key] = nil
        }
        machine.rule("get", weight: 2, requires: [keys]) { context in
            let key = context[try context.reference(from: keys)]
            monitor.use(key, in: context.system)
            try context.postcondition(context.system.get(key) == context.model[key], "returns the model's value")
        }
        machine.rule("retire", weight: 1, requires: [keys]) { context in
            let reference = try context.reference(from: keys)
            let key = context[reference]
            monitor.use(key, in: context.system)
            context.system.retire(key)
            context.model[key] = nil
            context.remove(reference)
        }
        machine.invariant("store matches model") { model, store in
            try Property.requireEqual(store.contents, model)
        }
        return machine
    }

    // MARK: - A counter that silently wraps at 16

    final class FourBitCounter {
        private var bits: UInt8 = 0
        var value: Int { Int(bits) }
        func add(_ amount: Int) { bits = UInt8((Int(bits) + amount) & 15) }
        func decrement() { bits = UInt8((Int(bits) + 15) & 15) }
        func reset() { bits = 0 }
    }

    static func counterMachine() -> StateMachine<Int, FourBitCounter> {
        var machine = StateMachine<Int, FourBitCounter>("four-bit counter", initialModel: { 0 }, makeSystem: { FourBitCounter() })
        machine.rule("increment") { context in
            context.system.add(1)
            context.model += 1
        }
        machine.rule("add", weight: 3) { context in
            let amount = try context.draw(Gen.int(in: 1 ... 10))
            context.system.add(amount)
            context.model += amount
        }
        machine.rule("decrement", when: { $0 > 0 }) { context in
            try Property.require(context.model > 0, kind: "precondition violated")
            context.system.decrement()
            context.model -= 1
        }
        machine.rule("reset") { context in
            context.system.reset()
            context.model = 0
        }
        machine.invariant("value matches model", holds: { model, counter in counter.value == model })
        return machine
    }


    /// A fresh, empty directory for one test.
    static func temporaryDirectory(_ name: String) -> String {
        let path = (NSTemporaryDirectory() as NSString)
            .appendingPathComponent("replica-property-tests-\(ProcessInfo.processInfo.processIdentifier)-\(name)")
        try? FileManager.default.removeItem(atPath: path)
        return path
    }
}
