import CLibpq
import Foundation

/// A bare libpq connection for what a device never does but a soak needs: read every byte the cloud keeps for a zone,
/// and end other sessions. Text results; parameters bound.
final class RawPostgres {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    private let handle: OpaquePointer

    init(_ connectionString: String) throws {
        guard let handle = PQconnectdb(connectionString) else { throw Failure(description: "libpq could not allocate a connection") }
        guard PQstatus(handle) == CONNECTION_OK else {
            // libpq's message names host and role; it never holds the password.
            let message = PQerrorMessage(handle).map { String(cString: $0) } ?? "unknown error"
            PQfinish(handle)
            throw Failure(description: "cannot connect: \(message.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        self.handle = handle
    }

    deinit { PQfinish(handle) }

    /// The rows of `sql` with text `parameters` (nil: NULL), as text.
    @discardableResult
    func rows(_ sql: String, _ parameters: [String?] = []) throws -> [[String?]] {
        let copies = parameters.map { $0.map { strdup($0) } ?? nil }
        defer { for copy in copies { free(copy) } }
        let values = copies.map { UnsafePointer($0) }
        guard let result = PQexecParams(handle, sql, Int32(parameters.count), nil, values, nil, nil, 0) else {
            throw Failure(description: "the query failed: no result")
        }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK:
            break
        default:
            let message = PQresultErrorMessage(result).map { String(cString: $0) } ?? "unknown error"
            throw Failure(description: message.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return (0..<PQntuples(result)).map { row in
            (0..<PQnfields(result)).map { column in
                PQgetisnull(result, row, column) != 0 ? nil : String(cString: PQgetvalue(result, row, column))
            }
        }
    }
}
