// Traces: NDJSON, one JSON object per line — a header (format version, seed, tape, scenario hash and the scenario
// itself), events, periodic state digests, and a verdict with the witness. Every line is built with keys in a
// fixed order from values that depend only on the tape, so the same seed gives byte-identical traces.

import CSodium
import Foundation

/// One JSON object written with keys in insertion order.
public struct JSONLine: Sendable {
    private var text = "{"
    private var empty = true

    public init() {}

    private mutating func key(_ key: String) {
        if !empty { text += "," }
        empty = false
        text += JSONLine.quote(key) + ":"
    }

    public mutating func add(_ key: String, _ value: String?) {
        self.key(key)
        text += value.map(JSONLine.quote) ?? "null"
    }

    public mutating func add(_ key: String, _ value: Int) {
        self.key(key)
        text += String(value)
    }

    public mutating func add(_ key: String, _ value: Int64) {
        self.key(key)
        text += String(value)
    }

    public mutating func add(_ key: String, _ value: UInt64) {
        self.key(key)
        text += String(value)
    }

    public mutating func add(_ key: String, _ value: Double) {
        self.key(key)
        text += value.isFinite ? String(format: "%.1f", value) : "null"
    }

    public mutating func add(_ key: String, _ value: Bool) {
        self.key(key)
        text += value ? "true" : "false"
    }

    public mutating func add(_ key: String, _ values: [String]) {
        self.key(key)
        text += "[" + values.map(JSONLine.quote).joined(separator: ",") + "]"
    }

    /// Adds already-serialized JSON.
    public mutating func addRaw(_ key: String, _ json: String) {
        self.key(key)
        text += json
    }

    public var string: String { text + "}" }

    /// A JSON string literal.
    public static func quote(_ string: String) -> String {
        var result = "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    result += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    result.unicodeScalars.append(scalar)
                }
            }
        }
        return result + "\""
    }
}

/// Collects a run's trace lines (or only counts them when tracing is off).
final class TraceRecorder {
    let isEnabled: Bool
    private(set) var lines: [String] = []

    init(enabled: Bool) { isEnabled = enabled }

    /// Appends an event line `{"t":…,"ev":…,…}` built by `fill` (not even built when tracing is off).
    func event(_ time: Int64, _ kind: String, _ fill: (inout JSONLine) -> Void = { _ in }) {
        guard isEnabled else { return }
        var line = JSONLine()
        line.add("t", time)
        line.add("ev", kind)
        fill(&line)
        lines.append(line.string)
    }

    func append(_ line: String) {
        guard isEnabled else { return }
        lines.append(line)
    }
}

/// The trace file format.
public enum TraceFormat {
    /// The format version written in headers.
    public static let version = 1

    /// A trace's header.
    public struct Header: Sendable {
        public var scenario: Scenario
        public var seed: UInt64?
        public var tape: ChoiceTape
        public var canaries: [String]
        public var scenarioHash: String
    }

    /// The header line for a run.
    static func headerLine(scenario: Scenario, seed: UInt64?, tape: ChoiceTape, canaries: [String]) -> String {
        var line = JSONLine()
        line.add("type", "header")
        line.add("format", version)
        line.add("scenario", scenario.name)
        line.add("scenario_hash", scenario.hash)
        if let seed { line.add("seed", seed) } else { line.add("seed", nil as String?) }
        line.add("canaries", canaries)
        line.add("steps", scenario.steps)
        line.add("tape", tape.encoded)
        line.addRaw("scenario_json", scenario.canonicalJSON)
        return line.string
    }

    /// Reads the header (the first line) of trace text.
    /// - Throws: ``TraceError`` when it is not a trace header of a known format.
    public static func header(of text: String, file: String) throws(TraceError) -> Header {
        guard let first = text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: true).first,
              let object = try? JSONSerialization.jsonObject(with: Data(first.utf8)) as? [String: Any] else {
            throw TraceError(file: file, problem: "the first line is not a JSON object")
        }
        guard object["type"] as? String == "header" else { throw TraceError(file: file, problem: "the first line is not a trace header") }
        guard let format = object["format"] as? Int, format == version else {
            throw TraceError(file: file, problem: "unsupported trace format \(object["format"] ?? "nil") (this replica-sim reads format \(version))")
        }
        guard let tapeText = object["tape"] as? String, let tape = ChoiceTape(encoded: tapeText) else {
            throw TraceError(file: file, problem: "the header has no readable tape")
        }
        let scenario = try headerScenario(object["scenario_json"], file: file)
        let seed = (object["seed"] as? NSNumber).map { $0.uint64Value }
        let canaries = object["canaries"] as? [String] ?? []
        return Header(scenario: scenario, seed: seed, tape: tape, canaries: canaries,
                      scenarioHash: object["scenario_hash"] as? String ?? "")
    }

    /// The scenario a header embeds (`scenario_json`: the canonical JSON of ``Scenario``), decoded and then checked
    /// as a scenario file is (``Scenario/validate(file:fieldPrefix:)``): a header is input like any other, and a run
    /// must never start from a scenario that no file could describe.
    /// - Throws: ``TraceError`` naming the field under `scenario_json` and the problem.
    static func headerScenario(_ value: Any?, file: String) throws(TraceError) -> Scenario {
        guard let value else { throw TraceError(file: file, field: "scenario_json", problem: "missing") }
        guard let object = value as? [String: Any] else {
            throw TraceError(file: file, field: "scenario_json", problem: "expected an object, found \(ScenarioReader(file: file).kind(of: value))")
        }
        let scenario: Scenario
        do {
            let data = try JSONSerialization.data(withJSONObject: object)
            scenario = try JSONDecoder().decode(Scenario.self, from: data)
        } catch let error as DecodingError {
            let (path, problem) = describe(error)
            throw TraceError(file: file, field: "scenario_json" + path, problem: problem)
        } catch {
            throw TraceError(file: file, field: "scenario_json", problem: "not readable (\(error))")
        }
        do {
            try scenario.validate(file: file, fieldPrefix: "scenario_json.")
        } catch {
            throw TraceError(file: file, field: error.field, problem: error.problem)
        }
        return scenario
    }

    /// A decoding error as a field path below `scenario_json` (`.devices[0].name`) and a problem.
    private static func describe(_ error: DecodingError) -> (path: String, problem: String) {
        func path(_ keys: [any CodingKey]) -> String {
            keys.map { key in key.intValue.map { "[\($0)]" } ?? ".\(key.stringValue)" }.joined()
        }
        switch error {
        case let .keyNotFound(key, context): return (path(context.codingPath + [key]), "missing")
        case let .typeMismatch(type, context): return (path(context.codingPath), "expected \(type)")
        case let .valueNotFound(type, context): return (path(context.codingPath), "expected \(type), found null")
        case let .dataCorrupted(context): return (path(context.codingPath), context.debugDescription)
        @unknown default: return ("", "not readable")
        }
    }

    /// The failed invariant named in a trace's verdict line, if any.
    public static func failedInvariant(of text: String) -> String? {
        for line in text.split(separator: "\n").reversed() {
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  object["type"] as? String == "verdict" else { continue }
            return object["invariant"] as? String
        }
        return nil
    }

    /// A digest of the trace's bytes: BLAKE2b-256 (libsodium's `crypto_generichash`), 64 hex digits.
    public static func digest(_ lines: [String]) -> String {
        _ = sodium_init()
        var bytes: [UInt8] = []
        for line in lines {
            bytes += line.utf8
            bytes.append(0x0A)
        }
        var out = [UInt8](repeating: 0, count: 32)
        crypto_generichash(&out, 32, bytes, UInt64(bytes.count), nil, 0)
        return out.map { String(format: "%02x", $0) }.joined()
    }
}

/// A trace file that cannot be used.
public struct TraceError: Error, CustomStringConvertible, Sendable {
    public var file: String
    /// The header field at fault (e.g. `scenario_json.devices`), when one is.
    public var field: String?
    public var problem: String

    public init(file: String, field: String? = nil, problem: String) {
        self.file = file
        self.field = field
        self.problem = problem
    }

    /// `FILE: PROBLEM`, or `FILE: field 'FIELD': PROBLEM` as for scenario files.
    public var description: String { field.map { "\(file): field '\($0)': \(problem)" } ?? "\(file): \(problem)" }
}
