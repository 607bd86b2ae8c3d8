-- pgfence._take_guard_lock as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._take_guard_lock(p_lease text, p_lock_key integer)
 RETURNS void
 LANGUAGE plpgsql
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    grace_ms bigint;
    victims  integer[];
    ended    text;
    wait_ms  bigint;
BEGIN
    -- Nobody holds the intent lock but a takeover (the caller's row lock keeps others out) and guards probing it
    -- for an instant, so this wait is short; bounded all the same.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), -p_lock_key) THEN
        wait_ms := pgfence._lock_wait_ms();
        BEGIN
            PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            PERFORM pg_catalog.pg_advisory_xact_lock(pgfence._guard_lock_class(), -p_lock_key);
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgfence: takeover of lease % waited % ms for its intent lock; held by %',
                pgfence._printable(p_lease), wait_ms,
                pgfence._describe_backends(pgfence._intent_lockers(p_lock_key, true))
                USING ERRCODE = 'PF003',
                      HINT = format('Only a takeover holds it for longer than an instant: a session holding advisory key (%s, -lock_key) outside pgfence blocks takeovers (see the hardened layout in docs/security.md).',
                                    pgfence._guard_lock_class());
        END;
    END IF;
    IF pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), p_lock_key) THEN
        RETURN;
    END IF;
    SELECT i.takeover_grace_ms INTO grace_ms FROM pgfence.instance i;
    BEGIN
        -- lock_timeout 0 would mean "wait forever".
        PERFORM set_config('lock_timeout', greatest(grace_ms, 1) || 'ms', true);
        PERFORM pg_catalog.pg_advisory_xact_lock(pgfence._guard_lock_class(), p_lock_key);
        RETURN;
    EXCEPTION WHEN lock_not_available THEN
        NULL;
    END;
    -- Signal the holders without waiting for them to exit (timeout 0) and queue again at once. A guard arriving
    -- meanwhile finds the intent lock taken and waits for this transaction to end; the later rounds are for a
    -- holder whose check came before our intent lock and whose guard lock came after the list was read.
    FOR round IN 1..3 LOOP
        victims := pgfence._guard_lockers(p_lock_key, true);
        ended := pgfence._describe_backends(victims);
        BEGIN
            PERFORM pg_catalog.pg_terminate_backend(v, 0) FROM unnest(victims) AS v;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'pgfence: takeover of lease % waited the % ms grace for guarded transactions of the ending tenure and may not end them: %',
                pgfence._printable(p_lease), grace_ms, ended
                USING ERRCODE = 'PF003',
                      HINT = 'Grant pg_signal_backend to the owner of the pgfence schema, or end those backends.';
        END;
        RAISE WARNING 'pgfence: takeover of lease % ended guarded transactions still open % ms into the grace: %',
            pgfence._printable(p_lease), grace_ms, ended;
        BEGIN
            -- A terminated backend exits and releases its locks within milliseconds.
            PERFORM set_config('lock_timeout', '1000ms', true);
            PERFORM pg_catalog.pg_advisory_xact_lock(pgfence._guard_lock_class(), p_lock_key);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    RAISE EXCEPTION 'pgfence: takeover of lease % still blocked after ending the holders of its guard lock; held by %',
        pgfence._printable(p_lease), pgfence._describe_backends(pgfence._guard_lockers(p_lock_key, true))
        USING ERRCODE = 'PF003';
END;
$function$
