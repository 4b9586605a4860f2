import Foundation

extension PostgresCloudSchema {
    /// Step 4: why a zone was deleted (CloudKit's reasons: deleted, purged, encrypted data reset), kept with the zone's
    /// incarnation (which outlives the zone) until the zone is created again, so devices learn it
    /// (`Specs/cloud-postgres.md` §4 and §6). A database upgraded from an earlier step knows no reason for zones deleted
    /// before: they stay merely missing.
    static let zoneDeletionReasons = Step(version: 4, summary: "zone deletion reasons", sql: """
        ALTER TABLE replica.zone_incarnation ADD COLUMN deletion_reason text
            CHECK (deletion_reason IN ('deleted', 'purged', 'encryptedDataReset'));

        -- Deletes the zone for a reason, kept until the zone is created again.
        CREATE FUNCTION replica.delete_zone(p_owner text, p_zone text, p_reason text) RETURNS void LANGUAGE plpgsql
        SET lock_timeout = '5s' AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
        BEGIN
            IF p_reason IS NULL OR p_reason NOT IN ('deleted', 'purged', 'encryptedDataReset') THEN
                RAISE EXCEPTION 'unknown zone deletion reason' USING ERRCODE = '22023';
            END IF;
            DELETE FROM replica.zone WHERE owner = v_owner AND name = p_zone;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'zone not found' USING ERRCODE = 'RZ001';
            END IF;
            UPDATE replica.zone_incarnation SET deletion_reason = p_reason WHERE owner = v_owner AND name = p_zone;
            PERFORM replica.announce(v_owner, p_zone);
        END
        $$;

        CREATE OR REPLACE FUNCTION replica.delete_zone(p_owner text, p_zone text) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM replica.delete_zone(p_owner, p_zone, 'deleted');
        END
        $$;

        -- Why the zone is gone: NULL while it exists, and when no reason is known.
        CREATE FUNCTION replica.zone_deletion_reason(p_owner text, p_zone text) RETURNS text LANGUAGE plpgsql STABLE AS $$
        DECLARE
            v_owner text := replica.enter(p_owner);
        BEGIN
            PERFORM 1 FROM replica.zone WHERE owner = v_owner AND name = p_zone;
            IF FOUND THEN
                RETURN NULL;
            END IF;
            RETURN (SELECT i.deletion_reason FROM replica.zone_incarnation i WHERE i.owner = v_owner AND i.name = p_zone);
        END
        $$;

        -- As in step 2, and a zone created again has no deletion reason any more.
        CREATE OR REPLACE FUNCTION replica.create_zone(p_owner text, p_zone text) RETURNS void LANGUAGE plpgsql
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
            UPDATE replica.zone_incarnation SET last_epoch = v_epoch, deletion_reason = NULL WHERE owner = v_owner AND name = p_zone;
            PERFORM replica.announce(v_owner, p_zone);
        END
        $$;

        REVOKE ALL ON FUNCTION replica.delete_zone(text, text, text), replica.zone_deletion_reason(text, text) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION replica.delete_zone(text, text, text), replica.zone_deletion_reason(text, text)
            TO replica_user, replica_app, replica_admin;
        """)
}
