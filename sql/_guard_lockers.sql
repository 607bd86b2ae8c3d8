-- pgfence._guard_lockers as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._guard_lockers(p_lock_key integer, p_granted boolean)
 RETURNS integer[]
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}')
      FROM pg_catalog.pg_locks k
     WHERE k.locktype = 'advisory' AND k.classid = pgfence._guard_lock_class()::oid AND k.objid = p_lock_key::oid
       AND k.objsubid = 2 AND k.granted = p_granted AND k.pid <> pg_catalog.pg_backend_pid()
       AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
$function$
