-- pgfence.set_takeover_grace as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.set_takeover_grace(p_grace interval)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    ms bigint;
BEGIN
    PERFORM pgfence._require_instance_operator('set_takeover_grace'::text);
    IF p_grace IS NULL OR p_grace < interval '0' OR p_grace > interval '10 minutes' THEN
        RAISE EXCEPTION 'pgfence: takeover grace must be between 0 and 10 minutes'
            USING ERRCODE = '22023', COLUMN = 'grace';
    END IF;
    ms := ceil(extract(epoch FROM p_grace) * 1000)::bigint;
    UPDATE pgfence.instance SET takeover_grace_ms = ms;
    RETURN ms;
END;
$function$
