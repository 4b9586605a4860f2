// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Replica",
    products: [
        .library(name: "Replica", targets: ["Replica"]),
        .library(name: "ReplicaTesting", targets: ["ReplicaTesting"]),
        // The PostgreSQL cloud: its own product, so that an app using only `Replica` never links libpq.
        .library(name: "ReplicaPostgres", targets: ["ReplicaPostgres"]),
        .executable(name: "replica-cloud", targets: ["replica-cloud"]),
        .executable(name: "trips-example", targets: ["trips-example"]),
        .executable(name: "replica-sim", targets: ["replica-sim"]),
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
        .systemLibrary(
            name: "CLibpq",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .target(
            name: "Replica",
            dependencies: ["CSQLite", "CSodium"]
        ),
        .target(
            name: "ReplicaPostgres",
            dependencies: ["Replica", "CLibpq"]
        ),
        // Server set-up and upkeep for the PostgreSQL cloud: schema, users, status, pruning.
        .executableTarget(
            name: "replica-cloud",
            dependencies: ["ReplicaPostgres"]
        ),
        .target(
            name: "ReplicaTesting",
            dependencies: ["Replica", "CSQLite", "CSodium"]
        ),
        .executableTarget(
            name: "replica-sim",
            dependencies: ["ReplicaTesting", "Replica"]
        ),
        // The fuzz targets for libFuzzer (built with -sanitize=fuzzer -DREPLICA_LIBFUZZER), else a reproducer.
        .executableTarget(
            name: "replica-fuzz",
            dependencies: ["ReplicaTesting"]
        ),
        .executableTarget(
            name: "trips-example",
            dependencies: ["Replica"]
        ),
        .executableTarget(
            name: "replica-widget",
            dependencies: ["Replica"]
        ),
        // Benchmarks against raw SQLite/libsodium C calls (`make bench`). Meaningful in release builds only: the
        // executable refuses to run when built in debug.
        .executableTarget(
            name: "replica-bench",
            dependencies: ["Replica", "ReplicaTesting", "CSQLite", "CSodium"]
        ),
        .testTarget(
            name: "ReplicaTests",
            dependencies: ["Replica", "ReplicaTesting", "ReplicaPostgres", "replica-widget", "replica-cloud"]
        ),
        .testTarget(
            name: "ReplicaTestingTests",
            dependencies: ["ReplicaTesting", "Replica", "replica-sim"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
