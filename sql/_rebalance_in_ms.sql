-- pgfence._rebalance_in_ms as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._rebalance_in_ms(g pgfence.groups)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT greatest(0, ceil(extract(epoch FROM (greatest(d.due, CASE WHEN g.claimed_until > clock_timestamp()
                                                                      THEN g.claimed_until END)
                                                - clock_timestamp())) * 1000))::bigint
      FROM (SELECT pgfence._rebalance_due(g) AS due) d
     WHERE d.due IS NOT NULL
$function$
