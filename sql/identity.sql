-- pgfence.identity as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.identity(OUT system_identifier text, OUT database text, OUT instance_id text, OUT in_recovery boolean, OUT timeline bigint, OUT server_version text)
 RETURNS record
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    database := current_database();
    in_recovery := pg_is_in_recovery();
    server_version := current_setting('server_version');
    SELECT i.instance_id::text INTO instance_id FROM pgfence.instance i;
    BEGIN
        SELECT c.system_identifier::text INTO system_identifier FROM pg_control_system() c;
        -- On a primary, the timeline WAL is written on now; a standby cannot ask that, so the last checkpoint's.
        IF in_recovery THEN
            SELECT c.timeline_id INTO timeline FROM pg_control_checkpoint() c;
        ELSE
            timeline := pgfence._timeline();
        END IF;
    EXCEPTION WHEN insufficient_privilege THEN
        system_identifier := NULL;
        timeline := NULL;
    END;
END;
$function$
