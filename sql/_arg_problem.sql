-- pgfence._arg_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._arg_problem(p_what text, p_value text, p_max integer, p_optional boolean DEFAULT false)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_value IS NOT NULL OR NOT p_optional
                THEN 'invalid ' || p_what || ': ' || pgfence._text_problem(p_value, p_max) END
$function$
