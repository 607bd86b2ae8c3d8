-- pgfence._trusted as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._trusted(p_role name)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_role) THEN false
                ELSE (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = p_role)
                     OR pg_catalog.pg_has_role(p_role, (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                                         WHERE n.nspname = 'pgfence'), 'MEMBER') END
$function$
