-- pgfence._member_lockers as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._member_lockers()
 RETURNS integer[]
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
     WHERE k.locktype = 'relation' AND k.relation IN ('pgfence.members'::regclass, 'pgfence.groups'::regclass)
       AND k.granted AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
$function$
