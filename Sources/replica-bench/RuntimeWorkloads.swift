import Foundation
import Replica

// B17 — the sync runtime (`CloudSync`) as an app holds it, with the in-memory cloud: what it costs while nothing
// happens, and how long a save waits before it is in the cloud beyond the debounce it asked for.
//
// One runtime, started from the container with a debounce of `debounce` ms, no timer and no cloud polling (the
// in-memory cloud announces its changes). First an idle window of `idleSeconds` with the runtime started and
// synced, nothing saved: the process CPU it costs (the target: none — no busy polling). Then `saves`
// one-record saves, one at a time: each latency runs from the save's return to the runtime's `sentChanges` event
// naming that record, minus the debounce. The sample is the median; the note has p90, max and the idle CPU.

/// The events of a runtime, read on a task of their own: the instant (ms, realtime clock) each record was sent.
private final class SentBox: @unchecked Sendable {
    let lock = NSLock()
    var sentAt: [PersistentIdentifier: Double] = [:]
    var error: Error?
}

private func realtimeMilliseconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Double(ts.tv_sec) * 1000 + Double(ts.tv_nsec) / 1_000_000
}

func runtimeLatencyTrial(saves: Int, debounce: Int64, idleSeconds: Double) throws -> Trial {
    let directory = trialDirectory("B17")
    let container = try makeStore(directory, [BenchRecord.self], synced: true)
    let records = makeRecords(saves, seed: 17)
    var note: String?
    return Trial(run: {}, cleanup: { try? FileManager.default.removeItem(at: directory) }, measured: {
        var options = CloudSync.Options()
        options.debounceMilliseconds = debounce
        options.timerMilliseconds = nil
        options.cloudPollingMilliseconds = nil
        let sync = try container.startSync(store: "bench", cloud: InMemoryCloudDatabase(), options: options)
        let box = SentBox()
        let events = sync.events
        let reader = Task {
            for await event in events {
                guard case let .sentChanges(ids) = event else { continue }
                let now = realtimeMilliseconds()
                box.lock.withLock { for id in ids where box.sentAt[id] == nil { box.sentAt[id] = now } }
            }
        }
        defer { reader.cancel() }
        _ = try blocking { try await sync.syncNow() }

        // The idle window: started, synced, nothing to do.
        let idleBefore = processCPUSeconds()
        Thread.sleep(forTimeInterval: idleSeconds)
        let idleCPU = processCPUSeconds() - idleBefore

        let context = ModelContext(container)
        var latencies: [Double] = []
        var totals: [Double] = []
        for record in records {
            context.insert(record)
            try context.save()
            let savedAt = realtimeMilliseconds()
            let id = record.persistentModelID
            let deadline = savedAt + 10_000
            var sentAt: Double?
            while sentAt == nil, realtimeMilliseconds() < deadline {
                sentAt = box.lock.withLock { box.sentAt[id] }
                if sentAt == nil { usleep(200) }
            }
            guard let sentAt else { throw CheckFailed("B17: a save was not sent within 10 s") }
            totals.append(sentAt - savedAt)
            latencies.append(sentAt - savedAt - Double(debounce))
        }
        _ = try blocking { await sync.stop() }
        let sorted = latencies.sorted()
        let median = sorted[sorted.count / 2]
        let total = totals.sorted()[totals.count / 2]
        note = "save → sent beyond the \(debounce) ms debounce: median \(format(median, 2)) ms, p90 "
            + "\(format(sorted[sorted.count * 9 / 10], 2)) ms, max \(format(sorted.last!, 2)) ms (\(saves) saves; save → sent median \(format(total, 2)) ms); "
            + "idle runtime CPU \(format(idleCPU * 1000, 1)) ms over \(format(idleSeconds, 0)) s"
        return Measurement(sample: Sample(cpu: median / 1000, wall: median / 1000), peakMB: nil, items: saves)
    }, note: { note })
}
