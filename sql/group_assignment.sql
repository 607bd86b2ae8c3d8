-- pgfence.group_assignment as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.group_assignment(p_group text)
 RETURNS TABLE(generation bigint, name text, member text)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    RETURN QUERY
    SELECT g.generation, a.name, a.member
      FROM pgfence.groups g LEFT JOIN pgfence.assignments a ON a.grp = g.grp
     WHERE g.grp = p_group
     ORDER BY a.name;
END;
$function$
