-- pgfence._claim_wait as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._claim_wait(g pgfence.groups, p_member text)
 RETURNS pgfence.rebalance_result
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE
        WHEN d.due IS NULL OR d.due > clock_timestamp()
            THEN ROW('not_due', NULL, g.version, g.generation, pgfence._rebalance_in_ms(g))::pgfence.rebalance_result
        WHEN g.claimed_until > clock_timestamp() AND g.claimed_by IS DISTINCT FROM p_member
            THEN ROW('claimed', NULL, g.version, g.generation, pgfence._rebalance_in_ms(g))::pgfence.rebalance_result
    END
      FROM (SELECT pgfence._rebalance_due(g) AS due) d
$function$
