// Shared test fixtures: foreign stamps and cloud records (malformed cloud data, clock extremes), a sync driver,
// temporary directories, and models for ID collisions, odd options and values that JSON cannot hold.
import Foundation
import Testing
@testable import Replica

/// A field stamp of a foreign replica at `physical` ms.
func foreignStamp(_ physical: Int64, logical: Int32 = 0, incarnation: Int64 = 1,
                  replica: UUID = UUID(uuidString: "0000AAAA-0000-7000-8000-000000000001")!) -> FieldStamp {
    FieldStamp(incarnation: incarnation, clock: HLC(physical: physical, logical: logical, replica: replica))
}

/// A SyncNote record as another device would upload it.
func noteRecord(_ id: UUID, causalLength: Int64 = 1, stamp: FieldStamp, title: SQLiteValue = .text("remote"),
                rating: SQLiteValue = .integer(1), type: String = "SyncNote") -> CloudRecord {
    CloudRecord(recordID: id, recordType: type, causalLength: causalLength, created: stamp,
                fields: ["title": CloudField(value: title, stamp: stamp), "rating": CloudField(value: rating, stamp: stamp)])
}

/// The clock start of `ReplicaEnvironment.seeded` (and so of every `Device`).
let seededStart: Int64 = 1_767_225_600_000

/// Syncs `device` with any cloud database, driving the engine by hand (backoffs skipped on the manual clock).
/// Returns the number of requests performed.
@discardableResult
func drive(_ device: Device, _ cloud: any CloudDatabase, maxRequests: Int = 200) async throws -> Int {
    device.engine.setNeedsFetch()
    var performed = 0
    while performed < maxRequests {
        if let request = try device.engine.nextRequest() {
            performed += 1
            try device.engine.handle(request.id, await cloud.perform(request.operation))
        } else if let wake = device.engine.wakeTime {
            device.clock.set(milliseconds: wake)
        } else {
            break
        }
    }
    return performed
}

/// A fresh directory path under the system temporary directory, `replica-<tag>-<random UUID>`.
func temporaryTestDirectory(_ tag: String = "test") -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("replica-\(tag)-\(UUID().uuidString)")
}

/// A second synced entity for ID-collision tests.
struct SyncTag: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var label: String = ""
    static let entity = ModelEntity<SyncTag>([.attribute("label", \.label, default: "")])
}

/// A synced model with a double, for non-finite values.
struct AdvMeasure: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var label: String = ""
    var value: Double = 0
    static let entity = ModelEntity<AdvMeasure>([
        .attribute("label", \.label, default: "", options: .preserveValueOnDeletion),
        .attribute("value", \.value, default: 0, options: .preserveValueOnDeletion),
    ])
}

/// A composite attribute with a double member.
struct AdvPoint: CompositeAttribute {
    var x: Double
    var y: Double
}

struct AdvPlace: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var point: AdvPoint = AdvPoint(x: 0, y: 0)
    static let entity = ModelEntity<AdvPlace>([.attribute("point", \.point, default: AdvPoint(x: 0, y: 0))])
}

struct UTrip: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var name: String = ""
    var items: [Reference<UItem>] = []
    static let entity = ModelEntity<UTrip>([
        .attribute("name", \.name, default: "", options: .unique),
        .toMany("items", \.items, inverse: "trip", deleteRule: .cascade),
    ])
}

struct UItem: PersistentModel, Codable, Equatable {
    var id = UUID.unassigned
    var title: String = ""
    var done: Bool = false
    var trip: Reference<UTrip>?
    static let entity = ModelEntity<UItem>([
        .attribute("title", \.title, default: ""),
        .attribute("done", \.done, default: false),
        .toOne("trip", \.trip, inverse: "items"),
    ], uniquenessConstraints: [["trip", "title"]])
}
