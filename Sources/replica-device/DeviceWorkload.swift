import Foundation
import Replica
import ReplicaTesting

/// The random workload of one device process: writes (each journaled before and after its commit), sync rounds and
/// offline spells, drawn from a seeded source, until the time is up or the writes are done.
final class DeviceWorkload {
    struct Settings {
        var seed: UInt64
        var generation: Int
        /// Wall-clock seconds to run (at most).
        var duration: Double
        /// Writes to make (at most); `nil`: until the time is up.
        var writes: Int?
        /// Percent of steps that go offline (no sync) for 0.3–2 s.
        var offlinePercent: Int
        /// Milliseconds between steps, at most (each waits a random part of it).
        var pauseMilliseconds: Int
        /// Unix time, in seconds, that log lines count from (the soak's start); `nil`: this process's start.
        var origin: Double?
    }

    let device: DeviceStore
    let settings: Settings
    let random: SeededRandomSource
    let journal: FileHandle
    private var index = 0
    private var notes: [UUID] = []
    private var folders: [UUID] = []
    private let start = ContinuousClock.now

    init(device: DeviceStore, settings: Settings, journal: URL) throws {
        self.device = device
        self.settings = settings
        random = SeededRandomSource(seed: settings.seed)
        if !FileManager.default.fileExists(atPath: journal.path) {
            _ = FileManager.default.createFile(atPath: journal.path, contents: nil)  // a failure throws at the open below
        }
        self.journal = try FileHandle(forWritingTo: journal)
        try self.journal.seekToEnd()
    }

    private var elapsed: Double {
        let duration = ContinuousClock.now - start
        return Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    private func draw(_ bound: Int) -> Int { Int(random.next() % UInt64(max(1, bound))) }

    /// Writes one line to standard output (the soak's log collects it).
    func log(_ text: String) {
        let time = settings.origin.map { Date().timeIntervalSince1970 - $0 } ?? elapsed
        print(String(format: "%7.2f", time) + " \(device.name): " + text)
        fflush(nil)
    }

    private func write(_ entry: SoakJournalEntry) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        var line = try encoder.encode(entry)
        line.append(0x0A)
        // One write(2) per line: a process killed after it returns has the whole line in the file.
        try journal.write(contentsOf: line)
    }

    func run() async throws {
        try refresh()
        var offlineUntil: Double?
        var saves = 0, rounds = 0
        while elapsed < settings.duration, settings.writes.map({ index < $0 }) ?? true {
            if let until = offlineUntil, elapsed >= until {
                offlineUntil = nil
                log("online")
            }
            let roll = draw(100)
            if offlineUntil == nil, roll < settings.offlinePercent {
                let spell = 0.3 + Double(draw(1_700)) / 1_000
                offlineUntil = elapsed + spell
                log(String(format: "offline for %.1f s", spell))
            } else if roll < 75 {
                if try writeStep() { saves += 1 }
            } else if offlineUntil == nil {
                rounds += 1
                try await syncRound(budget: 8)
            }
            if index % 25 == 0 { try refresh() }
            let pause = draw(settings.pauseMilliseconds + 1)
            if pause > 0 { try await Task.sleep(nanoseconds: UInt64(pause) * 1_000_000) }
        }
        log("done: \(saves) writes, \(rounds) sync rounds")
    }

    /// Up to `budget` requests, without waiting out a backoff (the device goes on writing meanwhile).
    func syncRound(budget: Int) async throws {
        device.engine.setNeedsFetch()
        for _ in 0..<budget {
            guard let request = try device.engine.nextRequest() else { return }
            let result = await device.cloud.perform(request.operation)
            if case let .failure(error) = result, error != lastError { log("sync: \(error)") }
            lastError = result.failureValue
            try device.engine.handle(request.id, result)
        }
    }

    /// The error of the last request (logged when it changes).
    private var lastError: CloudError?

    private func refresh() throws {
        notes = try device.context.fetchIdentifiers(FetchDescriptor<Note>()).map(\.id)
        folders = try device.context.fetchIdentifiers(FetchDescriptor<Folder>()).map(\.id)
    }

    private func text(_ prefix: String) -> String { "\(prefix).\(device.name).\(settings.generation).\(index)" }

    private func secret() -> String { "secret.\(device.name).\(settings.generation).\(index).\(String(random.next(), radix: 36))" }

    private func anyFolder() -> UUID? { folders.isEmpty || draw(3) == 0 ? nil : folders[draw(folders.count)] }

    /// One write: journal the intent, save, journal the acknowledgement with the stamps the store gave it.
    /// - Returns: whether something was saved.
    private func writeStep() throws -> Bool {
        index += 1
        let context = device.context
        let roll = draw(100)
        var operation = SoakJournalEntry.Operation.insert
        var entity = "Note"
        var fields: [String: SoakValue] = [:]
        let id: UUID
        if roll < 35 || notes.isEmpty {
            var slug = draw(10) == 0 ? "shared.\(draw(20))" : text("s")
            // A slug this device already holds would make the insert an upsert of its record (R15), whose new ID never
            // exists: the journal records inserts, so take a fresh slug. Cross-device duplicates stay contested.
            if try context.fetchCount(FetchDescriptor<Note>(predicate: #Predicate { $0.slug == slug })) > 0 { slug = text("s") }
            let folder = anyFolder()
            var note = Note(title: text("t"), body: secret(), rating: 2 + draw(1_000_000), slug: slug, folder: folder.map { Reference($0) })
            note = context.insert(note)
            id = note.id
            fields = ["title": .text(note.title), "body": .text(note.body!), "rating": .integer(Int64(note.rating)),
                      "slug": .text(slug), "folder": folder.map { .text($0.uuidString) } ?? .null]
            notes.append(id)
        } else if roll < 42 {
            entity = "Folder"
            let folder = context.insert(Folder(name: text("f")))
            id = folder.id
            fields = ["name": .text(folder.name)]
            folders.append(id)
        } else if roll < 85 {
            operation = .update
            let chosen = notes[draw(notes.count)]
            guard var note = try context.model(Note.self, id: chosen) else { return false }
            id = chosen
            for _ in 0...draw(2) {
                switch draw(4) {
                case 0:
                    note.title = text("t")
                    fields["title"] = .text(note.title)
                case 1:
                    note.body = secret()
                    fields["body"] = .text(note.body!)
                case 2:
                    note.rating = 2 + draw(1_000_000)
                    fields["rating"] = .integer(Int64(note.rating))
                default:
                    let folder = anyFolder()
                    note.folder = folder.map { Reference($0) }
                    fields["folder"] = folder.map { .text($0.uuidString) } ?? .null
                }
            }
            context.update(note)
        } else if roll < 95 || folders.isEmpty {
            operation = .delete
            let chosen = notes[draw(notes.count)]
            guard let note = try context.model(Note.self, id: chosen) else { return false }
            id = chosen
            context.delete(note)
            notes.removeAll { $0 == chosen }
        } else {
            operation = .delete
            entity = "Folder"
            let chosen = folders[draw(folders.count)]
            guard let folder = try context.model(Folder.self, id: chosen) else { return false }
            id = chosen
            context.delete(folder)
            folders.removeAll { $0 == chosen }
        }
        let intent = SoakJournalEntry(device: device.name, generation: settings.generation, index: index, phase: .intent,
                                      operation: operation, entity: entity, id: id, fields: fields)
        try write(intent)
        do {
            try context.save()
        } catch {
            // Nothing was committed (a unique key this device already holds, say): the intent did not happen.
            context.rollback()
            var abort = intent
            abort.phase = .abort
            try write(abort)
            if case .insert = operation { notes.removeAll { $0 == id } }
            return false
        }
        var ack = intent
        ack.phase = .ack
        if let state = try device.engine.replicationState(of: id) {
            ack.causalLength = state.causalLength
            ack.stamps = state.stamps.filter { fields[$0.key] != nil }.mapValues(\.description)
        }
        try write(ack)
        return true
    }
}

extension Result {
    /// The error, or `nil` for a success.
    var failureValue: Failure? { if case let .failure(error) = self { error } else { nil } }
}
