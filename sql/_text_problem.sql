-- pgfence._text_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._text_problem(p_value text, p_max integer)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN p_value IS NULL OR pg_catalog.length(p_value) OPERATOR(pg_catalog.=) 0 THEN 'must not be empty'
        WHEN pg_catalog.length(p_value) OPERATOR(pg_catalog.>) p_max
            THEN 'must be at most ' OPERATOR(pg_catalog.||) p_max::text OPERATOR(pg_catalog.||) ' characters, got '
                 OPERATOR(pg_catalog.||) pg_catalog.length(p_value)::text
        WHEN p_value OPERATOR(pg_catalog.~) '[\u0001-\u001f\u007f-\u009f]'
            THEN 'must not contain control characters (NUL, newline, …)'
        WHEN NOT p_value IS NFC NORMALIZED THEN 'must be in Unicode Normalization Form C (NFC)'
    END
$function$
