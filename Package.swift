// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Replica",
    products: [
        .library(name: "Replica", targets: ["Replica"]),
        .library(name: "ReplicaTesting", targets: ["ReplicaTesting"]),
        .executable(name: "trips-example", targets: ["trips-example"]),
    ],
    targets: [
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),
        .target(
            name: "Replica",
            dependencies: ["CSQLite", "CSodium"]
        ),
        .target(
            name: "ReplicaTesting",
            dependencies: ["Replica"]
        ),
        .executableTarget(
            name: "trips-example",
            dependencies: ["Replica"]
        ),
        .executableTarget(
            name: "replica-widget",
            dependencies: ["Replica"]
        ),
        .testTarget(
            name: "ReplicaTests",
            dependencies: ["Replica", "ReplicaTesting", "replica-widget"]
        ),
        .testTarget(
            name: "ReplicaTestingTests",
            dependencies: ["ReplicaTesting", "Replica"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
