import Foundation

extension PostgresCloudSchema {
    /// Step 5: assets (`Specs/cloud-postgres.md` §16). An asset belongs to a zone (deleted with it), is named by the
    /// SHA-256 of its bytes (each zone holds a hash once: deduplication) and arrives in chunks of 1 MiB, so an
    /// interrupted upload resumes with the chunks the zone lacks. The last chunk completes it: the server hashes the
    /// chunks in order and drops them all when they do not hash to the name. Same row-level security as records: a
    /// user reads and writes only the assets of their own zones. The limit per asset is `replica.server.max_asset_size`
    /// (`replica-cloud asset-limit`).
    static let assets = Step(version: 6, summary: "assets: chunked, resumable, deduplicated by hash, limited in size", sql: """
        ALTER TABLE replica.server ADD COLUMN max_asset_size bigint NOT NULL DEFAULT 268435456 CHECK (max_asset_size >= 0);

        CREATE TABLE replica.asset (
            zone_id bigint NOT NULL,
            owner text NOT NULL,
            hash text NOT NULL CHECK (hash ~ '^[0-9a-f]{64}$'),
            size bigint NOT NULL CHECK (size >= 0),
            complete boolean NOT NULL DEFAULT false,
            touched_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (zone_id, hash),
            UNIQUE (zone_id, hash, owner),
            FOREIGN KEY (zone_id, owner) REFERENCES replica.zone (id, owner) ON DELETE CASCADE
        );

        CREATE TABLE replica.asset_chunk (
            zone_id bigint NOT NULL,
            owner text NOT NULL,
            hash text NOT NULL,
            idx integer NOT NULL CHECK (idx >= 0),
            data bytea NOT NULL,
            PRIMARY KEY (zone_id, hash, idx),
            FOREIGN KEY (zone_id, hash, owner) REFERENCES replica.asset (zone_id, hash, owner) ON DELETE CASCADE
        );
        -- Chunks are mostly compressed media or sealed bytes: stored out of line, not compressed again.
        ALTER TABLE replica.asset_chunk ALTER COLUMN data SET STORAGE EXTERNAL;

        DO $policies$
        DECLARE t text;
        BEGIN
            FOREACH t IN ARRAY ARRAY['asset', 'asset_chunk'] LOOP
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

        -- The zone's entry of an asset, locked for the rest of the transaction: made (empty) when missing, restarted
        -- when an unfinished one of another size is there; an empty asset is complete at once. Returns whether it is
        -- complete and, when not, the chunk indices held (comma-separated, ascending).
        CREATE FUNCTION replica.asset_entry(p_zone bigint, p_owner text, p_hash text, p_size bigint)
        RETURNS TABLE (out_complete boolean, out_chunks text) LANGUAGE plpgsql AS $$
        DECLARE
            v_limit bigint;
            v_size bigint;
            v_complete boolean;
        BEGIN
            IF p_hash IS NULL OR p_hash !~ '^[0-9a-f]{64}$' OR p_size IS NULL OR p_size < 0 THEN
                RAISE EXCEPTION 'malformed asset reference' USING ERRCODE = 'RZ013';
            END IF;
            SELECT s.max_asset_size INTO v_limit FROM replica.server s;
            IF p_size > v_limit THEN
                RAISE EXCEPTION 'asset of % bytes exceeds the limit of % bytes', p_size, v_limit USING ERRCODE = 'RZ010';
            END IF;
            INSERT INTO replica.asset (zone_id, owner, hash, size) VALUES (p_zone, p_owner, p_hash, p_size)
                ON CONFLICT (zone_id, hash) DO NOTHING;
            SELECT a.size, a.complete INTO v_size, v_complete FROM replica.asset a
                WHERE a.zone_id = p_zone AND a.hash = p_hash FOR UPDATE;
            IF v_size <> p_size THEN
                -- Bytes of two sizes cannot have one hash: a finished asset keeps its size; an unfinished one restarts.
                IF v_complete THEN
                    RAISE EXCEPTION 'asset % does not hash to its name', p_hash USING ERRCODE = 'RZ012';
                END IF;
                DELETE FROM replica.asset_chunk c WHERE c.zone_id = p_zone AND c.hash = p_hash;
                UPDATE replica.asset a SET size = p_size WHERE a.zone_id = p_zone AND a.hash = p_hash;
            END IF;
            IF p_size = 0 AND NOT v_complete THEN
                IF p_hash <> pg_catalog.encode(pg_catalog.sha256(''::bytea), 'hex') THEN
                    RAISE EXCEPTION 'asset % does not hash to its name', p_hash USING ERRCODE = 'RZ012';
                END IF;
                v_complete := true;
            END IF;
            UPDATE replica.asset a SET touched_at = pg_catalog.now(), complete = v_complete
                WHERE a.zone_id = p_zone AND a.hash = p_hash;
            out_complete := v_complete;
            out_chunks := CASE WHEN v_complete THEN NULL ELSE (
                SELECT pg_catalog.string_agg(c.idx::text, ',' ORDER BY c.idx) FROM replica.asset_chunk c
                WHERE c.zone_id = p_zone AND c.hash = p_hash) END;
            RETURN NEXT;
        END
        $$;

        CREATE FUNCTION replica.prepare_asset_upload(p_owner text, p_zone text, p_hash text, p_size bigint)
        RETURNS TABLE (out_complete boolean, out_chunks text) LANGUAGE plpgsql SET lock_timeout = '5s' AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
            v_zone bigint;
        BEGIN
            SELECT z.id INTO v_zone FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
            END IF;
            RETURN QUERY SELECT e.out_complete, e.out_chunks FROM replica.asset_entry(v_zone, v_owner, p_hash, p_size) e;
        END
        $$;

        -- Stores one chunk; the last one completes the asset, or (its chunks not hashing to the name) drops it and
        -- answers out_mismatch (not raised: the drop must commit).
        CREATE FUNCTION replica.upload_asset_chunk(p_owner text, p_zone text, p_hash text, p_size bigint, p_index integer,
                                                   p_data bytea)
        RETURNS TABLE (out_complete boolean, out_chunks text, out_mismatch boolean) LANGUAGE plpgsql
        SET lock_timeout = '5s' AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
            v_zone bigint;
            v_complete boolean;
            v_chunks integer;
            v_expected bigint;
            v_count integer;
        BEGIN
            SELECT z.id INTO v_zone FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
            END IF;
            SELECT e.out_complete INTO v_complete FROM replica.asset_entry(v_zone, v_owner, p_hash, p_size) e;
            v_chunks := ((p_size + 1048575) / 1048576)::integer;
            IF p_index IS NULL OR p_index < 0 OR p_index >= v_chunks THEN
                RAISE EXCEPTION 'chunk % is outside the asset (% chunks)', p_index, v_chunks USING ERRCODE = 'RZ013';
            END IF;
            v_expected := LEAST(p_size - p_index::bigint * 1048576, 1048576);
            IF p_data IS NULL OR pg_catalog.length(p_data) <> v_expected THEN
                RAISE EXCEPTION 'chunk % holds % bytes, not %', p_index, pg_catalog.length(p_data), v_expected USING ERRCODE = 'RZ013';
            END IF;
            out_mismatch := false;
            IF NOT v_complete THEN
                INSERT INTO replica.asset_chunk (zone_id, owner, hash, idx, data) VALUES (v_zone, v_owner, p_hash, p_index, p_data)
                    ON CONFLICT (zone_id, hash, idx) DO UPDATE SET data = excluded.data;
                SELECT pg_catalog.count(*) INTO v_count FROM replica.asset_chunk c WHERE c.zone_id = v_zone AND c.hash = p_hash;
                IF v_count = v_chunks THEN
                    IF (SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.string_agg(c.data, ''::bytea ORDER BY c.idx)), 'hex')
                        FROM replica.asset_chunk c WHERE c.zone_id = v_zone AND c.hash = p_hash) = p_hash THEN
                        UPDATE replica.asset a SET complete = true WHERE a.zone_id = v_zone AND a.hash = p_hash;
                        v_complete := true;
                    ELSE
                        DELETE FROM replica.asset a WHERE a.zone_id = v_zone AND a.hash = p_hash;
                        out_mismatch := true;
                    END IF;
                END IF;
            END IF;
            out_complete := v_complete;
            out_chunks := CASE WHEN v_complete OR out_mismatch THEN NULL ELSE (
                SELECT pg_catalog.string_agg(c.idx::text, ',' ORDER BY c.idx) FROM replica.asset_chunk c
                WHERE c.zone_id = v_zone AND c.hash = p_hash) END;
            RETURN NEXT;
        END
        $$;

        CREATE FUNCTION replica.download_asset_chunk(p_owner text, p_zone text, p_hash text, p_size bigint, p_index integer)
        RETURNS bytea LANGUAGE plpgsql STABLE AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
            v_zone bigint;
            v_chunks integer;
            v_data bytea;
        BEGIN
            SELECT z.id INTO v_zone FROM replica.zone z WHERE z.owner = v_owner AND z.name = p_zone;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
            END IF;
            PERFORM 1 FROM replica.asset a WHERE a.zone_id = v_zone AND a.hash = p_hash AND a.size = p_size AND a.complete;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'asset % not found', p_hash USING ERRCODE = 'RZ011';
            END IF;
            v_chunks := ((p_size + 1048575) / 1048576)::integer;
            IF p_index IS NULL OR p_index < 0 OR p_index >= v_chunks THEN
                RAISE EXCEPTION 'chunk % is outside the asset (% chunks)', p_index, v_chunks USING ERRCODE = 'RZ013';
            END IF;
            SELECT c.data INTO v_data FROM replica.asset_chunk c WHERE c.zone_id = v_zone AND c.hash = p_hash AND c.idx = p_index;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'asset % not found', p_hash USING ERRCODE = 'RZ011';
            END IF;
            RETURN v_data;
        END
        $$;

        -- Administrators: drops the zone's assets that no record (alive or tombstone) names and that no one uploaded or
        -- prepared since `p_before` (seconds since 1970, server clock). A record names an asset when the asset's hash
        -- appears in its body (a reference `replica-asset:sha256:<hash>:<size>`, or a sealed asset's reference).
        CREATE FUNCTION replica.prune_assets(p_zone_id bigint, p_before double precision, OUT out_assets bigint,
                                             OUT out_bytes bigint) LANGUAGE plpgsql SET lock_timeout = '5s' AS $$
        BEGIN
            WITH gone AS (
                DELETE FROM replica.asset a WHERE a.zone_id = p_zone_id AND a.touched_at < pg_catalog.to_timestamp(p_before)
                    AND NOT EXISTS (SELECT 1 FROM replica.record r WHERE r.zone_id = a.zone_id
                                    AND position(pg_catalog.convert_to(a.hash, 'UTF8') IN r.body) > 0)  -- (SQL syntax, always pg_catalog's)
                RETURNING a.size, a.complete)
            SELECT pg_catalog.count(*), COALESCE(pg_catalog.sum(gone.size) FILTER (WHERE gone.complete), 0)
                INTO out_assets, out_bytes FROM gone;
        END
        $$;

        REVOKE ALL ON FUNCTION replica.asset_entry(bigint, text, text, bigint),
            replica.prepare_asset_upload(text, text, text, bigint),
            replica.upload_asset_chunk(text, text, text, bigint, integer, bytea),
            replica.download_asset_chunk(text, text, text, bigint, integer),
            replica.prune_assets(bigint, double precision) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION replica.prepare_asset_upload(text, text, text, bigint),
            replica.upload_asset_chunk(text, text, text, bigint, integer, bytea),
            replica.download_asset_chunk(text, text, text, bigint, integer) TO replica_user, replica_app, replica_admin;
        GRANT EXECUTE ON FUNCTION replica.asset_entry(bigint, text, text, bigint) TO replica_user, replica_app, replica_admin;
        GRANT EXECUTE ON FUNCTION replica.prune_assets(bigint, double precision) TO replica_admin;
        """)
}

extension PostgresCloudSchema {
    /// Step 7: a live record references only assets its zone holds complete (`Specs/cloud-postgres.md` §16, R19). The
    /// client names each record's assets (`p_assets[i]`: `hash:size` pairs, comma-separated; empty for none — the
    /// body is opaque to the server); `modify_records` refuses a record naming an asset the zone lacks, answering
    /// `out_missing` with its hash, and saves the rest of the batch. The check runs under the zone's row lock, so a
    /// zone deleted and created again between an asset's upload and the save is seen. The six-argument form (clients
    /// before this step) saves without the check.
    static let assetReferences = Step(version: 7, summary: "saves refuse records that reference assets the zone lacks", sql: """
        CREATE FUNCTION replica.modify_records(p_owner text, p_zone text, p_ids uuid[], p_tags text[], p_alive boolean[],
                                               p_bodies bytea[], p_assets text[])
        RETURNS TABLE (out_saved boolean, out_change_tag text, out_body bytea, out_missing text) LANGUAGE plpgsql
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
            v_reference text;
            v_missing text;
        BEGIN
            IF COALESCE(pg_catalog.array_length(p_tags, 1), 0) <> v_count
               OR COALESCE(pg_catalog.array_length(p_alive, 1), 0) <> v_count
               OR COALESCE(pg_catalog.array_length(p_bodies, 1), 0) <> v_count
               OR (p_assets IS NOT NULL AND COALESCE(pg_catalog.array_length(p_assets, 1), 0) <> v_count) THEN
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
                    out_missing := NULL;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
                v_missing := NULL;
                IF p_alive[i] AND p_assets IS NOT NULL AND COALESCE(p_assets[i], '') <> '' THEN
                    FOREACH v_reference IN ARRAY pg_catalog.string_to_array(p_assets[i], ',') LOOP
                        IF v_reference !~ '^[0-9a-f]{64}:[0-9]{1,18}$' THEN
                            RAISE EXCEPTION 'malformed asset reference' USING ERRCODE = 'RZ013';
                        END IF;
                        PERFORM 1 FROM replica.asset a WHERE a.zone_id = v_zone AND a.hash = pg_catalog.split_part(v_reference, ':', 1)
                            AND a.size = pg_catalog.split_part(v_reference, ':', 2)::bigint AND a.complete;
                        IF NOT FOUND THEN
                            v_missing := pg_catalog.split_part(v_reference, ':', 1);
                            EXIT;
                        END IF;
                    END LOOP;
                END IF;
                IF v_missing IS NOT NULL THEN
                    out_saved := false;
                    out_change_tag := NULL;
                    out_body := NULL;
                    out_missing := v_missing;
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
                out_missing := NULL;
                RETURN NEXT;
            END LOOP;
            IF v_sequence > v_start THEN
                UPDATE replica.zone SET sequence = v_sequence WHERE id = v_zone;
                PERFORM replica.announce(v_owner, p_zone);
            END IF;
        END
        $$;

        -- Clients from before this step: the same save, without the asset check.
        CREATE OR REPLACE FUNCTION replica.modify_records(p_owner text, p_zone text, p_ids uuid[], p_tags text[], p_alive boolean[],
                                                          p_bodies bytea[])
        RETURNS TABLE (out_saved boolean, out_change_tag text, out_body bytea) LANGUAGE sql
        SET lock_timeout = '5s' AS $$
            SELECT m.out_saved, m.out_change_tag, m.out_body
            FROM replica.modify_records(p_owner, p_zone, p_ids, p_tags, p_alive, p_bodies, NULL::text[]) m
        $$;

        REVOKE ALL ON FUNCTION replica.modify_records(text, text, uuid[], text[], boolean[], bytea[], text[]) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION replica.modify_records(text, text, uuid[], text[], boolean[], bytea[], text[])
            TO replica_user, replica_app, replica_admin;
        """)
}
