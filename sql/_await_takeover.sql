-- pgfence._await_takeover as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._await_takeover(p_lease text, p_lock_key integer)
 RETURNS void
 LANGUAGE plpgsql
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    wait_ms  bigint := pgfence._lock_wait_ms();
    deadline timestamptz := clock_timestamp() + wait_ms * interval '1 millisecond';
    left_ms  bigint;
    got      boolean := false;
BEGIN
    IF (coalesce(current_setting(pgfence._fence_setting(p_lock_key), true), '') <> ''
        OR coalesce(current_setting(pgfence._guard_held_setting(p_lock_key), true), '') <> '')
       AND pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), p_lock_key) THEN
        RETURN;
    END IF;
    LOOP
        left_ms := ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000)::bigint;
        IF left_ms < 1 THEN
            RAISE EXCEPTION USING ERRCODE = 'lock_not_available';
        END IF;
        PERFORM set_config('lock_timeout', left_ms || 'ms', true);
        BEGIN
            -- The takeover's end: the intent lock shared, given back as this block is rolled back.
            PERFORM pg_catalog.pg_advisory_xact_lock_shared(pgfence._guard_lock_class(), -p_lock_key);
            RAISE EXCEPTION USING ERRCODE = 'PF900';
        EXCEPTION WHEN SQLSTATE 'PF900' THEN
            NULL;
        END;
        BEGIN
            -- The guard lock shared, kept (this block commits into the transaction) only if no takeover has
            -- begun since: the intent probe of _guard (CASE: its two calls run in this order, both or none).
            got := pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), p_lock_key);
            IF got THEN
                got := CASE WHEN pg_catalog.pg_try_advisory_lock_shared(pgfence._guard_lock_class(), -p_lock_key)
                            THEN pg_catalog.pg_advisory_unlock_shared(pgfence._guard_lock_class(), -p_lock_key)
                            ELSE false END;
                IF NOT got THEN
                    RAISE EXCEPTION USING ERRCODE = 'PF900';
                END IF;
            END IF;
        EXCEPTION WHEN SQLSTATE 'PF900' THEN
            got := false;
        END;
        EXIT WHEN got;
        -- Not free although the intent lock was: a takeover between its commit's lock releases, or a session
        -- holding the guard key exclusive outside pgfence (docs/security.md). Do not spin.
        PERFORM pg_catalog.pg_sleep(0.001);
    END LOOP;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: guarded write on lease % waited % ms for a takeover in flight to end; held by %; guard lock held by %',
        pgfence._printable(p_lease), wait_ms,
        pgfence._describe_backends(pgfence._intent_lockers(p_lock_key, true)),
        pgfence._describe_backends(pgfence._guard_lockers(p_lock_key, true))
        USING ERRCODE = 'PF003',
              HINT = 'A takeover of this lease is in flight; it waits for guarded transactions left open (at most the takeover grace, then it ends them).';
END;
$function$
