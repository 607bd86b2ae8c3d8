-- pgfence._max_ttl_ms as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._max_ttl_ms()
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$SELECT 86400000::bigint$function$
