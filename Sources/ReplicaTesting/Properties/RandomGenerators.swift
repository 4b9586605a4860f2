// Deterministic pseudo-random number generators used by the property engine.
//
// Both generators are pure value types: the same seed always yields the same sequence,
// on every platform, in every process. Nothing here reads the clock or system entropy.

/// SplitMix64 (Steele, Lea & Flood; public-domain reference by Sebastiano Vigna).
///
/// A tiny 64-bit generator whose only job in Replica is to expand one `UInt64` seed into
/// well-mixed state for ``Xoshiro256StarStar`` (and to derive per-case seeds). Every 64-bit
/// seed, including 0, produces a full-period sequence.
public struct SplitMix64: RandomNumberGenerator, Sendable, Hashable {
    /// The internal 64-bit counter. Advances by the golden-ratio increment on every call.
    public var state: UInt64

    /// Creates a generator whose first output is derived from `seed`.
    /// - Parameter seed: Any 64-bit value; equal seeds give equal sequences.
    @inlinable
    public init(seed: UInt64) {
        self.state = seed
    }

    /// Returns the next 64-bit output. O(1), no allocation.
    @inlinable
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// xoshiro256** 1.0 (Blackman & Vigna, 2018): the engine's source of randomness.
///
/// A 256-bit-state generator with excellent statistical quality and a period of 2^256 − 1.
/// Seed it with ``init(seed:)``, which expands the 64-bit seed through ``SplitMix64`` exactly
/// as the authors recommend, so the all-zero state can never occur.
public struct Xoshiro256StarStar: RandomNumberGenerator, Sendable, Hashable {
    @usableFromInline var s0: UInt64
    @usableFromInline var s1: UInt64
    @usableFromInline var s2: UInt64
    @usableFromInline var s3: UInt64

    /// Creates a generator from a 64-bit seed, expanded to 256 bits of state with ``SplitMix64``.
    /// - Parameter seed: Any 64-bit value; equal seeds give equal sequences.
    @inlinable
    public init(seed: UInt64) {
        var mixer = SplitMix64(seed: seed)
        s0 = mixer.next()
        s1 = mixer.next()
        s2 = mixer.next()
        s3 = mixer.next()
    }

    /// Creates a generator from raw 256-bit state.
    /// - Parameter state: Four words of state; must not all be zero (precondition).
    public init(state: (UInt64, UInt64, UInt64, UInt64)) {
        precondition(state != (0, 0, 0, 0), "xoshiro256** state must not be all zero")
        (s0, s1, s2, s3) = state
    }

    /// The current 256-bit state, e.g. to snapshot and restore a stream.
    public var state: (UInt64, UInt64, UInt64, UInt64) { (s0, s1, s2, s3) }

    @inlinable
    static func rotl(_ x: UInt64, _ k: UInt64) -> UInt64 {
        (x << k) | (x >> (64 &- k))
    }

    /// Returns the next 64-bit output. O(1), no allocation.
    @inlinable
    public mutating func next() -> UInt64 {
        let result = Self.rotl(s1 &* 5, 7) &* 9
        let t = s1 << 17
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = Self.rotl(s3, 45)
        return result
    }

    /// Returns a uniformly distributed value in `0...bound` (inclusive), without modulo bias.
    ///
    /// Uses Lemire's multiply-and-reject method: usually one call to ``next()``.
    /// - Parameter bound: The largest value that may be returned.
    @inlinable
    public mutating func next(upTo bound: UInt64) -> UInt64 {
        if bound == .max { return next() }
        let range = bound &+ 1
        var product = next().multipliedFullWidth(by: range)
        if product.low < range {
            let threshold = (0 &- range) % range
            while product.low < threshold {
                product = next().multipliedFullWidth(by: range)
            }
        }
        return product.high
    }

    /// Returns `true` with the given probability (53-bit resolution).
    /// - Parameter probability: A value in `0...1`; values outside are clamped.
    @inlinable
    public mutating func nextBool(probability: Double) -> Bool {
        Double(next() >> 11) * 0x1p-53 < probability
    }

    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.state == rhs.state
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(s0)
        hasher.combine(s1)
        hasher.combine(s2)
        hasher.combine(s3)
    }
}

/// Stable hashing for names (seeds, file names).
enum PropertyHashing {
    /// 64-bit FNV-1a over UTF-8: a stable (process-independent) hash used to derive default
    /// seeds and failure-file names from property names. Never use `hashValue` for these: it is
    /// randomized per process.
    static func fnv1a64(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in text.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01B3
        }
        return hash
    }
}
