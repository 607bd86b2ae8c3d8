-- pgfence migration 3 of 6, the guard: _guard and its slow path (_await_takeover), pgfence.fence for a
-- caller's own transaction, the safety net of the one-statement guarded write (ungated_write), the raw-SQL
-- enforcement (its triggers and switch) and the audit's retention (prune_rejections).
-- Called from Rust by src/fence/ (Store::fenced and Store::guarded_write send pgfence.fence), src/admin.rs
-- (set_enforcement, enforcement, prune_rejections) and src/audit.rs (Store::rejections reads pgfence.rejections); src/tasks.rs's functions
-- (000004_tasks) call _guard. set_enforcement calls pgfence._harden (000006_roles) when it runs.

-- ---------------------------------------------------------------------------------------------------------
-- The guard.

-- The slow path of a guard: a takeover of the lease is in flight (its intent lock is taken) or the guard lock is
-- not free at once. A transaction that already holds the lease's guard lock (an earlier guarded write of this
-- lease in it) is in flight: it goes on and is judged on a fresh read, and the takeover waits for it as for every
-- holder. (It is known by the marker its guard left — the tenure's secret setting on acceptance,
-- pgfence.guard_held_<lock key> on a refusal after the lock — and a try of the guard lock, which succeeds at once
-- for a holder: a marker a session set itself is only a hint, and never lets a write in without the guard lock.)
-- Any other waits for the takeover to end: it takes the intent lock shared and gives it back at once (rolling back
-- the block that took it), so it holds nothing while it waits and never delays the takeover; then it tries the
-- guard lock shared without waiting (every holder of, or waiter for, the guard lock exclusive is a takeover
-- holding the intent lock) and keeps it only if no takeover has begun since (the intent probe); otherwise it waits
-- again. So a write arriving during a takeover, in whatever phase the takeover is (queued for the guard lock, in
-- the grace, ending the holders, queued again), is judged on a read after the takeover committed or gave up:
-- refused with the reason the takeover leaves (superseded, released), or accepted if it gave up; and it never
-- holds the guard lock while the takeover could end its holders. Waits at most _lock_wait_ms() in all, then fails
-- with PF003 naming the takeover.
CREATE FUNCTION pgfence._await_takeover(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
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
$$;

-- The name of the transaction-local setting in which pgfence.fence leaves the presented secret for the raw-SQL
-- enforcement triggers (per lease: one transaction may be fenced by several leases).
-- (This and the other small SQL helpers of the guard below name every function, operator and type qualified: the
-- guard's SQL shape inlines them under its caller's search_path; see pgfence._install_guard.)
CREATE FUNCTION pgfence._fence_setting(p_lock_key integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgfence.tenure_secret_' OPERATOR(pg_catalog.||) p_lock_key::pg_catalog.text
$$;

-- Whether the transaction runs under READ COMMITTED, the one isolation every guard decides under: each statement
-- reads a new snapshot, so the read after the guard lock sees every takeover that committed before the lock was
-- granted; under REPEATABLE READ or SERIALIZABLE the transaction's snapshot may predate it. (An SQL function,
-- inlined where it is used: each guard raises its own PF004.)
CREATE FUNCTION pgfence._read_committed() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
$$;

-- The name of the transaction-local setting a guard leaves when it holds the lease's guard lock without having
-- accepted the write (the marker by which _await_takeover knows the transaction holds the lock).
CREATE FUNCTION pgfence._guard_held_setting(p_lock_key integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgfence.guard_held_' OPERATOR(pg_catalog.||) p_lock_key::pg_catalog.text
$$;

-- ---------------------------------------------------------------------------------------------------------
-- The guard's fast path (_admit): the common case — a live tenure presented with its secret by a granted role, on
-- the current timeline, no takeover in flight — decided by the guard lock and ONE read, with nothing else around
-- them. Anything else (a refusal, a takeover in flight, a first write) is left to the full guard (_guard), which
-- decides it exactly as before; so the fast path can only admit what _guard admits, never refuse.
--
-- What a session remembers (pgfence.known_<slot>, one of 16 session settings by a hash of the lease name): the
-- lease's guard lock key, for the epoch _guard last admitted in this session — "<lock_key> <epoch> <lease>". It
-- lets the fast path take the guard lock BEFORE its read, so the read itself is the fresh one (no unlocked
-- pre-read). It is only a hint: the read checks that the lease's lock key is the one remembered (a lease's lock key
-- never changes and is never reused), and re-checks everything a write needs — the epoch, held, unexpired, the
-- timeline, the secret's hash and the grant — on that fresh row. A forged or stale memory can make a session take
-- the shared guard lock of a lease it has no business with (any role can take any advisory lock anyway) and then
-- fall back to _guard; it can never admit a write. Nothing about the secret, the grant or the timeline is
-- remembered: session settings are writable by the session's own role, so a remembered verdict could be forged.
-- It is forgotten (superseded) when _guard admits another epoch of a lease in the same slot, and cleared when
-- _guard refuses a write of that lease, so a superseded holder takes the lock at most once more before it is kept
-- off it again by _guard's unlocked pre-check.

-- The session setting that remembers a lease's guard lock key (see above).
CREATE FUNCTION pgfence._known_slot(p_lease text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgfence.known_' OPERATOR(pg_catalog.||)
           (pg_catalog.hashtext(p_lease) OPERATOR(pg_catalog.&) 15)::pg_catalog.text
$$;

-- The guard lock of a lease, taken SHARED without waiting and only if no takeover of the lease is in flight: a
-- takeover holds the intent lock (_guard_lock_class(), -lock_key) exclusive from its start to its end; the probe takes it
-- shared and gives it back in the same expression (CASE fixes the order; no interrupt is served between the two
-- calls, so the session-level lock cannot be left behind). Free: no takeover had started at the probe, and from
-- there the guard lock held makes every later takeover wait for this transaction. Taken, or the guard lock not
-- free (a takeover holds or waits for it; a try-lock fails behind a queued request, so this is fair): false, and
-- nothing is held. (IS TRUE: a NULL could only ever mean "not taken".) An SQL function, inlined where it is used.
CREATE FUNCTION pgfence._try_guard_lock(p_lock_key integer) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT (CASE WHEN pg_catalog.pg_try_advisory_lock_shared(pgfence._guard_lock_class(),
                                                             OPERATOR(pg_catalog.-) p_lock_key)
                 THEN CASE WHEN pg_catalog.pg_advisory_unlock_shared(pgfence._guard_lock_class(),
                                                                     OPERATOR(pg_catalog.-) p_lock_key)
                           THEN pg_catalog.pg_try_advisory_xact_lock_shared(pgfence._guard_lock_class(), p_lock_key) END
                 ELSE false END) IS TRUE
$$;

-- The fast path's one read, on a snapshot taken after the guard lock: whether tenure (p_lease, p_epoch) with
-- p_secret is admitted — the lease's lock key is p_lock_key (the one locked), and the verdict's three parts pass:
-- the tenure is live at p_now on timeline p_timeline (_loss_reason), p_secret is its secret (_secret_verdict) and
-- the session's login role may use the lease's cluster (_grant_of, told the owner: this runs as the owner of the
-- pgfence functions, so current_user is it) — and, when p_mark, the session's write mark of this tenure for this
-- second if it has not been recorded yet (NULL otherwise; see pgfence.fence). Nothing of the rule is restated
-- here: the three are SQL functions the planner inlines into this statement. A set-returning SQL function so that
-- the statement naming it in its FROM clause gets it inlined too: one executor run. No row: the lease does not
-- exist.
CREATE FUNCTION pgfence._admits(p_lease text, p_epoch bigint, p_secret text, p_lock_key integer, p_now timestamptz,
                                p_timeline bigint, p_mark boolean)
RETURNS TABLE (admitted boolean, mark text)
LANGUAGE sql STABLE AS $$
    SELECT l.lock_key = p_lock_key
           AND pgfence._loss_reason(l, NULL::text, p_epoch, p_now, p_timeline) IS NULL
           AND pgfence._secret_verdict(s.epoch, s.hash, p_epoch, p_secret) = 'ok'
           AND u.granted,
           CASE WHEN p_mark THEN NULLIF(m.mark, pg_catalog.current_setting('pgfence.write_mark', true)) END
      FROM pgfence.leases l
      JOIN pgfence.tenure_secrets s ON s.lease = l.name
     CROSS JOIN pgfence._grant_of(pgfence._cluster_of(p_lease), false, current_user) u,
           LATERAL (SELECT p_epoch::text || ':' || pg_catalog.date_part('epoch', p_now)::bigint::text || ':'
                           || p_lease AS mark) m
     WHERE l.name = p_lease
$$;

-- The verdict of a guard on l, the lease row it read after its guard lock was granted (in a statement of its own,
-- so under READ COMMITTED on a new snapshot, in which every takeover that held the intent or the guard lock before
-- has committed; all NULL when there is no such lease): why tenure (l.name, p_epoch) may not write at p_now on
-- timeline p_timeline, NULL when it may — its loss reason, else 'bad_secret' when p_secret is not the secret of
-- the lease's current tenure. The secret is not checked again when the row still names p_matched_epoch, the
-- epoch whose secret the caller matched p_secret with before the lock (a tenure's secret never changes; NULL: none
-- matched). When a takeover committed between that match and the read, tenure_secrets names the new epoch and
-- the old secret is refused too: a second check of what _loss_reason decides (an error in its epoch comparison
-- would be refused as bad_secret, not let through). Both guards decide by it: _guard and the raw-SQL enforcement
-- (_enforce_epoch). An SQL expression, inlined where it is used (no call); _secret_check runs only when the
-- secret is checked.
CREATE FUNCTION pgfence._verdict(l pgfence.leases, p_epoch bigint, p_secret text, p_now timestamptz,
                                 p_timeline bigint, p_matched_epoch bigint)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(pgfence._loss_reason(l, NULL::text, p_epoch, p_now, p_timeline),
                    CASE WHEN l.epoch IS DISTINCT FROM p_matched_epoch
                              AND pgfence._secret_check(l.name, p_epoch, p_secret) IS DISTINCT FROM 'ok'
                         THEN 'bad_secret' END)
$$;

-- The write mark (pgfence.write_marks: see the table for what a mark stands for): the session's first admitted
-- write of tenure (p_lease, p_epoch) in each second, by the clock after the guard admitted it, is recorded in the
-- transaction of the write; p_mark is the text that names that second (_admits'), remembered by the session so
-- its other writes of that second record nothing. Returns true (the guard's SQL shape calls it inside a CASE);
-- its search_path pinned, as that shape calls it under its caller's.
CREATE FUNCTION pgfence._mark(p_lease text, p_epoch bigint, p_mark text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    kept text;
BEGIN
    INSERT INTO pgfence.write_marks AS m (lease, epoch, backend, last_at)
    VALUES (p_lease, p_epoch, pg_catalog.pg_backend_pid(), clock_timestamp())
    ON CONFLICT (lease, epoch, backend) DO UPDATE SET last_at = greatest(m.last_at, EXCLUDED.last_at);
    kept := pg_catalog.set_config('pgfence.write_mark', p_mark, false);
    RETURN true;
END;
$$;

-- The fast path: true when the write of tenure (p_lease, p_epoch) presented with p_secret is admitted — its guard
-- lock held shared to the end of the transaction, the secret left for the raw-SQL enforcement (see _guard) and,
-- when p_mark, the write marked. False when the fast path cannot decide: the caller runs _guard, which decides.
-- Under any isolation but READ COMMITTED it does not even lock (a read's snapshot could predate a takeover):
-- _guard raises PF004. When it took the guard lock and then could not admit, it leaves the marker by which
-- _await_takeover knows the transaction holds the lock.
CREATE FUNCTION pgfence._admit(p_lease text, p_epoch bigint, p_secret text, p_mark boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    known text := pg_catalog.current_setting(pgfence._known_slot(p_lease), true);
    tail  text := ' ' || p_epoch::text || ' ' || p_lease;
    k     integer;
    now   timestamptz;
    tl    bigint;
    r     record;
    kept  text;
BEGIN
    -- "<lock_key> <epoch> <lease>" for this lease and epoch, with a lock key of 1 to 9 digits; else nothing known.
    k := CASE WHEN right(known, length(tail)) = tail AND length(known) - length(tail) BETWEEN 1 AND 9
                   AND ltrim(left(known, length(known) - length(tail)), '0123456789') = ''
              THEN left(known, length(known) - length(tail))::integer END;
    IF k IS NULL OR NOT pgfence._read_committed()
       OR NOT pgfence._try_guard_lock(k) THEN
        RETURN false;
    END IF;
    -- A new statement after the lock, so a new snapshot under READ COMMITTED: every takeover that held the intent
    -- or the guard lock before the lock was granted has committed and shows here. (The clock and the timeline are
    -- read into variables so that _admits is inlined.)
    now := clock_timestamp();
    tl := pgfence._timeline();
    SELECT a.admitted, a.mark INTO r FROM pgfence._admits(p_lease, p_epoch, p_secret, k, now, tl, p_mark) a;
    IF r.admitted THEN
        kept := pg_catalog.set_config(pgfence._fence_setting(k), p_secret, true);
        IF r.mark IS NOT NULL THEN
            PERFORM pgfence._mark(p_lease, p_epoch, r.mark);
        END IF;
        RETURN true;
    END IF;
    kept := pg_catalog.set_config(pgfence._guard_held_setting(k), 'on', true);
    RETURN false;
END;
$$;

-- The full guard: every write the fast path (_admit) does not admit, and every refusal.
-- Checks that the session's role may use p_lease's cluster, that p_epoch is the current, held, unexpired epoch
-- of p_lease, granted on the current timeline, and that p_secret is its tenure's secret; and keeps the lease's
-- guard lock SHARED until the end of the calling transaction, so no takeover can commit before the caller's
-- write. Returns NULL when all holds; otherwise records the refusal and returns the 'refused' result.
-- Needs READ COMMITTED (PF004 otherwise): under REPEATABLE READ or SERIALIZABLE the transaction's snapshot may
-- predate a takeover that committed before the lock was granted.
CREATE FUNCTION pgfence._guard(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text,
                               p_key text)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
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
$$;

-- The guard for a caller's own transaction (the generic fenced transaction):
--   BEGIN; SELECT outcome FROM pgfence.fence('prod/scheduler', 7, '<secret>', 'rebalance', NULL, NULL);
--   ... your writes, only if 'ok' ...; COMMIT;
-- On 'refused' the refusal row is already written: COMMIT (not ROLLBACK) to keep it. On 'ok' the secret is also
-- kept for the rest of the transaction (a transaction-local setting of this session), so raw writes to
-- pgfence.tasks and pgfence.task_events pass the raw-SQL enforcement; and the admitted write is marked
-- (pgfence.write_marks: see the table for what a mark stands for). Every argument is required (the operation
-- label, the target table and key of the audit: NULL when there is none): no shorter argument list resolves to
-- it, so a call written for an older signature fails (42883) instead of presenting a label as the secret.
--
-- pgfence.fence comes in two shapes with one verdict, installed by pgfence._install_guard (below): the fast path
-- (_admit's) in plpgsql, or in one SQL function. Both hand everything but the fast path's admission to
-- pgfence._fence_slow, which decides as _guard does; the labels are checked first by both (_check_labels).

-- The labels of a guarded write: 22023 naming the argument when one is not a valid label, else true (called only
-- when the cheap test, _plain_labels, did not pass them). Its search_path pinned: the SQL shape of pgfence.fence
-- calls it under its caller's.
CREATE FUNCTION pgfence._check_labels(p_operation text, p_table text, p_key text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
BEGIN
    problem := coalesce(pgfence._arg_problem('operation'::text, p_operation, pgfence._max_label_len()),
                        pgfence._arg_problem('target table'::text, p_table, pgfence._max_label_len(),
                                             p_optional => true),
                        pgfence._arg_problem('target key'::text, p_key, pgfence._max_holder_len(),
                                             p_optional => true));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    RETURN true;
END;
$$;

-- pgfence.fence past its fast path (labels already checked): the lease arguments and the secret checked, then the
-- full guard (_guard), which decides; an admitted write is marked. Its search_path pinned: the SQL shape of
-- pgfence.fence calls it under its caller's. Runs as the owner only inside pgfence.fence (SECURITY INVOKER: a
-- direct call by another role could not read the tables).
CREATE FUNCTION pgfence._fence_slow(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text,
                                    p_key text)
RETURNS pgfence.write_result
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    mark text;
    r pgfence.write_result;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND p_secret IS NOT NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch), pgfence._secret_problem(p_secret));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem
                USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
        END IF;
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    -- The write mark (see _mark), as the fast path leaves it.
    mark := p_epoch::text || ':' || pg_catalog.date_part('epoch', clock_timestamp())::bigint::text || ':'
            || p_lease;
    IF mark IS DISTINCT FROM pg_catalog.current_setting('pgfence.write_mark', true) THEN
        PERFORM pgfence._mark(p_lease, p_epoch, mark);
    END IF;
    RETURN ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.write_result;
END;
$$;

-- Installs pgfence.fence in the shape p_shape ('plpgsql' or 'sql'; NULL: the fastest the server supports) and
-- returns the shape installed. Idempotent: a pgfence.fence already of that shape is left as it is. Called by this
-- migration and by every migrate (Store::migrate, `pgfence migrate`), so a server upgraded to 18 gets the SQL
-- shape at its next migrate; an operator may call it (as the schema owner) at any time. CREATE OR REPLACE keeps
-- the function's identity and privileges.
--   'plpgsql' (PostgreSQL 17 and older): SECURITY DEFINER with search_path pinned; the fast path is _admit. Those
--             servers plan a SQL function's statements on every call, which costs more than plpgsql's cached
--             plans and the pinned search_path together.
--   'sql'     (PostgreSQL 18, server_version_num >= 180000, which keeps a SQL function's plans in its plan
--             cache): one SECURITY DEFINER SQL function of two statements without a SET clause (whose save and
--             restore of the setting costs on every call). Its defence against a hostile search_path is that
--             every function, operator, type and table it names — and every one named by the helpers it inlines
--             (_plain_labels, _read_committed, _try_guard_lock, _guard_lock_class, _timeline, _fence_setting,
--             _guard_held_setting, _known_slot, _max_*_len) — is qualified; what it calls and does not inline
--             (_check_labels, _mark, _fence_slow) pins its own. Its first statement takes the guard lock as _admit
--             does (when the labels are plain, under READ COMMITTED, for the lock key the session remembers for
--             this epoch), and leaves whether it did in the transaction-local setting pgfence.fast_lock (written
--             on every call, so a value set beforehand is never read); the second, on a new snapshot (each
--             statement of a VOLATILE SQL function takes one, as plpgsql's do), reads the lease, its secret's hash
--             and the grants, decides as _admits does — written out here with qualified operators, with the
--             conditions stated positively so that a NULL never admits — and either admits (the secret left for
--             the raw-SQL enforcement, the write marked) or leaves the marker of a held guard lock and hands the
--             call to _fence_slow. The differential test runs every shape through the verdict's truth table
--             (tests/native/differential.rs).
CREATE FUNCTION pgfence._install_guard(p_shape text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shape text := coalesce(p_shape, CASE WHEN current_setting('server_version_num')::integer >= 180000
                                         THEN 'sql' ELSE 'plpgsql' END);
    installed text;
BEGIN
    IF shape NOT IN ('plpgsql', 'sql') THEN
        RAISE EXCEPTION 'pgfence: the guard''s shape is ''plpgsql'' or ''sql'', not %', pgfence._printable(shape)
            USING ERRCODE = '22023';
    END IF;
    SELECT l.lanname INTO installed
      FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
     WHERE p.oid = to_regprocedure('pgfence.fence(text, bigint, text, text, text, text)');
    IF installed IS NOT DISTINCT FROM shape THEN
        RETURN shape;
    END IF;
    IF shape = 'plpgsql' THEN
        EXECUTE $shape$
CREATE OR REPLACE FUNCTION pgfence.fence(p_lease text, p_epoch bigint, p_secret text, p_operation text,
                                         p_table text, p_key text)
RETURNS pgfence.write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
BEGIN
    -- The labels first, by the cheap test (the lease and the epoch need none on the fast path: it admits only
    -- the name and the epoch of a held tenure, which were checked when it was acquired).
    IF pgfence._plain_labels(p_operation, p_table, p_key) IS NOT TRUE THEN
        PERFORM pgfence._check_labels(p_operation, p_table, p_key);
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, true) THEN
        RETURN ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL,
                   NULL)::pgfence.write_result;
    END IF;
    RETURN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
END;
$fence$
$shape$;
    ELSE
        EXECUTE $shape$
CREATE OR REPLACE FUNCTION pgfence.fence(p_lease text, p_epoch bigint, p_secret text, p_operation text,
                                         p_table text, p_key text)
RETURNS pgfence.write_result
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fence$
-- 1. The guard lock, for the lock key the session remembers for this lease and epoch ("<lock_key> <epoch>
--    <lease>" in its _known_slot, 1 to 9 digits), when the labels pass (else 22023) and the isolation is READ
--    COMMITTED; pgfence.fast_lock says whether it was taken ('' when not).
SELECT pg_catalog.set_config('pgfence.fast_lock',
           CASE WHEN ((pgfence._plain_labels(p_operation, p_table, p_key)
                       OR pgfence._check_labels(p_operation, p_table, p_key))
                      AND pgfence._read_committed()) IS NOT TRUE
                     OR k.k IS NULL
                THEN ''
                WHEN pgfence._try_guard_lock(k.k) THEN k.k::pg_catalog.text
                ELSE '' END,
           true)
  FROM (SELECT CASE WHEN m.known OPERATOR(pg_catalog.=)
                             (m.prefix OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_epoch::pg_catalog.text
                              OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_lease)
                         AND pg_catalog.octet_length(m.prefix) OPERATOR(pg_catalog.>=) 1
                         AND pg_catalog.octet_length(m.prefix) OPERATOR(pg_catalog.<=) 9
                         AND pg_catalog.ltrim(m.prefix, '0123456789') OPERATOR(pg_catalog.=) ''
                    THEN m.prefix::integer END AS k
          FROM (SELECT s.known, pg_catalog.split_part(s.known, ' ', 1) AS prefix
                  FROM (SELECT pg_catalog.current_setting(pgfence._known_slot(p_lease), true) AS known
                        OFFSET 0) s
                OFFSET 0) m
        OFFSET 0) k;
-- 2. On a new snapshot, taken after the lock: the verdict of _admits on the lease's row, its secret's hash and
--    the grants; admitted, or the marker of the held lock and the full guard.
SELECT CASE
           WHEN x.k IS NULL
               THEN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key)
           WHEN a.admitted IS NOT TRUE
               THEN CASE WHEN pg_catalog.set_config(pgfence._guard_held_setting(x.k), 'on', true) IS NOT NULL
                         THEN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key) END
           WHEN pg_catalog.set_config(pgfence._fence_setting(x.k), p_secret, true) IS NULL
               THEN NULL
           WHEN a.mark IS NOT NULL AND pgfence._mark(p_lease, p_epoch, a.mark) IS NOT TRUE
               THEN NULL
           ELSE ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL,
                    NULL)::pgfence.write_result
       END
  FROM (SELECT CASE WHEN pg_catalog.current_setting('pgfence.fast_lock') OPERATOR(pg_catalog.<>) ''
                    THEN pg_catalog.current_setting('pgfence.fast_lock')::integer END AS k
          OFFSET 0) x
  LEFT JOIN LATERAL (
      SELECT l.lock_key OPERATOR(pg_catalog.=) x.k
             -- _loss_reason(l, NULL, p_epoch, now, timeline) IS NULL:
             AND l.epoch OPERATOR(pg_catalog.=) p_epoch
             AND l.state OPERATOR(pg_catalog.<>) 'released'
             AND l.timeline OPERATOR(pg_catalog.>=) t.tl
             AND l.expires_at OPERATOR(pg_catalog.>) t.now
             -- _secret_verdict(s.epoch, s.hash, p_epoch, p_secret) = 'ok':
             AND s.epoch OPERATOR(pg_catalog.=) p_epoch
             AND pg_catalog.length(p_secret) OPERATOR(pg_catalog.<=) 128
             AND s.hash OPERATOR(pg_catalog.=) pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8'))
             -- _grant_of(_cluster_of(p_lease), false, current_user): the owner's members, or a grant row.
             AND (pg_catalog.pg_has_role(session_user, current_user, 'MEMBER')
                  OR EXISTS (SELECT FROM pgfence.grants g
                              WHERE (g.cluster OPERATOR(pg_catalog.=) pg_catalog.split_part(p_lease, '/', 1)
                                     OR g.cluster IS NULL)
                                AND pg_catalog.pg_has_role(session_user, g.role::pg_catalog.oid, 'MEMBER')))
             AS admitted,
             -- The write mark of this second, unless the session recorded it already (_mark).
             CASE WHEN t.mark OPERATOR(pg_catalog.=) pg_catalog.current_setting('pgfence.write_mark', true)
                  THEN NULL ELSE t.mark END AS mark
        FROM pgfence.leases l
        JOIN pgfence.tenure_secrets s ON s.lease OPERATOR(pg_catalog.=) l.name,
             (SELECT c.now, pgfence._timeline() AS tl,
                     p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ':'
                     OPERATOR(pg_catalog.||) pg_catalog.date_part('epoch', c.now)::bigint::pg_catalog.text
                     OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) p_lease AS mark
                FROM (SELECT pg_catalog.clock_timestamp() AS now OFFSET 0) c OFFSET 0) t
       WHERE l.name OPERATOR(pg_catalog.=) p_lease AND x.k IS NOT NULL) a ON true
$fence$
$shape$;
    END IF;
    RETURN shape;
END;
$$;

SELECT pgfence._install_guard();

-- The safety net of the one-statement guarded write (Store::guarded_write; see pgfence.fence above): the caller's
-- statement changed rows although its guard refused, so its SQL does not test pgfence_guard.passed. Raising
-- rolls the whole statement back, the refusal's audit row with it: a refused write never commits, and the caller
-- learns that its statement is not gated (SQLSTATE PF006).
CREATE FUNCTION pgfence.ungated_write(p_outcome text, p_written bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: a guarded write changed % rows although its guard answered %: the statement does not test pgfence_guard.passed',
        p_written, pgfence._printable(p_outcome)
        USING ERRCODE = 'PF006',
              HINT = 'Add AND (SELECT passed FROM pgfence_guard) to its WHERE clause (INSERT: INSERT ... SELECT ... WHERE it).';
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Raw-SQL enforcement (off by default; `SELECT pgfence.set_enforcement(true)`): every INSERT or UPDATE of
-- pgfence.tasks must carry the lease's current epoch in `fence`, every INSERT into pgfence.task_events in
-- `epoch` (and name its task's lease), in a transaction that presented that tenure's secret to pgfence.fence
-- (or another guarded function) first; DELETE/TRUNCATE of tasks and moving a task to another lease are
-- refused; and every other pgfence table (leases, tenures, tenure_secrets, beliefs, write_marks, rejections,
-- grants, instance, effects, effect_reports) may be written only by the schema owner — that is, through the pgfence functions — whatever
-- table privileges a role was given. The pgfence functions satisfy this by construction. Two modes for the task tables:
--   'error': the statement fails with SQLSTATE PF001 (its transaction aborts, so nothing can be recorded);
--   'audit': the offending row is skipped, the refusal is recorded in pgfence.rejections (operation
--            'raw_insert' / 'raw_update' / 'raw_delete') and a WARNING tells the client.
-- TRUNCATE is always refused with an error (a statement-level trigger cannot skip rows).

CREATE FUNCTION pgfence._enforce_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    presented bigint;
    target    text;
    key       text;
    l   pgfence.leases;
    why text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses TRUNCATE on pgfence.%', TG_TABLE_NAME USING ERRCODE = 'PF001';
    END IF;
    -- Separate statements per table: plpgsql plans each one against NEW's row type when it first runs.
    IF TG_TABLE_NAME = 'tasks' AND TG_OP = 'DELETE' THEN
        target := OLD.lease; presented := OLD.fence; key := OLD.key; why := 'delete_refused';
    ELSIF TG_TABLE_NAME = 'tasks' THEN
        target := NEW.lease; presented := NEW.fence; key := NEW.key;
        IF TG_OP = 'UPDATE' AND NEW.lease IS DISTINCT FROM OLD.lease THEN
            why := 'lease_change';
        ELSIF TG_OP = 'UPDATE' AND NEW.fence < OLD.fence THEN
            why := 'row_fence';
        END IF;
    ELSE
        target := NEW.lease; presented := NEW.epoch; key := NEW.task_id::text;
        -- An event belongs to its task's lease: the epoch is checked against that lease, not one the
        -- statement names.
        IF NOT EXISTS (SELECT 1 FROM pgfence.tasks t WHERE t.id = NEW.task_id AND t.lease = NEW.lease) THEN
            why := 'lease_mismatch';
        END IF;
    END IF;
    -- Before anything is read: a role with table privileges may write only the clusters it has a grant on
    -- (this trigger runs before row-level security's check of the new row), and an epoch below 1 was never issued.
    IF NOT pgfence._may_use(pgfence._cluster_of(target)) THEN
        why := 'no_grant';
    ELSIF presented IS NULL OR presented < 1 THEN
        why := 'future_epoch';
    END IF;
    IF why IN ('no_grant', 'future_epoch') THEN
        IF TG_NARGS > 0 AND TG_ARGV[0] = 'audit' THEN
            PERFORM pgfence._reject(target, coalesce(presented, 0), NULL::bigint, NULL::text, why, 'raw_' || lower(TG_OP),
                                    TG_TABLE_NAME::text, key);
            RAISE WARNING 'pgfence: refused raw % on pgfence.% (%); recorded in pgfence.rejections',
                TG_OP, TG_TABLE_NAME, why;
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'pgfence: enforcement refuses this % on pgfence.% (%)', TG_OP, TG_TABLE_NAME, why
            USING ERRCODE = 'PF001';
    END IF;
    -- A transaction that did not present the tenure's secret is refused before it takes the guard lock.
    IF why IS NULL AND pgfence._secret_check(target, presented,
                                             current_setting(pgfence._fence_setting(
                                                 (SELECT x.lock_key FROM pgfence.leases x WHERE x.name = target)),
                                                 true)) = 'bad' THEN
        why := 'bad_secret';
    END IF;
    -- The guard's protocol (as _guard's): the lease's guard lock shared (_try_guard_lock, else _await_takeover),
    -- then the row read in a new snapshot and the verdict on it (_verdict). Knowing the epoch is not enough: the
    -- transaction must have presented the tenure's secret to the guard (the setting pgfence.fence left).
    SELECT * INTO l FROM pgfence.leases WHERE name = target;
    IF FOUND AND why IS DISTINCT FROM 'bad_secret' THEN
        IF NOT pgfence._read_committed() THEN
            RAISE EXCEPTION 'pgfence: writes to pgfence.% need READ COMMITTED isolation; this transaction is %',
                TG_TABLE_NAME, upper(current_setting('transaction_isolation')) USING ERRCODE = 'PF004';
        END IF;
        IF NOT pgfence._try_guard_lock(l.lock_key) THEN
            PERFORM pgfence._await_takeover(target, l.lock_key);
        END IF;
        -- Held to the end of the transaction, whatever is decided below (the marker of _await_takeover).
        PERFORM set_config(pgfence._guard_held_setting(l.lock_key), 'on', true);
        SELECT * INTO l FROM pgfence.leases WHERE name = target;
    END IF;
    IF why IS NULL THEN
        why := pgfence._verdict(l, presented, current_setting(pgfence._fence_setting(l.lock_key), true),
                                clock_timestamp(), pgfence._timeline(), NULL::bigint);
    END IF;
    IF why IS NULL THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_NARGS > 0 AND TG_ARGV[0] = 'audit' THEN
        PERFORM pgfence._reject(target, presented, l.epoch, l.holder, why,
                                'raw_' || lower(TG_OP), TG_TABLE_NAME, key);
        RAISE WARNING 'pgfence: refused raw % on pgfence.% (%, presented epoch %, current %); recorded in pgfence.rejections',
            TG_OP, TG_TABLE_NAME, why, presented, l.epoch;
        RETURN NULL;
    END IF;
    IF why IN ('delete_refused', 'lease_change', 'lease_mismatch', 'bad_secret') THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses this % on pgfence.% (%)', TG_OP, TG_TABLE_NAME, why
            USING ERRCODE = 'PF001';
    END IF;
    RAISE EXCEPTION 'pgfence: stale write to %: presented epoch %, current epoch % (%)',
        target, presented, l.epoch, why USING ERRCODE = 'PF001';
END;
$$;

CREATE TRIGGER enforce_epoch BEFORE INSERT OR UPDATE OR DELETE ON pgfence.tasks
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('error');
CREATE TRIGGER enforce_audit BEFORE INSERT OR UPDATE OR DELETE ON pgfence.tasks
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('audit');
CREATE TRIGGER enforce_truncate BEFORE TRUNCATE ON pgfence.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._enforce_epoch();
CREATE TRIGGER enforce_epoch BEFORE INSERT ON pgfence.task_events
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('error');
CREATE TRIGGER enforce_audit BEFORE INSERT ON pgfence.task_events
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('audit');
ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_epoch;
ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_audit;
ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_truncate;
ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_epoch;
ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_audit;

-- The other tables: only the schema owner writes them (SECURITY INVOKER on purpose: current_user is the role
-- whose statement writes, which is the owner inside every pgfence function).
CREATE FUNCTION pgfence._owner_writes_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence'), 'MEMBER')
    THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses % on pgfence.% by role %: only the pgfence functions write it',
            TG_OP, TG_TABLE_NAME, quote_literal(regexp_replace(current_user, '[[:cntrl:]]', '?', 'g'))
            USING ERRCODE = 'PF001';
    END IF;
    RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END;
$$;
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['leases', 'tenures', 'tenure_secrets', 'beliefs', 'write_marks', 'rejections', 'grants', 'instance', 'effects', 'effect_reports'] LOOP
        EXECUTE format('CREATE TRIGGER enforce_owner BEFORE INSERT OR UPDATE OR DELETE ON pgfence.%I '
                       'FOR EACH ROW EXECUTE FUNCTION pgfence._owner_writes_only()', t);
        EXECUTE format('CREATE TRIGGER enforce_owner_truncate BEFORE TRUNCATE ON pgfence.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence._owner_writes_only()', t);
        EXECUTE format('ALTER TABLE pgfence.%I DISABLE TRIGGER enforce_owner', t);
        -- TRUNCATE bypasses row-level security: refused to other roles whether enforcement is on or not.
    END LOOP;
END;
$$;

-- Its table locks (ALTER TABLE … TRIGGER, LOCK TABLE) wait at most _lock_wait_ms(), then fail with PF003
-- naming the backends that hold locks on pgfence tables.
CREATE FUNCTION pgfence.set_enforcement(p_on boolean, p_mode text DEFAULT 'error') RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
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
$$;

CREATE FUNCTION pgfence.enforcement() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT CASE t.tgname WHEN 'enforce_epoch' THEN 'error' ELSE 'audit' END
                       FROM pg_catalog.pg_trigger t
                      WHERE t.tgrelid = 'pgfence.tasks'::regclass AND t.tgname IN ('enforce_epoch', 'enforce_audit')
                        AND t.tgenabled <> 'D'
                      LIMIT 1), 'off')
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Audit retention: deletes at most p_batch aggregated rejections last seen before now - p_older_than, and
-- returns how many it deleted. Callers loop until it returns 0; each call is a short transaction.
CREATE FUNCTION pgfence.prune_rejections(p_older_than interval, p_batch integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pgfence._require_instance_operator('prune_rejections'::text);
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_batch IS NULL OR p_batch < 1 OR p_batch > 1000000 THEN
        RAISE EXCEPTION 'pgfence: prune needs a non-negative age and a batch of 1 to 1000000 rows'
            USING ERRCODE = '22023', COLUMN = 'age or batch';
    END IF;
    DELETE FROM pgfence.rejections
     WHERE id IN (SELECT id FROM pgfence.rejections
                   WHERE last_rejected_at < clock_timestamp() - p_older_than
                   ORDER BY last_rejected_at LIMIT p_batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
