-- pgfence._secret_check as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._secret_check(p_lease text, p_epoch bigint, p_secret text)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT pgfence._secret_verdict(s.epoch, s.hash, p_epoch, p_secret)
      FROM pgfence.tenure_secrets s
     WHERE s.lease = p_lease
$function$
