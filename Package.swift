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
        // SHA-256 of assets (OpenSSL's EVP digest: the CPU's SHA extensions; libsodium's is portable C).
        .systemLibrary(
            name: "CCrypto",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CLibpq",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .target(
            name: "Replica",
            dependencies: ["CSQLite", "CSodium", "CCrypto"]
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
            dependencies: ["Replica", "ReplicaPostgres"]
        ),
        .executableTarget(
            name: "replica-widget",
            dependencies: ["Replica"]
        ),
        // A device as an OS process, syncing through a PostgreSQL cloud: the device of `replica-sim soak` and of the
        // tests that crash servers, connections and devices.
        .executableTarget(
            name: "replica-device",
            dependencies: ["Replica", "ReplicaPostgres", "ReplicaTesting", "CLibpq"]
        ),
        // Benchmarks against raw SQLite/libsodium C calls (`make bench`). Meaningful in release builds only: the
        // executable refuses to run when built in debug.
        .executableTarget(
            name: "replica-bench",
            dependencies: ["Replica", "ReplicaTesting", "ReplicaPostgres", "CSQLite", "CSodium", "CLibpq"]
        ),
        .testTarget(
            name: "ReplicaTests",
            dependencies: ["Replica", "ReplicaTesting", "ReplicaPostgres", "replica-widget", "replica-cloud", "replica-device", "replica-sim", "trips-example"]
        ),
        .testTarget(
            name: "ReplicaTestingTests",
            dependencies: ["ReplicaTesting", "Replica", "replica-sim"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
