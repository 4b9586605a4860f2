import Foundation
import Testing
@testable import Replica

@Suite("Adversarial: hybrid logical clock extremes")
struct AdversarialClockTests {
    @Test("tick and receive strictly increase and always fit the fixed-width text form")
    func tickAndReceiveAtTheTopOfTheCounter() throws {
        let replica = UUID(uuidString: "0000BBBB-0000-7000-8000-000000000001")!
        let top = HLC(physical: seededStart, logical: 0xFFFF, replica: replica)
        for next in [top.tick(wall: seededStart - 5, replica: replica),
                     top.receive(top, wall: seededStart - 5, replica: replica),
                     HLC.zero(replica).receive(top, wall: 0, replica: replica)] {
            #expect(next > top)
            #expect(HLC(hex: Substring(next.hex)) == next, "\(next.hex) does not read back")
        }
    }

    @Test("a remote stamp at the top of the logical counter never crashes the merge")
    func logicalCounterAtInt32Max() async throws {
        await #expect(processExitsWith: .success) {
            let cloud = InMemoryCloudDatabase()
            let device = try Device("A", seed: 1, inMemory: true)
            let id = UUID(uuidString: "01900000-0000-7000-8000-000000000002")!
            try device.deliver([noteRecord(id, stamp: foreignStamp(1_767_225_600_005 + 60_000, logical: Int32.max))], cloud: cloud)
            device.context.insert(SyncNote(title: "after"))
            try device.context.save()
        }
    }

    @Test("an edit made after seeing a remote edit orders after it, even when the logical counter passes 16 bits (R2)")
    func logicalCounterPast16Bits() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("A", seed: 1)
        let id = UUID()
        // Another device, one minute ahead, wrote the title at the top of the 16-bit logical counter.
        let remote = noteRecord(id, stamp: foreignStamp(seededStart + 60_000, logical: 0xFFFF), title: .text("remote"))
        try device.deliver([remote], cloud: cloud)
        // Having seen it, this device edits the title.
        var note = try #require(try device.context.model(SyncNote.self, id: id))
        note.title = "local, later"
        device.context.update(note)
        try device.context.save()
        // The same remote record arriving again (a duplicate) must not undo the later local edit.
        try device.deliver([remote], cloud: cloud)
        #expect(try device.context.model(SyncNote.self, id: id)?.title == "local, later")
    }
}
