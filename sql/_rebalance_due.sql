-- pgfence._rebalance_due as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._rebalance_due(g pgfence.groups)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE
        WHEN g.urgent OR EXISTS (SELECT 1 FROM pgfence.members m
                                  WHERE m.grp = g.grp AND m.counted AND m.expires_at <= clock_timestamp())
             THEN clock_timestamp()
        WHEN g.version > g.assigned_version
             THEN least(g.changed_at + least(1000, g.ttl_ms / 4) * interval '1 millisecond',
                        g.pending_since + g.ttl_ms * interval '1 millisecond')
    END
$function$
