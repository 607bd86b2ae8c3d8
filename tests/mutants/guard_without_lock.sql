-- MUTANT 1 of the history checker's proof (tests/history.rs): the guard without its lock.
--
-- pgfence._guard exactly as in migrations/2026-11-30-000001_pgfence_core/up.sql, except that it no longer takes
-- the lease's guard lock SHARED before re-reading the lease row (the pg_try_advisory_xact_lock_shared /
-- pgfence._wait_guard_lock step is removed). The epoch check still runs, twice, but nothing holds a takeover off
-- until the guarded transaction ends: an acquisition can commit between the check and the write's commit, and
-- the write of the old epoch then commits after its successor's acquisition (invariant 3).
-- Applied with PGFENCE_MUTANT_SQL=tests/mutants/guard_without_lock.sql.

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
    -- lock that the current leader's writes share and that a takeover waits for. (Under READ COMMITTED the read
    -- is fresh, so 'future_epoch' too is decided: that epoch has not been issued.)
    -- First, before any read: under REPEATABLE READ or SERIALIZABLE even a refusal could misreport (an old
    -- snapshot's current epoch) or fail with a bare 40001 on the aggregated audit row.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: guarded writes need READ COMMITTED isolation; this transaction is %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'PF004',
                  HINT = 'Run the guarded write in a READ COMMITTED transaction (BEGIN ISOLATION LEVEL READ COMMITTED).';
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL THEN
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    -- MUTANT: the guard lock is not taken SHARED here (pg_try_advisory_xact_lock_shared, _wait_guard_lock).
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
