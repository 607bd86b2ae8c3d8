-- pgfence.assigned_names as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.assigned_names(p_group text, p_member text, OUT generation bigint, OUT names text[], OUT members integer)
 RETURNS record
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    PERFORM pgfence._check_text('member'::text, p_member, pgfence._max_holder_len());
    -- One snapshot for all three: the generation is that of the names read.
    SELECT coalesce(g.generation, 0),
           ARRAY(SELECT a.name FROM pgfence.assignments a WHERE a.grp = p_group AND a.member = p_member
                  ORDER BY a.name),
           (SELECT count(*) FROM pgfence.members m WHERE m.grp = p_group AND m.counted)
      INTO generation, names, members
      FROM (SELECT 1) one LEFT JOIN pgfence.groups g ON g.grp = p_group;
END;
$function$
