-- MUTANT 2 of the history checker's proof (tests/history.rs): acquisition without its exclusive lock.
--
-- pgfence._take_guard_lock and the trigger function pgfence._lease_change exactly as in
-- migrations/2026-11-30-000001_pgfence_core/up.sql, except that neither takes the lease's guard lock EXCLUSIVE:
-- _take_guard_lock returns at once, and the trigger (which would otherwise take the lock again on the lease row
-- UPDATE of acquire, release and force_release; in this migration it does so through _take_guard_lock, in
-- earlier ones with pg_advisory_xact_lock) no longer asks for it. Guards still take the lock SHARED, but no
-- change of who may write waits for guarded transactions already past their check: an acquisition commits while
-- such a transaction is open, and its write of the old epoch commits after the successor's acquisition
-- (invariant 3). Applied with PGFENCE_MUTANT_SQL=tests/mutants/acquire_without_exclusive_lock.sql.

CREATE OR REPLACE FUNCTION pgfence._take_guard_lock(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    grace_ms bigint;
    victims  integer[];
    ended    text;
BEGIN
    -- MUTANT: returns at once, without the exclusive guard lock (nothing below is ever reached).
    RETURN;
    IF pg_catalog.pg_try_advisory_xact_lock(1885824613, p_lock_key) THEN
        RETURN;
    END IF;
    SELECT i.takeover_grace_ms INTO grace_ms FROM pgfence.instance i;
    BEGIN
        -- lock_timeout 0 would mean "wait forever".
        PERFORM set_config('lock_timeout', greatest(grace_ms, 1) || 'ms', true);
        PERFORM pg_catalog.pg_advisory_xact_lock(1885824613, p_lock_key);
        RETURN;
    EXCEPTION WHEN lock_not_available THEN
        NULL;
    END;
    -- A guard that took the lock in the moment between two of our requests is ended too in the next round.
    FOR round IN 1..3 LOOP
        victims := pgfence._guard_lockers(p_lock_key, true);
        ended := pgfence._describe_backends(victims);
        BEGIN
            PERFORM pg_catalog.pg_terminate_backend(v, 1000) FROM unnest(victims) AS v;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'pgfence: takeover of lease % waited the % ms grace for guarded transactions of the ending tenure and may not end them: %',
                pgfence._printable(p_lease), grace_ms, ended
                USING ERRCODE = 'PF003',
                      HINT = 'Grant pg_signal_backend to the owner of the pgfence schema, or end those backends.';
        END;
        RAISE WARNING 'pgfence: takeover of lease % ended guarded transactions still open % ms into the grace: %',
            pgfence._printable(p_lease), grace_ms, ended;
        BEGIN
            PERFORM set_config('lock_timeout', '1000ms', true);
            PERFORM pg_catalog.pg_advisory_xact_lock(1885824613, p_lock_key);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    RAISE EXCEPTION 'pgfence: takeover of lease % still blocked after ending the holders of its guard lock; held by %',
        pgfence._printable(p_lease), pgfence._describe_backends(pgfence._guard_lockers(p_lock_key, true))
        USING ERRCODE = 'PF003';
END;
$$;

CREATE OR REPLACE FUNCTION pgfence._lease_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'pgfence: lease rows are never deleted (their epochs must keep increasing)'
            USING ERRCODE = 'PF005';
    END IF;
    IF NEW.epoch < OLD.epoch OR NEW.name <> OLD.name OR NEW.lock_key <> OLD.lock_key THEN
        RAISE EXCEPTION 'pgfence: refused change of lease %: epochs never go down, names and lock keys never change',
            pgfence._printable(OLD.name) USING ERRCODE = 'PF005';
    END IF;
    -- MUTANT: the exclusive guard lock is not taken here (PERFORM pgfence._take_guard_lock(OLD.name, OLD.lock_key)).
    RETURN NEW;
END;
$$;
