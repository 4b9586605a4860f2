import CLibpq
import Foundation

/// Where and as whom to connect, parsed once from a libpq connection string (`postgresql://…` URI or
/// `key=value …`). Keeps the password only to send it and to scrub it from messages; ``summary`` never shows it.
struct PGConnectionOptions: Sendable {
    /// Every option the string set (libpq keyword, value), in libpq's order.
    let options: [(keyword: String, value: String)]
    /// Strings that must never appear in a message: the password, and the connection string itself.
    let secrets: [String]

    /// Parses `connectionString`; `nil` when libpq cannot parse it (the string is never echoed: it may hold a
    /// password).
    init?(_ connectionString: String) {
        var errorMessage: UnsafeMutablePointer<CChar>?
        guard let parsed = PQconninfoParse(connectionString, &errorMessage) else {
            if let errorMessage { PQfreemem(errorMessage) }
            return nil
        }
        defer { PQconninfoFree(parsed) }
        var options: [(String, String)] = []
        var secrets = [connectionString]
        var index = 0
        while let keyword = parsed[index].keyword {
            if let value = parsed[index].val {
                let name = String(cString: keyword), text = String(cString: value)
                options.append((name, text))
                if name == "password", !text.isEmpty { secrets.append(text) }
            }
            index += 1
        }
        self.options = options
        self.secrets = secrets
    }

    func value(_ keyword: String) -> String? { options.first { $0.keyword == keyword }?.value }

    /// A description without secrets: role, host, port and database as given (libpq's defaults where unset).
    var summary: String {
        let role = value("user") ?? "(default role)"
        let host = value("host") ?? value("hostaddr") ?? "(default host)"
        let port = value("port").map { ":\($0)" } ?? ""
        let database = value("dbname") ?? "(default database)"
        return "role \(role) at \(host)\(port), database \(database)"
    }
}

/// Why a libpq call failed, before it is mapped to a ``CloudError`` (``PostgresErrorMapping``).
struct PGFailure: Error, Sendable {
    enum Origin: Sendable {
        /// The connection could not be made (refused, unreachable, authentication, unknown database…).
        case connect
        /// The server answered with an error (`sqlState` says which).
        case server
        /// The connection broke while a request was under way: its outcome is unknown.
        case connectionLost
        /// The server's answer did not have the expected shape (another schema version, or a bug).
        case unexpectedResult
    }

    var origin: Origin
    /// The five-character SQLSTATE of a server error (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
    var sqlState: String?
    /// The server's or libpq's message (the primary message only: never the DETAIL, which may quote values), with
    /// every secret removed.
    var message: String
    /// The role the connection used (or tried to use).
    var role: String?
}

/// One libpq connection. Not thread-safe: the pool hands it to one request at a time, and every call on it runs on
/// that request's connection queue.
final class PGConnection: @unchecked Sendable {
    let handle: OpaquePointer
    let role: String
    private let secrets: [String]
    /// Names of the statements prepared on this connection, by SQL.
    private var prepared: [String: String] = [:]
    /// Set (by the notice receiver) when the server sent a FATAL message outside a request: the session is over.
    private let ended: UnsafeMutablePointer<Int32>

    private init(handle: OpaquePointer, secrets: [String]) {
        self.handle = handle
        self.secrets = secrets
        self.role = PQuser(handle).map { String(cString: $0) } ?? "?"
        ended = .allocate(capacity: 1)
        ended.initialize(to: 0)
        replica_pq_watch_notices(handle, ended)
    }

    deinit {
        PQfinish(handle)
        ended.deallocate()
    }

    /// Connects (blocking) with `options`, adding what the string leaves unset: a 10 s connect timeout, TCP
    /// keepalives after 30 s idle (a server that vanished without closing the connection is noticed in about a
    /// minute, not the system's two hours) and an application name. Notices are dropped, not printed.
    /// - Throws: ``PGFailure`` with origin `connect`.
    static func open(_ options: PGConnectionOptions) throws(PGFailure) -> PGConnection {
        var pairs = options.options
        if options.value("connect_timeout") == nil { pairs.append(("connect_timeout", "10")) }
        if options.value("keepalives_idle") == nil { pairs.append(("keepalives_idle", "30")) }
        if options.value("keepalives_interval") == nil { pairs.append(("keepalives_interval", "10")) }
        if options.value("keepalives_count") == nil { pairs.append(("keepalives_count", "3")) }
        if options.value("application_name") == nil { pairs.append(("fallback_application_name", "replica")) }
        let keywords = pairs.map { strdup($0.keyword) }, values = pairs.map { strdup($0.value) }
        defer { for pointer in keywords + values { free(pointer) } }
        let handle: OpaquePointer? = (keywords.map { UnsafePointer($0) } + [nil]).withUnsafeBufferPointer { keywordList in
            (values.map { UnsafePointer($0) } + [nil]).withUnsafeBufferPointer { valueList in
                PQconnectdbParams(keywordList.baseAddress, valueList.baseAddress, 0)
            }
        }
        guard let handle else {
            throw PGFailure(origin: .connect, message: "libpq could not allocate a connection", role: options.value("user"))
        }
        var secrets = options.secrets
        if let password = PQpass(handle), password.pointee != 0 { secrets.append(String(cString: password)) }
        guard PQstatus(handle) == CONNECTION_OK else {
            let failure = PGFailure(origin: .connect, sqlState: nil,
                                    message: scrub(lastError(handle), secrets),
                                    role: PQuser(handle).map { String(cString: $0) } ?? options.value("user"))
            PQfinish(handle)
            throw failure
        }
        return PGConnection(handle: handle, secrets: secrets)
    }

    private static func lastError(_ handle: OpaquePointer) -> String {
        PQerrorMessage(handle).map { String(cString: $0) }?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "unknown error"
    }

    /// `message` with every secret replaced by `•••`.
    static func scrub(_ message: String, _ secrets: [String]) -> String {
        var message = message
        for secret in secrets where !secret.isEmpty { message = message.replacingOccurrences(of: secret, with: "•••") }
        return message
    }

    /// `false` when the connection is known to be unusable: libpq says so, or, while it sat idle, the server ended the
    /// session (a FATAL message: an administrator's `pg_terminate_backend`, a shutdown) or closed it. Reads without
    /// waiting, so a connection the server dropped between requests is replaced before a request is lost on it.
    var isUsable: Bool {
        guard PQstatus(handle) == CONNECTION_OK else { return false }
        guard consumeWaitingInput() else { return false }
        // Parses what arrived: a FATAL message sent while idle reaches the notice receiver.
        while let notification = PQnotifies(handle) { PQfreemem(notification) }
        return PQstatus(handle) == CONNECTION_OK && !sessionEnded
    }

    /// `true` once the server sent a FATAL message outside a request (seen when input is parsed: `PQnotifies`).
    var sessionEnded: Bool { ended.pointee != 0 }

    /// Reads into libpq's buffer whatever the server has sent, until nothing more is waiting (without blocking);
    /// `false` when the connection broke or ended. Reading until the socket is dry matters: a server that ends a
    /// session sends a last error (57P01…) and closes, and only a read that meets the end tells libpq; a dispatch
    /// source (edge-triggered on Linux) would not fire again for an end that arrived with the last message.
    func consumeWaitingInput() -> Bool {
        while true {
            let socket = PQsocket(handle)
            guard socket >= 0 else { return false }
            guard replica_pq_socket_readable(socket) != 0 else { return PQstatus(handle) == CONNECTION_OK }
            guard PQconsumeInput(handle) != 0, PQstatus(handle) == CONNECTION_OK else { return false }
        }
    }

    /// `true` unless libpq marked the connection bad or it was left inside a transaction. (A request that failed on
    /// the server leaves the connection usable: every request is one statement in a transaction of its own.)
    var isHealthyAfterRequest: Bool {
        PQstatus(handle) == CONNECTION_OK && PQtransactionStatus(handle) == PQTRANS_IDLE
    }

    /// Runs `sql` with `parameters` bound in binary format and returns its rows in binary format.
    ///
    /// With `prepare`, the statement is parsed once per connection (`PQprepare`) and run with `PQexecPrepared`;
    /// otherwise each call sends it as an unnamed statement (`PQexecParams`), which a transaction-mode connection
    /// pooler accepts. Either way one round trip per call.
    /// - Throws: ``PGFailure``: `server` with the SQLSTATE, or `connectionLost` when the connection broke.
    func query(_ sql: String, _ parameters: [PGParameter], prepare: Bool) throws(PGFailure) -> PGRows {
        var buffer: [UInt8] = []
        // Room for every value at once (a batch's bodies are tens of kilobytes), instead of growing by doubling.
        buffer.reserveCapacity(parameters.reduce(1) { $0 + $1.encodedSize })
        var ranges: [Range<Int>?] = []
        for parameter in parameters {
            let start = buffer.count
            ranges.append(parameter.encode(into: &buffer) ? start..<buffer.count : nil)
        }
        let types = parameters.map { Oid($0.type.rawValue) }
        let lengths = ranges.map { Int32($0?.count ?? 0) }
        let formats = [Int32](repeating: 1, count: parameters.count)
        var statement: String?
        if prepare {
            if let name = prepared[sql] {
                statement = name
            } else {
                let name = "replica_\(prepared.count + 1)"
                let result = PQprepare(handle, name, sql, Int32(parameters.count), types)
                _ = try check(result)
                prepared[sql] = name
                statement = name
            }
        }
        // One trailing byte, so that every non-NULL value — also an empty one — has a non-null pointer (a null
        // pointer means SQL NULL).
        buffer.append(0)
        let result: OpaquePointer? = buffer.withUnsafeBufferPointer { bytes in
            let base = UnsafeRawPointer(bytes.baseAddress!)
            let values: [UnsafePointer<CChar>?] = ranges.map { range in
                range.map { (base + $0.lowerBound).assumingMemoryBound(to: CChar.self) }
            }
            if let statement {
                return PQexecPrepared(handle, statement, Int32(parameters.count), values, lengths, formats, 1)
            }
            return PQexecParams(handle, sql, Int32(parameters.count), types, values, lengths, formats, 1)
        }
        return try check(result)
    }

    /// Runs `sql` — one or more statements without parameters (schema scripts) — with the simple query protocol.
    func execute(_ sql: String) throws(PGFailure) {
        _ = try check(PQexec(handle, sql))
    }

    /// The rows of `result`, or the failure it reports.
    private func check(_ result: OpaquePointer?) throws(PGFailure) -> PGRows {
        guard let result else {
            throw PGFailure(origin: PQstatus(handle) == CONNECTION_OK ? .server : .connectionLost,
                            message: Self.scrub(Self.lastError(handle), secrets), role: role)
        }
        let rows = PGRows(result)
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK:
            return rows
        default:
            let sqlState = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            let primary = PQresultErrorField(result, Int32(UInt8(ascii: "M"))).map { String(cString: $0) }
            let lost = PQstatus(handle) != CONNECTION_OK
            let message = primary ?? Self.lastError(handle)
            throw PGFailure(origin: lost ? .connectionLost : .server, sqlState: sqlState,
                            message: Self.scrub(message, secrets), role: role)
        }
    }
}
