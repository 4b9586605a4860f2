// The network, the cloud and the events of a simulation run (see SimulationRun.swift).

import CSQLite
import Foundation
@_spi(Simulation) import Replica

extension SimulationRun {
    /// Whether an event can no longer do anything (a time-out of a request that was answered, a wake-up of an engine
    /// that crashed…): such events do not keep the world busy.
    func isMoot(_ event: SimEvent) -> Bool {
        switch event {
        case let .timeout(message):
            guard let engine = engines[message.engine] else { return true }
            return !isCurrent(engine) || engine.outstanding != message.request.id
        case let .wake(serial), let .push(serial):
            guard let engine = engines[serial] else { return true }
            return !isCurrent(engine)
        case let .respond(message, _):
            guard let engine = engines[message.engine] else { return true }
            return !isCurrent(engine)
        case let .restart(device, process):
            return devices[device].processes[process].isUp
        case let .online(device):
            return devices[device].offlineUntil < 0
        case let .partitionEnd(device):
            return devices[device].partitionedUntil < 0
        case .arrive:
            return false
        case .runtimeWake, .runtimeResume, .runtimeStart, .runtimeCancel:
            return isMootRuntimeEvent(event)
        }
    }

    func enqueuePump(_ engine: SimEngine) {
        guard !engine.queued else { return }
        engine.queued = true
        pumpQueue.append(engine)
    }

    func runPumps() throws {
        var index = 0
        while index < pumpQueue.count {
            let engine = pumpQueue[index]
            index += 1
            engine.queued = false
            try pump(engine)
        }
        pumpQueue.removeAll(keepingCapacity: true)
    }

    func isCurrent(_ engine: SimEngine) -> Bool {
        engine.process.isUp && engine.process.engines[engine.store] === engine
    }

    /// Asks an engine for its next request and sends it, or schedules its wake-up.
    func pump(_ engine: SimEngine) throws {
        if runtimesDrive, engine.runtime != nil { return try runtimeTurn(engine) }
        guard isCurrent(engine), !engine.isBroken, !engine.engine.isAwaitingResponse else { return }
        let request: SyncRequest?
        do {
            request = try engine.engine.nextRequest()
        } catch {
            return try engineFailed(engine, "nextRequest", error)
        }
        if let request {
            try send(request, from: engine)
        } else if let wake = engine.engine.wakeTime {
            let at = now + max(1, wake - engine.process.device.clock.nowMilliseconds())
            if engine.wakeAt.map({ at < $0 }) ?? true {
                engine.wakeAt = at
                queue.push(at, .wake(engine.serial))
            }
        }
    }

    func send(_ request: SyncRequest, from engine: SimEngine) throws {
        let device = engine.process.device
        var message = Message(id: nextMessageID, engine: engine.serial, device: device.index, process: engine.process.index,
                              store: engine.store, request: request)
        nextMessageID += 1
        engine.outstanding = request.id
        stats.syncRequests += 1
        let latency = Int64(scenario.timing.latencyMs)
        if device.isOffline(now) {
            traceSend(message, engine, "offline")
            queue.push(now + 1, .respond(message, .failure(.networkUnavailable)))
            return
        }
        if device.isPartitioned(now) {
            traceSend(message, engine, "partitioned")
            queue.push(now + Int64(scenario.timing.timeoutMs), .timeout(message))
            return
        }
        if !messageSlots.isEmpty {
            let slot = messageSlots.removeFirst()
            let isFetch: Bool = if case .fetchZoneChanges = request.operation { true } else { false }
            message.fate = MessageFate(rawValue: slot.kind) ?? .normal
            switch message.fate {
            case .duplicateRequest, .duplicateResponse, .delay:
                message.extraDelay = Int64(1 + slot.parameter % (scenario.timing.maxDelayMs + 1))
            case .staleFetch:
                if isFetch && !engine.recentFetches.isEmpty {
                    message.staleIndex = slot.parameter % engine.recentFetches.count
                } else {
                    message.fate = .normal
                }
            default: break
            }
        }
        if case let .modifyRecords(records, _) = request.operation { stats.recordsUploaded += records.count }
        traceSend(message, engine, message.fate.name)
        switch message.fate {
        case .dropRequest:
            break
        case .delay:
            queue.push(now + latency + message.extraDelay, .arrive(message))
        case .duplicateRequest:
            queue.push(now + latency, .arrive(message))
            var copy = message
            copy.fate = .normal
            queue.push(now + latency + message.extraDelay, .arrive(copy))
        default:
            queue.push(now + latency, .arrive(message))
        }
        queue.push(now + Int64(scenario.timing.timeoutMs), .timeout(message))
    }

    private func traceSend(_ message: Message, _ engine: SimEngine, _ fate: String) {
        trace.event(now, "send") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("req", message.request.id)
            line.add("op", message.request.operation.name)
            if case let .modifyRecords(records, _) = message.request.operation { line.add("records", records.count) }
            line.add("fate", fate)
        }
    }

    func handle(_ event: SimEvent) throws {
        switch event {
        case let .arrive(message):
            let device = devices[message.device]
            if device.isPartitioned(now) {
                trace.event(now, "lost") { $0.add("req", message.request.id); $0.add("why", "partition") }
                return
            }
            let result = try performAtCloud(message)
            if message.fate == .dropResponse { return }
            var message = message
            if case let .modifyRecords(_, zone) = message.request.operation { message.zoneResets = zoneResets[zone] ?? 0 }
            let latency = Int64(scenario.timing.latencyMs)
            queue.push(now + latency, .respond(message, result))
            if message.fate == .duplicateResponse { queue.push(now + latency + message.extraDelay, .respond(message, result)) }
        case let .respond(message, result):
            try deliver(message, result)
        case let .timeout(message):
            guard let engine = engines[message.engine], isCurrent(engine), engine.outstanding == message.request.id else { return }
            trace.event(now, "timeout") { line in
                line.add("process", engine.process.label)
                line.add("store", engine.store)
                line.add("req", message.request.id)
            }
            engine.outstanding = nil
            stats.syncResponses += 1
            do {
                try engine.engine.abandon(message.request.id)
            } catch {
                try engineFailed(engine, "abandon", error)
            }
            runtimeSawResult(engine, .failure(.networkUnavailable))
            enqueuePump(engine)
        case let .wake(serial):
            guard let engine = engines[serial] else { return }
            engine.wakeAt = nil
            enqueuePump(engine)
        case let .push(serial):
            guard let engine = engines[serial] else { return }
            engine.pushPending = false
            let device = engine.process.device
            guard isCurrent(engine), !device.isOffline(now), !device.isPartitioned(now) else { return }
            if runtimesDrive, engine.runtime != nil {
                noteCloudAnnouncement(engine)
            } else {
                engine.engine.setNeedsFetch()
            }
            enqueuePump(engine)
        case let .restart(deviceIndex, processIndex):
            let process = devices[deviceIndex].processes[processIndex]
            try restart(process)
        case let .online(deviceIndex):
            let device = devices[deviceIndex]
            guard !device.isOffline(now) else { return }
            trace.event(now, "online") { $0.add("device", device.name) }
            // (A runtime is not told: it retries at its engine's backoff.)
            if runtimesDrive { return }
            for process in device.processes where process.isUp {
                for engine in orderedEngines(process) {
                    engine.engine.setNeedsFetch()
                    enqueuePump(engine)
                }
            }
        case let .partitionEnd(deviceIndex):
            let device = devices[deviceIndex]
            guard !device.isPartitioned(now) else { return }
            trace.event(now, "partition-healed") { $0.add("device", device.name) }
            for process in device.processes where process.isUp { for engine in orderedEngines(process) { enqueuePump(engine) } }
        case .runtimeWake, .runtimeResume, .runtimeStart, .runtimeCancel:
            try handleRuntimeEvent(event)
        }
    }

    private func deliver(_ message: Message, _ result: Result<CloudOperationResult, CloudError>) throws {
        let device = devices[message.device]
        guard let engine = engines[message.engine], isCurrent(engine), !engine.isBroken else { return }
        if device.isOffline(now) || device.isPartitioned(now) {
            if case .failure(.networkUnavailable) = result {} else {
                trace.event(now, "lost") { $0.add("req", message.request.id); $0.add("why", "device unreachable") }
                return
            }
        }
        var result = result
        if message.fate == .staleFetch, case .success(.changes) = result, !engine.recentFetches.isEmpty {
            result = .success(.changes(engine.recentFetches[message.staleIndex % engine.recentFetches.count]))
        } else if case let .success(.changes(batch)) = result {
            engine.recentFetches.append(batch)
            if engine.recentFetches.count > 4 { engine.recentFetches.removeFirst() }
        }
        trace.event(now, "deliver") { line in
            line.add("process", engine.process.label)
            line.add("store", engine.store)
            line.add("req", message.request.id)
            line.add("result", describe(result))
        }
        // Only the answer to the request the engine has in flight is applied; a duplicate or late answer is ignored.
        let applied = engine.outstanding == message.request.id
        if applied {
            engine.outstanding = nil
            switch result {
            case let .success(.changes(batch)): stats.recordsMerged += batch.records.count
            case let .success(.modified(results)), let .failure(.partialFailure(results)):
                stats.recordsMerged += results.filter { if case .conflict = $0 { true } else { false } }.count
            default: break
            }
        }
        stats.syncResponses += 1
        do {
            try engine.engine.handle(message.request.id, result)
        } catch let simulated as SimulatedCrash {
            _ = engine.decisions.take()
            crash(engine.process, reason: simulated.point, restartAfter: engine.process.pendingRestartDelay)
            return
        } catch {
            _ = engine.decisions.take()
            return try engineFailed(engine, "handling \(message.request.operation.name)", error)
        }
        try noteZoneDeletionDecisions(engine)
        if applied { runtimeSawResult(engine, result) }
        // (A zone reset between the save and this answer removed the saved records legitimately: the engine learns
        // of the reset later, and convergence checks that it uploads them again. An answer the engine ignored — a
        // duplicate of one it applied earlier — dropped nothing: what it dropped then was checked then.)
        if applied, case let .modifyRecords(records, zone) = message.request.operation, message.zoneResets == zoneResets[zone] ?? 0 {
            try checkOutbox(engine, records: records, zone: zone)
        }
        enqueuePump(engine)
    }

    /// After an upload's answer: every record the outbox no longer holds pending must be contained in the cloud's
    /// version of it (otherwise a newer local write will never be uploaded).
    private func checkOutbox(_ engine: SimEngine, records: [CloudRecord], zone: String) throws {
        for record in records {
            // (A row whose bookkeeping the simulator overwrote since is the corruption checks' concern.)
            if try hasCorruptionInPlace(engine, record.recordID) { continue }
            guard let state = try engine.engine.replicationStamps(of: record.recordID), !state.isPending else { continue }
            // (The message text is built only for a violation.)
            func label() -> String { "\(engine.process.label) dropped \(alias(record.recordID)) from its outbox" }
            guard let stored = mirror[zone]?[record.recordID] else {
                throw InvariantViolation(.noLostWrites, "\(label()), but the cloud does not have it")
            }
            if stored.causalLength < state.causalLength {
                throw InvariantViolation(.noLostWrites, "\(label()) at causal length \(state.causalLength), but the cloud has \(stored.causalLength)")
            }
            guard stored.causalLength == state.causalLength, state.causalLength % 2 == 1 else { continue }
            func lacks(_ name: String, _ stamp: FieldStamp) -> Bool { stored.fields[name].map({ $0.stamp < stamp }) ?? true }
            // Field order matters only for naming the first missing write.
            guard state.stamps.contains(where: lacks) else { continue }
            for (name, stamp) in state.stamps.sorted(by: { $0.key < $1.key }) where lacks(name, stamp) {
                throw InvariantViolation(.noLostWrites, "\(label()), but the cloud lacks its write of '\(name)' (stamp \(stamp))")
            }
        }
    }

    private func describe(_ result: Result<CloudOperationResult, CloudError>) -> String {
        switch result {
        case let .success(outcome):
            switch outcome {
            case .zoneCreated: return "zone created"
            case .zoneDeleted: return "zone deleted"
            case let .modified(results): return describe(results)
            case let .changes(batch): return "\(batch.records.count) records\(batch.moreComing ? ", more coming" : "")"
            case .metadata: return "metadata"
            case .metadataValue: return "metadata set"
            case let .assetUpload(state):
                return state.isComplete ? "asset complete" : "asset \(state.receivedChunks.count) of \(state.asset.chunkCount) chunks"
            case let .assetChunk(bytes): return "asset chunk of \(bytes.count) bytes"
            }
        case let .failure(.partialFailure(results)):
            return "partial failure: " + describe(results)
        case let .failure(error):
            return "error: \(error)"
        }
    }

    private func describe(_ results: [RecordSaveResult]) -> String {
        var saved = 0, conflicts = 0, failed = 0
        for result in results {
            switch result {
            case .saved: saved += 1
            case .conflict: conflicts += 1
            case .failed: failed += 1
            }
        }
        return "saved \(saved), conflicts \(conflicts), failed \(failed)"
    }

    /// The cloud performs a request, with an injected error drawn from the tape.
    private func performAtCloud(_ message: Message) throws -> Result<CloudOperationResult, CloudError> {
        stats.cloudRequests += 1
        let operation = message.request.operation
        var fault = 0
        var retryAfter: Int64 = 0
        var split = 0
        if !cloudSlots.isEmpty {
            let slot = cloudSlots.removeFirst()
            let records: [CloudRecord] = if case let .modifyRecords(records, _) = operation { records } else { [] }
            fault = slot.kind
            if records.isEmpty && (fault == 4 || fault == 5) { fault = 0 }
            retryAfter = Int64(100 + slot.parameter % 20_001)
            if fault == 5 { split = slot.parameter % records.count }
        }
        let faultNames = ["none", "rate-limited", "quota-exceeded", "zone-busy", "conflict", "partial-failure"]
        let result: Result<CloudOperationResult, CloudError>
        switch fault {
        case 1: result = .failure(.rateLimited(retryAfterMilliseconds: retryAfter))
        case 2: result = .failure(.quotaExceeded)
        case 3: result = .failure(.zoneBusy(retryAfterMilliseconds: retryAfter))
        case 4:
            // Another writer saves the same record (unchanged) first: the upload meets a conflict.
            if case let .modifyRecords(records, zone) = operation,
               let touched = records.first(where: { mirror[zone]?[$0.recordID] != nil }), let stored = mirror[zone]?[touched.recordID] {
                _ = try modify([stored], zone: zone, from: nil)
            }
            result = try perform(operation, from: message)
        case 5:
            guard case let .modifyRecords(records, zone) = operation else { result = try perform(operation, from: message); break }
            // Only the first `split` records are saved; the others fail with a transient error.
            let done = Array(records.prefix(split))
            let first: Result<CloudOperationResult, CloudError> = done.isEmpty ? .success(.modified([])) : try modify(done, zone: zone, from: message)
            if case let .success(.modified(results)) = first {
                result = .failure(.partialFailure(results + records.dropFirst(split).map {
                    .failed(recordID: $0.recordID, error: .zoneBusy(retryAfterMilliseconds: 1_000))
                }))
            } else {
                result = first
            }
        default:
            result = try perform(operation, from: message)
        }
        trace.event(now, "cloud") { line in
            line.add("process", "\(devices[message.device].name)/\(message.process == 0 ? "app" : "ext")")
            line.add("store", message.store)
            line.add("req", message.request.id)
            line.add("op", operation.name)
            line.add("fault", faultNames[fault])
            line.add("result", describe(result))
        }
        return result
    }

    private func perform(_ operation: CloudOperation, from message: Message) throws -> Result<CloudOperationResult, CloudError> {
        if case let .modifyRecords(records, zone) = operation { return try modify(records, zone: zone, from: message) }
        return cloud.performNow(operation)
    }

    /// Saves records in the cloud, checking first that every version that replaces one is a superset of it (the
    /// cloud never loses an acknowledged write), and keeps the mirror.
    func modify(_ records: [CloudRecord], zone: String, from message: Message?) throws -> Result<CloudOperationResult, CloudError> {
        if scenario.expect.cloudEncryption {
            // No plaintext of an encrypted attribute ever reaches the cloud, not even in a version replaced later.
            for record in records {
                for name in (encryptedAttributes[record.recordType] ?? []).sorted() {
                    guard let field = record.fields[name] else { continue }
                    // A sealed value (a BLOB), or the reference of a sealed asset (whose bytes are sealed).
                    let sealed: Bool = switch field.value {
                    case .blob: field.isEncrypted
                    case let .text(text): field.isEncrypted && SealedAssetReference(fieldValue: text) != nil
                    default: false
                    }
                    if !sealed {
                        let who = message.map { "\(devices[$0.device].name)/\($0.process == 0 ? "app" : "ext")" } ?? "the cloud"
                        throw InvariantViolation(.noPlaintext, "\(who) uploaded \(alias(record.recordID)).\(name) to zone '\(zone)' unsealed")
                    }
                }
            }
        }
        if let message { try checkCorruptedUploads(records, zone: zone, device: message.device) }
        for record in records {
            guard let old = mirror[zone]?[record.recordID], old.changeTag == record.changeTag else { continue }
            if let gap = dominanceGap(new: record, old: old) {
                let who = message.map { "\(devices[$0.device].name)/\($0.process == 0 ? "app" : "ext")" } ?? "the cloud"
                throw InvariantViolation(.noLostWrites, "\(who) overwrote \(alias(record.recordID)) in zone '\(zone)' with a version that lost data: \(gap)")
            }
        }
        let result = cloud.performNow(.modifyRecords(records, zone: zone))
        if case let .success(.modified(results)) = result {
            var saved = 0
            for (record, outcome) in zip(records, results) {
                if case let .saved(id, tag) = outcome {
                    var stored = record
                    stored.changeTag = tag
                    mirror[zone, default: [:]][id] = stored
                    reference.noteRedirect(zone: zone, stored)
                    reference.noteCloudVersion(zone: zone, stored)
                    saved += 1
                }
            }
            stats.cloudSaves += saved
            if saved > 0 { schedulePushes(zone: zone, except: message?.engine) }
        }
        return result
    }

    /// Push notifications to every engine of `zone` (but the uploader).
    func schedulePushes(zone: String, except serial: Int?) {
        // `currentEngines`' order (device, process, store), without building the list.
        for device in devices {
            for process in device.processes where process.isUp {
                for store in process.stores where store.name == zone {
                    guard let engine = process.engines[store.name], engine.serial != serial, !engine.pushPending else { continue }
                    engine.pushPending = true
                    queue.push(now + Int64(scenario.timing.pushLatencyMs), .push(engine.serial))
                }
            }
        }
    }

    /// A short, stable name for a record (`Trip#3`).
    func alias(_ id: UUID) -> String { aliases[id] ?? "record-\(id.uuidString.prefix(8).lowercased())" }

    /// Runs `PRAGMA integrity_check` on a store file, through a read-only connection of the simulator's that stays
    /// open for the file (see ``IntegrityChecker``).
    func checkIntegrity(_ process: SimProcess, _ store: Scenario.Store) throws {
        guard let url = process.container?.url(of: configurationName(store.name)) else { return }
        let checker: IntegrityChecker
        if let known = integrityCheckers[url.path], known.isCurrent {
            checker = known
        } else {
            integrityCheckers[url.path] = nil
            guard let opened = IntegrityChecker(path: url.path) else {
                throw InvariantViolation(.crashConsistency, "\(process.label) store '\(store.name)': the file cannot be opened")
            }
            checker = opened
            integrityCheckers[url.path] = opened
        }
        guard let results = checker.check() else {
            throw InvariantViolation(.crashConsistency, "\(process.label) store '\(store.name)': integrity_check cannot run")
        }
        guard results == ["ok"] else {
            throw InvariantViolation(.crashConsistency, "\(process.label) store '\(store.name)': integrity_check says \(results.prefix(3).joined(separator: "; "))")
        }
    }
}
