// replica-fuzz: the fuzz targets of ReplicaTesting (Fuzzer.swift) for libFuzzer, and a reproducer.
//
// Built normally it runs files through a target: `replica-fuzz cloud-record CRASH-FILE...` (exit 0 unless one traps).
// Built for libFuzzer — coverage-guided, mutations of its own — it is the fuzz entry point:
//
//     swift build --product replica-fuzz --scratch-path .build-fuzz -Xswiftc -sanitize=fuzzer -Xswiftc -DREPLICA_LIBFUZZER
//     REPLICA_FUZZ_TARGET=cloud-record .build-fuzz/debug/replica-fuzz -max_total_time=60 CORPUS_DIR
//
// (the target is read from REPLICA_FUZZ_TARGET, default cloud-record). A trap is a crash libFuzzer reports and keeps.

import Foundation
import ReplicaTesting

#if REPLICA_LIBFUZZER
private let target = FuzzTarget(rawValue: ProcessInfo.processInfo.environment["REPLICA_FUZZ_TARGET"] ?? "") ?? .cloudRecord

@_cdecl("LLVMFuzzerTestOneInput")
public func replicaFuzzTestOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    _ = Fuzzer.execute(target, Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

/// libFuzzer's driver (in the runtime that `-sanitize=fuzzer` links). A pointer-and-integer signature: the Swift and C
/// calling conventions agree on it.
@_silgen_name("LLVMFuzzerRunDriver")
private func runFuzzerDriver(_ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                             _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt) -> CInt

/// SwiftPM links an executable's entry point under this name (and makes `main` an alias of it), so libFuzzer's own
/// `main` is never linked in: start libFuzzer's driver from here.
@_cdecl("replica_fuzz_main")
public func replicaFuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var count = argc
    var arguments = argv
    return runFuzzerDriver(&count, &arguments, replicaFuzzTestOneInput)
}
#else
@main
enum ReplicaFuzz {
    static func main() {
        let arguments = CommandLine.arguments.dropFirst()
        guard let name = arguments.first, let target = FuzzTarget(rawValue: name), arguments.count > 1 else {
            FileHandle.standardError.write(Data("usage: replica-fuzz \(FuzzTarget.allCases.map(\.rawValue).joined(separator: "|")) FILE...\n".utf8))
            exit(2)
        }
        for path in arguments.dropFirst() {
            guard let data = FileManager.default.contents(atPath: path) else {
                FileHandle.standardError.write(Data("replica-fuzz: cannot read \(path)\n".utf8))
                exit(2)
            }
            switch Fuzzer.execute(target, Array(data)) {
            case .accepted: print("\(path): accepted")
            case let .refused(error): print("\(path): refused (\(error))")
            }
        }
    }
}
#endif
