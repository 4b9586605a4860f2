import Foundation

extension HLC {
    /// The stamp as a person reads it: the physical time as ISO-8601 UTC with milliseconds, the logical counter when
    /// it is not zero, and the replica that made it — e.g. `2026-12-01T10:00:00.123Z+2 by 5F0C…` (the whole replica
    /// UUID). Computed from the stamp alone (no time zone, no locale, no current time), so the same stamp reads the
    /// same on every device.
    public var readableDescription: String {
        var text = Self.iso8601(milliseconds: physical)
        if logical != 0 { text += "+\(logical)" }
        return text + " by " + replica.uuidString
    }

    /// `milliseconds` since 1970 as `YYYY-MM-DDTHH:MM:SS.mmmZ` (proleptic Gregorian calendar, UTC).
    ///
    /// Source: the days-to-civil conversion of H. Hinnant, "chrono-Compatible Low-Level Date Algorithms".
    static func iso8601(milliseconds: Int64) -> String {
        let millisPerDay: Int64 = 86_400_000
        var days = milliseconds / millisPerDay
        var rest = milliseconds % millisPerDay
        if rest < 0 {
            rest += millisPerDay
            days -= 1
        }
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func pad(_ value: Int64, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        let hours = rest / 3_600_000, minutes = rest / 60_000 % 60, seconds = rest / 1_000 % 60, millis = rest % 1_000
        return "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))T\(pad(hours, 2)):\(pad(minutes, 2)):\(pad(seconds, 2)).\(pad(millis, 3))Z"
    }
}

extension FieldStamp {
    /// The stamp as a person reads it: the clock's ``HLC/readableDescription`` and, when the record has been deleted
    /// and re-inserted, the incarnation (its causal length) — e.g. `2026-12-01T10:00:00.123Z by 5F0C… (incarnation 3)`.
    /// ``description`` stays the 64-hex-digit form that orders and parses.
    public var readableDescription: String {
        incarnation == 1 ? clock.readableDescription : clock.readableDescription + " (incarnation \(incarnation))"
    }
}
