-- pgfence._task_lockers as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._task_lockers(p_lease text, p_key text)
 RETURNS integer[]
 LANGUAGE sql
 STABLE
AS $function$
    WITH exact AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'transactionid' AND k.granted AND k.pid <> pg_catalog.pg_backend_pid()
           AND k.transactionid = (SELECT t.xmax FROM pgfence.tasks t WHERE t.lease = p_lease AND t.key = p_key)
    ), candidates AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'relation' AND k.relation = 'pgfence.tasks'::regclass AND k.granted
           AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
    )
    SELECT coalesce((SELECT array_agg(DISTINCT pid) FROM exact),
                    (SELECT array_agg(DISTINCT pid) FROM candidates), '{}')
$function$
