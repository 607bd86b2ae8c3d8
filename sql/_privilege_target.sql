-- pgfence._privilege_target as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._privilege_target(p_kind text, p_object oid)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE p_kind WHEN 'SCHEMA' THEN 'SCHEMA pgfence'
                       WHEN 'FUNCTION' THEN 'ROUTINE ' || p_object::regprocedure::text
                       ELSE p_kind || ' ' || p_object::regclass::text END
$function$
