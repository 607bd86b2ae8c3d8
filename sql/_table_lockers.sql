-- pgfence._table_lockers as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._table_lockers()
 RETURNS integer[]
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}')
      FROM pg_catalog.pg_locks k
      JOIN pg_catalog.pg_class c ON c.oid = k.relation
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE k.locktype = 'relation' AND k.granted AND n.nspname = 'pgfence'
       AND k.pid <> pg_catalog.pg_backend_pid()
$function$
