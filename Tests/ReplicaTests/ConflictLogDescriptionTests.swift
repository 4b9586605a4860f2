import Foundation
@testable import Replica
import Testing

@Suite("Conflict log: readable stamps")
struct ConflictLogDescriptionTests {
    static let replica = UUID(uuidString: "5F0C8E2A-1B3D-4C5E-8F70-A1B2C3D4E5F6")!

    @Test("an HLC reads as ISO-8601 UTC with milliseconds, the logical counter and the replica")
    func hlcReadsAsTime() {
        // 2026-12-01T10:00:00.123Z is 1_796_119_200_123 ms after 1970.
        let stamp = HLC(physical: 1_796_119_200_123, logical: 2, replica: Self.replica)
        #expect(stamp.readableDescription == "2026-12-01T10:00:00.123Z+2 by 5F0C8E2A-1B3D-4C5E-8F70-A1B2C3D4E5F6")
        #expect(HLC(physical: 0, logical: 0, replica: Self.replica).readableDescription.hasPrefix("1970-01-01T00:00:00.000Z by "))
    }

    @Test("the calendar conversion agrees with Foundation's on leap days, year ends and the encodable range's ends")
    func calendarMatchesFoundation() {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let samples: [Int64] = [0, 951_782_400_000, 951_868_799_999, 1_078_012_800_000, 4_107_542_399_999, 1_796_119_200_123,
                                -1, -86_400_001, HLC.maxPhysical]
        for milliseconds in samples {
            let date = Date(timeIntervalSince1970: Double(milliseconds) / 1_000)
            let parts = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
            let millis = ((milliseconds % 1_000) + 1_000) % 1_000
            let expected = String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", parts.year!, parts.month!, parts.day!,
                                  parts.hour!, parts.minute!, parts.second!, Int(millis))
            #expect(HLC.iso8601(milliseconds: milliseconds) == expected, "\(milliseconds) ms")
        }
    }

    @Test("a field stamp shows its incarnation only after a re-insert; the hex form is unchanged")
    func fieldStampReadable() {
        let clock = HLC(physical: 1_796_119_200_000, logical: 0, replica: Self.replica)
        #expect(FieldStamp(incarnation: 1, clock: clock).readableDescription == "2026-12-01T10:00:00.000Z by \(Self.replica.uuidString)")
        #expect(FieldStamp(incarnation: 3, clock: clock).readableDescription.hasSuffix(" (incarnation 3)"))
        #expect(FieldStamp(incarnation: 3, clock: clock).description.count == 64)
    }

    @Test("a logged conflict describes the lost field with both stamps as time and replica, never raw hex or values")
    func conflictEntryReadable() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2)
        let note = a.context.insert(SyncNote(title: "t"))
        try a.context.save()
        try a.sync(cloud); try b.sync(cloud)
        var onB = try #require(try b.context.model(SyncNote.self, id: note.id))
        onB.title = "B wins"
        b.clock.advance(by: 5_000)
        b.context.update(onB)
        try b.context.save()
        try b.sync(cloud)
        var onA = note
        onA.title = "A loses"
        a.context.update(onA)
        try a.context.save()
        try a.sync(cloud)
        let entry = try #require(try a.engine.conflictLog().first)
        let text = entry.description
        #expect(text.hasPrefix("\(entry.id): title written "))
        #expect(text.contains(" by \(entry.localStamp.clock.replica.uuidString)"))
        #expect(text.contains("lost to the write of \(entry.winningStamp.readableDescription)"))
        #expect(!text.contains(entry.localStamp.description) && !text.contains(entry.winningStamp.description))
        #expect(!text.contains("A loses") && !text.contains("B wins"))
    }
}
