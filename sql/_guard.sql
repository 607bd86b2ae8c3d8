-- pgfence._guard as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._guard(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text, p_key text)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    l   pgfence.leases;
    why text;
    pre record;
    secret_ok boolean;
    seen bigint;     -- the epoch the pre-check read
    kept text;
BEGIN
    -- What makes a presented epoch stale is permanent: epochs only grow, a released tenure stays released, an
    -- expired one can never be renewed and timelines only grow. (One conservative exception: a renewal that
    -- judged the tenure live just before its expiry and commits just after it extends a tenure that a guard
    -- reading in between refuses as 'expired'. Nobody could acquire meanwhile — the renewal holds the row — so
    -- this refuses a write that would have been safe, never the reverse.) So if even an unlocked read shows the epoch
    -- stale, it is stale for good: refusing it without the guard lock keeps a hammering stale holder off the
    -- lock that the current leader's writes share and that a takeover waits for. (Under READ COMMITTED the read
    -- is fresh, so 'future_epoch' too is decided: that epoch has not been issued.)
    -- First, before any read: under REPEATABLE READ or SERIALIZABLE even a refusal could misreport (an old
    -- snapshot's current epoch) or fail with a bare 40001 on the aggregated audit row.
    IF NOT pgfence._read_committed() THEN
        RAISE EXCEPTION 'pgfence: guarded writes need READ COMMITTED isolation; this transaction is %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'PF004',
                  HINT = 'Run the guarded write in a READ COMMITTED transaction (BEGIN ISOLATION LEVEL READ COMMITTED).';
    END IF;
    -- The pre-check, in one statement (each statement of a function costs an executor run): the role's grant on
    -- the cluster (the rule inlined here, not a call of _may_use: that would be a second executor run), the
    -- lease, the hash of its current tenure's secret and the WAL timeline.
    SELECT u.granted, pgfence._timeline() AS tl, x AS lease, s.epoch AS secret_epoch, s.hash AS secret_hash
      INTO pre
      FROM pgfence._grant_of(pgfence._cluster_of(p_lease)) AS u
      LEFT JOIN pgfence.leases x ON x.name = p_lease
      LEFT JOIN pgfence.tenure_secrets s ON s.lease = p_lease;
    IF NOT pre.granted THEN
        kept := pg_catalog.set_config(pgfence._known_slot(p_lease), '', false);
        RETURN pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'no_grant'::text, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    l := pre.lease;
    seen := l.epoch;
    why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), pre.tl);
    IF why IS NULL THEN
        -- A forged fence is refused before it takes the guard lock, like a stale one (a tenure's secret never
        -- changes, so the answer is final either way; NULL: the row names another epoch, decided after the lock).
        secret_ok := pgfence._secret_verdict(pre.secret_epoch, pre.secret_hash, p_epoch, p_secret) = 'ok';
        IF NOT secret_ok THEN
            why := 'bad_secret';
        END IF;
    END IF;
    IF why IS NOT NULL THEN
        kept := pg_catalog.set_config(pgfence._known_slot(p_lease), '', false);
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    -- The intent probe, then the guard lock shared, without waiting (_try_guard_lock, inlined: an expression, no
    -- call). From here the guard lock held makes every later takeover wait for this transaction (one whose intent
    -- lock fell between the probe and the try finds this write holding the guard lock and waits for it, like for
    -- any write past its check). Taken, or the guard lock not free: pgfence._await_takeover waits for the takeover
    -- to end, holding nothing meanwhile.
    IF NOT pgfence._try_guard_lock(l.lock_key) THEN
        PERFORM pgfence._await_takeover(p_lease, l.lock_key);
    END IF;
    -- A new statement, so a new snapshot under READ COMMITTED: every takeover that held the intent or the guard
    -- lock before we were granted the guard lock has committed (a transaction's locks are released after its
    -- commit is visible) and shows here. The verdict on it: the secret again only if the pre-check did not match
    -- it for the epoch the row still names (no cost to a write no takeover met).
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._verdict(l, p_epoch, p_secret, clock_timestamp(), pre.tl, CASE WHEN secret_ok THEN seen END);
    IF why IS NULL THEN
        -- For the rest of the transaction, raw writes of this tenure pass the raw-SQL enforcement. An assignment,
        -- not PERFORM: a plpgsql expression without an executor run.
        kept := pg_catalog.set_config(pgfence._fence_setting(l.lock_key), p_secret, true);
        -- The session remembers the lease's lock key for this epoch: its next writes take the fast path (_admit).
        kept := pg_catalog.set_config(pgfence._known_slot(p_lease),
                                      l.lock_key::text || ' ' || p_epoch::text || ' ' || p_lease, false);
        -- No write mark here: the guard runs before the write it admits, and only its caller knows whether a
        -- write happened (pgfence.fence marks; a task write is known by its event).
        RETURN NULL;
    END IF;
    -- Refused after the lock, which stays held to the end of the transaction: the marker _await_takeover reads
    -- when the same transaction calls a guard of this lease again. The session forgets the lease's lock key: its
    -- next write of this lease is judged by the unlocked pre-check first.
    kept := pg_catalog.set_config(pgfence._guard_held_setting(l.lock_key), 'on', true);
    kept := pg_catalog.set_config(pgfence._known_slot(p_lease), '', false);
    RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key);
END;
$function$
