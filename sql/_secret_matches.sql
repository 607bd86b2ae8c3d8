-- pgfence._secret_matches as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._secret_matches(p_hash bytea, p_secret text)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(p_secret IS NOT NULL AND length(p_secret) <= 128
                    AND p_hash = pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8')), false)
$function$
