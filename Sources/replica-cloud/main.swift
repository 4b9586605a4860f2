// replica-cloud: set-up and upkeep of a PostgreSQL server as Replica's cloud database.
//
//   replica-cloud init [URL] [--shard N]   install the schema (tables, indexes, policies, roles), or upgrade it
//   replica-cloud add-user NAME [--app|--admin]   make a login role; password from $REPLICA_CLOUD_PASSWORD or stdin
//   replica-cloud status                   zones, records, tombstones, oldest token kept, assets
//   replica-cloud prune --keep DAYS        drop tombstones older than DAYS; older tokens then expire; drop
//                                          unreferenced assets untouched for DAYS (and at least an hour)
//   replica-cloud asset-limit [BYTES]      show, or set, the largest asset the server accepts
//   replica-cloud failover                 expire every token (after a loss of acknowledged writes the server's
//                                          lineage does not show)
//   replica-cloud shard N CONNECTION       the directory: how to reach shard N
//   replica-cloud place OWNER N            the directory: OWNER's zones live on shard N
//
// Every command takes --url URL (a libpq connection string); without it, $REPLICA_CLOUD_URL, then libpq's own
// defaults (PGHOST, PGUSER, …). Exit status: 0 done, 1 failed (connection, server, schema), 2 wrong usage.
// Neither the connection string nor a password is ever printed.
import Foundation
import ReplicaPostgres

let usage = """
    usage: replica-cloud COMMAND [--url URL] …
      init [URL] [--shard N]      install or upgrade the replica schema (idempotent); --shard: this database's shard
                                  id (0…32767, fixed once it keeps zones)
      add-user NAME [--app|--admin]
                                  make login role NAME (a user owning its zones; --app: a backend acting for users;
                                  --admin: sees every zone). The password comes from $REPLICA_CLOUD_PASSWORD, or
                                  the first line of standard input (asked for, unechoed, on a terminal).
      status                      every zone: owner, records, tombstones, sequence, oldest valid token, assets
      prune --keep DAYS           drop tombstones older than DAYS (devices with older tokens resync in full), and
                                  assets no record references that no one uploaded for DAYS (nor in the last hour)
      asset-limit [BYTES]         show, or set, the largest asset (in bytes) the server accepts
      failover                    every zone gets new epochs: every device re-reads its zones and re-uploads what only
                                  it holds. Needed only after a loss the server's lineage does not show (a logical dump
                                  restored into the same cluster, a crash with synchronous_commit off); a promoted
                                  standby or a point-in-time recovery changes the lineage by itself
      shard N CONNECTION          record in this directory database how to reach shard N (a connection string
                                  without credentials)
      place OWNER N               record in this directory database that OWNER's zones live on shard N
    URL: a libpq connection string (postgresql://role@host:port/database or key=value pairs); default
    $REPLICA_CLOUD_URL, then libpq's environment (PGHOST, PGUSER, PGPASSWORD, …).
    exit status: 0 done, 1 failed, 2 wrong usage
    """

func fail(_ message: String, status: Int32) -> Never {
    FileHandle.standardError.write(Data("replica-cloud: \(message)\n".utf8))
    exit(status)
}

func usageError(_ message: String) -> Never {
    FileHandle.standardError.write(Data("replica-cloud: \(message)\n\(usage)\n".utf8))
    exit(2)
}

/// Reads the password: the environment variable, else one line of standard input (unechoed on a terminal).
func readPassword(for role: String) -> String {
    if let password = ProcessInfo.processInfo.environment["REPLICA_CLOUD_PASSWORD"], !password.isEmpty { return password }
    let terminal = isatty(STDIN_FILENO) != 0
    var saved = termios()
    if terminal {
        FileHandle.standardError.write(Data("password for role '\(role)': ".utf8))
        tcgetattr(STDIN_FILENO, &saved)
        var silent = saved
        silent.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &silent)
    }
    let line = readLine(strippingNewline: true)
    if terminal {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
        FileHandle.standardError.write(Data("\n".utf8))
    }
    guard let line, !line.isEmpty else {
        usageError("no password: set REPLICA_CLOUD_PASSWORD or give it on standard input")
    }
    return line
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else { usageError("no command") }
arguments.removeFirst()
if command == "help" || command == "--help" || command == "-h" {
    print(usage)
    exit(0)
}

var url: String?
var keepDays: Double?
var shardOption: Int?
var group = PostgresCloudAdministration.Group.user
var positional: [String] = []
var index = 0
while index < arguments.count {
    let argument = arguments[index]
    switch argument {
    case "--url":
        guard index + 1 < arguments.count else { usageError("--url needs a connection string") }
        url = arguments[index + 1]
        index += 1
    case "--keep":
        guard index + 1 < arguments.count, let days = Double(arguments[index + 1]), days >= 0, days.isFinite else {
            usageError("--keep needs a number of days ≥ 0")
        }
        keepDays = days
        index += 1
    case "--shard":
        guard index + 1 < arguments.count, let shard = Int(arguments[index + 1]), (0...32767).contains(shard) else {
            usageError("--shard needs a number in 0...32767")
        }
        shardOption = shard
        index += 1
    case "--app": group = .app
    case "--admin": group = .admin
    default:
        if argument.hasPrefix("--") { usageError("unknown option \(argument)") }
        positional.append(argument)
    }
    index += 1
}

func administration(_ url: String?) -> PostgresCloudAdministration {
    let connectionString = url ?? ProcessInfo.processInfo.environment["REPLICA_CLOUD_URL"] ?? ""
    do {
        return try PostgresCloudAdministration(connectionString: connectionString)
    } catch {
        fail(error.description, status: 1)
    }
}

func run(_ body: () throws(PostgresCloudAdministration.Failure) -> Void) {
    do {
        try body()
    } catch {
        if case .invalidArgument = error { fail(error.description, status: 2) }
        fail(error.description, status: 1)
    }
}

switch command {
case "init":
    guard positional.count <= 1 else { usageError("init takes one URL") }
    if let given = positional.first {
        guard url == nil else { usageError("init: give the URL once") }
        url = given
    }
    let admin = administration(url)
    run { () throws(PostgresCloudAdministration.Failure) in
        let report = try admin.install()
        if report.stepsRun.isEmpty {
            print("replica-cloud: schema already at version \(report.version)")
        } else {
            let from = report.previousVersion == 0 ? "installed" : "upgraded from version \(report.previousVersion)"
            print("replica-cloud: schema \(from) to version \(report.version)")
            for step in report.stepsRun { print("  step \(step)") }
        }
        if let shardOption {
            try admin.setShard(shardOption)
            print("replica-cloud: shard id \(shardOption)")
        }
    }
case "add-user":
    guard positional.count == 1, let name = positional.first else { usageError("add-user takes one role NAME") }
    let admin = administration(url)
    let password = readPassword(for: name)
    run { () throws(PostgresCloudAdministration.Failure) in
        let created = try admin.addUser(name, password: password, group: group)
        print("replica-cloud: role '\(name)' \(created ? "created" : "updated (new password)") in \(group.rawValue)")
    }
case "status":
    guard positional.isEmpty else { usageError("status takes no arguments") }
    let admin = administration(url)
    run { () throws(PostgresCloudAdministration.Failure) in
        let status = try admin.status()
        print("replica-cloud: schema version \(status.schemaVersion), \(status.zones.count) zone(s)")
        if !status.zones.isEmpty {
            print("owner\tzone\trecords\ttombstones\tsequence\toldest valid token\toldest tombstone\tassets\tasset bytes\tunfinished assets")
            let formatter = ISO8601DateFormatter()
            for zone in status.zones {
                let oldest = zone.oldestTombstone.map { formatter.string(from: $0) } ?? "-"
                print("\(zone.owner)\t\(zone.name)\t\(zone.records)\t\(zone.tombstones)\t\(zone.sequence)\t"
                      + "\(zone.oldestValidSequence)\t\(oldest)\t\(zone.assets)\t\(zone.assetBytes)\t\(zone.unfinishedAssets)")
            }
        }
    }
case "prune":
    guard positional.isEmpty else { usageError("prune takes no arguments besides --keep DAYS") }
    guard let keepDays else { usageError("prune needs --keep DAYS") }
    let admin = administration(url)
    run { () throws(PostgresCloudAdministration.Failure) in
        let pruned = try admin.prune(keepingDays: keepDays)
        for zone in pruned {
            if zone.tombstonesDropped > 0 {
                print("replica-cloud: \(zone.owner)/\(zone.name): dropped \(zone.tombstonesDropped) tombstone(s); "
                      + "tokens before sequence \(zone.oldestValidSequence) now expire")
            }
            if zone.assetsDropped > 0 {
                print("replica-cloud: \(zone.owner)/\(zone.name): dropped \(zone.assetsDropped) unreferenced asset(s), "
                      + "\(zone.assetBytesDropped) byte(s)")
            }
        }
        let days = keepDays == keepDays.rounded() && keepDays < 1e15 ? String(Int(keepDays)) : String(keepDays)
        print("replica-cloud: pruned \(pruned.count) zone(s), keeping \(days) day(s) of tombstones")
    }
case "asset-limit":
    guard positional.count <= 1 else { usageError("asset-limit takes at most one number of BYTES") }
    let admin = administration(url)
    if let given = positional.first {
        guard let bytes = Int64(given), bytes >= 0 else { usageError("asset-limit needs a number of bytes ≥ 0") }
        run { () throws(PostgresCloudAdministration.Failure) in
            try admin.setMaximumAssetSize(bytes)
            print("replica-cloud: the largest asset accepted is now \(bytes) bytes")
        }
    } else {
        run { () throws(PostgresCloudAdministration.Failure) in
            print("replica-cloud: the largest asset accepted is \(try admin.maximumAssetSize()) bytes")
        }
    }
case "failover":
    guard positional.isEmpty else { usageError("failover takes no arguments") }
    let admin = administration(url)
    run { () throws(PostgresCloudAdministration.Failure) in
        try admin.renewEpochs()
        print("replica-cloud: every zone has new epochs: devices re-read their zones in full and upload what only they hold")
    }
case "shard":
    guard positional.count == 2, let shard = Int(positional[0]) else { usageError("shard takes a shard id N and a CONNECTION string") }
    let admin = administration(url)
    run { () throws(PostgresCloudAdministration.Failure) in
        try admin.setShardEndpoint(shard, connection: positional[1])
        print("replica-cloud: shard \(shard) recorded")
    }
case "place":
    guard positional.count == 2, let shard = Int(positional[1]) else { usageError("place takes an OWNER and a shard id N") }
    let admin = administration(url)
    run { () throws(PostgresCloudAdministration.Failure) in
        try admin.place(owner: positional[0], shard: shard)
        print("replica-cloud: '\(positional[0])' placed on shard \(shard)")
    }
default:
    usageError("unknown command '\(command)'")
}
