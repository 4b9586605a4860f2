import Foundation
import Testing
@testable import Replica

/// An SQLiteCloudDatabase whose file is damaged (truncated, overwritten) or deleted while open: the engine reports
/// transient errors that show no record values, keeps local data and its queue, writes to the file now at the cloud's
/// path, and uploads everything again to a new, empty cloud file.
@Suite("SQLiteCloudDatabase: a cloud file damaged or deleted while open")
struct SQLiteCloudFileFaultTests {
    @Test("a cloud file truncated or overwritten while open: transient errors without record values, local data and queue kept, recovery by a new file")
    func damagedCloudFile() async throws {
        for damage in ["truncate", "garbage", "delete", "delete-main", "delete-all"] {
            let directory = temporaryTestDirectory()
            defer { try? FileManager.default.removeItem(at: directory) }
            let cloudURL = directory.appendingPathComponent("cloud.sqlite")
            let cloud = try SQLiteCloudDatabase(url: cloudURL)
            let device = try Device("a", seed: 51, directory: directory.appendingPathComponent("a"))
            for i in 0..<40 { device.context.insert(SyncNote(title: "n\(i)", body: "secret-body-\(i)", rating: i)) }
            try device.context.save()
            _ = try await drive(device, cloud)
            #expect(try device.engine.status().pendingRecords == 0)
            let other = try Connection(location: .file(cloudURL))
            // Deleting files leaves the write-ahead log as it is (the open connections keep using it).
            if !damage.hasPrefix("delete-") { try other.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
            let handle = try FileHandle(forWritingTo: cloudURL)
            switch damage {
            case "truncate": try handle.truncate(atOffset: 4096)
            case "garbage":
                try handle.seek(toOffset: 4096)
                handle.write(Data(repeating: 0xA5, count: 16_384))
            case "delete-all":
                for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: cloudURL.path + suffix) }
            default: try FileManager.default.removeItem(at: cloudURL)
            }
            try handle.close()
            var note = try #require(try device.context.fetch(SyncNote.self).first)
            note.body = "secret-edit"
            device.context.update(note)
            try device.context.save()
            _ = try await drive(device, cloud, maxRequests: 12)
            let status = try device.engine.status()
            #expect(try device.context.fetchCount(FetchDescriptor<SyncNote>()) == 40, "\(damage)")
            #expect(try device.context.model(SyncNote.self, id: note.id)?.body == "secret-edit", "\(damage)")
            if let error = status.lastError {
                #expect(!error.description.contains("secret"), "\(damage): \(error)")
                #expect(error.isTransient, "\(damage): \(error)")
                #expect(status.pendingRecords >= 1, "\(damage)")
            }
            if damage.hasPrefix("delete") {
                // The file was deleted while open: the engine's writes must reach the file now at that path (which
                // other processes see), not the unlinked one.
                #expect(status.pendingRecords == 0 && status.lastError == nil)
                let seen = try SQLiteCloudDatabase(url: cloudURL).records(in: "notes")
                #expect(seen.count == 40, "\(damage): records in the file at the cloud's path after it was deleted while open")
                #expect(seen.contains { $0.fields["body"]?.value == .text("secret-edit") })
            }
            // A new, empty cloud file at another path: everything reaches it again (zone not found → re-upload).
            let fresh = try SQLiteCloudDatabase(url: directory.appendingPathComponent("cloud2.sqlite"))
            _ = try await drive(device, fresh)
            let uploaded = try fresh.records(in: "notes")
            let lastError = try device.engine.status().lastError
            #expect(uploaded.count == 40, "\(damage): \(String(describing: lastError))")
            #expect(uploaded.contains { $0.fields["body"]?.value == .text("secret-edit") }, "\(damage)")
        }
    }

    @Test("a cloud file deleted while open, with no other connection to it: writes go to the file now at its path and a separate connection sees them all")
    func deletedCloudFileKeepsNewLog() async throws {
        let directory = temporaryTestDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let cloudURL = directory.appendingPathComponent("cloud.sqlite")
        let cloud = try SQLiteCloudDatabase(url: cloudURL)
        let device = try Device("a", seed: 52, directory: directory.appendingPathComponent("a"))
        for i in 0..<10 { device.context.insert(SyncNote(title: "n\(i)", rating: i)) }
        try device.context.save()
        _ = try await drive(device, cloud)
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: cloudURL.path + suffix) }
        var note = try #require(try device.context.fetch(SyncNote.self).first)
        note.rating = 99
        device.context.update(note)
        try device.context.save()
        _ = try await drive(device, cloud, maxRequests: 30)
        #expect(try device.engine.status().pendingRecords == 0)
        // A separate connection to the path finds every record, with the edit. (The cross-process hazard of the stale
        // connection unlinking the new file's `-wal` by name on close is prevented with SQLITE_FCNTL_PERSIST_WAL; an
        // in-process connection shares SQLite's per-inode state and cannot show it.)
        let seen = try SQLiteCloudDatabase(url: cloudURL).records(in: "notes")
        #expect(seen.count == 10)
        #expect(seen.contains { $0.fields["rating"]?.value == .integer(99) })
    }
}
