-- pgfence._fence_setting as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._fence_setting(p_lock_key integer)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT 'pgfence.tenure_secret_' OPERATOR(pg_catalog.||) p_lock_key::pg_catalog.text
$function$
