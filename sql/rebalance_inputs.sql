-- pgfence.rebalance_inputs as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.rebalance_inputs(p_group text)
 RETURNS TABLE(member text, weight integer, set_id bigint, pinned text[], excluded text[], settled boolean, counted boolean)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    RETURN QUERY
    SELECT m.member, m.weight, m.set_id, m.pinned, m.excluded, m.settled_at IS NOT NULL, m.counted
      FROM pgfence.members m
     WHERE m.grp = p_group AND m.left_at IS NULL AND m.expires_at > clock_timestamp()
       AND (m.settled_at IS NOT NULL OR m.counted)
     ORDER BY m.member;
END;
$function$
