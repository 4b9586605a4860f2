import Foundation
import Testing
@testable import Replica

@Suite("Clock and causal-length bounds")
struct ClockBoundsTests {
    private let replica = UUID(uuidString: "0000BBBB-0000-7000-8000-000000000001")!
    private static let century: Int64 = 100 * 365 * 86_400_000

    @Test("tick and receive never leave the encodable range and never overflow; at the very top they saturate")
    func arithmeticStaysInRange() throws {
        let top = HLC(physical: HLC.maxPhysical, logical: HLC.maxLogical, replica: replica)
        #expect(top.isExhausted && top.isEncodable)
        #expect(top.tick(wall: .max, replica: replica) == top)
        #expect(top.receive(top, wall: .max, replica: replica) == top)
        let nearTop = HLC(physical: HLC.maxPhysical, logical: HLC.maxLogical - 1, replica: replica)
        #expect(nearTop.tick(wall: 0, replica: replica) == top)
        let wild = [HLC(physical: .max, logical: .max, replica: replica), HLC(physical: .min, logical: .min, replica: replica),
                    HLC(physical: 1 << 48, logical: 0x1_0000, replica: replica), HLC(physical: HLC.maxPhysical - 1, logical: 0xFFFF, replica: replica),
                    HLC(physical: 5, logical: -3, replica: replica)]
        for clock in wild {
            for wall: Int64 in [.min, -1, 0, seededStart, HLC.maxPhysical, .max] {
                for next in [clock.tick(wall: wall, replica: replica), clock.receive(clock, wall: wall, replica: replica),
                             HLC.zero(replica).receive(clock, wall: wall, replica: replica)] {
                    #expect(next.isEncodable, "\(clock.physical)/\(clock.logical) at \(wall)")
                    #expect(HLC(hex: Substring(next.hex)) == next)
                }
            }
        }
        // Below the top, every tick is strictly later.
        let below = HLC(physical: HLC.maxPhysical - 1, logical: HLC.maxLogical, replica: replica)
        #expect(below.tick(wall: 0, replica: replica) > below)
        #expect(ReplicationBounds.maxRemotePhysical == HLC.maxPhysical - ReplicationBounds.edgeMarginMilliseconds)
    }

    @Test("a save with the store's clock at the top of its range throws clockExhausted and keeps its changes; never a reused stamp")
    func exhaustedClock() throws {
        let device = try Device("A", seed: 1)
        let top = HLC(physical: HLC.maxPhysical, logical: HLC.maxLogical, replica: device.container.stores[0].identity)
        try device.engine.db.run("INSERT INTO replica_metadata (key, value) VALUES ('hlc', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                                 [.text(top.hex)])
        device.context.insert(SyncNote(title: "late"))
        #expect(throws: ReplicaError.clockExhausted(store: "notes")) { try device.context.save() }
        #expect(device.context.hasChanges)
        #expect(try device.notes().isEmpty)
    }

    @Test("a remote stamp at the edge of the range is refused with a typed reason; the clock, later edits and the SQLite cloud stay sound",
          arguments: [Int32(0xFFFE), 0xFFFF])
    func stampAtTheEdge(_ logical: Int32) async throws {
        let root = temporaryTestDirectory()
        let cloud = try SQLiteCloudDatabase(url: root.appendingPathComponent("cloud.sqlite"))
        let a = try Device("A", seed: 1, directory: root.appendingPathComponent("a"))
        let plain = a.context.insert(SyncNote(title: "plain"))
        try a.context.save()
        try await drive(a, cloud)
        let id = UUID()
        _ = try cloud.modifyRecords([noteRecord(id, stamp: foreignStamp(HLC.maxPhysical, logical: logical))], in: "notes")
        try await drive(a, cloud)
        let entry = try #require(try a.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: id)))
        #expect(entry.state == .rejected(reason: RecordRejection.clockAtEdge(.creation).description))
        #expect(try a.context.model(SyncNote.self, id: id) == nil)
        // The clock never moved: a later edit is stamped now and uploads readably.
        var edited = plain
        edited.title = "edited"
        a.context.update(edited)
        try a.context.save()
        let clock = try SyncLedger.loadHLC(a.engine.db, replica: a.container.stores[0].identity)
        #expect(clock.physical < seededStart + 86_400_000)
        try await drive(a, cloud)
        // A new device receives everything it can read, and refuses the edge record the same way.
        let b = try Device("B", seed: 2, directory: root.appendingPathComponent("b"))
        try await drive(b, cloud)
        #expect(try b.notes().map(\.title) == ["edited"])
        #expect(try b.engine.status().rejectedRecords == 1)
        #expect(try b.engine.status().lastError == nil)
    }

    @Test("a record stamped a century ahead is held, never merged early, never drags later stamps; merged once the clock catches up")
    func farFutureRecordIsHeld() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let id = UUID()
        let future = noteRecord(id, stamp: foreignStamp(seededStart + Self.century), title: .text("from the future"))
        try a.deliver([future], cloud: cloud)
        let pid = PersistentIdentifier(entityName: "SyncNote", id: id)
        guard case let .aheadOfClock(reason, retryAt)? = try a.engine.ledgerEntry(for: pid)?.state else {
            Issue.record("not held: \(String(describing: try a.engine.ledgerEntry(for: pid)))")
            return
        }
        #expect(reason.contains("the creation stamp") && reason.contains("\(ReplicationBounds.defaultMaxClockDriftMilliseconds)"))
        #expect(retryAt == seededStart + Self.century - ReplicationBounds.defaultMaxClockDriftMilliseconds)
        let status = try a.engine.status()
        #expect(status.heldRecords == 1 && !status.isUpToDate)
        #expect(try a.context.model(SyncNote.self, id: id) == nil)
        // Later local stamps follow this device's clock.
        let mine = a.context.insert(SyncNote(title: "mine"))
        try a.context.save()
        #expect(try #require(try a.engine.replicationState(of: mine.id)).created.clock.physical < seededStart + 86_400_000)
        // Still ahead at the next fetch: still held.
        try a.sync(cloud)
        #expect(try a.engine.status().heldRecords == 1)
        // The clock catches up: the next fetch merges it, and the cloud learns it.
        a.clock.set(milliseconds: retryAt)
        #expect(try a.sync(cloud).isUpToDate)
        #expect(try a.context.model(SyncNote.self, id: id)?.title == "from the future")
        #expect(cloud.records(in: "notes").contains { $0.recordID == id && $0.fields["title"]?.value == .text("from the future") })
    }

    @Test("the drift bound is an engine option: a stamp an hour ahead is merged by default and held under a one-minute bound")
    func configurableDrift() throws {
        let cloud = InMemoryCloudDatabase()
        var strict = SyncEngine.Options()
        strict.maxClockDriftMilliseconds = 60_000
        let a = try Device("A", seed: 1)
        let b = try Device("B", seed: 2, options: strict)
        let record = noteRecord(UUID(), stamp: foreignStamp(seededStart + 3_600_000, logical: 3))
        try a.deliver([record], cloud: cloud)
        try b.deliver([record], cloud: cloud)
        #expect(try a.notes().count == 1)
        #expect(try b.notes().isEmpty)
        #expect(try b.engine.ledgerEntries(in: .aheadOfClock).count == 1)
        // A field (not the creation stamp) far ahead names the field.
        var partly = noteRecord(UUID(), stamp: foreignStamp(seededStart))
        partly.fields["rating"]!.stamp = foreignStamp(seededStart + 120_000)
        try b.deliver([partly], cloud: cloud)
        let reasons = try b.engine.ledgerEntries(in: .aheadOfClock).compactMap { entry -> String? in
            if case let .aheadOfClock(reason, _) = entry.state { reason } else { nil }
        }
        #expect(reasons.contains { $0.contains("field 'rating'") })
    }

    @Test("a local edit of a record whose cloud version is held replaces it without a conflict loop; the held writes merge later")
    func localEditOverAHeldVersion() throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let note = a.context.insert(SyncNote(title: "t", body: "b", rating: 1))
        try a.context.save()
        try a.sync(cloud)
        // A device whose clock is a year ahead edits the body.
        let year: Int64 = 365 * 86_400_000
        var ahead = try #require(cloud.records(in: "notes").first)
        ahead.fields["body"] = CloudField(value: .text("from a fast clock"), stamp: foreignStamp(seededStart + year))
        #expect(try cloud.modifyRecords([ahead], in: "notes").allSatisfy { if case .saved = $0 { true } else { false } })
        // A edits the title meanwhile; its sync settles (no conflict loop) and its edit reaches the cloud.
        var local = note
        local.title = "edited"
        a.context.update(local)
        try a.context.save()
        let status = try a.sync(cloud, maxSteps: 40)
        #expect(status.heldRecords == 1 && status.pendingRecords == 0)
        #expect(cloud.records(in: "notes").first?.fields["title"]?.value == .text("edited"))
        // A year on, the held version merges and both edits are in the cloud.
        a.clock.set(milliseconds: seededStart + year)
        #expect(try a.sync(cloud).isUpToDate)
        let record = try #require(cloud.records(in: "notes").first)
        #expect(record.fields["title"]?.value == .text("edited"))
        #expect(record.fields["body"]?.value == .text("from a fast clock"))
    }

    @Test("causal lengths beyond 2^62 are rejected with a reason; a local re-insert past the bound throws a typed error, never traps")
    func causalLengthBounds() async throws {
        let cloud = InMemoryCloudDatabase()
        let a = try Device("A", seed: 1)
        let beyond = noteRecord(UUID(), causalLength: ReplicationBounds.maxCausalLength + 1,
                                stamp: foreignStamp(seededStart, incarnation: ReplicationBounds.maxCausalLength + 1))
        try a.deliver([beyond], cloud: cloud)
        let entry = try a.engine.ledgerEntry(for: PersistentIdentifier(entityName: "SyncNote", id: beyond.recordID))
        #expect(entry?.state == .rejected(reason: RecordRejection.causalLengthOutOfRange(ReplicationBounds.maxCausalLength + 1).description))
        await #expect(processExitsWith: .success) {
            let cloud = InMemoryCloudDatabase()
            let a = try Device("A", seed: 1, inMemory: true)
            let top = ReplicationBounds.maxCausalLength
            let id = UUID()
            // Deleted at the largest causal length accepted: a re-insert would pass it.
            try a.deliver([CloudRecord(recordID: id, recordType: "SyncNote", causalLength: top, created: foreignStamp(seededStart, incarnation: top - 1),
                                       fields: [:])], cloud: cloud)
            a.context.insert(SyncNote(id: id, title: "again"))
            do {
                try a.context.save()
                exit(2)
            } catch ReplicaError.counterExhausted(store: "notes", recordID: id, counter: "causal_length") {
                exit(0)
            }
        }
    }

    @Test("a record whose stamps the text form cannot hold is refused per record by both cloud databases; the rest of the batch is saved")
    func cloudsRefuseUnencodableStamps() throws {
        let root = temporaryTestDirectory()
        let sqlite = try SQLiteCloudDatabase(url: root.appendingPathComponent("cloud.sqlite"))
        let memory = InMemoryCloudDatabase()
        try sqlite.createZone("notes")
        try memory.createZone("notes")
        let good = noteRecord(UUID(), stamp: foreignStamp(seededStart))
        var bad = noteRecord(UUID(), stamp: foreignStamp(seededStart))
        bad.fields["rating"]!.stamp = foreignStamp(1 << 48)
        for results in [try sqlite.modifyRecords([bad, good], in: "notes"), try memory.modifyRecords([bad, good], in: "notes")] {
            guard case let .failed(id, .invalidRecord(reason)) = results[0] else { Issue.record("\(results)"); continue }
            #expect(id == bad.recordID && reason.contains("field 'rating'"))
            guard case .saved = results[1] else { Issue.record("\(results)"); continue }
        }
        #expect(try sqlite.fetchZoneChanges("notes", since: nil, limit: 10).records.map(\.recordID) == [good.recordID])
        #expect(try memory.fetchZoneChanges("notes", since: nil, limit: 10).records.map(\.recordID) == [good.recordID])
    }

    @Test("history queries and pruning by dates beyond Int64 milliseconds never trap; such dates count as the nearest end")
    func historyDatesOutOfRange() async throws {
        #expect(HistoryLog.milliseconds(Date(timeIntervalSince1970: 1e300)) == .max)
        #expect(HistoryLog.milliseconds(Date(timeIntervalSince1970: -1e300)) == .min)
        #expect(HistoryLog.milliseconds(Date(timeIntervalSince1970: .nan)) == .min)
        #expect(HistoryLog.milliseconds(Date(timeIntervalSince1970: 1.5)) == 1_500)
        await #expect(processExitsWith: .success) {
            let device = try Device("A", seed: 1, inMemory: true)
            device.context.insert(SyncNote(title: "t"))
            try device.context.save()
            let far = Date(timeIntervalSince1970: 1e300)
            guard try device.context.fetchHistory(HistoryDescriptor(from: Date(timeIntervalSince1970: -1e300), to: far)).count == 1,
                  try device.context.fetchHistory(HistoryDescriptor(from: far)).isEmpty else { exit(2) }
            _ = try device.context.deleteHistory(before: far)
        }
    }
}

@Suite("Hybrid logical clock extremes")
struct HybridClockExtremeTests {
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
