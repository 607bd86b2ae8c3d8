-- pgfence._known_slot as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._known_slot(p_lease text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT 'pgfence.known_' OPERATOR(pg_catalog.||)
           (pg_catalog.hashtext(p_lease) OPERATOR(pg_catalog.&) 15)::pg_catalog.text
$function$
