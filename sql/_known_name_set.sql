-- pgfence._known_name_set as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._known_name_set(p_names text[])
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT s.set_id FROM pgfence.name_sets s
     WHERE s.digest = sha256(convert_to(array_to_string(p_names, E'\n', ''), 'UTF8')) AND s.names = p_names
$function$
