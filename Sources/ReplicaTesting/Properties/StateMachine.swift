// Stateful (rule-based) property testing.
//
// A state machine test runs a random sequence of rules against the real system and a simple
// reference model, checking postconditions after each rule and invariants after each step.
// Steps are drawn from the same choice tape as everything else, so the shrinker deletes and
// simplifies steps like any other data. Entities created by earlier steps are referred to
// symbolically: a reference is drawn as an index into the entities that are alive *at that
// moment*, so a shrunk program can never refer to an entity whose creating step was removed.

/// Type-erased view of an ``EntityPool`` (used in a rule's `requires:` list).
public protocol AnyEntityPool: Sendable {
    /// The pool's name.
    var name: String { get }
    /// Position of the pool in its state machine.
    var poolIndex: Int { get }
}

/// A named collection of entities of one type that rules create and later refer to
/// (Hypothesis calls it a bundle). Create pools with ``StateMachine/pool(_:of:)``.
public struct EntityPool<Entity>: AnyEntityPool, Hashable, CustomStringConvertible {
    /// The pool's name (shown in references, e.g. `keys#0`).
    public let name: String
    /// Position of the pool in its state machine.
    public let poolIndex: Int
    public var description: String { "pool \(name)" }
}

/// A reference to an entity created by an earlier step, e.g. `keys#0` (the first entity
/// created in pool `keys`). Resolve it with ``RuleContext/value(of:)``.
public struct SymbolicReference<Entity>: Sendable, Hashable, CustomStringConvertible {
    /// Name of the pool the entity lives in.
    public let poolName: String
    /// Position of the pool in its state machine.
    public let poolIndex: Int
    /// Creation number within the pool in this run (0 for the first entity created).
    public let ordinal: Int
    /// The 1-based step that created the entity.
    public let createdAtStep: Int

    /// `pool#ordinal`.
    public var description: String { "\(poolName)#\(ordinal)" }
}

/// The executed program of a state-machine case: the counterexample of a failing
/// state-machine property.
public struct StateMachineProgram: Sendable, Hashable, CustomStringConvertible {
    /// An entity mentioned by a step.
    public struct Entity: Sendable, Hashable, CustomStringConvertible {
        /// Name of the entity's pool.
        public var pool: String
        /// Creation number within the pool (0 for the first).
        public var ordinal: Int
        /// The step that created the entity.
        public var createdAtStep: Int
        public var description: String { "\(pool)#\(ordinal)" }
    }

    /// One executed rule.
    public struct Step: Sendable, Hashable, CustomStringConvertible {
        /// 1-based position in the program.
        public var number: Int
        /// Name of the rule.
        public var rule: String
        /// Arguments drawn by the rule, in order (values and references).
        public var arguments: [String]
        /// Entities the rule referred to.
        public var references: [Entity]
        /// Entities the rule created.
        public var created: [Entity]
        /// Entities the rule removed.
        public var removed: [Entity]
        /// Notes recorded by the rule.
        public var notes: [String]

        /// e.g. `keys#0 = newKey()` or `put(keys#0, 3)`.
        public var description: String {
            let call = "\(rule)(\(arguments.joined(separator: ", ")))"
            if created.isEmpty { return call }
            return created.map(\.description).joined(separator: ", ") + " = " + call
        }
    }

    /// The steps in execution order.
    public var steps: [Step] = []
    /// Notes recorded outside rules (e.g. by invariants), and the failing check.
    public var notes: [String] = []

    /// Creates a program from its steps.
    public init(steps: [Step] = [], notes: [String] = []) {
        self.steps = steps
        self.notes = notes
    }

    /// The rule names in execution order.
    public var rules: [String] { steps.map(\.rule) }

    /// The steps as one call per line, e.g. `["keys#0 = newKey()", "put(keys#0, 0)"]`.
    public var lines: [String] { steps.map(\.description) }

    /// Whether some step refers to an entity that no earlier step created, or that an earlier
    /// step removed. The engine guarantees this is `false` for every executed program.
    public var hasDanglingReferences: Bool {
        var live = Set<Entity>()
        for step in steps {
            for reference in step.references {
                if reference.createdAtStep >= step.number || !live.contains(reference) { return true }
            }
            for entity in step.removed { live.remove(entity) }
            for entity in step.created { live.insert(entity) }
        }
        return false
    }

    /// Numbered steps, one per line.
    public var description: String {
        if steps.isEmpty { return "(no steps)" }
        return steps.map { "\($0.number). \($0)" }.joined(separator: "\n")
    }
}

/// What a rule sees while it runs: the model, the system, and ways to draw arguments and to
/// create, refer to and remove entities.
///
/// A context lives for one test case. Rules run synchronously, one at a time.
public final class RuleContext<Model, System> {
    /// The reference model. Update it to mirror what the rule did.
    public var model: Model
    /// The system under test.
    public var system: System
    /// The 1-based number of the running step (0 while checking the initial state).
    public private(set) var step: Int = 0
    /// The name of the running rule.
    public private(set) var ruleName: String = ""

    var source: ChoiceSource
    private var pools: [PoolStorage]
    let collecting: Bool
    var program = StateMachineProgram()
    private var current: StateMachineProgram.Step?

    struct LiveEntity {
        var ordinal: Int
        var createdAtStep: Int
        var value: Any
    }

    struct PoolStorage {
        var name: String
        var created = 0
        var live: [LiveEntity] = []
    }

    init(model: Model, system: System, poolNames: [String], collecting: Bool) {
        self.model = model
        self.system = system
        self.pools = poolNames.map { PoolStorage(name: $0) }
        self.collecting = collecting
        self.source = ChoiceSource(replaying: [])
    }

    func liveCount(_ poolIndex: Int) -> Int { pools[poolIndex].live.count }

    func beginStep(_ number: Int, rule: String) {
        step = number
        ruleName = rule
        if collecting {
            current = StateMachineProgram.Step(
                number: number, rule: rule, arguments: [], references: [], created: [], removed: [], notes: []
            )
        }
    }

    func endStep() {
        if let current { program.steps.append(current) }
        current = nil
    }

    /// Draws an argument for the running rule.
    /// - Parameters:
    ///   - generator: The argument's generator.
    ///   - label: Optional name shown in the program listing (`label: value`).
    /// - Returns: The drawn value.
    public func draw<T>(_ generator: Generator<T>, label: String? = nil) throws -> T {
        let value = try generator.generate(from: &source)
        if collecting {
            let text = Property.describe(value)
            current?.arguments.append(label.map { "\($0): \(text)" } ?? text)
        }
        return value
    }

    /// Draws a reference to one of the entities currently alive in `pool` (the most recently
    /// created is the simplest). List the pool in the rule's `requires:` so the rule only runs when the pool
    /// is non-empty; otherwise an empty pool discards the test case.
    /// - Returns: A reference that is valid for the rest of the step.
    /// - Complexity: O(1).
    public func reference<Entity>(from pool: EntityPool<Entity>) throws -> SymbolicReference<Entity> {
        let live = pools[pool.poolIndex].live
        guard !live.isEmpty else {
            throw PropertyDiscard(reason: "pool '\(pool.name)' is empty; list it in the rule's requires:")
        }
        source.beginSpan(.reference)
        defer { source.endSpan() }
        // Choice 0 is the most recently created live entity (as in Hypothesis): deleting the
        // steps that created older entities then leaves later references unchanged.
        let entry = live[live.count - 1 - Int(try source.draw(upTo: UInt64(live.count - 1)))]
        let reference = SymbolicReference<Entity>(
            poolName: pool.name, poolIndex: pool.poolIndex, ordinal: entry.ordinal, createdAtStep: entry.createdAtStep
        )
        if collecting {
            current?.arguments.append(reference.description)
            current?.references.append(.init(pool: pool.name, ordinal: entry.ordinal, createdAtStep: entry.createdAtStep))
        }
        return reference
    }

    /// The entity behind `reference`.
    /// - Precondition: The entity has not been removed.
    /// - Complexity: O(log n) in the number of live entities of its pool.
    public func value<Entity>(of reference: SymbolicReference<Entity>) -> Entity {
        guard let index = liveIndex(of: reference.poolIndex, ordinal: reference.ordinal) else {
            preconditionFailure("\(reference) was removed; it cannot be resolved any more")
        }
        return pools[reference.poolIndex].live[index].value as! Entity
    }

    /// The entity behind `reference`; same as ``value(of:)``.
    public subscript<Entity>(_ reference: SymbolicReference<Entity>) -> Entity {
        value(of: reference)
    }

    /// Adds a new entity to `pool`, making it available to later steps.
    /// - Returns: Its symbolic reference (`pool#n`).
    @discardableResult
    public func add<Entity>(_ entity: Entity, to pool: EntityPool<Entity>) -> SymbolicReference<Entity> {
        let ordinal = pools[pool.poolIndex].created
        pools[pool.poolIndex].created += 1
        pools[pool.poolIndex].live.append(LiveEntity(ordinal: ordinal, createdAtStep: step, value: entity))
        if collecting {
            current?.created.append(.init(pool: pool.name, ordinal: ordinal, createdAtStep: step))
        }
        return SymbolicReference(poolName: pool.name, poolIndex: pool.poolIndex, ordinal: ordinal, createdAtStep: step)
    }

    /// Removes an entity from its pool (e.g. after deleting it from the system); later steps can
    /// no longer draw it.
    public func remove<Entity>(_ reference: SymbolicReference<Entity>) {
        guard let index = liveIndex(of: reference.poolIndex, ordinal: reference.ordinal) else { return }
        pools[reference.poolIndex].live.remove(at: index)
        if collecting {
            current?.removed.append(.init(pool: reference.poolName, ordinal: reference.ordinal, createdAtStep: reference.createdAtStep))
        }
    }

    /// Number of live entities in `pool`.
    public func count<Entity>(of pool: EntityPool<Entity>) -> Int {
        pools[pool.poolIndex].live.count
    }

    /// Checks a postcondition of the running rule.
    /// - Parameters:
    ///   - condition: What must hold after the rule.
    ///   - name: Stable name of the postcondition (part of the failure identity).
    ///   - detail: Explanation, built only on failure.
    /// - Throws: ``PropertyFailure`` with kind `postcondition '<rule>': <name>`.
    public func postcondition(_ condition: Bool, _ name: String, _ detail: @autoclosure () -> String = "") throws {
        if !condition {
            throw PropertyFailure(kind: "postcondition '\(ruleName)': \(name)", message: detail().isEmpty ? name : detail())
        }
    }

    /// Records a note for the program listing (only built for the final counterexample).
    public func note(_ text: @autoclosure () -> String) {
        guard collecting else { return }
        if current != nil { current?.notes.append(text()) } else { program.notes.append(text()) }
    }

    private func liveIndex(of poolIndex: Int, ordinal: Int) -> Int? {
        let live = pools[poolIndex].live
        var low = 0, high = live.count
        while low < high {
            let middle = (low + high) / 2
            if live[middle].ordinal < ordinal { low = middle + 1 } else { high = middle }
        }
        return low < live.count && live[low].ordinal == ordinal ? low : nil
    }
}

/// A rule-based model of a system: rules (with weights and preconditions) that act on the
/// system and a reference model, invariants that must hold after every step, and entity pools
/// for symbolic references.
///
/// ```swift
/// var machine = StateMachine<[Int: Int], Store>("store", initialModel: { [:] }, makeSystem: { Store() })
/// let keys = machine.pool("keys", of: Int.self)
/// machine.rule("newKey") { ctx in ctx.add(ctx.system.makeKey(), to: keys) }
/// machine.rule("put", requires: [keys]) { ctx in
///     let key = ctx[try ctx.reference(from: keys)]
///     let value = try ctx.draw(Gen.int(in: 0...9))
///     ctx.system.put(key, value); ctx.model[key] = value
/// }
/// machine.invariant("matches model") { model, store in try Property.requireEqual(store.contents, model) }
/// let result = machine.check()
/// ```
///
/// Tape layout of one step (a ``SpanLabel/step`` span): an "another step?" choice (1 = yes),
/// the rule's index in declaration order (a replayed index of a disabled rule moves to the next
/// enabled rule), then whatever the rule draws. Lower indices are simpler, so declare the
/// simplest rules first. Deleting a step span removes exactly one step; references are drawn
/// relative to the newest live entity, so deleting the creation of older entities leaves later
/// references intact.
public struct StateMachine<Model, System>: Sendable {
    /// Name used for seeds, reports and the failure file.
    public var name: String
    /// Maximum number of steps per case.
    public var maxSteps: Int
    /// Mean number of steps when generating (capped at ``maxSteps``); `nil` means `maxSteps`.
    public var averageSteps: Double?

    struct Rule: Sendable {
        var name: String
        var weight: UInt64
        var requiredPools: [Int]
        var precondition: (@Sendable (Model) -> Bool)?
        var body: @Sendable (RuleContext<Model, System>) throws -> Void
    }

    struct Invariant: Sendable {
        var name: String
        var check: @Sendable (Model, System) throws -> Void
    }

    let initialModel: @Sendable () -> Model
    let makeSystem: @Sendable () throws -> System
    var teardownBody: (@Sendable (System) -> Void)?
    var rules: [Rule] = []
    var invariants: [Invariant] = []
    var poolNames: [String] = []

    /// Creates an empty machine.
    /// - Parameters:
    ///   - name: Name used for seeds, reports and the failure file.
    ///   - maxSteps: Maximum number of steps per case.
    ///   - averageSteps: Mean number of steps when generating; `nil` means `maxSteps`.
    ///   - initialModel: Builds the model's initial state (once per case).
    ///   - makeSystem: Builds a fresh system under test (once per case).
    public init(
        _ name: String,
        maxSteps: Int = 50,
        averageSteps: Double? = nil,
        initialModel: @escaping @Sendable () -> Model,
        makeSystem: @escaping @Sendable () throws -> System
    ) {
        precondition(maxSteps >= 0, "maxSteps must not be negative")
        self.name = name
        self.maxSteps = maxSteps
        self.averageSteps = averageSteps
        self.initialModel = initialModel
        self.makeSystem = makeSystem
    }

    /// Declares a pool of entities of type `Entity`.
    /// - Returns: A handle used to add, draw and resolve entities.
    public mutating func pool<Entity>(_ name: String, of type: Entity.Type = Entity.self) -> EntityPool<Entity> {
        poolNames.append(name)
        return EntityPool(name: name, poolIndex: poolNames.count - 1)
    }

    /// Declares a rule. Declaration order is simplicity order: shrinking prefers earlier rules.
    /// - Parameters:
    ///   - name: Shown in the program listing; part of failure identities.
    ///   - weight: Relative frequency among the enabled rules when generating (> 0).
    ///   - pools: Pools that must be non-empty for the rule to be enabled.
    ///   - precondition: Further condition on the model for the rule to be enabled.
    ///   - body: Acts on `context.system`, updates `context.model`, checks postconditions.
    ///     Errors other than ``PropertyFailure`` fail the case as `rule '<name>' threw <type>`.
    public mutating func rule(
        _ name: String,
        weight: Int = 1,
        requires pools: [any AnyEntityPool] = [],
        when precondition: (@Sendable (Model) -> Bool)? = nil,
        _ body: @escaping @Sendable (RuleContext<Model, System>) throws -> Void
    ) {
        Swift.precondition(weight > 0, "rule weights must be positive")
        rules.append(Rule(
            name: name, weight: UInt64(weight), requiredPools: pools.map(\.poolIndex),
            precondition: precondition, body: body
        ))
    }

    /// Declares an invariant checked on the initial state and after every step.
    /// A thrown error fails the case with identity `invariant '<name>'`.
    public mutating func invariant(_ name: String, _ check: @escaping @Sendable (Model, System) throws -> Void) {
        invariants.append(Invariant(name: name, check: check))
    }

    /// Declares an invariant given as a predicate.
    public mutating func invariant(_ name: String, holds predicate: @escaping @Sendable (Model, System) -> Bool) {
        invariants.append(Invariant(name: name, check: { model, system in
            if !predicate(model, system) { throw PropertyFailure(kind: "invariant '\(name)'", message: "does not hold") }
        }))
    }

    /// Sets a function run on the system at the end of every case (pass or fail).
    public mutating func teardown(_ body: @escaping @Sendable (System) -> Void) {
        teardownBody = body
    }

    /// Runs one case, drawing steps from `source`.
    /// - Returns: The executed program when `source.collectsNotes` is set, otherwise an empty one.
    /// - Throws: The first failure (postcondition, invariant, rule error) or a discard.
    /// - Complexity: O(steps × (rules + invariants)) plus the cost of the rules themselves.
    @discardableResult
    public func run(_ source: inout ChoiceSource) throws -> StateMachineProgram {
        var program = StateMachineProgram()
        try execute(&source) { program = $0 }
        return program
    }

    /// Runs one case; `finished` receives the (possibly partial) program when the source
    /// collects notes, whether the case passes or fails.
    func execute(_ source: inout ChoiceSource, finished: (StateMachineProgram) -> Void) throws {
        let context = RuleContext<Model, System>(
            model: initialModel(), system: try makeSystem(), poolNames: poolNames, collecting: source.collectsNotes
        )
        defer { teardownBody?(context.system) }
        swap(&context.source, &source)
        defer { swap(&context.source, &source) }
        defer { if context.collecting { finished(context.program) } }
        try checkInvariants(context)
        let average = min(averageSteps ?? Double(maxSteps), Double(maxSteps))
        let continueProbability = average <= 0 ? 0 : 1 - 1 / (1 + average)
        var weights = [UInt64](repeating: 0, count: rules.count)
        var stepNumber = 0
        while stepNumber < maxSteps {
            stepNumber += 1
            context.source.beginSpan(.step)
            defer { context.source.endSpan() }
            guard try context.source.drawBool(probability: continueProbability) else { break }
            var anyEnabled = false
            for (index, rule) in rules.enumerated() {
                var enabled = true
                for pool in rule.requiredPools where context.liveCount(pool) == 0 {
                    enabled = false
                    break
                }
                if enabled, let precondition = rule.precondition { enabled = precondition(context.model) }
                weights[index] = enabled ? rule.weight : 0
                anyEnabled = anyEnabled || enabled
            }
            guard anyEnabled else { break }
            let rule = rules[try context.source.drawIndex(weights: weights)]
            context.beginStep(stepNumber, rule: rule.name)
            context.source.beginSpan(.arguments)
            do {
                try rule.body(context)
            } catch let error as PropertyDiscard {
                throw error
            } catch let error as ChoiceOverrun {
                throw error
            } catch let error as PropertyFailure {
                context.endStep()
                throw error
            } catch {
                context.endStep()
                throw PropertyFailure(
                    kind: "rule '\(rule.name)' threw \(PropertyFailure.defaultIdentity(error))", message: "\(error)"
                )
            }
            context.source.endSpan()
            context.endStep()
            try checkInvariants(context)
        }
    }

    private func checkInvariants(_ context: RuleContext<Model, System>) throws {
        for invariant in invariants {
            do {
                try invariant.check(context.model, context.system)
            } catch let error as PropertyDiscard {
                throw error
            } catch {
                let message = (error as? PropertyFailure)?.message ?? "\(error)"
                throw PropertyFailure(
                    kind: "invariant '\(invariant.name)'",
                    message: context.step == 0 ? "\(message) (initial state)" : "\(message) (after step \(context.step))"
                )
            }
        }
    }

    /// Checks the machine: runs up to `configuration.cases` programs, shrinks the first failing
    /// one to a minimal program and returns it. Records no Swift Testing issue; see
    /// ``propertyCheck(_:cases:seed:configuration:replay:fileID:function:sourceLocation:)``.
    /// - Returns: The result; its counterexample value is the shrunk ``StateMachineProgram``.
    public func check(configuration: PropertyConfiguration = PropertyConfiguration()) -> PropertyResult<StateMachineProgram> {
        var captured: StateMachineProgram?
        return runPropertyEngine(name: name, configuration: configuration, test: { source in
            try execute(&source) { captured = $0 }
        }, capture: { captured })
    }
}
