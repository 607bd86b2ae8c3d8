-- pgfence._plain_arg as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._plain_arg(p_value text, p_max integer, p_optional boolean DEFAULT false)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT (p_optional AND p_value IS NULL) OR (p_value ~ '^[ -~]+$' AND octet_length(p_value) <= p_max)
$function$
