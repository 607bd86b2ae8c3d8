-- pgfence._argument_of as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._argument_of(p_problem text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT coalesce(substring(p_problem FROM '^invalid ([a-z]+(?: [a-z]+)*)(?: [0-9]+ of [0-9]+)?: '), '')
$function$
