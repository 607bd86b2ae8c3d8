-- pgfence._settle_delay as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._settle_delay(p_flaps integer, p_ttl_ms bigint)
 RETURNS interval
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_flaps = 0 THEN interval '0'
                ELSE (p_ttl_ms * (1 << (least(p_flaps, 4) - 1))) * interval '1 millisecond' END
$function$
