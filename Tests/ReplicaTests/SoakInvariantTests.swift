import Foundation
import Testing
@testable import Replica
import ReplicaTesting

/// The soak's check (`SoakOutcome.check()`) over hand-made outcomes: a healthy one passes, and each kind of damage is
/// caught by the invariant it breaks — so a soak that passes means something.
@Suite("Soak invariants")
struct SoakInvariantTests {
    static let replica = UUID(uuidString: "00000000-0000-7000-8000-00000000000A")!
    static let noteID = UUID(uuidString: "00000000-0000-7000-8000-000000000001")!
    static let folderID = UUID(uuidString: "00000000-0000-7000-8000-000000000002")!

    static func stamp(_ physical: Int64, incarnation: Int64 = 1) -> FieldStamp {
        FieldStamp(incarnation: incarnation, clock: HLC(physical: physical, logical: 0, replica: replica))
    }

    static func note(title: String, titleStamp: Int64 = 10, body: SQLiteValue = .blob(Data(repeating: 7, count: 40)), causalLength: Int64 = 1,
                     slug: String = "s1") -> CloudRecord {
        CloudRecord(recordID: noteID, recordType: "Note", causalLength: causalLength, created: stamp(1), fields: [
            "title": CloudField(value: .text(title), stamp: stamp(titleStamp)),
            "body": CloudField(value: body, stamp: stamp(10), isEncrypted: true),
            "rating": CloudField(value: .integer(5), stamp: stamp(10)),
            "slug": CloudField(value: .text(slug), stamp: stamp(10)),
            "folder": CloudField(value: .blob(withUnsafeBytes(of: folderID.uuid) { Data($0) }), stamp: stamp(10)),
        ])
    }

    static func folder() -> CloudRecord {
        CloudRecord(recordID: folderID, recordType: "Folder", causalLength: 1, created: stamp(1),
                    fields: ["name": CloudField(value: .text("f1"), stamp: stamp(2))])
    }

    static func cloud(_ records: [CloudRecord], metadata: [Data] = []) throws -> SoakCloudDump {
        let encoder = CloudRecordJSON.encoder()
        return SoakCloudDump(records: try records.map { SoakCloudDump.Record(id: $0.recordID, changeTag: "1.1", body: try encoder.encode($0)) },
                             metadata: metadata)
    }

    static func device(_ name: String, title: String = "t2", slug: String = "s1", causalLength: Int64 = 1,
                       extraNote: (String, [String: SoakValue])? = nil) -> SoakDeviceDump {
        var notes: [String: [String: SoakValue]] = [noteID.uuidString: ["title": .text(title), "body": .text("secret.body.1"),
                                                                       "rating": .integer(5), "slug": .text(slug),
                                                                       "folder": .text(folderID.uuidString)]]
        if let extraNote { notes[extraNote.0] = extraNote.1 }
        return SoakDeviceDump(device: name, rows: ["Note": causalLength % 2 == 1 ? notes : [:], "Folder": [folderID.uuidString: ["name": .text("f1")]]],
                              states: [noteID.uuidString: SoakLedgerState(entity: "Note", causalLength: causalLength, pending: false, stamps: [:]),
                                       folderID.uuidString: SoakLedgerState(entity: "Folder", causalLength: 1, pending: false, stamps: [:])],
                              upToDate: true)
    }

    static var journal: [SoakJournalEntry] {
        let insertFields: [String: SoakValue] = ["title": .text("t1"), "body": .text("secret.body.1"), "rating": .integer(5),
                                                 "slug": .text("s1"), "folder": .text(folderID.uuidString)]
        return [
            SoakJournalEntry(device: "a", generation: 0, index: 1, phase: .intent, operation: .insert, entity: "Folder", id: folderID,
                             fields: ["name": .text("f1")]),
            SoakJournalEntry(device: "a", generation: 0, index: 1, phase: .ack, operation: .insert, entity: "Folder", id: folderID,
                             fields: ["name": .text("f1")], causalLength: 1, stamps: ["name": stamp(2).description]),
            SoakJournalEntry(device: "a", generation: 0, index: 2, phase: .intent, operation: .insert, entity: "Note", id: noteID, fields: insertFields),
            SoakJournalEntry(device: "a", generation: 0, index: 2, phase: .ack, operation: .insert, entity: "Note", id: noteID,
                             fields: insertFields, causalLength: 1, stamps: ["title": stamp(5).description]),
            SoakJournalEntry(device: "b", generation: 0, index: 1, phase: .intent, operation: .update, entity: "Note", id: noteID,
                             fields: ["title": .text("t2")]),
            SoakJournalEntry(device: "b", generation: 0, index: 1, phase: .ack, operation: .update, entity: "Note", id: noteID,
                             fields: ["title": .text("t2")], causalLength: 1, stamps: ["title": stamp(10).description]),
        ]
    }

    static func invariants(_ outcome: SoakOutcome) throws -> Set<SoakViolation.Invariant> { Set(try outcome.check().map(\.invariant)) }

    @Test("a healthy outcome passes every invariant")
    func healthy() throws {
        let outcome = SoakOutcome(journal: Self.journal, devices: [Self.device("a"), Self.device("b")],
                                  cloud: try Self.cloud([Self.note(title: "t2"), Self.folder()]))
        #expect(try outcome.check().isEmpty)
    }

    @Test("each kind of damage is caught by the invariant it breaks")
    func damage() throws {
        let cloud = try Self.cloud([Self.note(title: "t2"), Self.folder()])
        // A device holding another value: convergence.
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [Self.device("a"), Self.device("b", title: "t1")], cloud: cloud))
                .contains(.convergence))
        // The cloud kept the older write although the newer one was acknowledged: a lost write.
        let older = try Self.cloud([Self.note(title: "t1", titleStamp: 5), Self.folder()])
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [Self.device("a", title: "t1"), Self.device("b", title: "t1")],
                                                cloud: older)) == [.noLostWrites])
        // An acknowledged record missing from the cloud.
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [], cloud: try Self.cloud([Self.folder()]))) == [.noLostWrites])
        // Alive again after an acknowledged delete (causal length 3, which no insert produced).
        var deleted = Self.journal
        deleted.append(SoakJournalEntry(device: "a", generation: 0, index: 3, phase: .ack, operation: .delete, entity: "Note", id: Self.noteID,
                                        fields: [:], causalLength: 2))
        let revived = try Self.cloud([Self.note(title: "t2", causalLength: 3), Self.folder()])
        #expect(try Self.invariants(SoakOutcome(journal: deleted, devices: [Self.device("a", causalLength: 3)], cloud: revived))
                .contains(.noResurrection))
        // A value no write wrote.
        let invented = try Self.cloud([Self.note(title: "from nowhere", titleStamp: 11), Self.folder()])
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [Self.device("a", title: "from nowhere")], cloud: invented))
                == [.noResurrection])
        // Two live notes with one slug on a device.
        let twin = UUID(uuidString: "00000000-0000-7000-8000-000000000003")!
        let duplicate = Self.device("a", extraNote: (twin.uuidString, ["title": .text("x"), "slug": .text("s1"), "folder": .null]))
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [duplicate], cloud: cloud)).contains(.uniqueKeys))
        // A reference to a folder the device does not hold.
        let orphan = Self.device("a", extraNote: (twin.uuidString, ["title": .text("x"), "slug": .text("s9"),
                                                                   "folder": .text(UUID(uuidString: "00000000-0000-7000-8000-000000000009")!.uuidString)]))
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [orphan], cloud: cloud)).contains(.referentialIntegrity))
        // The plaintext of an encrypted field, in a record's body or in zone metadata.
        let leaked = try Self.cloud([Self.note(title: "t2", body: .text("secret.body.1")), Self.folder()])
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [Self.device("a")], cloud: leaked)).contains(.noPlaintext))
        let leakedMetadata = try Self.cloud([Self.note(title: "t2"), Self.folder()], metadata: [Data("…secret.body.1…".utf8)])
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [Self.device("a")], cloud: leakedMetadata)) == [.noPlaintext])
        // A device that did not settle.
        var unsettled = Self.device("a")
        unsettled.upToDate = false
        #expect(try Self.invariants(SoakOutcome(journal: Self.journal, devices: [unsettled], cloud: cloud)) == [.healed])
    }

    @Test("a journal cut short by kill -9 in its last line is read without that line; damage elsewhere is an error")
    func truncatedJournal() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("soak-journal-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: url) }
        let encoder = JSONEncoder()
        let lines = try Self.journal.prefix(2).map { String(decoding: try encoder.encode($0), as: UTF8.self) }
        try (lines.joined(separator: "\n") + "\n" + "{\"device\":\"a\",\"gener").write(to: url, atomically: true, encoding: .utf8)
        #expect(try SoakJournalEntry.read(url) == Array(Self.journal.prefix(2)))
        try (lines[0] + "\n{broken}\n" + lines[1] + "\n").write(to: url, atomically: true, encoding: .utf8)
        #expect(throws: SoakFormatError.self) { try SoakJournalEntry.read(url) }
    }
}
