-- pgfence._lock_task as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._lock_task(p_lease text, p_key text, p_operation text)
 RETURNS pgfence.tasks
 LANGUAGE plpgsql
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    t pgfence.tasks;
    wait_ms bigint;
BEGIN
    SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN t;
    END IF;
    -- Held by another transaction (or no such task): wait, bounded (local to this function: its SET clause
    -- restores the caller's lock_timeout on exit).
    wait_ms := pgfence._lock_wait_ms();
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: % waited % ms for the row lock of task % of lease %; blocked by %',
            pgfence._printable(p_operation), wait_ms, pgfence._printable(p_key), pgfence._printable(p_lease),
            pgfence._describe_backends(pgfence._task_lockers(p_lease, p_key))
            USING ERRCODE = 'PF003',
                  HINT = 'Another transaction writing this task or its effects stays open: let it finish and retry.';
    END;
    RETURN t;
END;
$function$
