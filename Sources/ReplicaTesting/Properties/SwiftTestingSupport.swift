// Swift Testing integration: run a property inside a @Test and record one issue for the
// shrunk counterexample.

#if canImport(Testing)
import Testing

/// Checks a property inside a Swift Testing test and records an `Issue` if it fails.
///
/// ```swift
/// @Test func sortingIsIdempotent() {
///     propertyCheck(Gen.array(of: Gen.int(in: -100...100))) { xs in
///         try Property.requireEqual(xs.sorted().sorted(), xs.sorted())
///     }
/// }
/// ```
///
/// On failure the issue contains the seed, the shrunk counterexample, the failure and two ways
/// to replay it: `REPLICA_PROPERTY_SEED=<seed> swift test --filter <test>` (reruns the same
/// search) or `replay: "<tape>"` (runs exactly the counterexample). The shrunk tape is saved
/// under the failure folder (see ``FailurePersistence``) and replayed first on later runs.
/// `REPLICA_PROPERTY_SCALE` multiplies the number of cases for long runs.
/// - Parameters:
///   - name: Property name; defaults to `"<file>.<function>"` of the caller.
///   - cases: Number of cases (overrides `configuration.cases`).
///   - seed: Master seed (overrides `configuration.seed` and `REPLICA_PROPERTY_SEED`).
///   - configuration: Everything else (budgets, persistence, ...).
///   - replay: A tape printed by an earlier failure; runs only that case.
///   - generator: Draws each case's input.
///   - body: The property; throw to fail (use ``Property/require(_:_:kind:fileID:line:)``, not `#expect`).
/// - Returns: The result, for further assertions.
@discardableResult
public func propertyCheck<Value>(
    _ name: String? = nil,
    cases: Int? = nil,
    seed: UInt64? = nil,
    configuration: PropertyConfiguration = PropertyConfiguration(),
    replay: String? = nil,
    _ generator: Generator<Value>,
    fileID: String = #fileID,
    function: String = #function,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: (Value) throws -> Void
) -> PropertyResult<Value> {
    let propertyName = name ?? PropertyTestingGlue.defaultPropertyName(fileID: fileID, function: function)
    guard let configuration = PropertyTestingGlue.testingConfiguration(configuration, cases: cases, seed: seed, replay: replay, sourceLocation: sourceLocation)
    else { return PropertyTestingGlue.failedToParse(propertyName) }
    let result = checkProperty(propertyName, configuration: configuration, generator, body)
    PropertyTestingGlue.recordIssueIfFailed(result, function: function, sourceLocation: sourceLocation)
    return result
}

/// Checks a state machine inside a Swift Testing test and records an `Issue` with the shrunk
/// program if it fails. Parameters as in
/// ``propertyCheck(_:cases:seed:configuration:replay:_:fileID:function:sourceLocation:_:)``;
/// the property name is the machine's name.
@discardableResult
public func propertyCheck<Model, System>(
    _ machine: StateMachine<Model, System>,
    cases: Int? = nil,
    seed: UInt64? = nil,
    configuration: PropertyConfiguration = PropertyConfiguration(),
    replay: String? = nil,
    fileID: String = #fileID,
    function: String = #function,
    sourceLocation: SourceLocation = #_sourceLocation
) -> PropertyResult<StateMachineProgram> {
    guard let configuration = PropertyTestingGlue.testingConfiguration(configuration, cases: cases, seed: seed, replay: replay, sourceLocation: sourceLocation)
    else { return PropertyTestingGlue.failedToParse(machine.name) }
    let result = machine.check(configuration: configuration)
    PropertyTestingGlue.recordIssueIfFailed(result, function: function, sourceLocation: sourceLocation)
    return result
}

/// Helpers of the Swift Testing glue.
enum PropertyTestingGlue {
    /// `"<module/file without extension>.<function without parameters>"`.
    static func defaultPropertyName(fileID: String, function: String) -> String {
        var file = Substring(fileID)
        if file.hasSuffix(".swift") { file = file.dropLast(6) }
        let functionName = function.split(separator: "(", maxSplits: 1).first.map(String.init) ?? function
        return "\(file).\(functionName)"
    }

    static func testingConfiguration(
        _ base: PropertyConfiguration,
        cases: Int?,
        seed: UInt64?,
        replay: String?,
        sourceLocation: SourceLocation
    ) -> PropertyConfiguration? {
        var configuration = base
        if let cases { configuration.cases = cases }
        if let seed { configuration.seed = seed }
        if let replay {
            guard let tape = ChoiceTape(encoded: replay) else {
                Issue.record("replay: \"\(replay)\" is not a tape (expected comma-separated integers)", sourceLocation: sourceLocation)
                return nil
            }
            configuration.replay = tape
        }
        return configuration
    }

    static func failedToParse<Value>(_ name: String) -> PropertyResult<Value> {
        PropertyResult(
            name: name, seed: 0, casesRequested: 0, casesRun: 0, discarded: 0, persistedTapesReplayed: 0,
            counterexample: nil, gaveUpReason: "invalid replay tape", savedFailurePath: nil
        )
    }

    static func recordIssueIfFailed<Value>(_ result: PropertyResult<Value>, function: String, sourceLocation: SourceLocation) {
        guard !result.passed else { return }
        let testName = function.split(separator: "(", maxSplits: 1).first.map(String.init) ?? function
        Issue.record(Comment(rawValue: result.report(testFilter: testName)), sourceLocation: sourceLocation)
    }
}
#endif
