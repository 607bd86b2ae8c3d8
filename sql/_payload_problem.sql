-- pgfence._payload_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._payload_problem(p_payload jsonb)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN pg_column_size(p_payload) > 16777216 THEN 'invalid payload: larger than 16 MiB stored' END
$function$
