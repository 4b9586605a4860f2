import Foundation
import Replica

/// The ``CloudError`` a PostgreSQL failure amounts to, by what a device can do about it.
///
/// | Failure | Cloud error |
/// |---|---|
/// | connection refused, unreachable, timed out; the connection lost mid-request; SQLSTATE class 08; 57P01/57P02 (backend terminated, server crashed) | ``CloudError/networkUnavailable`` |
/// | 40001 serialization failure, 40P01 deadlock, 55P03 lock timeout | ``CloudError/zoneBusy(retryAfterMilliseconds:)`` (100 ms) |
/// | 28P01 / 28000 authentication, 42501 privilege, a refused login, an unknown role or database (3D000) | ``CloudError/permissionFailure(reason:)`` naming the role |
/// | 53100 disk full | ``CloudError/quotaExceeded`` |
/// | RZ001 (the schema's "zone not found") | ``CloudError/zoneNotFound``, or ``CloudError/zoneDeleted(reason:)`` when `replica.zone_deletion_reason` names why (asked by ``PostgresCloudDatabase`` after the failure) |
/// | RZ002 (the schema's "change token expired") | ``CloudError/changeTokenExpired`` |
/// | RZ010 / RZ011 / RZ012 / RZ013 (the schema's asset errors) | ``CloudError/assetTooLarge(size:limit:)`` / ``CloudError/assetNotFound(hash:)`` / ``CloudError/assetHashMismatch(hash:)`` / ``CloudError/invalidAsset(reason:)`` |
/// | class 22 (data exception), 54000 (program limit: a record too large) | ``CloudError/invalidRecord(reason:)`` |
/// | 42P01, 42883, 3F000 (no such table, function or schema) | ``CloudError/serviceUnavailable(reason:)`` saying to run `replica-cloud init` |
/// | anything else (57P03 starting up, 53300 too many connections, 57014 statement timeout, …) | ``CloudError/serviceUnavailable(reason:)`` with the SQLSTATE |
///
/// Reasons carry the SQLSTATE, the server's primary message (never its DETAIL, which can quote values) and the role;
/// the password and connection string are scrubbed from every message before it gets here.
/// Source: <https://www.postgresql.org/docs/current/errcodes-appendix.html>
enum PostgresErrorMapping {
    /// Milliseconds a device waits after a busy zone before retrying (the server gave no delay of its own).
    static let busyRetryMilliseconds: Int64 = 100

    static func cloudError(for failure: PGFailure) -> CloudError {
        let role = failure.role.map { "role '\($0)'" } ?? "the role"
        switch failure.origin {
        case .connectionLost:
            return .networkUnavailable
        case .connect:
            return connectError(failure.message, role: role)
        case .unexpectedResult:
            return .serviceUnavailable(reason: "PostgreSQL: \(failure.message)")
        case .server:
            break
        }
        guard let state = failure.sqlState else { return .serviceUnavailable(reason: "PostgreSQL: \(failure.message)") }
        switch state {
        case "RZ001": return .zoneNotFound
        case "RZ002": return .changeTokenExpired
        case "RZ010":
            // "asset of <size> bytes exceeds the limit of <limit> bytes"
            let numbers = failure.message.split(whereSeparator: { !$0.isNumber }).compactMap { Int64($0) }
            return .assetTooLarge(size: numbers.first ?? -1, limit: numbers.dropFirst().first ?? -1)
        case "RZ011": return .assetNotFound(hash: hexWord(in: failure.message))
        case "RZ012": return .assetHashMismatch(hash: hexWord(in: failure.message))
        case "RZ013": return .invalidAsset(reason: "\(failure.message) (SQLSTATE \(state))")
        case "40001", "40P01", "55P03": return .zoneBusy(retryAfterMilliseconds: busyRetryMilliseconds)
        case "28P01", "28000", "42501", "3D000": return .permissionFailure(reason: "\(role): \(failure.message) (SQLSTATE \(state))")
        case "53100": return .quotaExceeded
        case "57P01", "57P02": return .networkUnavailable
        case "42P01", "42883", "3F000":
            return .serviceUnavailable(reason: "the server lacks the replica schema, or has an older one (SQLSTATE \(state): "
                + "\(failure.message)): run `replica-cloud init`")
        case "54000": return .invalidRecord(reason: "PostgreSQL refused the request: \(failure.message) (SQLSTATE \(state))")
        default:
            if state.hasPrefix("08") { return .networkUnavailable }
            if state.hasPrefix("22") {
                return .invalidRecord(reason: "PostgreSQL refused the request: \(failure.message) (SQLSTATE \(state))")
            }
            return .serviceUnavailable(reason: "PostgreSQL error SQLSTATE \(state): \(failure.message)")
        }
    }

    /// The 64-hex-digit word (an asset's hash) of a message of the schema's asset functions; empty when none.
    static func hexWord(in message: String) -> String {
        message.split(separator: " ").map(String.init).first { $0.count == 64 && $0.allSatisfy { $0.isHexDigit } } ?? ""
    }

    /// A failed connection attempt. libpq gives no SQLSTATE for it, only the message: a message from the server
    /// (`FATAL: …`) that refuses the login is a permission failure; a server starting up, shutting down or full is
    /// unavailable for now; anything else (no `FATAL`: refused, unreachable, timed out, or a message this code does
    /// not recognize, e.g. translated by the server's `lc_messages`) is treated as the network, so it is retried.
    static func connectError(_ message: String, role: String) -> CloudError {
        let lowered = message.lowercased()
        let refusals = ["password authentication failed", "no pg_hba.conf entry", "authentication failed",
                        "does not exist", "permission denied", "no password supplied", "not permitted to log in",
                        "pg_hba.conf rejects"]
        let transient = ["the database system is starting up", "the database system is shutting down",
                         "the database system is in recovery mode", "too many clients",
                         "remaining connection slots are reserved", "the database system is not yet accepting connections",
                         "the database system is not accepting connections"]
        if transient.contains(where: lowered.contains) {
            return .serviceUnavailable(reason: "PostgreSQL: \(conciseServerMessage(message))")
        }
        if lowered.contains("fatal:") && refusals.contains(where: lowered.contains) {
            return .permissionFailure(reason: "\(role) was refused: \(conciseServerMessage(message))")
        }
        if lowered.contains("no password supplied") || lowered.contains("password is required") {
            return .permissionFailure(reason: "\(role) was refused: \(conciseServerMessage(message))")
        }
        return .networkUnavailable
    }

    /// The part of a libpq connection message after its `FATAL:`, on one line.
    private static func conciseServerMessage(_ message: String) -> String {
        let text: Substring
        if let range = message.range(of: "FATAL:") {
            text = message[range.upperBound...]
        } else {
            text = Substring(message)
        }
        return text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            .joined(separator: " ")
    }
}
