-- pgfence._lease_change as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._lease_change()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'pgfence: lease rows are never deleted (their epochs must keep increasing)'
            USING ERRCODE = 'PF005';
    END IF;
    IF NEW.epoch < OLD.epoch OR NEW.name <> OLD.name OR NEW.lock_key <> OLD.lock_key THEN
        RAISE EXCEPTION 'pgfence: refused change of lease %: epochs never go down, names and lock keys never change',
            pgfence._printable(OLD.name) USING ERRCODE = 'PF005';
    END IF;
    -- Bounded like a takeover: the grace, then the guard holders are ended (a no-op re-grant for the functions,
    -- which took the lock already).
    PERFORM pgfence._take_guard_lock(OLD.name, OLD.lock_key);
    RETURN NEW;
END;
$function$
