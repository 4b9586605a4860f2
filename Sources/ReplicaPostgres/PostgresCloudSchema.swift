import Foundation

/// The server side of the PostgreSQL cloud: the `replica` schema, installed and upgraded by `replica-cloud init`
/// (``PostgresCloudAdministration/install()``), as ordered steps. A database records the last step it ran in
/// `replica.schema_version`; `init` runs the steps after it, all in one transaction, under an advisory lock (two
/// `init`s at once wait for each other). Steps are never edited once released: a change is a new step.
///
/// `Specs/cloud-postgres.md` explains the tables, policies and functions.
enum PostgresCloudSchema {
    /// One step of the schema.
    struct Step {
        var version: Int
        var summary: String
        var sql: String
    }

    /// The schema version this code speaks (the last step).
    static var currentVersion: Int { steps.last!.version }

    /// The key of the advisory lock `init` holds while it installs or upgrades (per database).
    static let installLockKey: Int64 = 0x5245_504C_4943_4101  // "REPLICA" + 1

    /// What `init` runs first, in its transaction: the schema and the table recording its version.
    static let bootstrap = """
        CREATE SCHEMA IF NOT EXISTS replica;
        CREATE TABLE IF NOT EXISTS replica.schema_version (
            singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
            version integer NOT NULL,
            upgraded_at timestamptz NOT NULL DEFAULT now()
        );
        """

    static let steps: [Step] = [
        Step(version: 1, summary: "roles, tables, indexes and row-level security", sql: """
            CREATE SCHEMA IF NOT EXISTS replica;

            DO $roles$
            DECLARE r text;
            BEGIN
                FOREACH r IN ARRAY ARRAY['replica_user', 'replica_app', 'replica_admin'] LOOP
                    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
                        BEGIN
                            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
                        EXCEPTION WHEN duplicate_object OR unique_violation THEN
                            NULL;  -- created meanwhile by an init of another database of this cluster
                        END;
                    END IF;
                END LOOP;
            END
            $roles$;

            CREATE TABLE replica.server (
                singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                shard integer NOT NULL DEFAULT 0 CHECK (shard BETWEEN 0 AND 32767)
            );
            INSERT INTO replica.server DEFAULT VALUES;

            CREATE TABLE replica.zone (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                owner text NOT NULL CHECK (owner <> ''),
                name text NOT NULL,
                epoch bigint NOT NULL CHECK (epoch > 0),
                sequence bigint NOT NULL DEFAULT 0,
                oldest_valid bigint NOT NULL DEFAULT 0,
                created_at timestamptz NOT NULL DEFAULT now(),
                UNIQUE (owner, name),
                UNIQUE (id, owner)
            );

            CREATE TABLE replica.zone_incarnation (
                owner text NOT NULL CHECK (owner <> ''),
                name text NOT NULL,
                last_epoch bigint NOT NULL,
                PRIMARY KEY (owner, name)
            );

            CREATE TABLE replica.record (
                zone_id bigint NOT NULL,
                owner text NOT NULL,
                id uuid NOT NULL,
                sequence bigint NOT NULL,
                change_tag text NOT NULL,
                alive boolean NOT NULL,
                changed_at timestamptz NOT NULL DEFAULT now(),
                body bytea NOT NULL,
                PRIMARY KEY (zone_id, id),
                FOREIGN KEY (zone_id, owner) REFERENCES replica.zone (id, owner) ON DELETE CASCADE
            );
            CREATE UNIQUE INDEX record_change_feed ON replica.record (zone_id, sequence);
            CREATE INDEX record_tombstone_age ON replica.record (zone_id, changed_at) WHERE NOT alive;

            CREATE TABLE replica.zone_metadata (
                zone_id bigint NOT NULL,
                owner text NOT NULL,
                key text NOT NULL,
                value bytea NOT NULL,
                PRIMARY KEY (zone_id, key),
                FOREIGN KEY (zone_id, owner) REFERENCES replica.zone (id, owner) ON DELETE CASCADE
            );

            DO $policies$
            DECLARE t text;
            BEGIN
                FOREACH t IN ARRAY ARRAY['zone', 'zone_incarnation', 'record', 'zone_metadata'] LOOP
                    EXECUTE pg_catalog.format('ALTER TABLE replica.%I ENABLE ROW LEVEL SECURITY', t);
                    EXECUTE pg_catalog.format('ALTER TABLE replica.%I FORCE ROW LEVEL SECURITY', t);
                    EXECUTE pg_catalog.format($p$CREATE POLICY owner_is_role ON replica.%I TO replica_user
                        USING (owner = current_user::text) WITH CHECK (owner = current_user::text)$p$, t);
                    EXECUTE pg_catalog.format($p$CREATE POLICY owner_is_setting ON replica.%I TO replica_app
                        USING (owner = pg_catalog.current_setting('replica.owner', true))
                        WITH CHECK (owner = pg_catalog.current_setting('replica.owner', true))$p$, t);
                    EXECUTE pg_catalog.format($p$CREATE POLICY administration ON replica.%I TO replica_admin
                        USING (true) WITH CHECK (true)$p$, t);
                    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON replica.%I TO replica_user, replica_app, replica_admin', t);
                END LOOP;
            END
            $policies$;

            GRANT USAGE ON SCHEMA replica TO replica_user, replica_app, replica_admin;
            GRANT SELECT ON replica.server, replica.schema_version TO replica_user, replica_app, replica_admin;
            """),
        Step(version: 2, summary: "the functions the client calls, and per-owner notification channels", sql: """
            CREATE TABLE replica.owner_channel (
                owner text PRIMARY KEY CHECK (owner <> ''),
                channel text NOT NULL UNIQUE
            );
            ALTER TABLE replica.owner_channel ENABLE ROW LEVEL SECURITY;
            ALTER TABLE replica.owner_channel FORCE ROW LEVEL SECURITY;
            CREATE POLICY owner_is_role ON replica.owner_channel TO replica_user
                USING (owner = current_user::text) WITH CHECK (owner = current_user::text);
            CREATE POLICY owner_is_setting ON replica.owner_channel TO replica_app
                USING (owner = pg_catalog.current_setting('replica.owner', true))
                WITH CHECK (owner = pg_catalog.current_setting('replica.owner', true));
            CREATE POLICY administration ON replica.owner_channel TO replica_admin USING (true) WITH CHECK (true);
            GRANT SELECT, INSERT ON replica.owner_channel TO replica_user, replica_app, replica_admin;

            CREATE FUNCTION replica.current_owner() RETURNS text LANGUAGE sql STABLE AS $$
                SELECT CASE WHEN pg_catalog.pg_has_role('replica_app', 'MEMBER')
                            THEN NULLIF(pg_catalog.current_setting('replica.owner', true), '')
                            ELSE current_user::text END
            $$;

            CREATE FUNCTION replica.enter(p_owner text) RETURNS text LANGUAGE plpgsql AS $$
            DECLARE
                v_owner text;
            BEGIN
                IF p_owner IS NOT NULL THEN
                    IF pg_catalog.pg_has_role('replica_app', 'MEMBER') THEN
                        PERFORM pg_catalog.set_config('replica.owner', p_owner, true);
                    ELSIF p_owner <> current_user::text THEN
                        RAISE EXCEPTION 'role "%" may act only as itself', current_user USING ERRCODE = '42501';
                    END IF;
                END IF;
                v_owner := replica.current_owner();
                IF v_owner IS NULL THEN
                    RAISE EXCEPTION 'role "%" acts for no owner: set replica.owner in the transaction', current_user
                        USING ERRCODE = '42501';
                END IF;
                RETURN v_owner;
            END
            $$;

            CREATE FUNCTION replica.new_epoch(p_previous bigint) RETURNS bigint LANGUAGE plpgsql AS $$
            DECLARE
                v_shard bigint;
                v_incarnation bigint;
            BEGIN
                SELECT shard INTO v_shard FROM replica.server;
                LOOP
                    v_incarnation := pg_catalog.floor(pg_catalog.random() * 4294967295)::bigint + 1;
                    EXIT WHEN v_incarnation <> ((p_previous >> 16) & 4294967295);
                END LOOP;
                RETURN (COALESCE(v_shard, 0) << 48) | (v_incarnation << 16);
            END
            $$;

            CREATE FUNCTION replica.announce(p_owner text, p_zone text) RETURNS void LANGUAGE plpgsql AS $$
            DECLARE
                v_channel text;
            BEGIN
                SELECT channel INTO v_channel FROM replica.owner_channel WHERE owner = p_owner;
                IF FOUND THEN
                    PERFORM pg_catalog.pg_notify(v_channel, p_zone);
                END IF;
            END
            $$;

            CREATE FUNCTION replica.create_zone(p_owner text, p_zone text) RETURNS void LANGUAGE plpgsql
            SET lock_timeout = '5s' AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_last bigint;
                v_epoch bigint;
            BEGIN
                PERFORM 1 FROM replica.zone WHERE owner = v_owner AND name = p_zone;
                IF FOUND THEN
                    RETURN;
                END IF;
                INSERT INTO replica.zone_incarnation (owner, name, last_epoch) VALUES (v_owner, p_zone, 0)
                    ON CONFLICT (owner, name) DO NOTHING;
                SELECT last_epoch INTO v_last FROM replica.zone_incarnation WHERE owner = v_owner AND name = p_zone FOR UPDATE;
                -- A creation of the same zone may have committed while this one waited for the row.
                PERFORM 1 FROM replica.zone WHERE owner = v_owner AND name = p_zone;
                IF FOUND THEN
                    RETURN;
                END IF;
                v_epoch := replica.new_epoch(v_last);
                INSERT INTO replica.zone (owner, name, epoch) VALUES (v_owner, p_zone, v_epoch);
                UPDATE replica.zone_incarnation SET last_epoch = v_epoch WHERE owner = v_owner AND name = p_zone;
                PERFORM replica.announce(v_owner, p_zone);
            END
            $$;

            CREATE FUNCTION replica.delete_zone(p_owner text, p_zone text) RETURNS void LANGUAGE plpgsql
            SET lock_timeout = '5s' AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
            BEGIN
                DELETE FROM replica.zone WHERE owner = v_owner AND name = p_zone;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
                END IF;
                PERFORM replica.announce(v_owner, p_zone);
            END
            $$;

            CREATE FUNCTION replica.modify_records(p_owner text, p_zone text, p_ids uuid[], p_tags text[], p_alive boolean[],
                                                   p_bodies bytea[])
            RETURNS TABLE (out_saved boolean, out_change_tag text, out_body bytea) LANGUAGE plpgsql
            SET lock_timeout = '5s' AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_zone bigint;
                v_epoch bigint;
                v_start bigint;
                v_sequence bigint;
                v_count integer := COALESCE(pg_catalog.array_length(p_ids, 1), 0);
                v_tag text;
                v_body bytea;
            BEGIN
                IF COALESCE(pg_catalog.array_length(p_tags, 1), 0) <> v_count
                   OR COALESCE(pg_catalog.array_length(p_alive, 1), 0) <> v_count
                   OR COALESCE(pg_catalog.array_length(p_bodies, 1), 0) <> v_count THEN
                    RAISE EXCEPTION 'modify_records: arrays of different lengths' USING ERRCODE = '22023';
                END IF;
                -- The zone row is the zone's write lock: saves to one zone commit one after another, in sequence order.
                SELECT z.id, z.epoch, z.sequence INTO v_zone, v_epoch, v_start FROM replica.zone z
                    WHERE z.owner = v_owner AND z.name = p_zone FOR UPDATE;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
                END IF;
                v_sequence := v_start;
                FOR i IN 1 .. v_count LOOP
                    SELECT r.change_tag, r.body INTO v_tag, v_body FROM replica.record r WHERE r.zone_id = v_zone AND r.id = p_ids[i];
                    IF FOUND AND v_tag IS DISTINCT FROM p_tags[i] THEN
                        out_saved := false;
                        out_change_tag := v_tag;
                        out_body := v_body;
                        RETURN NEXT;
                        CONTINUE;
                    END IF;
                    v_sequence := v_sequence + 1;
                    v_tag := v_epoch::text || '.' || v_sequence::text;
                    INSERT INTO replica.record AS r (zone_id, owner, id, sequence, change_tag, alive, body)
                        VALUES (v_zone, v_owner, p_ids[i], v_sequence, v_tag, p_alive[i], p_bodies[i])
                        ON CONFLICT (zone_id, id) DO UPDATE SET sequence = excluded.sequence, change_tag = excluded.change_tag,
                            alive = excluded.alive, body = excluded.body, changed_at = pg_catalog.now();
                    out_saved := true;
                    out_change_tag := v_tag;
                    out_body := NULL;
                    RETURN NEXT;
                END LOOP;
                IF v_sequence > v_start THEN
                    UPDATE replica.zone SET sequence = v_sequence WHERE id = v_zone;
                    PERFORM replica.announce(v_owner, p_zone);
                END IF;
            END
            $$;

            -- STABLE: every query in it reads the one snapshot of the calling statement, so the zone's sequence and the records
            -- returned are from the same instant.
            CREATE FUNCTION replica.fetch_changes(p_owner text, p_zone text, p_epoch bigint, p_sequence bigint, p_limit integer)
            RETURNS TABLE (out_epoch bigint, out_zone_sequence bigint, out_sequence bigint, out_id uuid, out_change_tag text,
                           out_body bytea) LANGUAGE plpgsql STABLE AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_zone bigint;
                v_epoch bigint;
                v_sequence bigint;
                v_oldest bigint;
            BEGIN
                SELECT z.id, z.epoch, z.sequence, z.oldest_valid INTO v_zone, v_epoch, v_sequence, v_oldest FROM replica.zone z
                    WHERE z.owner = v_owner AND z.name = p_zone;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
                END IF;
                IF p_epoch IS NOT NULL AND (
                       (p_epoch >> 16) <> (v_epoch >> 16)                 -- another incarnation, shard or database
                    OR p_sequence < 0 OR p_sequence > v_sequence          -- from the future (a restore or failover lost changes)
                    OR (p_epoch & 65535) > (v_epoch & 65535)
                    OR ((p_epoch & 65535) < (v_epoch & 65535) AND p_sequence < v_oldest)) THEN  -- from before a prune it missed
                    RAISE EXCEPTION 'change token expired' USING ERRCODE = 'RZ002';
                END IF;
                out_epoch := v_epoch;
                out_zone_sequence := v_sequence;
                RETURN NEXT;
                RETURN QUERY SELECT v_epoch, v_sequence, r.sequence, r.id, r.change_tag, r.body FROM replica.record r
                    WHERE r.zone_id = v_zone AND r.sequence > COALESCE(p_sequence, 0)
                    ORDER BY r.sequence LIMIT GREATEST(p_limit, 1) + 1;
            END
            $$;

            CREATE FUNCTION replica.zone_metadata(p_owner text, p_zone text)
            RETURNS TABLE (out_key text, out_value bytea) LANGUAGE plpgsql STABLE AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_zone bigint;
            BEGIN
                SELECT z.id INTO v_zone FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
                END IF;
                RETURN QUERY SELECT m.key, m.value FROM replica.zone_metadata m WHERE m.zone_id = v_zone ORDER BY m.key;
            END
            $$;

            CREATE FUNCTION replica.set_zone_metadata(p_owner text, p_zone text, p_key text, p_value bytea, p_expected bytea)
            RETURNS bytea LANGUAGE plpgsql SET lock_timeout = '5s' AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_zone bigint;
                v_current bytea;
            BEGIN
                SELECT z.id INTO v_zone FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone FOR UPDATE;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
                END IF;
                SELECT m.value INTO v_current FROM replica.zone_metadata m WHERE m.zone_id = v_zone AND m.key = p_key;
                IF v_current IS DISTINCT FROM p_expected THEN
                    RETURN COALESCE(v_current, ''::bytea);
                END IF;
                INSERT INTO replica.zone_metadata (zone_id, owner, key, value) VALUES (v_zone, v_owner, p_key, p_value)
                    ON CONFLICT (zone_id, key) DO UPDATE SET value = excluded.value;
                PERFORM replica.announce(v_owner, p_zone);
                RETURN p_value;
            END
            $$;

            CREATE FUNCTION replica.listen(p_owner text) RETURNS text LANGUAGE plpgsql AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
                v_channel text;
            BEGIN
                INSERT INTO replica.owner_channel (owner, channel)
                    VALUES (v_owner, 'replica_' || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''))
                    ON CONFLICT (owner) DO NOTHING;
                SELECT c.channel INTO v_channel FROM replica.owner_channel c WHERE c.owner = v_owner;
                EXECUTE pg_catalog.format('LISTEN %I', v_channel);
                RETURN v_channel;
            END
            $$;

            CREATE FUNCTION replica.zone_names(p_owner text) RETURNS SETOF text LANGUAGE plpgsql STABLE AS $$
            DECLARE
                v_owner text := replica.enter(p_owner);
            BEGIN
                RETURN QUERY SELECT z.name FROM replica.zone z WHERE z.owner = v_owner ORDER BY z.name;
            END
            $$;

            CREATE FUNCTION replica.prune_zone(p_zone_id bigint, p_before double precision, OUT out_pruned bigint,
                                               OUT out_oldest_valid bigint) LANGUAGE plpgsql SET lock_timeout = '5s' AS $$
            DECLARE
                v_epoch bigint;
                v_oldest bigint;
                v_horizon bigint;
                v_next bigint;
            BEGIN
                SELECT z.epoch, z.oldest_valid INTO v_epoch, v_oldest FROM replica.zone z WHERE z.id = p_zone_id FOR UPDATE;
                IF NOT FOUND THEN
                    out_pruned := 0;
                    RETURN;
                END IF;
                WITH gone AS (
                    DELETE FROM replica.record r WHERE r.zone_id = p_zone_id AND NOT r.alive AND r.changed_at < pg_catalog.to_timestamp(p_before)
                    RETURNING r.sequence)
                SELECT pg_catalog.count(*), pg_catalog.max(gone.sequence) INTO out_pruned, v_horizon FROM gone;
                IF out_pruned = 0 THEN
                    out_oldest_valid := v_oldest;
                    RETURN;
                END IF;
                out_oldest_valid := GREATEST(v_oldest, v_horizon);
                -- The next prune generation; after 65535 of them, a new incarnation (every older token expires once).
                v_next := CASE WHEN (v_epoch & 65535) = 65535 THEN replica.new_epoch(v_epoch) ELSE v_epoch + 1 END;
                UPDATE replica.zone SET oldest_valid = out_oldest_valid, epoch = v_next WHERE id = p_zone_id;
                IF (v_next >> 16) <> (v_epoch >> 16) THEN
                    UPDATE replica.zone_incarnation i SET last_epoch = v_next FROM replica.zone z
                        WHERE z.id = p_zone_id AND i.owner = z.owner AND i.name = z.name;
                END IF;
            END
            $$;

            -- Makes (or updates) a login role in one of the three groups. Only the SCRAM verifier of the password
            -- reaches the server (the client computes it with PQencryptPasswordConn); utility commands take no bound
            -- parameters, so the name and verifier are quoted here, by format's %I and %L.
            CREATE FUNCTION replica.create_login(p_name text, p_verifier text, p_group text) RETURNS boolean
            LANGUAGE plpgsql AS $$
            DECLARE
                v_created boolean := false;
                v_other text;
            BEGIN
                IF p_group NOT IN ('replica_user', 'replica_app', 'replica_admin') THEN
                    RAISE EXCEPTION 'unknown group "%"', p_group USING ERRCODE = '22023';
                END IF;
                IF p_name IN ('replica_user', 'replica_app', 'replica_admin') OR pg_catalog.left(p_name, 3) = 'pg_' THEN
                    RAISE EXCEPTION 'role name "%" is reserved', p_name USING ERRCODE = '22023';
                END IF;
                -- A per-user role that could also act as an app backend could set any owner: never both.
                SELECT g.rolname INTO v_other FROM pg_catalog.pg_auth_members m
                    JOIN pg_catalog.pg_roles g ON g.oid = m.roleid JOIN pg_catalog.pg_roles r ON r.oid = m.member
                    WHERE r.rolname = p_name AND g.rolname IN ('replica_user', 'replica_app') AND g.rolname <> p_group
                    LIMIT 1;
                IF FOUND AND p_group IN ('replica_user', 'replica_app') THEN
                    RAISE EXCEPTION 'role "%" is already a member of %', p_name, v_other USING ERRCODE = '22023';
                END IF;
                IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_name) THEN
                    EXECUTE pg_catalog.format('CREATE ROLE %I LOGIN PASSWORD %L', p_name, p_verifier);
                    v_created := true;
                ELSE
                    EXECUTE pg_catalog.format('ALTER ROLE %I LOGIN PASSWORD %L', p_name, p_verifier);
                END IF;
                EXECUTE pg_catalog.format('GRANT %I TO %I', p_group, p_name);
                RETURN v_created;
            END
            $$;

            REVOKE ALL ON ALL FUNCTIONS IN SCHEMA replica FROM PUBLIC;
            GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA replica TO replica_user, replica_app, replica_admin;
            REVOKE EXECUTE ON FUNCTION replica.prune_zone(bigint, double precision) FROM replica_user, replica_app;
            REVOKE EXECUTE ON FUNCTION replica.create_login(text, text, text) FROM replica_user, replica_app;
            """),
        lineageAndShards,
        zoneDeletionReasons,
        requestCost,
        assets,
        assetReferences,
    ]
}
