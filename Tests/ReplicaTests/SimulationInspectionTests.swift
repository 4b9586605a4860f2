import Foundation
import Testing
@testable @_spi(Simulation) import Replica

/// The light inspection reads the simulator's checks use instead of the full ones: each must agree with the full read
/// it replaces, on every record and history state (else a check would judge other values than before).
@Suite("Simulation inspection reads")
struct SimulationInspectionTests {
    @Test("replicationStamps(of:) equals the causal length, pending flag and stamps of replicationState(of:)")
    func stampsAgreeWithFullState() throws {
        let cloud = InMemoryCloudDatabase()
        let device = try Device("a", seed: 7)
        var notes: [SyncNote] = []
        for n in 0..<12 { notes.append(device.context.insert(SyncNote(title: "t\(n)", body: n % 3 == 0 ? nil : "b\(n)", rating: n))) }
        try device.context.save()
        try device.sync(cloud)
        // Pending updates, deletes (tombstones) and a re-insert after them.
        for n in stride(from: 0, to: 12, by: 2) {
            var note = notes[n]
            note.title = "u\(n)"
            device.context.update(note)
        }
        try device.context.save()
        for n in stride(from: 1, to: 12, by: 3) { device.context.delete(notes[n]) }
        try device.context.save()
        device.context.insert(SyncNote(id: notes[1].id, title: "again"))
        try device.context.save()
        let states = try device.engine.replicationStates()
        #expect(states.count == 12)
        #expect(states.contains(where: \.isPending) && states.contains(where: { !$0.isPending }))
        #expect(states.contains(where: { !$0.isAlive }))
        for state in states {
            let light = try #require(try device.engine.replicationStamps(of: state.id.id))
            let full = try #require(try device.engine.replicationState(of: state.id.id))
            #expect(light.causalLength == full.causalLength)
            #expect(light.isPending == full.isPending)
            #expect(light.stamps == full.stamps)
            #expect((light.causalLength % 2 == 1) == full.isAlive)
        }
        let unknown = UUID(uuidString: "00000000-0000-7000-8000-0000000000FF")!
        #expect(try device.engine.replicationStamps(of: unknown) == nil)
        #expect(try device.engine.replicationState(of: unknown) == nil)
    }

    @Test("historySpan(storeName:) agrees with a full read of the history, before and after pruning")
    func historySpanAgreesWithFetch() throws {
        let device = try Device("a", seed: 8)
        let empty = try device.context.historySpan(storeName: "notes")
        #expect(empty.newest == nil && empty.count == 0 && empty.prunedThrough == 0)
        #expect(empty.storeIdentity == device.container.stores[0].identity)
        for n in 0..<6 {
            device.context.insert(SyncNote(title: "t\(n)"))
            try device.context.save()
        }
        func agrees() throws {
            let history = try device.context.fetchHistory(HistoryDescriptor(storeNames: ["notes"]))
            let span = try device.context.historySpan(storeName: "notes")
            #expect(span.count == history.count)
            #expect(span.count == (try device.context.historyTransactionCount(storeName: "notes")))
            #expect(span.newest == history.last?.token.value)
            #expect(history.allSatisfy { $0.token.storeIdentity == span.storeIdentity })
            if let first = history.first?.token {
                // Not expired exactly when a read after the token before the first transaction succeeds.
                let before = HistoryToken(storeIdentity: first.storeIdentity, value: first.value - 1)
                let readable = (try? device.context.fetchHistory(HistoryDescriptor(after: before, storeNames: ["notes"]))) != nil
                #expect(readable == (first.value - 1 >= span.prunedThrough))
            }
        }
        try agrees()
        let third = try device.context.fetchHistory(HistoryDescriptor(storeNames: ["notes"]))[2].token
        _ = try device.context.deleteHistory(through: third)
        try agrees()
        let span = try device.context.historySpan(storeName: "notes")
        #expect(span.prunedThrough == third.value)
        #expect(throws: ReplicaError.self) { try device.context.historySpan(storeName: "nope") }
    }
}
