-- pgfence._readable_clusters as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._readable_clusters()
 RETURNS text[]
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT coalesce(array_agg(DISTINCT g.cluster) FILTER (WHERE g.cluster IS NOT NULL), '{}')
      FROM pgfence.grants g
     WHERE pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER')
$function$
