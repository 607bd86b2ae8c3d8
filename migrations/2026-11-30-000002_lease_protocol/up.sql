-- pgfence migration 2 of 6, the lease protocol: acquire, renew, renew_many, release and force_release; the row
-- and guard locks a change of who may write takes; why a tenure is not current (_loss_reason) and whether a
-- secret is its tenure's; the trigger that makes every change of a lease row take the guard lock; the takeover
-- grace setting; the tenure history view; the release notification (NOTIFY pgfence_lease_free).
-- Called from Rust by src/lease/ (acquire, renew, release, force_release; Store::tenures, src/history/, reads
-- pgfence.tenure_history) and src/leader/pg/ (renew_many; it LISTENs to pgfence_lease_free).

-- ---------------------------------------------------------------------------------------------------------
-- Locks of a change of who may write: the lease row, then the guard lock EXCLUSIVE.

-- The backends holding a lease row's lock: the transaction in the row's xmax when it is a plain one, else every
-- other backend in a transaction that holds a row-level lock mode on pgfence.leases (a MultiXact locker set).
CREATE FUNCTION pgfence._row_lockers(p_lease text) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    WITH exact AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'transactionid' AND k.granted AND k.pid <> pg_catalog.pg_backend_pid()
           AND k.transactionid = (SELECT l.xmax FROM pgfence.leases l WHERE l.name = p_lease)
    ), candidates AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'relation' AND k.relation = 'pgfence.leases'::regclass AND k.granted
           AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
    )
    SELECT coalesce((SELECT array_agg(DISTINCT pid) FROM exact),
                    (SELECT array_agg(DISTINCT pid) FROM candidates), '{}')
$$;

-- Locks a lease row (FOR NO KEY UPDATE: it does not conflict with the FOR KEY SHARE of foreign-key checks) for
-- a change, waiting at most _lock_wait_ms(); p_create first inserts the row if it is missing (a concurrent insert
-- of the same name is waited for, bounded too). Returns the locked row (all NULL when there is no such lease).
CREATE FUNCTION pgfence._lock_lease_row(p_lease text, p_create boolean DEFAULT false) RETURNS pgfence.leases
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    l pgfence.leases;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    -- Local to this function (its SET clause restores the caller's value on exit).
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    IF p_create THEN
        INSERT INTO pgfence.leases (name) VALUES (p_lease) ON CONFLICT (name) DO NOTHING;
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease FOR NO KEY UPDATE;
    RETURN l;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: waited % ms for the row lock of lease %; blocked by %', wait_ms,
        pgfence._printable(p_lease), pgfence._describe_backends(pgfence._row_lockers(p_lease))
        USING ERRCODE = 'PF003',
              HINT = 'A transaction holding the lease row stays open: end it (pg_terminate_backend) or let it finish.';
END;
$$;

-- Takes a lease's intent lock, then its guard lock, EXCLUSIVE for a change of who may write. The intent lock
-- (_guard_lock_class(), -lock_key) first, held to the end of the transaction: from then on no guard of the lease passes its
-- check (each probes the intent lock before it takes the guard lock, and one that finds it taken waits for this
-- takeover to end: pgfence._await_takeover), whatever this function does next — wait for the guard lock, let its
-- wait run out after the grace, end the holders, queue again. Then the guard lock: waits for the guarded
-- transactions already past their check, at most the takeover grace; then terminates the backends still holding
-- it (their tenure is ending: a transaction still open that long after must not commit after its successor's) and
-- waits for them to go. No new holder can appear meanwhile (a write whose probe preceded the intent lock and whose
-- guard lock came after the list was read is the one exception, ended in the next round). Fails with PF003
-- naming the blockers if it cannot end them (the schema owner lacks pg_signal_backend) or they keep it. The caller
-- holds the lease row lock, so no second takeover of the lease runs meanwhile.
CREATE FUNCTION pgfence._take_guard_lock(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
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
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Lease protocol. Every entry function reads the lease row without a lock first: an answer that a plain read
-- already decides for good ('held' by another live tenure, 'not_held') takes no lock, so a caller that leaves
-- its transaction open afterwards blocks nobody.

-- Why a lease is not (or no longer) held by (holder, epoch), judged on a locked or freshly read row, at time ts
-- (the database clock), on WAL timeline p_timeline. The one definition of when a tenure is live: every path that
-- judges one — the guards (_verdict, the fast path _admits), renewals, releases, an acquisition judging the tenure
-- it takes over (_held_by_other, the end it records), force_release, the in-doubt list — asks this function; the
-- native guard's fast path answers as it does (tests/native/differential.rs). With _secret_verdict and _grant_of
-- it is the whole verdict on a write.
CREATE FUNCTION pgfence._loss_reason(l pgfence.leases, p_holder text, p_epoch bigint, ts timestamptz,
                                     p_timeline bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN l.name IS NULL THEN 'unknown_lease'
        WHEN p_epoch < l.epoch THEN 'superseded'
        WHEN p_epoch > l.epoch THEN 'future_epoch'
        WHEN p_holder IS NOT NULL AND l.holder IS DISTINCT FROM p_holder THEN 'holder_mismatch'
        WHEN l.state = 'released' THEN 'released'
        -- Granted before the last promotion: its ending may have been lost with the old primary's tail.
        WHEN l.timeline < p_timeline THEN 'failover'
        WHEN l.expires_at <= ts THEN 'expired'
        ELSE NULL
    END
$$;

-- Whether a live tenure of another holder blocks an acquisition by p_holder.
-- Another holder is another holder name, or the same name used by another login role: knowing a holder's name
-- (readable by every role of the cluster) must not let a role end its tenure.
CREATE FUNCTION pgfence._held_by_other(l pgfence.leases, p_holder text, ts timestamptz, p_timeline bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pgfence._loss_reason(l, NULL::text, l.epoch, ts, p_timeline) IS NULL
           AND (l.holder IS DISTINCT FROM p_holder OR l.holder_role IS DISTINCT FROM session_user)
$$;

-- Whether p_secret is the secret whose SHA-256 is p_hash. Secrets longer than 128 characters are not even
-- hashed. (Comparing hashes leaks nothing an attacker can steer: it cannot choose the hash of its guess.)
-- STABLE, as convert_to is: an IMMUTABLE declaration would keep PostgreSQL from inlining it.
CREATE FUNCTION pgfence._secret_matches(p_hash bytea, p_secret text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p_secret IS NOT NULL AND length(p_secret) <= 128
                    AND p_hash = pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8')), false)
$$;

-- Whether p_secret is the secret of tenure p_epoch, given the lease's row of pgfence.tenure_secrets (the epoch
-- and hash of its latest tenure's secret): 'ok', 'bad', or NULL when that tenure is not the latest (its secret is
-- gone: it has been superseded). A tenure's secret never changes, so 'ok' and 'bad' are final. The one definition
-- of the secret's rule: _secret_check reads the row for it, the guard's pre-check and its fast path pass the row
-- they read with the lease. An SQL expression, inlined where it is used.
CREATE FUNCTION pgfence._secret_verdict(p_secret_epoch bigint, p_hash bytea, p_epoch bigint, p_secret text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_secret_epoch <> p_epoch THEN NULL
                WHEN pgfence._secret_matches(p_hash, p_secret) THEN 'ok'
                ELSE 'bad' END
$$;

-- _secret_verdict of tenure (p_lease, p_epoch), its row read here (NULL when the lease has none).
CREATE FUNCTION pgfence._secret_check(p_lease text, p_epoch bigint, p_secret text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pgfence._secret_verdict(s.epoch, s.hash, p_epoch, p_secret)
      FROM pgfence.tenure_secrets s
     WHERE s.lease = p_lease
$$;

-- Ends tenure (p_lease, p_epoch) in the history (pgfence.tenures), unless it has ended already: at p_ended_at, for
-- p_reason. The one writer of a tenure's end, called by each change of who may write that ends one (acquire ends the
-- tenure it takes over, release and force_release the current one) in its own transaction, after the guard lock.
CREATE FUNCTION pgfence._end_tenure(p_lease text, p_epoch bigint, p_ended_at timestamptz, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgfence.tenures SET ended_at = p_ended_at, end_reason = p_reason
     WHERE lease = p_lease AND epoch = p_epoch AND ended_at IS NULL;
END;
$$;

-- Refuses a call of a role without a grant on the lease's cluster (p_operator: operator rights needed): records
-- it and returns the lease_result 'refused' / 'no_grant'; NULL when the role may go on. Every role with a grant
-- may execute every lease function (force_release included), so a missing right on a cluster is this one answer
-- for every role: an application role calling force_release gets it as an operator of another cluster does.
CREATE FUNCTION pgfence._deny_lease_call(p_lease text, p_epoch bigint, p_operation text,
                                         p_operator boolean DEFAULT false)
RETURNS pgfence.lease_result
LANGUAGE plpgsql AS $$
BEGIN
    IF pgfence._may_use(pgfence._cluster_of(p_lease), p_operator) THEN
        RETURN NULL;
    END IF;
    PERFORM pgfence._reject(p_lease, coalesce(p_epoch, 0), NULL::bigint, NULL::text, 'no_grant'::text, p_operation, NULL::text, NULL::text,
                            p_may_wait => true);
    RETURN ROW('refused', 'no_grant', NULL, NULL, NULL, NULL)::pgfence.lease_result;
END;
$$;

-- The calling connection as the server sees it, recorded with every tenure: the system identifier (NULL when
-- the owner may not read pg_control_system()), the pgfence instance, the server's and the client's address and
-- port (NULL over a Unix socket) and the session's application_name.
CREATE FUNCTION pgfence._server_view(OUT system_identifier text, OUT instance_id uuid, OUT server_addr text,
                                     OUT client_addr text, OUT application_name text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT i.instance_id INTO instance_id FROM pgfence.instance i;
    server_addr := host(inet_server_addr()) || ':' || inet_server_port();
    client_addr := host(inet_client_addr()) || ':' || inet_client_port();
    application_name := current_setting('application_name', true);
    BEGIN
        SELECT c.system_identifier::text INTO system_identifier FROM pg_control_system() c;
    EXCEPTION WHEN insufficient_privilege THEN
        system_identifier := NULL;
    END;
END;
$$;

-- One acquisition, the caller having checked the arguments and the role's grant (acquire, acquire_many): by
-- compare-and-set, decided first without a lock (a live tenure of another holder answers 'held' at once), then on
-- the locked row after the guard lock (writes of the ending tenure past their check finish or are ended). p_view
-- is the server's view for the tenure row (`_server_view`, read once per statement). Without p_wait (a batch,
-- whose locks are held until all of it commits) it waits for no lock: a lease whose row or guard lock another
-- transaction holds answers 'busy', and is acquired alone, with acquire's bounded waits.
CREATE FUNCTION pgfence._acquire_checked(p_lease text, p_holder text, p_ttl_ms bigint, p_timeline bigint,
                                         p_view record, p_wait boolean DEFAULT true)
RETURNS pgfence.lease_result
LANGUAGE plpgsql AS $$
DECLARE
    l   pgfence.leases;
    known boolean;
    ts  timestamptz;
    tl  bigint := p_timeline;
    new_epoch bigint;
    secret text;
    secret_hash bytea;
BEGIN
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    known := FOUND;
    IF known AND pgfence._held_by_other(l, p_holder, clock_timestamp(), tl) THEN
        -- Decided without a lock: a live tenure of another holder stays live until it ends.
        RETURN ROW('held', NULL, l.epoch, l.holder,
                   ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000)::bigint,
                   NULL)::pgfence.lease_result;
    END IF;

    -- The row lock first (a rival taker or a renewal in flight), then the guard lock (guarded writes in flight).
    -- (A lease row is never deleted while pgfence runs: one that was read exists; a new one is inserted.)
    IF p_wait THEN
        l := pgfence._lock_lease_row(p_lease, p_create => NOT known);
    ELSE
        IF NOT known THEN
            INSERT INTO pgfence.leases (name) VALUES (p_lease) ON CONFLICT (name) DO NOTHING;
        END IF;
        SELECT * INTO l FROM pgfence.leases WHERE name = p_lease FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN ROW('busy', NULL, NULL, NULL, NULL, NULL)::pgfence.lease_result;
        END IF;
    END IF;
    -- Read the clock after the lock wait: expiry is judged at the moment we own the row.
    ts := clock_timestamp();
    IF pgfence._held_by_other(l, p_holder, ts, tl) THEN
        RETURN ROW('held', NULL, l.epoch, l.holder,
                   ceil(extract(epoch FROM (l.expires_at - ts)) * 1000)::bigint, NULL)::pgfence.lease_result;
    END IF;
    IF p_wait THEN
        PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ELSIF NOT (pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), -l.lock_key)
               AND pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), l.lock_key)) THEN
        RETURN ROW('busy', NULL, NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    ts := clock_timestamp();

    IF l.epoch > 0 THEN
        PERFORM pgfence._end_tenure(p_lease, l.epoch,
                                    LEAST(l.expires_at, ts),
                                    coalesce(NULLIF(pgfence._loss_reason(l, NULL::text, l.epoch, ts, tl),
                                                    'released'::text), 'reacquired'::text));
    END IF;

    -- Failover safety: after a promotion the server writes WAL on a new timeline, and an asynchronous standby
    -- may have lost the last epochs its old primary issued. Every epoch issued on timeline t is at least
    -- (t - 1) * 2^32 + 1, which exceeds every epoch issued on earlier timelines (fewer than 2^32 acquisitions per
    -- lease and timeline), so epochs keep increasing across failovers even when the counter went backwards.
    new_epoch := GREATEST(l.epoch + 1, (tl - 1) * 4294967296 + 1);
    UPDATE pgfence.leases
       SET holder = p_holder, holder_role = session_user, epoch = new_epoch, state = 'held', ttl_ms = p_ttl_ms,
           timeline = tl,
           expires_at = ts + p_ttl_ms * interval '1 millisecond', acquired_at = ts, renewed_at = ts,
           transitions = transitions + CASE WHEN holder IS DISTINCT FROM p_holder THEN 1 ELSE 0 END
     WHERE name = p_lease;
    INSERT INTO pgfence.tenures (lease, epoch, holder, acquired_at, timeline, system_identifier, instance_id,
                                 server_addr, client_addr, application_name)
    VALUES (p_lease, new_epoch, p_holder, ts, tl, p_view.system_identifier, p_view.instance_id,
            p_view.server_addr, p_view.client_addr, p_view.application_name);
    -- 256 bits from the server's strong random source (two version-4 UUIDs: 244 random bits), as hexadecimal.
    secret := encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    secret_hash := sha256(convert_to(secret, 'UTF8'));
    INSERT INTO pgfence.tenure_secrets (lease, epoch, hash)
    VALUES (p_lease, new_epoch, secret_hash)
    ON CONFLICT (lease) DO UPDATE SET epoch = EXCLUDED.epoch, hash = EXCLUDED.hash;
    INSERT INTO pgfence.beliefs (lease, epoch, report_hash) VALUES (p_lease, new_epoch, secret_hash);
    RETURN ROW('acquired', NULL, new_epoch, p_holder, p_ttl_ms, secret)::pgfence.lease_result;
END;
$$;

-- Acquire by compare-and-set: succeeds when the lease is new, released, expired (by the database clock) or
-- held by a tenure granted before the last promotion, and issues epoch + 1. The same holder acquiring again
-- while it holds also gets a new epoch: an acquisition always starts a new tenure and fences every earlier one
-- (a restarted process reusing its holder name must not inherit the writes in flight of its previous
-- incarnation). To extend a tenure, renew it. An acquisition returns the new tenure's secret, once: every
-- write, renewal and release of the tenure presents it (the database keeps only its SHA-256).
CREATE FUNCTION pgfence.acquire(p_lease text, p_holder text, p_ttl_ms bigint)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, 1::bigint);
    PERFORM pgfence._check_text('holder'::text, p_holder, pgfence._max_holder_len());
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_lease_call(p_lease, 0::bigint, 'acquire'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    RETURN pgfence._acquire_checked(p_lease, p_holder, p_ttl_ms, pgfence._timeline(),
                                    (SELECT v FROM pgfence._server_view() v));
END;
$$;

-- The most leases one acquire_many call takes: a batch holds the row and guard locks of the leases it acquired
-- until it commits, so it is kept short.
CREATE FUNCTION pgfence._max_acquire_batch() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 256';

-- Several acquisitions for one holder in one statement and one transaction, each exactly as acquire's (a
-- supervisor starting many tenures at once: the names a rebalance gave it), but waiting for no lock: a lease whose
-- row or guard lock another transaction holds answers 'busy' (acquire it alone), so a batch never holds the
-- leases it took behind one it waits for. Leases are taken in name order; each answers a row, in name order. Asked once
-- per distinct cluster: the role's grant (a cluster without one answers 'refused' / 'no_grant' for its leases,
-- audited once). For each lease acquired, also what a new tenure reads first, in the same snapshot of its start:
-- in_doubt, how many effects earlier tenures left in doubt (`in_doubt_effects`: 0 spares the successor that
-- read), and gap_us, how long the lease had no holder when the tenure before was released (a handover), by the
-- database clock. Bad input (NULL, empty, too many, a lease named twice, a malformed one) writes nothing.
CREATE FUNCTION pgfence.acquire_many(p_leases text[], p_holder text, p_ttl_ms bigint)
RETURNS TABLE (lease text, outcome text, reason text, epoch bigint, holder text, expires_in_ms bigint,
               secret text, in_doubt integer, gap_us bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tl bigint;
    view record;
    refused text[];
    r pgfence.lease_result;
    n text;
BEGIN
    IF p_leases IS NULL OR cardinality(p_leases) = 0 OR cardinality(p_leases) > pgfence._max_acquire_batch()
       OR array_position(p_leases, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: acquire_many takes 1 to % leases, none NULL', pgfence._max_acquire_batch()
            USING ERRCODE = '22023', COLUMN = 'leases';
    END IF;
    IF (SELECT count(DISTINCT x) FROM unnest(p_leases) x) <> cardinality(p_leases) THEN
        RAISE EXCEPTION 'pgfence: acquire_many names a lease twice' USING ERRCODE = '22023', COLUMN = 'leases';
    END IF;
    PERFORM pgfence._check_lease_args(x, 1::bigint) FROM unnest(p_leases) x;
    PERFORM pgfence._check_text('holder'::text, p_holder, pgfence._max_holder_len());
    PERFORM pgfence._check_ttl(p_ttl_ms);
    -- One audited refusal per cluster without a grant (acquire's answer, through the same function).
    refused := ARRAY(SELECT d.c FROM (SELECT pgfence._cluster_of(x) AS c, min(x) AS first
                                        FROM unnest(p_leases) x GROUP BY 1) d
                      WHERE (pgfence._deny_lease_call(d.first, 0::bigint, 'acquire'::text)).outcome IS NOT NULL);
    tl := pgfence._timeline();
    SELECT * INTO view FROM pgfence._server_view();
    FOR n IN SELECT x FROM unnest(p_leases) x ORDER BY x LOOP
        IF pgfence._cluster_of(n) = ANY (refused) THEN
            RETURN QUERY SELECT n, 'refused'::text, 'no_grant'::text, NULL::bigint, NULL::text, NULL::bigint,
                                NULL::text, NULL::integer, NULL::bigint;
            CONTINUE;
        END IF;
        r := pgfence._acquire_checked(n, p_holder, p_ttl_ms, tl, view, p_wait => false);
        IF r.outcome <> 'acquired' THEN
            RETURN QUERY SELECT n, r.outcome, r.reason, r.epoch, r.holder, r.expires_in_ms, NULL::text,
                                NULL::integer, NULL::bigint;
            CONTINUE;
        END IF;
        RETURN QUERY
        SELECT n, r.outcome, r.reason, r.epoch, r.holder, r.expires_in_ms, r.secret,
               -- Nothing can be in doubt without an unsettled attempt (one index probe, the usual answer);
               -- otherwise the ledger's own list is counted.
               CASE WHEN EXISTS (SELECT 1 FROM pgfence.effects e WHERE e.lease = n AND e.settlement IS NULL
                                   AND (e.outcome IS NULL OR e.outcome = 'unknown'))
                    THEN (SELECT count(*)::integer FROM pgfence.in_doubt_effects(n)) ELSE 0 END,
               (SELECT CASE WHEN p.end_reason = 'released'
                            THEN (extract(epoch FROM (t.acquired_at - p.ended_at)) * 1000000)::bigint END
                  FROM pgfence.tenures p, pgfence.tenures t
                 WHERE p.lease = n AND t.lease = n AND t.epoch = r.epoch AND p.epoch < r.epoch
                 ORDER BY p.epoch DESC LIMIT 1);
    END LOOP;
END;
$$;

-- Renew: extends the expiry only while the epoch is current, the lease has not expired and the tenure was
-- granted on the current timeline, and p_secret is the tenure's. The secret identifies the tenure (and so its
-- holder, which never changes within an epoch): no holder is presented. It takes the row lock (bounded: it waits
-- only for a takeover or another renewal in flight) but never the guard lock, so it never waits for guarded
-- writes. Every other answer is 'refused' with the reason (the loss reasons, 'bad_secret' audited, 'no_grant').
CREATE FUNCTION pgfence.renew(p_lease text, p_epoch bigint, p_secret text, p_ttl_ms bigint)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    tl bigint;
    why text;
    secret text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_secret(p_secret);
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_lease_call(p_lease, p_epoch, 'renew'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    tl := pgfence._timeline();

    -- Decided before any lock: only a caller presenting the tenure's secret may wait for the row lock, so a
    -- role without it never holds the row a holder's renewal or a takeover needs (a forged renew left open in a
    -- transaction used to hold it until PF003). A secret is 'bad' for good (its hash never changes); one whose
    -- tenure is not the lease's latest any more is gone (NULL). Everything else is judged on the locked row, as
    -- before: a renewal of the same tenure in flight may extend it past an expiry this unlocked read would see.
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    secret := pgfence._secret_check(p_lease, p_epoch, p_secret);
    IF secret IS DISTINCT FROM 'ok' THEN
        -- Not the live tenure's secret: a loss stays the answer (epochs only grow, a released or expired tenure
        -- stays over; NULL: superseded between the two reads); a live tenure presented with a wrong secret is
        -- refused and audited.
        why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), tl);
        IF why IS NULL AND secret = 'bad' THEN
            PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret'::text, 'renew'::text, NULL::text, NULL::text,
                                    p_may_wait => true);
            RETURN ROW('refused', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
        END IF;
        RETURN ROW('refused', coalesce(why, 'superseded'), l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;

    l := pgfence._lock_lease_row(p_lease);
    ts := clock_timestamp();
    -- Judged again on the locked row: a takeover may have committed while we waited. The secret was 'ok' for
    -- this epoch, and a tenure's secret never changes.
    why := pgfence._loss_reason(l, NULL::text, p_epoch, ts, tl);
    IF why IS NOT NULL THEN
        RETURN ROW('refused', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    UPDATE pgfence.leases
       SET expires_at = ts + p_ttl_ms * interval '1 millisecond', renewed_at = ts, ttl_ms = p_ttl_ms
     WHERE name = p_lease;
    RETURN ROW('renewed', NULL, p_epoch, l.holder, p_ttl_ms, NULL)::pgfence.lease_result;
END;
$$;

-- Renews many tenures in one statement: a process holding N leases (a sharded controller) renews them all with
-- one statement per tick. One row per input lease, in input order: 'renewed' or 'refused' with the reason (as
-- renew's: a loss reason, 'no_grant' for a cluster the role has no grant on, 'bad_secret'). Every input is
-- checked as renew checks it (22023, nothing renewed: a NULL array or a NULL element of any of the three arrays
-- too), and a tenure listed twice gets the same answer twice.
-- As renew, it decides on an unlocked read first and locks only the rows of live tenures presented with their
-- secret: a forged entry never holds a row. Refusals are audited once per (lease, epoch, reason) with their
-- count, so a call is linear in its length however many entries repeat.
CREATE FUNCTION pgfence.renew_many(p_leases text[], p_epochs bigint[], p_secrets text[], p_ttl_ms bigint)
RETURNS TABLE (lease text, outcome text, reason text, epoch bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    ts timestamptz;
    tl bigint;
    wait_ms bigint := pgfence._lock_wait_ms();
    refused text[];
    whys text[];
    live text[];
    r record;
    first boolean := true;
BEGIN
    PERFORM pgfence._check_ttl(p_ttl_ms);
    IF p_leases IS NULL OR p_epochs IS NULL OR p_secrets IS NULL OR cardinality(p_leases) <> cardinality(p_epochs)
       OR cardinality(p_leases) <> cardinality(p_secrets) THEN
        RAISE EXCEPTION 'pgfence: renew_many needs as many epochs and secrets as leases'
            USING ERRCODE = '22023', COLUMN = 'leases';
    END IF;
    -- A NULL secret is bad input, as renew's: 22023 before anything is written (not an audited bad_secret).
    IF array_position(p_secrets, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: renew_many: secret % of %: %', array_position(p_secrets, NULL),
            cardinality(p_secrets), pgfence._secret_problem(NULL::text) USING ERRCODE = '22023', COLUMN = 'secret';
    END IF;
    PERFORM pgfence._check_lease_args(i.lease, i.epoch) FROM unnest(p_leases, p_epochs) AS i(lease, epoch);
    tl := pgfence._timeline();

    -- Clusters the role has no grant on: their leases are refused.
    -- Asked once per distinct cluster, not once per lease: the grant check is most of a renewal's server time
    -- (about 0.2 ms a call), and a member renews every lease it leads in this one statement.
    refused := ARRAY(SELECT d.c FROM (SELECT DISTINCT pgfence._cluster_of(n) AS c FROM unnest(p_leases) AS n) d
                      WHERE NOT pgfence._may_use(d.c));

    -- The unlocked judgment of every entry whose secret is not its tenure's (see renew): refused for good. The
    -- rest presented their tenure's secret: the only rows this call locks, judged on the locked rows.
    whys := ARRAY(
        SELECT CASE WHEN pgfence._cluster_of(i.lease) = ANY (refused) THEN 'no_grant'
                    WHEN s.secret = 'ok' THEN NULL
                    ELSE coalesce(pgfence._loss_reason(l, NULL::text, i.epoch, clock_timestamp(), tl),
                                  CASE s.secret WHEN 'bad' THEN 'bad_secret' ELSE 'superseded' END) END
          FROM unnest(p_leases, p_epochs, p_secrets) WITH ORDINALITY AS i(lease, epoch, secret, ord)
          LEFT JOIN pgfence.leases l ON l.name = i.lease
          CROSS JOIN LATERAL (SELECT pgfence._secret_check(i.lease, i.epoch, i.secret) AS secret) s
         ORDER BY i.ord);

    -- The audit: one call per distinct refusal with its count, not one per entry (the aggregated row would be
    -- updated N times in one statement, each update slower than the last). Only the first may answer later
    -- (backpressure, as on every refused path: no lock is held yet), so a call waits at most once.
    -- (A role-scope refusal, no_grant, is one row whatever the lease: one call for all of them.)
    FOR r IN SELECT min(i.lease) AS lease, min(i.epoch) AS epoch, i.why, count(*) AS n
               FROM unnest(p_leases, p_epochs, whys) AS i(lease, epoch, why)
              WHERE i.why = 'no_grant'
              GROUP BY i.why
             UNION ALL
             (SELECT i.lease, i.epoch, i.why, count(*) AS n
               FROM unnest(p_leases, p_epochs, whys) AS i(lease, epoch, why)
              WHERE i.why = 'bad_secret'
              GROUP BY i.lease, i.epoch, i.why ORDER BY i.lease, i.epoch)
    LOOP
        PERFORM pgfence._reject(r.lease, r.epoch, CASE WHEN r.why = 'bad_secret' THEN l.epoch END,
                                CASE WHEN r.why = 'bad_secret' THEN l.holder END, r.why, 'renew'::text, NULL::text, NULL::text,
                                p_may_wait => first, p_count => r.n)
           FROM (SELECT NULL) AS one LEFT JOIN pgfence.leases l ON l.name = r.lease;
        first := false;
    END LOOP;

    -- Lock the live rows in name order (two holders renewing overlapping sets cannot deadlock), bounded.
    live := ARRAY(SELECT DISTINCT i.lease FROM unnest(p_leases, whys) AS i(lease, why) WHERE i.why IS NULL);
    IF cardinality(live) > 0 THEN
        BEGIN
            PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            PERFORM 1 FROM pgfence.leases l WHERE l.name = ANY (live) ORDER BY l.name FOR NO KEY UPDATE OF l;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgfence: renew_many waited % ms for lease row locks; blocked by %', wait_ms,
                pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT p), '{}')
                                              FROM unnest(live) AS n, unnest(pgfence._row_lockers(n)) AS p))
                USING ERRCODE = 'PF003';
        END;
    END IF;
    ts := clock_timestamp();

    RETURN QUERY
    WITH judged AS (
        -- Live entries judged again on the locked rows (a takeover may have committed while we waited; their
        -- secrets were 'ok' for these epochs, and a tenure's secret never changes); the others keep their
        -- unlocked judgment.
        SELECT i.lease, i.ord, l.epoch AS current_epoch,
               coalesce(i.why, pgfence._loss_reason(l, NULL::text, i.epoch, ts, tl)) AS why
          FROM unnest(p_leases, p_epochs, whys) WITH ORDINALITY AS i(lease, epoch, why, ord)
          LEFT JOIN pgfence.leases l ON l.name = i.lease
    ), renewed AS (
        UPDATE pgfence.leases l
           SET expires_at = ts + p_ttl_ms * interval '1 millisecond', renewed_at = ts, ttl_ms = p_ttl_ms
         WHERE l.name IN (SELECT j.lease FROM judged j WHERE j.why IS NULL)
        RETURNING l.name
    )
    -- `judged` reads the rows as they were before this statement's UPDATE (locked by us: nobody else changed
    -- them), so one tenure listed twice is answered the same twice, and one holder may present two tenures of
    -- one lease (an old one it has not noticed is superseded, and the new one). The UPDATE runs whatever the
    -- outer query reads of it (a data-modifying CTE always runs to completion).
    SELECT j.lease,
           CASE WHEN j.why IS NULL THEN 'renewed' ELSE 'refused' END,
           j.why,
           CASE WHEN j.why = 'no_grant' THEN NULL ELSE j.current_epoch END
      FROM judged j
     ORDER BY j.ord;
END;
$$;

-- Release: ends the tenure (lease, epoch) at once so a successor can acquire immediately. Idempotent, and it
-- never touches a successor's tenure: releasing an epoch that is no longer current is a no-op ('not_held', with
-- the reason: nothing is left to end, so nothing is refused). It waits for the tenure's guarded writes in
-- flight (at most the takeover grace, then ends them). Only the tenure's secret ends it (no holder is presented:
-- the secret identifies the tenure): a wrong one is refused ('refused', 'bad_secret') and audited.
CREATE FUNCTION pgfence.release(p_lease text, p_epoch bigint, p_secret text)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    tl bigint;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_secret(p_secret);
    denied := pgfence._deny_lease_call(p_lease, p_epoch, 'release'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    tl := pgfence._timeline();

    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why NOT IN ('expired', 'failover') THEN
        RETURN ROW('not_held', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    -- Decided for good ('bad' is final), before any lock.
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) = 'bad' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret'::text, 'release'::text, NULL::text, NULL::text,
                                p_may_wait => true);
        RETURN ROW('refused', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    l := pgfence._lock_lease_row(p_lease);
    why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why NOT IN ('expired', 'failover') THEN
        RETURN ROW('not_held', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) IS DISTINCT FROM 'ok' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret'::text, 'release'::text, NULL::text, NULL::text);
        RETURN ROW('refused', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();

    UPDATE pgfence.leases SET state = 'released', expires_at = LEAST(expires_at, ts) WHERE name = p_lease;
    PERFORM pgfence._end_tenure(p_lease, p_epoch, LEAST(l.expires_at, ts),
                                coalesce(pgfence._loss_reason(l, NULL::text, p_epoch, ts, tl), 'released'::text));
    -- Wake waiting candidates (delivered at commit) so a successor acquires in milliseconds, not a poll later.
    -- The payload is the lease's lock key, not its name: any role may LISTEN, and only roles that can read the
    -- lease row (a grant on its cluster) can tell which lease it is.
    PERFORM pg_notify('pgfence_lease_free', l.lock_key::text);
    RETURN ROW('released', why, p_epoch, l.holder, 0, NULL)::pgfence.lease_result;
END;
$$;

-- Operator override: ends whatever tenure is current so its epoch can no longer write. The epoch is kept (the
-- next acquisition issues epoch + 1). Waits for the tenure's guarded writes in flight (at most the takeover
-- grace, then ends them). Needs operator rights on the lease's cluster ('refused' / 'no_grant' otherwise).
CREATE FUNCTION pgfence.force_release(p_lease text)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, 1::bigint);
    denied := pgfence._deny_lease_call(p_lease, 0::bigint, 'force_release'::text, p_operator => true);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    IF NOT FOUND THEN
        RETURN ROW('not_held', 'unknown_lease', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    ELSIF l.state = 'released' THEN
        RETURN ROW('not_held', 'released', l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    l := pgfence._lock_lease_row(p_lease);
    IF l.state = 'released' THEN
        RETURN ROW('not_held', 'released', l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();
    why := coalesce(pgfence._loss_reason(l, NULL::text, l.epoch, ts, pgfence._timeline()), 'forced'::text);
    UPDATE pgfence.leases SET state = 'released', expires_at = LEAST(expires_at, ts) WHERE name = p_lease;
    PERFORM pgfence._end_tenure(p_lease, l.epoch, LEAST(l.expires_at, ts), why);
    PERFORM pg_notify('pgfence_lease_free', l.lock_key::text);
    RETURN ROW('released', why, l.epoch, l.holder, 0, NULL)::pgfence.lease_result;
END;
$$;

-- Every change of who may write a lease (epoch, holder, state, timeline) takes its guard lock EXCLUSIVE, also
-- when a role with table privileges UPDATEs the row directly: it waits for guarded transactions in flight and
-- holds off new ones until it commits; like theirs, its wait is bounded by the grace, after which it ends the
-- guard holders. The functions above take the lock themselves first; for them this is a re-grant. Epochs never go down and lease rows are never
-- deleted (invariant 1: a deleted row would restart at epoch 0).
CREATE FUNCTION pgfence._lease_change() RETURNS trigger
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
    -- Bounded like a takeover: the grace, then the guard holders are ended (a no-op re-grant for the functions,
    -- which took the lock already).
    PERFORM pgfence._take_guard_lock(OLD.name, OLD.lock_key);
    RETURN NEW;
END;
$$;
CREATE TRIGGER lease_change BEFORE UPDATE ON pgfence.leases FOR EACH ROW
    WHEN (OLD.epoch IS DISTINCT FROM NEW.epoch OR OLD.holder IS DISTINCT FROM NEW.holder
          OR OLD.state IS DISTINCT FROM NEW.state OR OLD.timeline IS DISTINCT FROM NEW.timeline
          OR OLD.name IS DISTINCT FROM NEW.name OR OLD.lock_key IS DISTINCT FROM NEW.lock_key)
    EXECUTE FUNCTION pgfence._lease_change();
CREATE TRIGGER lease_delete BEFORE DELETE ON pgfence.leases FOR EACH ROW EXECUTE FUNCTION pgfence._lease_change();
CREATE TRIGGER lease_truncate BEFORE TRUNCATE ON pgfence.leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._lease_change();

-- The takeover grace (an operator setting): how long a takeover waits for guarded transactions of the ending
-- tenure before it terminates them. Returns the new value in milliseconds.
CREATE FUNCTION pgfence.set_takeover_grace(p_grace interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ms bigint;
BEGIN
    PERFORM pgfence._require_instance_operator('set_takeover_grace'::text);
    IF p_grace IS NULL OR p_grace < interval '0' OR p_grace > interval '10 minutes' THEN
        RAISE EXCEPTION 'pgfence: takeover grace must be between 0 and 10 minutes'
            USING ERRCODE = '22023', COLUMN = 'grace';
    END IF;
    ms := ceil(extract(epoch FROM p_grace) * 1000)::bigint;
    UPDATE pgfence.instance SET takeover_grace_ms = ms;
    RETURN ms;
END;
$$;

-- Tenures with the time of their last accepted task write (every guarded task write appends an event). A view
-- runs with its owner's rights, which row-level security does not filter: the WHERE clause applies the same rule,
-- and security_barrier makes it run before any condition of the caller's (which could otherwise see, through an
-- error or a function with side effects, rows the rule hides).
-- Every tenure with the database's side (acquired_at, ended_at: database clock), the holder's belief as it
-- reported it (believed_from, believed_until: the holder's clock; NULL when no report arrived), the endpoint as
-- each side saw it, and the last accepted write: the newest of the epoch's task events (exact) and of its
-- write marks (pgfence.fence's admitted writes: at most one second before the last one; last_mark_at).
CREATE VIEW pgfence.tenure_history WITH (security_barrier) AS
SELECT t.lease, t.epoch, t.holder, t.acquired_at, t.ended_at, t.end_reason,
       greatest(ev.last_event_at, mk.last_mark_at) AS last_write_at,
       t.timeline, t.system_identifier, t.instance_id, t.server_addr, t.client_addr, t.application_name,
       b.endpoint, b.believed_from, b.start_sent_at, b.start_received_at,
       b.believed_until, b.end_cause, b.end_detail, b.end_sent_at, b.end_received_at,
       ev.last_event_at, mk.last_mark_at
  FROM pgfence.tenures t
  LEFT JOIN pgfence.beliefs b ON b.lease = t.lease AND b.epoch = t.epoch
  -- The newest event of the epoch, found by a backward scan of task_events_epoch_idx.
  LEFT JOIN LATERAL (SELECT e.created_at AS last_event_at FROM pgfence.task_events e
                      WHERE e.lease = t.lease AND e.epoch = t.epoch ORDER BY e.id DESC LIMIT 1) ev ON true
  LEFT JOIN LATERAL (SELECT max(m.last_at) AS last_mark_at FROM pgfence.write_marks m
                      WHERE m.lease = t.lease AND m.epoch = t.epoch) mk ON true
 WHERE (SELECT pgfence._reads_all()) OR split_part(t.lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]);

-- ---------------------------------------------------------------------------------------------------------
-- Beliefs: a holder reports, after the fact and best effort, when it started believing it led a tenure
-- (p_event 'start': p_at is when it received the acquisition's reply, p_endpoint the server it used as it saw
-- it) and when it stopped ('end': p_at, p_cause — 'released', 'lost' (the database said so), 'deadline' (its
-- local deadline passed), 'write_refused' or 'shutdown' — and p_detail, e.g. the loss reason). Both times are
-- the holder's wall clock (UTC), as is p_sent_at, when the report was sent; the database adds its own clock
-- at arrival. The tenure's secret authenticates the report, also after the tenure ended (pgfence.beliefs
-- keeps its hash). The first report of each kind stands: a retry changes nothing.
-- Every argument is positional and required (NULL where it does not apply: the endpoint when unknown, the cause
-- and detail of a start). Answers one row (outcome, reason): 'recorded', 'kept' (an earlier report of this kind
-- stands), or 'refused', audited like a write's, with reason 'no_grant' or 'bad_secret' (an unknown tenure
-- presents no valid secret either).
CREATE FUNCTION pgfence.report_belief(p_lease text, p_epoch bigint, p_secret text, p_event text,
                                      p_at timestamptz, p_sent_at timestamptz, p_endpoint text,
                                      p_cause text, p_detail text, OUT outcome text, OUT reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    b pgfence.beliefs;
    arrived timestamptz := clock_timestamp();
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    -- Bounded: another report of the same tenure in an open transaction is waited for at most this long.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_secret(p_secret);
    IF p_event IS NULL OR p_event NOT IN ('start', 'end') THEN
        RAISE EXCEPTION 'pgfence: invalid belief event: must be ''start'' or ''end'', got %',
            pgfence._printable(p_event) USING ERRCODE = '22023', COLUMN = 'belief event';
    END IF;
    IF p_at IS NULL OR NOT isfinite(p_at) OR p_sent_at IS NULL OR NOT isfinite(p_sent_at) THEN
        RAISE EXCEPTION 'pgfence: invalid belief time: the time and the send time must be finite'
            USING ERRCODE = '22023', COLUMN = 'belief time';
    END IF;
    IF p_endpoint IS NOT NULL THEN
        PERFORM pgfence._check_text('endpoint'::text, p_endpoint, pgfence._max_endpoint_len());
    END IF;
    IF p_event = 'start' AND (p_cause IS NOT NULL OR p_detail IS NOT NULL) THEN
        RAISE EXCEPTION 'pgfence: invalid belief cause: a start has none'
            USING ERRCODE = '22023', COLUMN = 'belief cause';
    END IF;
    IF p_event = 'end' AND (p_cause IS NULL
                            OR p_cause NOT IN ('released', 'lost', 'deadline', 'write_refused', 'shutdown')) THEN
        RAISE EXCEPTION 'pgfence: invalid belief cause: must be released, lost, deadline, write_refused or shutdown, got %',
            pgfence._printable(p_cause) USING ERRCODE = '22023', COLUMN = 'belief cause';
    END IF;
    IF p_detail IS NOT NULL THEN
        PERFORM pgfence._check_text('belief detail'::text, p_detail, pgfence._max_label_len());
    END IF;
    IF NOT pgfence._may_use(pgfence._cluster_of(p_lease)) THEN
        PERFORM pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'no_grant'::text, 'report_belief'::text, NULL::text, NULL::text,
                                p_may_wait => true);
        outcome := 'refused'; reason := 'no_grant';
        RETURN;
    END IF;
    -- Decided before any lock, on an unlocked read (the hash never changes): a role without the tenure's
    -- secret never holds the belief row. A tenure that does not exist explains nothing: its refusal is
    -- aggregated per role (a flood of bogus names or epochs costs one row), like an unknown lease's.
    SELECT * INTO b FROM pgfence.beliefs WHERE lease = p_lease AND epoch = p_epoch;
    IF NOT FOUND THEN
        PERFORM pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'bad_secret'::text, 'report_belief'::text, NULL::text, NULL::text,
                                p_may_wait => true, p_by_role => true);
        outcome := 'refused'; reason := 'bad_secret';
        RETURN;
    END IF;
    IF NOT pgfence._secret_matches(b.report_hash, p_secret) THEN
        PERFORM pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'bad_secret'::text, 'report_belief'::text, NULL::text, NULL::text,
                                p_may_wait => true);
        outcome := 'refused'; reason := 'bad_secret';
        RETURN;
    END IF;
    SELECT * INTO b FROM pgfence.beliefs WHERE lease = p_lease AND epoch = p_epoch FOR NO KEY UPDATE;
    IF p_event = 'start' THEN
        IF b.start_received_at IS NOT NULL THEN
            outcome := 'kept';
            RETURN;
        END IF;
        UPDATE pgfence.beliefs
           SET believed_from = p_at, start_sent_at = p_sent_at, start_received_at = arrived,
               endpoint = p_endpoint
         WHERE lease = p_lease AND epoch = p_epoch;
    ELSE
        IF b.end_received_at IS NOT NULL THEN
            outcome := 'kept';
            RETURN;
        END IF;
        UPDATE pgfence.beliefs
           SET believed_until = p_at, end_cause = p_cause, end_detail = p_detail, end_sent_at = p_sent_at,
               end_received_at = arrived
         WHERE lease = p_lease AND epoch = p_epoch;
    END IF;
    outcome := 'recorded';
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: a belief report of lease % waited % ms for its row; blocked by %',
        pgfence._printable(p_lease), wait_ms, pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'Another report of this tenure is in an open transaction.';
END;
$$;
