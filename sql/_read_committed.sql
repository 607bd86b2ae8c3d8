-- pgfence._read_committed as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._read_committed()
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
$function$
