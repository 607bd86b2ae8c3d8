-- pgfence._claim_ms as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._claim_ms(g pgfence.groups)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT greatest(2000, least(g.ttl_ms / 2, 10000))
$function$
