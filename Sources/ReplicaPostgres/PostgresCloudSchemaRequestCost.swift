import Foundation

extension PostgresCloudSchema {
    /// Step 5: the per-request cost of the lineage. `lineage()` and `epoch_mix()` were SQL functions that cannot be
    /// inlined (they read from a function and a table), so every request that called them — each save and fetch —
    /// planned both of their bodies again: about 0.3 ms of server time per request (`pg_stat_user_functions` during
    /// replica-bench B14), more than a fetch of a few records costs. As PL/pgSQL functions their statements are
    /// planned once per session. Same results, same errors (`pg_walfile_name` still refuses to run on a standby):
    /// only the language changes (`Specs/cloud-postgres.md` §2, §12).
    static let requestCost = Step(version: 5, summary: "lineage() and epoch_mix() planned once per session", sql: """
        CREATE OR REPLACE FUNCTION replica.lineage() RETURNS bigint LANGUAGE plpgsql STABLE AS $$
        BEGIN
            RETURN (SELECT ((s.system_identifier >> 32) # (s.system_identifier & 4294967295)
                    # (((('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint)::numeric
                        * 2654435761 % 4294967296)::bigint)) & 4294967295
                FROM pg_catalog.pg_control_system() s);
        END
        $$;

        CREATE OR REPLACE FUNCTION replica.epoch_mix() RETURNS bigint LANGUAGE plpgsql STABLE AS $$
        BEGIN
            RETURN (SELECT ((replica.lineage() # s.epoch_salt) & 4294967295) << 16 FROM replica.server s);
        END
        $$;
        """)
}
