-- pgfence._flaps_after as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._flaps_after(m pgfence.members, ts timestamp with time zone)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN m.left_at IS NULL AND m.expires_at > ts - 10 * m.ttl_ms * interval '1 millisecond'
                THEN m.flaps + 1 ELSE 0 END
$function$
