-- pgfence._grant_is_valid as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._grant_is_valid(g pgfence.grants)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = g.role::oid)
$function$
