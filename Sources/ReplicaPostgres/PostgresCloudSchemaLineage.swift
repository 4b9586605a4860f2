import Foundation

extension PostgresCloudSchema {
    /// Step 3: the server's lineage in every epoch (a failover or restore that may have lost acknowledged writes
    /// expires every token and never repeats a change tag), and the user → shard directory
    /// (`Specs/cloud-postgres.md` §12–§13).
    static let lineageAndShards = Step(version: 3, summary: "the server's lineage in every epoch; the shard directory", sql: """
        -- The lineage of the running primary: its system identifier (drawn by initdb, copied to every physical standby)
        -- and its WAL timeline (a new one at every promotion and point-in-time recovery), folded into 32 bits. Timelines
        -- of one system never collide (the multiplier is odd, so the fold is a bijection of the timeline); other
        -- systems collide with a chance of 2^-32. Raises 55000 during recovery: a standby never serves the feed.
        CREATE FUNCTION replica.lineage() RETURNS bigint LANGUAGE sql STABLE AS $$
            SELECT ((s.system_identifier >> 32) # (s.system_identifier & 4294967295)
                    # (((('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint)::numeric
                        * 2654435761 % 4294967296)::bigint)) & 4294967295
            FROM pg_catalog.pg_control_system() s
        $$;

        -- XORed with the lineage into the incarnation bits of every epoch the clients see. Set to the lineage at install,
        -- so the epochs of the lineage the database was made on are the stored ones (an upgrade expires no token); any
        -- other lineage — a promoted standby, a restored backup, another cluster — shows every zone under other epochs.
        -- `replica-cloud failover` sets it to a random value: the same, for a loss PostgreSQL cannot see.
        ALTER TABLE replica.server ADD COLUMN epoch_salt bigint;
        UPDATE replica.server SET epoch_salt = replica.lineage();
        ALTER TABLE replica.server ALTER COLUMN epoch_salt SET NOT NULL;
        ALTER TABLE replica.server ADD CHECK (epoch_salt BETWEEN 0 AND 4294967295);

        -- What turns a zone's stored epoch into the one its tokens and change tags carry: stored # epoch_mix().
        CREATE FUNCTION replica.epoch_mix() RETURNS bigint LANGUAGE sql STABLE AS $$
            SELECT ((replica.lineage() # s.epoch_salt) & 4294967295) << 16 FROM replica.server s
        $$;

        -- As in step 2, with the epoch the clients see: the stored one mixed with the lineage.
        CREATE OR REPLACE FUNCTION replica.modify_records(p_owner text, p_zone text, p_ids uuid[], p_tags text[], p_alive boolean[],
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
            SELECT z.id, z.epoch # replica.epoch_mix(), z.sequence INTO v_zone, v_epoch, v_start FROM replica.zone z
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

        CREATE OR REPLACE FUNCTION replica.fetch_changes(p_owner text, p_zone text, p_epoch bigint, p_sequence bigint, p_limit integer)
        RETURNS TABLE (out_epoch bigint, out_zone_sequence bigint, out_sequence bigint, out_id uuid, out_change_tag text,
                       out_body bytea) LANGUAGE plpgsql STABLE AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
            v_zone bigint;
            v_epoch bigint;
            v_sequence bigint;
            v_oldest bigint;
        BEGIN
            SELECT z.id, z.epoch # replica.epoch_mix(), z.sequence, z.oldest_valid INTO v_zone, v_epoch, v_sequence, v_oldest
                FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
            END IF;
            IF p_epoch IS NOT NULL AND (
                   (p_epoch >> 16) <> (v_epoch >> 16)                 -- another incarnation, shard, lineage or database
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

        -- Administrators: every token expires and no change tag repeats (a restore or promotion PostgreSQL's lineage does
        -- not show, see `replica-cloud failover`). Returns the new salt.
        CREATE FUNCTION replica.renew_epoch_salt() RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            v_old bigint;
            v_new bigint;
        BEGIN
            SELECT epoch_salt INTO v_old FROM replica.server FOR UPDATE;
            LOOP
                v_new := pg_catalog.floor(pg_catalog.random() * 4294967296)::bigint;
                EXIT WHEN v_new <> v_old;
            END LOOP;
            UPDATE replica.server SET epoch_salt = v_new;
            RETURN v_new;
        END
        $$;

        -- The shard directory (kept in one database, the directory, which may be one of the shards): which shard keeps
        -- each owner's zones, and how to reach each shard (a libpq connection string without credentials: every device
        -- adds its own). Users read their own placement; app backends and administrators read every one.
        CREATE TABLE replica.shard_endpoint (
            shard integer PRIMARY KEY CHECK (shard BETWEEN 0 AND 32767),
            connection text NOT NULL
        );
        CREATE TABLE replica.placement (
            owner text PRIMARY KEY CHECK (owner <> ''),
            shard integer NOT NULL REFERENCES replica.shard_endpoint (shard),
            placed_at timestamptz NOT NULL DEFAULT now()
        );
        ALTER TABLE replica.placement ENABLE ROW LEVEL SECURITY;
        ALTER TABLE replica.placement FORCE ROW LEVEL SECURITY;
        CREATE POLICY owner_is_role ON replica.placement FOR SELECT TO replica_user USING (owner = current_user::text);
        CREATE POLICY any_owner ON replica.placement FOR SELECT TO replica_app USING (true);
        CREATE POLICY administration ON replica.placement TO replica_admin USING (true) WITH CHECK (true);
        GRANT SELECT ON replica.placement, replica.shard_endpoint TO replica_user, replica_app, replica_admin;
        GRANT INSERT, UPDATE, DELETE ON replica.placement, replica.shard_endpoint TO replica_admin;

        -- Where the owner's zones live: the shard and its connection string; no row when the owner is not placed.
        CREATE FUNCTION replica.locate(p_owner text) RETURNS TABLE (out_shard integer, out_connection text)
        LANGUAGE plpgsql STABLE AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
        BEGIN
            RETURN QUERY SELECT p.shard, e.connection FROM replica.placement p JOIN replica.shard_endpoint e USING (shard)
                WHERE p.owner = v_owner;
        END
        $$;

        REVOKE ALL ON FUNCTION replica.lineage(), replica.epoch_mix(), replica.renew_epoch_salt(), replica.locate(text) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION replica.lineage(), replica.epoch_mix(), replica.locate(text) TO replica_user, replica_app, replica_admin;
        GRANT EXECUTE ON FUNCTION replica.renew_epoch_salt() TO replica_admin;
        GRANT UPDATE ON replica.server TO replica_admin;
        """)
}
