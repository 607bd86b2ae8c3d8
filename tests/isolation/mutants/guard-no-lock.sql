-- MUTANT (never applied in the normal run; use PGFENCE_MUTANT_SQL=tests/isolation/mutants/guard-no-lock.sql or
-- run.sh --mutants): pgfence._guard without its guard lock. The two statements that take the lease's guard lock
-- SHARED (pg_try_advisory_xact_lock_shared, and _wait_guard_lock when that fails) are removed; everything else
-- is the migration's text. A guard then neither holds off a takeover nor waits for one: the isolation specs
-- about takeovers must fail.
CREATE OR REPLACE FUNCTION pgfence._guard(p_lease text, p_epoch bigint, p_operation text, p_table text, p_key text)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
DECLARE
    l   pgfence.leases;
    why text;
    tl  bigint := pgfence._timeline();
BEGIN
    -- What makes a presented epoch stale is permanent: epochs only grow, a released tenure stays released, an
    -- expired one can never be renewed and timelines only grow. So if even an unlocked read shows the epoch
    -- stale, it is stale for good: refusing it without the guard lock keeps a hammering stale holder off the
    -- lock that the current leader's writes share and that a takeover waits for. ('future_epoch' is the
    -- exception: an old snapshot may not show an epoch issued since.)
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why <> 'future_epoch' THEN
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: guarded writes need READ COMMITTED isolation; this transaction is %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'PF004',
                  HINT = 'Run the guarded write in a READ COMMITTED transaction (BEGIN ISOLATION LEVEL READ COMMITTED).';
    END IF;
    IF why IS NOT NULL THEN
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    -- (mutant: the guard lock is not taken)
    -- A new statement, so a new snapshot under READ COMMITTED: every takeover that held the exclusive lock before
    -- we were granted the shared one has committed (a transaction's locks are released after its commit is
    -- visible) and shows here.
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), tl);
    IF why IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key);
END;
$$;
