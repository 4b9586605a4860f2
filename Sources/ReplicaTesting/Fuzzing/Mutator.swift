// A seeded mutation engine for the inputs Replica takes from outside (cloud records, trace files, scenario JSON,
// store files): bit flips, byte inserts and deletes, boundary integers written over numbers, truncation, and
// structural mutations of JSON. Every input is a function of (seed, iteration) alone, so any iteration can be
// reproduced by itself (`replica-sim fuzz --target T --seed S --iteration I`).

import Foundation

/// SplitMix64: a small, fast generator whose whole state is one word (Steele, Lea and Flood, 2014).
struct FuzzRandom {
    private var state: UInt64

    /// The generator of iteration `iteration` of a run seeded with `seed` (independent of every other iteration).
    init(seed: UInt64, iteration: Int) {
        state = seed ^ (UInt64(truncatingIfNeeded: iteration) &* 0x9E37_79B9_7F4A_7C15)
        _ = next()
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in `0..<count` (0 when `count` is 0).
    mutating func below(_ count: Int) -> Int {
        count <= 0 ? 0 : Int(next() % UInt64(count))
    }

    mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
}

/// The mutations, in order of how much of the input they keep.
enum Mutation: String, CaseIterable {
    case flipBit = "flip a bit", setByte = "set a byte", insertBytes = "insert bytes", deleteBytes = "delete bytes",
         boundaryInteger = "write a boundary integer over a number", truncate = "truncate", json = "change the JSON structure",
         duplicateSpan = "duplicate a span"
}

enum Mutator {
    /// Integers at the edges of the ranges Replica's formats use (16, 32, 48 and 64 bits, signed and not), and a few
    /// numbers JSON readers treat specially.
    static let boundaryIntegers = ["0", "-1", "1", "2", "65535", "65536", "2147483647", "-2147483648", "4294967295", "281474976710655",
                                   "281474976710656", "4611686018427387904", "9223372036854775807", "-9223372036854775808",
                                   "9223372036854775808", "18446744073709551615", "18446744073709551616", "1e308", "-0", "0.5"]

    /// Bytes that matter to the parsers: JSON punctuation, quotes, escapes, a NUL, UTF-8 lead bytes.
    static let interestingBytes: [UInt8] = [0x00, 0x22, 0x5C, 0x7B, 0x7D, 0x5B, 0x5D, 0x2C, 0x3A, 0x0A, 0xFF, 0xC0, 0xE2, 0x80, 0x7F, 0x30]

    /// `input` after 1 to 4 mutations drawn from `random`. For JSON inputs, two in three runs keep the JSON readable
    /// (structure mutations and boundary integers only), so most inputs reach past the parser.
    static func mutate(_ input: [UInt8], random: inout FuzzRandom, allowJSON: Bool, binary: Bool = false) -> [UInt8] {
        var bytes = input
        if binary {
            for _ in 0..<(1 + random.below(4)) {
                if random.below(3) == 0 {
                    bytes = boundaryBinary(bytes, random: &random)
                } else {
                    var mutation = Mutation.allCases[random.below(Mutation.allCases.count)]
                    if mutation == .json || mutation == .boundaryInteger { mutation = .setByte }
                    bytes = apply(mutation, to: bytes, random: &random)
                }
            }
            return bytes
        }
        if allowJSON && random.below(3) < 2 {
            for _ in 0..<(1 + random.below(3)) {
                bytes = apply(random.below(3) == 0 ? .boundaryInteger : .json, to: bytes, random: &random)
            }
            return bytes
        }
        for _ in 0..<(1 + random.below(4)) {
            var mutation = Mutation.allCases[random.below(Mutation.allCases.count)]
            if mutation == .json && !allowJSON { mutation = .flipBit }
            bytes = apply(mutation, to: bytes, random: &random)
        }
        return bytes
    }

    static func apply(_ mutation: Mutation, to input: [UInt8], random: inout FuzzRandom) -> [UInt8] {
        var bytes = input
        switch mutation {
        case .flipBit:
            guard !bytes.isEmpty else { return [interestingBytes[random.below(interestingBytes.count)]] }
            bytes[random.below(bytes.count)] ^= UInt8(1) << UInt8(random.below(8))
        case .setByte:
            guard !bytes.isEmpty else { return bytes }
            let value = random.chance(50) ? interestingBytes[random.below(interestingBytes.count)] : UInt8(truncatingIfNeeded: random.next())
            bytes[random.below(bytes.count)] = value
        case .insertBytes:
            let count = 1 + random.below(8)
            let insert = (0..<count).map { _ in random.chance(50) ? interestingBytes[random.below(interestingBytes.count)] : UInt8(truncatingIfNeeded: random.next()) }
            bytes.insert(contentsOf: insert, at: random.below(bytes.count + 1))
        case .deleteBytes:
            guard !bytes.isEmpty else { return bytes }
            let start = random.below(bytes.count)
            bytes.removeSubrange(start..<min(bytes.count, start + 1 + random.below(16)))
        case .boundaryInteger:
            let runs = digitRuns(bytes)
            let value = Array(boundaryIntegers[random.below(boundaryIntegers.count)].utf8)
            guard !runs.isEmpty else {
                bytes.insert(contentsOf: value, at: random.below(bytes.count + 1))
                return bytes
            }
            bytes.replaceSubrange(runs[random.below(runs.count)], with: value)
        case .truncate:
            guard !bytes.isEmpty else { return bytes }
            bytes = Array(bytes.prefix(random.below(bytes.count)))
        case .json:
            guard let mutated = mutateJSON(bytes, random: &random) else { return apply(.flipBit, to: bytes, random: &random) }
            bytes = mutated
        case .duplicateSpan:
            guard !bytes.isEmpty else { return bytes }
            let start = random.below(bytes.count)
            let span = bytes[start..<min(bytes.count, start + 1 + random.below(64))]
            bytes.insert(contentsOf: span, at: random.below(bytes.count + 1))
        }
        return bytes
    }

    /// Integers at the edges of the ranges of binary formats' fields, written big-endian over 8 or 4 bytes or as a
    /// varint at a random offset of `input`: 0, ±1, the 16-, 32-, 48- and 64-bit edges, lengths past the end.
    static func boundaryBinary(_ input: [UInt8], random: inout FuzzRandom) -> [UInt8] {
        guard !input.isEmpty else { return input }
        var bytes = input
        let values: [UInt64] = [0, 1, 2, 0x7F, 0x80, 0xFFFF, 0x1_0000, 0x7FFF_FFFF, 0xFFFF_FFFF, (1 << 48) - 1, 1 << 48,
                                UInt64(Int64.max), UInt64(bitPattern: Int64.min), UInt64.max, UInt64(bytes.count), UInt64(bytes.count) + 1]
        let value = values[random.below(values.count)]
        let at = random.below(bytes.count)
        switch random.below(3) {
        case 0:
            for index in 0..<8 where at + index < bytes.count { bytes[at + index] = UInt8(truncatingIfNeeded: value >> (56 - 8 * UInt64(index))) }
        case 1:
            for index in 0..<4 where at + index < bytes.count { bytes[at + index] = UInt8(truncatingIfNeeded: value >> (24 - 8 * UInt64(index))) }
        default:
            var varint: [UInt8] = []
            var v = value
            while v >= 0x80 { varint.append(UInt8(truncatingIfNeeded: v) | 0x80); v >>= 7 }
            varint.append(UInt8(v))
            bytes.replaceSubrange(at..<min(bytes.count, at + 1 + random.below(2)), with: varint)
        }
        return bytes
    }

    /// The ranges of runs of ASCII digits (with a leading minus sign).
    static func digitRuns(_ bytes: [UInt8]) -> [Range<Int>] {
        var runs: [Range<Int>] = []
        var index = 0
        while index < bytes.count {
            guard bytes[index] >= 0x30 && bytes[index] <= 0x39 else { index += 1; continue }
            var start = index
            if start > 0 && bytes[start - 1] == 0x2D { start -= 1 }
            while index < bytes.count && bytes[index] >= 0x30 && bytes[index] <= 0x39 { index += 1 }
            runs.append(start..<index)
        }
        return runs
    }

    // MARK: JSON structure

    /// Values a JSON mutation puts in place of another (never NaN or infinity, which JSON cannot hold).
    static func replacement(_ random: inout FuzzRandom) -> Any {
        let values: [Any] = [NSNull(), true, false, 0, -1, Int64.max, Int64.min, UInt64.max, 1e308, -1e-308, 0.5, "", "x",
                             String(repeating: "a", count: 300), "00000000-0000-0000-0000-000000000000", [Any](), [String: Any](),
                             [NSNull()], ["": NSNull()]]
        return values[random.below(values.count)]
    }

    /// Parses `bytes` as JSON (one document, or one per line for NDJSON), changes one node and writes it back;
    /// `nil` when no line is JSON.
    static func mutateJSON(_ bytes: [UInt8], random: inout FuzzRandom) -> [UInt8]? {
        var lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: false).map(Array.init)
        let candidates = lines.indices.filter { !lines[$0].isEmpty }
        guard !candidates.isEmpty else { return nil }
        let line = candidates[random.below(candidates.count)]
        guard let root = try? JSONSerialization.jsonObject(with: Data(lines[line]), options: [.fragmentsAllowed]) else { return nil }
        let mutated = mutateNode(root, depth: 0, random: &random)
        guard let data = try? JSONSerialization.data(withJSONObject: mutated, options: [.fragmentsAllowed, .sortedKeys]) else { return nil }
        lines[line] = Array(data)
        return Array(lines.joined(separator: [0x0A]))
    }

    /// `node` with one descendant (or itself) changed: replaced, removed, duplicated, wrapped, or its members swapped.
    static func mutateNode(_ node: Any, depth: Int, random: inout FuzzRandom) -> Any {
        if var object = node as? [String: Any], !object.isEmpty, depth < 12, random.chance(70) {
            let keys = object.keys.sorted()
            let key = keys[random.below(keys.count)]
            switch random.below(6) {
            case 0: object[key] = nil
            case 1: object[key] = replacement(&random)
            case 2: object[key + "_"] = object[key]
            case 3:
                let other = keys[random.below(keys.count)]
                (object[key], object[other]) = (object[other], object[key])
            default: object[key] = mutateNode(object[key]!, depth: depth + 1, random: &random)
            }
            return object
        }
        if var array = node as? [Any], !array.isEmpty, depth < 12, random.chance(70) {
            let index = random.below(array.count)
            switch random.below(5) {
            case 0: array.remove(at: index)
            case 1: array.append(array[index])
            case 2: array[index] = replacement(&random)
            default: array[index] = mutateNode(array[index], depth: depth + 1, random: &random)
            }
            return array
        }
        return random.chance(20) ? [node] : replacement(&random)
    }
}
