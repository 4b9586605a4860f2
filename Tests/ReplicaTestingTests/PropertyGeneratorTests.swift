import Testing
@testable import ReplicaTesting

@Suite("Generators")
struct PropertyGeneratorTests {
    @Test("The all-zero tape decodes to the simplest value of every builder")
    func zeroTapeIsSimplest() throws {
        #expect(try PropertyFixtures.decode(Gen.int(in: -100 ... 100), []) == 0)
        #expect(try PropertyFixtures.decode(Gen.int(in: 5 ... 100), []) == 5)
        #expect(try PropertyFixtures.decode(Gen.int(in: -100 ... -5), []) == -5)
        #expect(try PropertyFixtures.decode(Gen.int, []) == 0)
        #expect(try PropertyFixtures.decode(Gen.integer(in: UInt8(3) ... 9), []) == 3)
        #expect(try PropertyFixtures.decode(Gen.bool, []) == false)
        #expect(try PropertyFixtures.decode(Gen.element(of: ["x", "y", "z"]), []) == "x")
        #expect(try PropertyFixtures.decode(Gen.optional(Gen.int(in: 0 ... 9)), []) == nil)
        #expect(try PropertyFixtures.decode(Gen.array(of: Gen.int(in: 0 ... 9)), []) == [])
        #expect(try PropertyFixtures.decode(Gen.array(of: Gen.int(in: 0 ... 9), minLength: 2), []) == [0, 0])
        #expect(try PropertyFixtures.decode(Gen.string(), []) == "")
        #expect(try PropertyFixtures.decode(Gen.string(minLength: 3), []) == "aaa")
        #expect(try PropertyFixtures.decode(Gen.dictionary(keys: Gen.int(in: 0 ... 9), values: Gen.bool), []) == [:])
        #expect(try PropertyFixtures.decode(Gen.oneOf(Gen.constant("first"), Gen.constant("second")), []) == "first")
        #expect(try PropertyFixtures.decode(Gen.frequency((1, Gen.constant("rare")), (99, Gen.constant("common"))), []) == "rare")
        #expect(try PropertyFixtures.decode(PropertyFixtures.treeGenerator, []) == .leaf(0))
        #expect(try PropertyFixtures.decode(Gen.double(in: -1 ... 1), []) == -1)
    }

    @Test("Integers: lowering the choice moves toward zero; positive before negative")
    func integerEncodingOrder() throws {
        let generator = Gen.int(in: -3 ... 100)
        // Magnitude first, then sign (0 = positive).
        #expect(try PropertyFixtures.decode(generator, [5, 0]) == 5)
        #expect(try PropertyFixtures.decode(generator, [2, 1]) == -2)
        // Only positive values have magnitude 50; the sign is forced and recorded as 0.
        var source = ChoiceSource(replaying: [50, 1])
        #expect(try generator.generate(from: &source) == 50)
        #expect(source.finish().choices == [50, 0])
        // Extreme bounds.
        #expect(try PropertyFixtures.decode(Gen.int, [UInt64(1) << 63, 1]) == Int.min)
        #expect(try PropertyFixtures.decode(Gen.int, [UInt64(Int.max), 0]) == Int.max)
        #expect(try PropertyFixtures.decode(Gen.integer(in: Int8.min ... Int8.max), [128, 0]) == -128)
        #expect(try PropertyFixtures.decode(Gen.integer(in: UInt64(10) ... UInt64.max), [UInt64.max]) == UInt64.max)
        #expect(try PropertyFixtures.decode(Gen.int(in: -10 ... -2), [100]) == -10)
    }

    @Test("Generated values respect ranges, lengths and alphabets")
    func valuesRespectConstraints() throws {
        for value in try PropertyFixtures.sample(Gen.int(in: -7 ... 1000)) { #expect((-7 ... 1000).contains(value)) }
        for value in try PropertyFixtures.sample(Gen.integer(in: Int16(-300) ... -200)) { #expect((-300 ... -200).contains(value)) }
        for value in try PropertyFixtures.sample(Gen.array(of: Gen.bool, minLength: 2, maxLength: 5)) { #expect((2 ... 5).contains(value.count)) }
        for value in try PropertyFixtures.sample(Gen.string(alphabet: "xyz", maxLength: 4)) {
            #expect(value.count <= 4)
            #expect(value.allSatisfy { "xyz".contains($0) })
        }
        for value in try PropertyFixtures.sample(Gen.double(in: 2.5 ... 3.5)) { #expect((2.5 ... 3.5).contains(value)) }
        for value in try PropertyFixtures.sample(Gen.dictionary(keys: Gen.int(in: 0 ... 3), values: Gen.bool, maxCount: 10)) {
            #expect(value.count <= 4)
        }
    }

    @Test("Integers reach both bounds and both signs")
    func integerCoverage() throws {
        let values = try PropertyFixtures.sample(Gen.int(in: -5 ... 5), count: 2000)
        #expect(Set(values) == Set(-5 ... 5))
        let wide = try PropertyFixtures.sample(Gen.int, count: 2000)
        #expect(wide.contains { $0 < 0 })
        #expect(wide.contains { $0 > 1_000_000 })
        #expect(wide.contains(0))
    }

    @Test("Recursive generators respect the depth budget and produce nodes")
    func recursiveDepth() throws {
        let trees = try PropertyFixtures.sample(PropertyFixtures.treeGenerator, count: 500)
        #expect(trees.allSatisfy { $0.depth <= 3 })
        #expect(trees.contains { $0.depth == 3 })
        #expect(trees.contains { $0.depth == 0 })
    }

    @Test("frequency follows its weights; oneOf reaches every branch")
    func weightedChoice() throws {
        let picks = try PropertyFixtures.sample(Gen.frequency((1, Gen.constant(0)), (9, Gen.constant(1))), count: 2000)
        let ones = picks.filter { $0 == 1 }.count
        #expect((1650 ... 1950).contains(ones))
        let zeroWeight = try PropertyFixtures.sample(Gen.frequency((0, Gen.constant("never")), (1, Gen.constant("always"))), count: 200)
        #expect(zeroWeight.allSatisfy { $0 == "always" })
        // A replayed index with weight 0 moves to the next positive weight.
        #expect(try PropertyFixtures.decode(Gen.frequency((0, Gen.constant("never")), (1, Gen.constant("always"))), [0]) == "always")
        let branches = try PropertyFixtures.sample(Gen.oneOf(Gen.constant(0), Gen.constant(1), Gen.constant(2)), count: 300)
        #expect(Set(branches) == [0, 1, 2])
    }

    @Test("map, flatMap, zip and filter compose on one tape")
    func combinators() throws {
        let sized = Gen.int(in: 1 ... 4).flatMap { count in
            Gen.array(of: Gen.constant(count), minLength: count, maxLength: count)
        }
        for value in try PropertyFixtures.sample(sized) {
            #expect(value.count == value.first)
            #expect(value.allSatisfy { $0 == value.count })
        }
        #expect(try PropertyFixtures.decode(sized, []) == [1])
        let doubled = Gen.int(in: 0 ... 50).map { $0 * 2 }
        #expect(try PropertyFixtures.sample(doubled).allSatisfy { $0.isMultiple(of: 2) })
        let pair = Gen.zip(Gen.bool, Gen.int(in: 0 ... 9))
        let decoded = try PropertyFixtures.decode(pair, [1, 7])
        #expect(decoded.0 == true && decoded.1 == 7)
        let odd = Gen.int(in: 0 ... 100).filter { !$0.isMultiple(of: 2) }
        #expect(try PropertyFixtures.sample(odd).allSatisfy { !$0.isMultiple(of: 2) })
        #expect(throws: PropertyDiscard.self) { try PropertyFixtures.decode(Gen.int(in: 0 ... 100).filter(maxAttempts: 5) { $0 > 1000 }, []) }
    }

    @Test("Sampling is deterministic: the same seed gives the same values")
    func samplingIsDeterministic() throws {
        let generator = Gen.array(of: Gen.oneOf(Gen.string(maxLength: 4).map { Optional($0) }, Gen.constant(nil)))
        let first = try PropertyFixtures.sample(generator, count: 100, seed: 99)
        let second = try PropertyFixtures.sample(generator, count: 100, seed: 99)
        let other = try PropertyFixtures.sample(generator, count: 100, seed: 100)
        #expect(first == second)
        #expect(first != other)
    }
}
