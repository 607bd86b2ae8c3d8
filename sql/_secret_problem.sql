-- pgfence._secret_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._secret_problem(p_secret text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_secret IS NULL THEN 'invalid secret: the tenure''s secret is required, got <NULL>' END
$function$
