-- pgfence.roster as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.roster(p_group text)
 RETURNS TABLE(member text, weight integer, settled boolean, names text[], pinned text[], excluded text[], leads text[], expires_in_ms bigint)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF pgfence._lease_problem(p_group) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid group: %', pgfence._lease_problem(p_group)
            USING ERRCODE = '22023', COLUMN = 'group';
    END IF;
    IF NOT pgfence._may_use(pgfence._cluster_of(p_group)) THEN
        RAISE EXCEPTION 'pgfence: role % has no grant on cluster %', pgfence._printable(session_user::text),
            pgfence._printable(pgfence._cluster_of(p_group)) USING ERRCODE = '42501';
    END IF;
    RETURN QUERY
    SELECT g.member, g.weight, g.settled, g.names, g.pinned, g.excluded, g.leads, g.expires_in_ms
      FROM pgfence.group_members g
     WHERE g."group" = p_group AND g.live
     ORDER BY g.member;
END;
$function$
