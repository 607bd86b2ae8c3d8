-- pgfence._secret_verdict as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._secret_verdict(p_secret_epoch bigint, p_hash bytea, p_epoch bigint, p_secret text)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN p_secret_epoch <> p_epoch THEN NULL
                WHEN pgfence._secret_matches(p_hash, p_secret) THEN 'ok'
                ELSE 'bad' END
$function$
