-- pgfence.group_names as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.group_names(p_group text, p_set_id bigint)
 RETURNS text[]
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    RETURN (SELECT s.names FROM pgfence.name_sets s
             WHERE s.set_id = p_set_id
               AND EXISTS (SELECT 1 FROM pgfence.members m WHERE m.grp = p_group AND m.set_id = p_set_id));
END;
$function$
