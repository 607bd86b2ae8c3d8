-- pgfence._in_doubt as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._in_doubt(p_settlement text, p_outcome text, p_epoch bigint, p_live_epoch bigint)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT p_settlement IS NULL
       AND CASE WHEN p_outcome IS NULL THEN p_epoch IS DISTINCT FROM p_live_epoch
                ELSE p_outcome OPERATOR(pg_catalog.=) 'unknown' END
$function$
