-- pgfence._lock_wait_ms as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._lock_wait_ms()
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT i.takeover_grace_ms + 5000 FROM pgfence.instance i
$function$
