import Testing
@testable import ReplicaTesting

@Suite("PRNG and choice tape")
struct PropertyEngineCoreTests {
    @Test("SplitMix64 matches the reference implementation")
    func splitMixReferenceVectors() {
        var generator = SplitMix64(seed: 1_234_567)
        let outputs = (0 ..< 5).map { _ in generator.next() }
        #expect(outputs == [
            6_457_827_717_110_365_317, 3_203_168_211_198_807_973, 9_817_491_932_198_370_423,
            4_593_380_528_125_082_431, 16_408_922_859_458_223_821,
        ])
        var zero = SplitMix64(seed: 0)
        #expect(zero.next() == 16_294_208_416_658_607_535)
    }

    @Test("xoshiro256** matches the reference implementation, seeded directly and via SplitMix64")
    func xoshiroReferenceVectors() {
        var direct = Xoshiro256StarStar(state: (1, 2, 3, 4))
        #expect((0 ..< 6).map { _ in direct.next() } == [
            11520, 0, 1_509_978_240, 1_215_971_899_390_074_240, 1_216_172_134_540_287_360, 607_988_272_756_665_600,
        ])
        var seeded = Xoshiro256StarStar(seed: 42)
        #expect((0 ..< 5).map { _ in seeded.next() } == [
            1_546_998_764_402_558_742, 6_990_951_692_964_543_102, 12_544_586_762_248_559_009,
            17_057_574_109_182_124_193, 18_295_552_978_065_317_476,
        ])
    }

    @Test("Bounded draws stay in range and reach both ends")
    func boundedDraws() {
        var generator = Xoshiro256StarStar(seed: 7)
        var seen = Set<UInt64>()
        for _ in 0 ..< 2000 {
            let value = generator.next(upTo: 9)
            #expect(value <= 9)
            seen.insert(value)
        }
        #expect(seen == Set(0 ... 9))
        #expect(generator.next(upTo: 0) == 0)
        _ = generator.next(upTo: .max)
    }

    @Test("Replay reads the tape, clamps to bounds and yields 0 past the end")
    func replaySemantics() throws {
        var source = ChoiceSource(replaying: [3, 50, 7])
        #expect(try source.draw(upTo: 10) == 3)
        #expect(try source.draw(upTo: 10) == 10) // clamped
        #expect(try source.draw(upTo: 10) == 7)
        #expect(try source.draw(upTo: 10) == 0) // past the end
        #expect(try source.drawBool() == false)
        let tape = source.finish()
        #expect(tape.choices == [3, 10, 7, 0, 0])
        #expect(tape.bounds == [10, 10, 10, 10, 1])
    }

    @Test("Generation records exactly the choices that replay reproduces")
    func generationThenReplay() throws {
        let generator = Gen.array(of: Gen.zip(Gen.int(in: -50 ... 50), Gen.string(maxLength: 5)), maxLength: 10)
        for seed in 0 ..< UInt64(50) {
            var source = ChoiceSource(seed: seed)
            let value = try generator.generate(from: &source)
            let tape = source.finish()
            var replay = ChoiceSource(replaying: tape.choices)
            let replayed = try generator.generate(from: &replay)
            #expect(replayed.map(\.0) == value.map(\.0))
            #expect(replayed.map(\.1) == value.map(\.1))
            #expect(replay.finish().choices == tape.choices)
        }
    }

    @Test("Spans nest and cover each array element with its continue flag")
    func spansRecordStructure() throws {
        var source = ChoiceSource(replaying: [1, 4, 1, 2, 0])
        let value = try Gen.array(of: Gen.int(in: 0 ... 9)).generate(from: &source)
        let tape = source.finish()
        #expect(value == [4, 2])
        let elements = tape.spans.filter { $0.label == .element }.map(\.range)
        #expect(elements == [0 ..< 2, 2 ..< 4, 4 ..< 5])
        let collection = try #require(tape.spans.first { $0.label == .collection })
        #expect(collection.range == 0 ..< 5)
        #expect(collection.depth == 0)
        #expect(tape.spans.filter { $0.label == .element }.allSatisfy { $0.depth == 1 })
    }

    @Test("Overrunning maxChoices throws ChoiceOverrun")
    func overrun() {
        var source = ChoiceSource(seed: 1, maxChoices: 3)
        #expect(throws: ChoiceOverrun.self) {
            for _ in 0 ..< 4 { _ = try source.draw(upTo: 5) }
        }
    }

    @Test("Tape text encoding round-trips and shortlex orders by length then values")
    func encodingAndShortlex() {
        let tape = ChoiceTape(choices: [1, 0, 18_446_744_073_709_551_615, 7])
        #expect(tape.encoded == "1,0,18446744073709551615,7")
        #expect(ChoiceTape(encoded: tape.encoded)?.choices == tape.choices)
        #expect(ChoiceTape(encoded: "[1, 2 ,3]")?.choices == [1, 2, 3])
        #expect(ChoiceTape(encoded: "")?.choices == [])
        #expect(ChoiceTape(encoded: "1,x") == nil)
        #expect(ChoiceTape.shortlexPrecedes([9, 9], [0, 0, 0]))
        #expect(ChoiceTape.shortlexPrecedes([1, 0, 5], [1, 1, 0]))
        #expect(!ChoiceTape.shortlexPrecedes([1, 1], [1, 1]))
    }

    @Test("Seeds parse from decimal and hex and format as 16 hex digits")
    func seedParsing() {
        #expect(PropertyConfiguration.parseSeed("42") == 42)
        #expect(PropertyConfiguration.parseSeed("0x2A") == 42)
        #expect(PropertyConfiguration.parseSeed(" 0xdead_beef ") == 0xDEAD_BEEF)
        #expect(PropertyConfiguration.parseSeed("nope") == nil)
        #expect(PropertyConfiguration.formatSeed(42) == "0x000000000000002a")
    }
}
