-- pgfence._group_changed as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._group_changed(p_group text, p_urgent boolean)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    gr pgfence.groups;
BEGIN
    UPDATE pgfence.groups g
       SET version = g.version + 1, changed_at = clock_timestamp(),
           pending_since = coalesce(g.pending_since, clock_timestamp()), urgent = g.urgent OR p_urgent
     WHERE g.grp = p_group
    RETURNING g.* INTO gr;
    PERFORM pg_notify(gr.channel, 'changed ' || coalesce(pgfence._rebalance_in_ms(gr), 0));
END;
$function$
