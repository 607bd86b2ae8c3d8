-- pgfence._printable as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._printable(p_text text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_text IS NULL THEN 'null'
                ELSE quote_literal(regexp_replace(left(p_text, 64), '[[:cntrl:]]', '?', 'g')) END
$function$
