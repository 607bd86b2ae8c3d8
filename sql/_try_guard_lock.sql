-- pgfence._try_guard_lock as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._try_guard_lock(p_lock_key integer)
 RETURNS boolean
 LANGUAGE sql
AS $function$
    SELECT (CASE WHEN pg_catalog.pg_try_advisory_lock_shared(pgfence._guard_lock_class(),
                                                             OPERATOR(pg_catalog.-) p_lock_key)
                 THEN CASE WHEN pg_catalog.pg_advisory_unlock_shared(pgfence._guard_lock_class(),
                                                                     OPERATOR(pg_catalog.-) p_lock_key)
                           THEN pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), p_lock_key) END
                 ELSE false END) IS TRUE
$function$
