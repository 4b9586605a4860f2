import Foundation

/// The JSON form in which cloud databases store a ``CloudRecord``: keys sorted (the same record always gives the same
/// bytes), slashes unescaped, non-finite reals as the strings `"+Infinity"`, `"-Infinity"` and `"NaN"` (a hostile or
/// odd value round-trips instead of failing the whole batch). Cloud databases wrote record bodies in this form
/// before the binary form (``CloudRecordBody``) existed; ``SQLiteCloudDatabase`` and `PostgresCloudDatabase` now
/// write binary bodies and still read JSON ones (``CloudRecordBody/decode(_:)`` reads either).
///
/// An encoder or decoder is not thread-safe: make one per batch (reusing it within the batch saves its set-up).
public enum CloudRecordJSON {
    /// A new encoder for the stored form.
    public static func encoder() -> JSONEncoder { ReplicaJSON.encoder() }

    /// A new decoder for the stored form.
    public static func decoder() -> JSONDecoder { ReplicaJSON.decoder() }
}
