-- pgfence._check_secret as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._check_secret(p_secret text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    IF p_secret IS NULL THEN
        RAISE EXCEPTION 'pgfence: %', pgfence._secret_problem(p_secret) USING ERRCODE = '22023', COLUMN = 'secret';
    END IF;
END;
$function$
