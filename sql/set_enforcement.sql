-- pgfence.set_enforcement as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.set_enforcement(p_on boolean, p_mode text DEFAULT 'error'::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    t text;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    PERFORM pgfence._require_instance_operator('set_enforcement'::text);
    IF p_mode IS NULL OR p_mode NOT IN ('error', 'audit') THEN
        RAISE EXCEPTION 'pgfence: enforcement mode must be ''error'' or ''audit'', got %', pgfence._printable(p_mode)
            USING ERRCODE = '22023', COLUMN = 'mode';
    END IF;
    -- Raw writes to the task tables are left to granted roles only while enforcement judges them: hardened for
    -- the state being switched to (before the table locks, which hold guarded writes off).
    PERFORM pgfence._harden(p_on);
    -- Lock both task tables up front, in the order readers join them (tasks, then task_events).
    LOCK TABLE pgfence.tasks, pgfence.task_events IN SHARE ROW EXCLUSIVE MODE;
    FOREACH t IN ARRAY ARRAY['leases', 'tenures', 'tenure_secrets', 'beliefs', 'write_marks', 'rejections', 'grants', 'instance', 'effects', 'effect_reports'] LOOP
        EXECUTE format('ALTER TABLE pgfence.%I %s TRIGGER enforce_owner', t,
                       CASE WHEN p_on THEN 'ENABLE' ELSE 'DISABLE' END);
    END LOOP;
    ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_epoch;
    ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_audit;
    ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_truncate;
    ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_epoch;
    ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_audit;
    IF p_on AND p_mode = 'error' THEN
        ALTER TABLE pgfence.tasks ENABLE TRIGGER enforce_epoch;
        ALTER TABLE pgfence.task_events ENABLE TRIGGER enforce_epoch;
    ELSIF p_on THEN
        ALTER TABLE pgfence.tasks ENABLE TRIGGER enforce_audit;
        ALTER TABLE pgfence.task_events ENABLE TRIGGER enforce_audit;
    END IF;
    IF p_on THEN
        ALTER TABLE pgfence.tasks ENABLE TRIGGER enforce_truncate;
    END IF;
    RETURN p_on;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: set_enforcement waited % ms for a table lock; blocked by %', wait_ms,
        pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'A long transaction on pgfence tables holds them: let it finish and retry.';
END;
$function$
