-- pgfence._timeline as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._timeline()
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT ('x' OPERATOR(pg_catalog.||)
            pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$function$
