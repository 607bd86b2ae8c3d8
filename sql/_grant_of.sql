-- pgfence._grant_of as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._grant_of(p_cluster text, p_operator boolean DEFAULT false, p_owner name DEFAULT NULL::name)
 RETURNS TABLE(granted boolean)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT pg_catalog.pg_has_role(session_user,
                                  coalesce(p_owner, pgfence._owner()), 'MEMBER')
           OR EXISTS (SELECT 1 FROM pgfence.grants g
                       WHERE (g.cluster = p_cluster OR g.cluster IS NULL) AND (g.operator OR NOT p_operator)
                         AND pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER'))
$function$
