-- pgfence migration 4 of 6, tasks: the guarded task writes (create_task, claim_task, transition_task,
-- append_event: each one statement that checks the fence, writes the task row and appends its event), the
-- trigger that keeps pgfence.task_events append-only, and the effect ledger of the tasks' external calls
-- (record_intent, record_outcome, settle_effect, in_doubt_effects).
-- Called from Rust by src/tasks.rs and src/effects/.

CREATE FUNCTION pgfence._task_result(t pgfence.tasks, p_outcome text, p_reason text, p_epoch bigint,
                                     p_created boolean, p_event_id bigint)
RETURNS pgfence.write_result
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_outcome, p_reason, p_epoch, NULL, t.id, t.key, t.state, t.assignee, t.payload, t.fence,
               t.version, p_created, p_event_id)::pgfence.write_result
$$;

-- A guarded task UPDATE matched no row: tell apart a missing task, a row written by a newer epoch (refused,
-- 'row_fence', audited) and a business-guard failure (conflict, not audited).
CREATE FUNCTION pgfence._explain_miss(p_lease text, p_epoch bigint, p_key text, p_operation text)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
DECLARE
    t pgfence.tasks;
BEGIN
    SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key;
    IF NOT FOUND THEN
        RETURN ROW('not_found', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
               ::pgfence.write_result;
    END IF;
    IF t.fence > p_epoch THEN
        RETURN pgfence._reject(p_lease, p_epoch, t.fence, NULL::text, 'row_fence'::text, p_operation, 'tasks'::text, p_key);
    END IF;
    RETURN pgfence._task_result(t, 'conflict'::text, t.state, p_epoch, false, NULL::bigint);
END;
$$;

-- The opening every task write shares: its arguments checked — the cheap test first, the full checks only when it
-- fails (see the argument checks in 000001_schema) — then the guard. Besides the lease, epoch and task key, a
-- write checks one text argument of its own (p_what, p_text, p_max; p_what NULL: none) and a payload (NULL:
-- none). Raises 22023 on a bad argument; returns the guard's refusal, or NULL when the write may go on.
-- Sharing it costs one plpgsql call per write against a copy in each of the four writes: measured +1.1–2.0 % of
-- append_event's server time, 3–5 µs of 220–300 µs (benches/append_event_side_by_side.sh 5343df0; the same script
-- comparing identical definitions reads 1.001–1.004), below the 2 % at which four copies would be worth it.
CREATE FUNCTION pgfence._open_task_write(p_lease text, p_epoch bigint, p_secret text, p_key text, p_operation text,
                                         p_table text, p_what text, p_text text, p_max integer, p_payload jsonb)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND p_secret IS NOT NULL AND pgfence._plain_arg(p_key, pgfence._max_holder_len())
        AND pgfence._plain_arg(p_text, p_max, p_optional => p_what IS NULL)
        AND pgfence._payload_problem(p_payload) IS NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch), pgfence._secret_problem(p_secret),
                            pgfence._arg_problem('task key'::text, p_key, pgfence._max_holder_len()),
                            pgfence._arg_problem(p_what, p_text, p_max, p_optional => p_what IS NULL),
                            pgfence._payload_problem(p_payload));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
        END IF;
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, false) THEN
        RETURN NULL;
    END IF;
    RETURN pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
END;
$$;

-- The backends holding the row lock of task p_key of lease p_lease, for PF003's message: the transaction in the
-- row's xmax when it is one (an update or an exclusive lock), else every other backend holding a row-level lock
-- on pgfence.tasks (a MultiXact: the lock shared with foreign-key checks).
CREATE FUNCTION pgfence._task_lockers(p_lease text, p_key text) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    WITH exact AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'transactionid' AND k.granted AND k.pid <> pg_catalog.pg_backend_pid()
           AND k.transactionid = (SELECT t.xmax FROM pgfence.tasks t WHERE t.lease = p_lease AND t.key = p_key)
    ), candidates AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'relation' AND k.relation = 'pgfence.tasks'::regclass AND k.granted
           AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
    )
    SELECT coalesce((SELECT array_agg(DISTINCT pid) FROM exact),
                    (SELECT array_agg(DISTINCT pid) FROM candidates), '{}')
$$;

-- Locks task p_key of lease p_lease (FOR NO KEY UPDATE: the FOR KEY SHARE of foreign-key checks still passes)
-- for a write that decides on the task or on its effects: every ledger write (record_intent, record_outcome,
-- settle_effect) and claim_task and transition_task take it after their guard and BEFORE the read they decide
-- on. So two such calls on one task — a repeat of a call racing the first, still in flight, or two tasks of one
-- leader reporting and settling at once — run one after the other: the second waits for the first's transaction,
-- and its read, a new statement (a new snapshot under READ COMMITTED), sees what the first committed. It decides
-- as it would had it been sent after the first returned. The lock is free in the usual case and taken without
-- waiting (SKIP LOCKED: no subtransaction); otherwise the wait is at most _lock_wait_ms(), then PF003 naming the
-- holders. Returns the locked row (all NULL: no such task).
CREATE FUNCTION pgfence._lock_task(p_lease text, p_key text, p_operation text) RETURNS pgfence.tasks
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    t pgfence.tasks;
    wait_ms bigint;
BEGIN
    SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN t;
    END IF;
    -- Held by another transaction (or no such task): wait, bounded (local to this function: its SET clause
    -- restores the caller's lock_timeout on exit).
    wait_ms := pgfence._lock_wait_ms();
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: % waited % ms for the row lock of task % of lease %; blocked by %',
            pgfence._printable(p_operation), wait_ms, pgfence._printable(p_key), pgfence._printable(p_lease),
            pgfence._describe_backends(pgfence._task_lockers(p_lease, p_key))
            USING ERRCODE = 'PF003',
                  HINT = 'Another transaction writing this task or its effects stays open: let it finish and retry.';
    END;
    RETURN t;
END;
$$;

-- Every task write takes (lease, epoch, secret) first and all its arguments without defaults (a NULL payload is
-- '{}'): an argument list of an older signature matches none of them and fails (42883) instead of binding the
-- task key to the secret.

-- Creates a pending task and its 'created' event, idempotent by (lease, key): a retry returns the existing
-- task with created = false and adds no event.
CREATE FUNCTION pgfence.create_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_payload jsonb)
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    r := pgfence._open_task_write(p_lease, p_epoch, p_secret, p_key, 'create_task'::text, 'tasks'::text, NULL::text, NULL::text, NULL::integer,
                                  p_payload);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    INSERT INTO pgfence.tasks (lease, key, state, payload, fence)
    VALUES (p_lease, p_key, 'pending', coalesce(p_payload, '{}'), p_epoch)
    ON CONFLICT (lease, key) DO NOTHING
    RETURNING * INTO t;
    IF NOT FOUND THEN
        SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key;
        RETURN pgfence._task_result(t, 'ok'::text, NULL::text, p_epoch, false, NULL::bigint);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, 'created', t.payload) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok'::text, NULL::text, p_epoch, true, ev);
END;
$$;

-- Claims a pending task for an assignee: the pending guard, the row fence and the 'claimed' event in one step.
CREATE FUNCTION pgfence.claim_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_assignee text)
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e pgfence.effects;
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    r := pgfence._open_task_write(p_lease, p_epoch, p_secret, p_key, 'claim_task'::text, 'tasks'::text, 'assignee'::text, p_assignee,
                                  pgfence._max_holder_len(), NULL::jsonb);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    -- Tasks follow their effects: not moved while an ended tenure's effect is unsettled (the duplicate a re-run
    -- would make is refused here, not guessed). Read under the task's row lock (_lock_task): a ledger write of
    -- this task in flight (its 'unknown' outcome, say) is waited for, not read past.
    PERFORM pgfence._lock_task(p_lease, p_key, 'claim_task'::text);
    SELECT * INTO e FROM pgfence._task_in_doubt(p_lease, p_key, p_epoch);
    IF FOUND THEN
        RETURN pgfence._in_doubt_result(e, p_key);
    END IF;
    UPDATE pgfence.tasks
       SET state = 'claimed', assignee = p_assignee, fence = p_epoch, version = version + 1,
           updated_at = clock_timestamp()
     WHERE lease = p_lease AND key = p_key AND state = 'pending' AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN pgfence._explain_miss(p_lease, p_epoch, p_key, 'claim_task'::text);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, 'claimed', jsonb_build_object('assignee', p_assignee)) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok'::text, NULL::text, p_epoch, false, ev);
END;
$$;

-- Moves a task from p_from to p_to (the business guard) and records the event p_kind with p_payload.
CREATE FUNCTION pgfence.transition_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_from text,
                                        p_to text, p_payload jsonb)
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e pgfence.effects;
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    -- First: the shared opening runs the guard right after the other checks, and a bad state is refused before
    -- the guard, writing nothing.
    IF p_from IS NULL OR p_to IS NULL
       OR p_from NOT IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled')
       OR p_to NOT IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgfence: unknown task state % -> %', p_from, p_to
            USING ERRCODE = '22023', COLUMN = 'state';
    END IF;
    r := pgfence._open_task_write(p_lease, p_epoch, p_secret, p_key, 'transition_task'::text, 'tasks'::text, NULL::text, NULL::text, NULL::integer,
                                  p_payload);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    -- Tasks follow their effects: not moved while an ended tenure's effect is unsettled (the duplicate a re-run
    -- would make is refused here, not guessed). Read under the task's row lock (_lock_task): a ledger write of
    -- this task in flight (its 'unknown' outcome, say) is waited for, not read past.
    PERFORM pgfence._lock_task(p_lease, p_key, 'transition_task'::text);
    SELECT * INTO e FROM pgfence._task_in_doubt(p_lease, p_key, p_epoch);
    IF FOUND THEN
        RETURN pgfence._in_doubt_result(e, p_key);
    END IF;
    UPDATE pgfence.tasks
       SET state = p_to, fence = p_epoch, version = version + 1, updated_at = clock_timestamp(),
           assignee = CASE WHEN p_to = 'pending' THEN NULL ELSE assignee END
     WHERE lease = p_lease AND key = p_key AND state = p_from AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN pgfence._explain_miss(p_lease, p_epoch, p_key, 'transition_task'::text);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, p_to, coalesce(p_payload, '{}')) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok'::text, NULL::text, p_epoch, false, ev);
END;
$$;

-- Appends an event to a task. The task row is fenced too (fence raised to p_epoch), so an older epoch can
-- never write this task again.
CREATE FUNCTION pgfence.append_event(p_lease text, p_epoch bigint, p_secret text, p_key text, p_kind text,
                                     p_payload jsonb)
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    r := pgfence._open_task_write(p_lease, p_epoch, p_secret, p_key, 'append_event'::text, 'task_events'::text, 'event kind'::text,
                                  p_kind, pgfence._max_kind_len(), p_payload);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    UPDATE pgfence.tasks SET fence = p_epoch, updated_at = clock_timestamp()
     WHERE lease = p_lease AND key = p_key AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN pgfence._explain_miss(p_lease, p_epoch, p_key, 'append_event'::text);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, p_kind, coalesce(p_payload, '{}')) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok'::text, NULL::text, p_epoch, false, ev);
END;
$$;

CREATE FUNCTION pgfence._append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: pgfence.% is append-only', TG_TABLE_NAME USING ERRCODE = 'PF002';
END;
$$;
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON pgfence.task_events
    FOR EACH ROW EXECUTE FUNCTION pgfence._append_only();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON pgfence.task_events
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._append_only();

-- ---------------------------------------------------------------------------------------------------------
-- The effect ledger (pgfence.effects, 000001_schema): a tenure records the intent of an external call under its
-- fence before it makes the call (record_intent) and its outcome after (record_outcome); a later tenure lists what
-- an ended tenure left in doubt (in_doubt_effects), asks the external system by the effect key, and settles each,
-- once (settle_effect). Every write is one guarded statement like the task writes: the guard, the task's row
-- fence raised, the attempt written and the task's event appended. Called from Rust by src/effects/.

-- The in-doubt rule, the one text every reader and writer of the ledger asks: an attempt (its settlement, outcome
-- and epoch) is in doubt when it is unsettled and its outcome is 'unknown', or it has none while its tenure is
-- not the lease's live one. p_live_epoch is that live tenure's epoch, NULL when none is live: inside a guarded
-- write, the writer's own epoch (its guard just admitted it, so every other epoch has ended); anywhere else,
-- _live_epoch of the lease's row. Never NULL. Inlined where it is called (plain IMMUTABLE SQL).
CREATE FUNCTION pgfence._in_doubt(p_settlement text, p_outcome text, p_epoch bigint, p_live_epoch bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_settlement IS NULL
       AND CASE WHEN p_outcome IS NULL THEN p_epoch IS DISTINCT FROM p_live_epoch
                ELSE p_outcome OPERATOR(pg_catalog.=) 'unknown' END
$$;

-- The epoch of lease row l's live tenure by the guard's rule (_loss_reason: held, not expired by the database
-- clock, granted on this timeline), NULL when none is live: what a reader outside a guarded write gives
-- _in_doubt. After a promotion every tenure granted before it has ended, so their open attempts are in doubt.
CREATE FUNCTION pgfence._live_epoch(l pgfence.leases) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pgfence._loss_reason(l, NULL::text, l.epoch, clock_timestamp(), pgfence._timeline()) IS NULL
                THEN l.epoch END
$$;

-- The unsettled effect of task p_key of lease p_lease that tenure p_epoch (the current one: its guard admitted
-- it) must settle before the task moves on: the oldest attempt in doubt (_in_doubt; no row: none).
CREATE FUNCTION pgfence._task_in_doubt(p_lease text, p_key text, p_epoch bigint) RETURNS SETOF pgfence.effects
LANGUAGE sql STABLE AS $$
    SELECT e.* FROM pgfence.tasks t JOIN pgfence.effects e ON e.task_id = t.id
     WHERE t.lease = p_lease AND t.key = p_key AND e.settlement IS NULL
       AND pgfence._in_doubt(e.settlement, e.outcome, e.epoch, p_epoch)
     ORDER BY e.id LIMIT 1
$$;

-- A task write's answer when the task has effect e in doubt.
CREATE FUNCTION pgfence._in_doubt_result(e pgfence.effects, p_key text) RETURNS pgfence.write_result
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW('in_doubt', e.effect_key, e.epoch, NULL::text, e.task_id, p_key, NULL::text, NULL::text, NULL::jsonb,
               NULL::bigint, NULL::bigint, NULL::boolean, NULL::bigint)::pgfence.write_result
$$;

-- The ledger's answer for attempt e after a write (or for a write that wrote nothing: p_created false, no event).
CREATE FUNCTION pgfence._effect_result(e pgfence.effects, p_outcome text, p_reason text, p_task_key text,
                                       p_created boolean, p_event_id bigint, p_waited_ms bigint)
RETURNS pgfence.effect_result
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_outcome, p_reason, NULL::bigint, NULL::text, e.id, e.task_id, p_task_key, e.effect_key, e.attempt,
               e.epoch, e.intent, coalesce(e.settlement, e.outcome, 'open'),
               coalesce(e.settle_detail, e.outcome_detail), e.settled_epoch, p_created, p_event_id, false,
               p_waited_ms)::pgfence.effect_result
$$;

-- The ledger's answer for a write that the guard refused, or that found no task (a pgfence.write_result r of
-- the guard or _explain_miss); p_late: whether a refused outcome was kept as a late report.
CREATE FUNCTION pgfence._effect_refusal(r pgfence.write_result, p_task_key text, p_effect_key text, p_late boolean)
RETURNS pgfence.effect_result
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(r.outcome, r.reason, r.current_epoch, r.current_holder, NULL::bigint, r.task_id,
               coalesce(r.task_key, p_task_key), p_effect_key, NULL::integer, NULL::bigint, NULL::jsonb, NULL::text,
               NULL::jsonb, NULL::bigint, false, NULL::bigint, p_late, NULL::bigint)::pgfence.effect_result
$$;

-- The opening every ledger write shares (as _open_task_write for the task writes): the lease, epoch and secret,
-- the effect key, one text argument of the write's own (p_what, p_text, p_max: the task key of an intent, NULL:
-- none) and its jsonb argument checked, then the guard, whose refusal names ('effects', effect key). Raises 22023
-- on a bad argument; returns the guard's refusal, or NULL when the write may go on.
CREATE FUNCTION pgfence._open_effect_write(p_lease text, p_epoch bigint, p_secret text, p_effect_key text,
                                           p_operation text, p_what text, p_text text, p_max integer,
                                           p_detail jsonb)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    -- The cheap test first, the full checks (which name the problem) only when it fails, as the task writes do.
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND p_secret IS NOT NULL
        AND pgfence._plain_arg(p_effect_key, pgfence._max_holder_len())
        AND pgfence._plain_arg(p_text, p_max, p_optional => p_what IS NULL)
        AND p_detail IS NOT NULL AND pgfence._payload_problem(p_detail) IS NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch), pgfence._secret_problem(p_secret),
                            pgfence._arg_problem('effect key'::text, p_effect_key, pgfence._max_holder_len()),
                            pgfence._arg_problem(p_what, p_text, p_max, p_optional => p_what IS NULL),
                            CASE WHEN p_detail IS NULL THEN 'a jsonb argument is required (''{}'' for none)' END,
                            pgfence._payload_problem(p_detail));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
        END IF;
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, false) THEN
        RETURN NULL;
    END IF;
    RETURN pgfence._guard(p_lease, p_epoch, p_secret, p_operation, 'effects'::text, p_effect_key);
END;
$$;

-- The last attempt of effect key p_effect_key of lease p_lease (no row: the key was never used).
CREATE FUNCTION pgfence._last_attempt(p_lease text, p_effect_key text) RETURNS SETOF pgfence.effects
LANGUAGE sql STABLE AS $$
    SELECT e.* FROM pgfence.effects e WHERE e.lease = p_lease AND e.effect_key = p_effect_key
     ORDER BY e.attempt DESC LIMIT 1
$$;

-- Records, under tenure (p_lease, p_epoch), the intent of an effect of task p_task_key BEFORE the external call:
-- p_effect_key, the idempotency key the external system will be asked about, and p_intent, what is about to be
-- done. A tenure that has ended is refused here (audited), before it calls anything. The attempt recorded is
--   * 1 for a key never used;
--   * the same one again, created = false and nothing written, for a retry of this call by the same tenure with
--     the same intent (its reply was lost);
--   * the next one when the key's last attempt failed or was abandoned.
-- Writes nothing and answers 'in_doubt' while the task has an unsettled effect of an ended tenure (or one whose
-- outcome is 'unknown'): settle it first (settle_effect); 'conflict' when the key's effect is done or confirmed
-- ('done'), in flight under this tenure with another intent ('intent_differs'), or the key is another task's
-- ('other_task'); 'not_found' for an unknown task.
CREATE FUNCTION pgfence.record_intent(p_lease text, p_epoch bigint, p_secret text, p_task_key text,
                                      p_effect_key text, p_intent jsonb)
RETURNS pgfence.effect_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pgfence.write_result;
    t pgfence.tasks;
    e pgfence.effects;
    doubt pgfence.effects;
    hash bytea;
    got record;
    next_attempt integer := 1;
    ev bigint;
BEGIN
    r := pgfence._open_effect_write(p_lease, p_epoch, p_secret, p_effect_key, 'record_intent'::text,
                                    'task key'::text, p_task_key, pgfence._max_holder_len(), p_intent);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN pgfence._effect_refusal(r, p_task_key, p_effect_key, false);
    END IF;
    -- The task's row lock first (_lock_task): another ledger write of this task in flight is waited for, and the
    -- read below sees what it committed.
    PERFORM pgfence._lock_task(p_lease, p_task_key, 'record_intent'::text);
    -- One read for what the write decides on: the task, an effect of it in doubt (_task_in_doubt's rule), the
    -- key's last attempt, and the tenure's secret hash (kept with the attempt; the guard admitted this epoch, so
    -- tenure_secrets names it until this transaction ends).
    SELECT x AS task, d AS doubt, a AS last, s.hash AS hash INTO got
      FROM pgfence.tasks x
      LEFT JOIN LATERAL (SELECT y.* FROM pgfence.effects y
                          WHERE y.task_id = x.id AND y.settlement IS NULL
                            AND pgfence._in_doubt(y.settlement, y.outcome, y.epoch, p_epoch)
                          ORDER BY y.id LIMIT 1) d ON true
      LEFT JOIN LATERAL (SELECT y.* FROM pgfence.effects y WHERE y.lease = p_lease AND y.effect_key = p_effect_key
                          ORDER BY y.attempt DESC LIMIT 1) a ON true
      LEFT JOIN pgfence.tenure_secrets s ON s.lease = p_lease AND s.epoch = p_epoch
     WHERE x.lease = p_lease AND x.key = p_task_key;
    IF FOUND THEN
        t := got.task;
        doubt := got.doubt;
        e := got.last;
        hash := got.hash;
    END IF;
    IF NOT FOUND OR t.fence > p_epoch THEN
        RETURN pgfence._effect_refusal(pgfence._explain_miss(p_lease, p_epoch, p_task_key, 'record_intent'::text),
                                       p_task_key, p_effect_key, false);
    END IF;
    IF doubt.id IS NOT NULL THEN
        RETURN pgfence._effect_result(doubt, 'in_doubt'::text, doubt.effect_key, p_task_key, false, NULL::bigint,
                                      NULL::bigint);
    END IF;
    IF e.id IS NOT NULL THEN
        IF e.task_id <> t.id THEN
            RETURN pgfence._effect_result(e, 'conflict'::text, 'other_task'::text, NULL::text, false, NULL::bigint,
                                          NULL::bigint);
        ELSIF e.outcome = 'done' OR e.settlement = 'confirmed' THEN
            RETURN pgfence._effect_result(e, 'conflict'::text, 'done'::text, p_task_key, false, NULL::bigint,
                                          NULL::bigint);
        ELSIF e.outcome IS NULL AND e.settlement IS NULL THEN
            -- Not in doubt (checked above), so this tenure's own attempt in flight: a retry of this call.
            RETURN pgfence._effect_result(e, CASE WHEN e.intent = p_intent THEN 'ok' ELSE 'conflict' END,
                                          CASE WHEN e.intent = p_intent THEN NULL ELSE 'intent_differs' END,
                                          p_task_key, false, NULL::bigint, NULL::bigint);
        END IF;
        next_attempt := e.attempt + 1;  -- failed, or abandoned
    END IF;
    IF hash IS NULL THEN
        -- Unreachable while the guard holds (it admitted this epoch, whose secret tenure_secrets names): said loudly
        -- rather than recording an intent no late report could ever be matched against.
        RAISE EXCEPTION 'pgfence: no secret of tenure % of lease % to record the intent with', p_epoch,
            pgfence._printable(p_lease) USING ERRCODE = 'XX000';
    END IF;
    -- The task's row fence raised to this epoch, unless this epoch raised it already (the row is not written
    -- again for nothing: a hot task row is the write's main cost).
    IF t.fence < p_epoch THEN
        UPDATE pgfence.tasks SET fence = p_epoch, updated_at = clock_timestamp()
         WHERE id = t.id AND fence <= p_epoch;
    END IF;
    INSERT INTO pgfence.effects (task_id, lease, effect_key, attempt, epoch, tenure_hash, intent)
    VALUES (t.id, p_lease, p_effect_key, next_attempt, p_epoch, hash, p_intent)
    ON CONFLICT (lease, effect_key, attempt) DO NOTHING
    RETURNING * INTO e;
    IF NOT FOUND THEN
        -- Another call of this tenure recorded the same attempt meanwhile (committed: the unique index waited for
        -- it): answered as a retry.
        SELECT * INTO e FROM pgfence._last_attempt(p_lease, p_effect_key);
        RETURN pgfence._effect_result(e, CASE WHEN e.intent = p_intent AND e.epoch = p_epoch THEN 'ok' ELSE 'conflict' END,
                                      CASE WHEN e.intent = p_intent AND e.epoch = p_epoch THEN NULL ELSE 'intent_differs' END,
                                      p_task_key, false, NULL::bigint, NULL::bigint);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, 'effect_intent',
            jsonb_build_object('effect_key', p_effect_key, 'attempt', e.attempt, 'intent', p_intent))
    RETURNING id INTO ev;
    RETURN pgfence._effect_result(e, 'ok'::text, NULL::text, p_task_key, true, ev, NULL::bigint);
END;
$$;

-- Keeps outcome p_outcome (p_detail) that tenure (p_lease, p_epoch) sent for its attempt of p_effect_key after
-- the tenure ended (its write was refused) as the attempt's late report, when p_secret is that tenure's (the
-- attempt keeps its hash: knowing the epoch is not enough to leave evidence). True when kept (or counted again).
-- Waits at most _lock_wait_ms() for another report of the same attempt in an open transaction, then PF003.
CREATE FUNCTION pgfence._keep_late_report(p_lease text, p_epoch bigint, p_secret text, p_effect_key text,
                                          p_outcome text, p_detail jsonb)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    e pgfence.effects;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    SELECT * INTO e FROM pgfence.effects x
     WHERE x.lease = p_lease AND x.effect_key = p_effect_key AND x.epoch = p_epoch
     ORDER BY x.attempt DESC LIMIT 1;
    IF NOT FOUND OR NOT pgfence._secret_matches(e.tenure_hash, p_secret) THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    INSERT INTO pgfence.effect_reports AS k (effect_id, lease, epoch, outcome, detail)
    VALUES (e.id, p_lease, p_epoch, p_outcome, p_detail)
    ON CONFLICT (effect_id) DO UPDATE
       SET count = k.count + 1, last_at = clock_timestamp(),
           outcome = CASE WHEN k.outcome = 'unknown' THEN EXCLUDED.outcome ELSE k.outcome END,
           detail = CASE WHEN k.outcome = 'unknown' THEN EXCLUDED.detail ELSE k.detail END;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: the late report of % attempt % waited % ms for another report of it; blocked by %',
        pgfence._printable(p_effect_key), e.attempt, wait_ms,
        pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
                                     WHERE k.locktype = 'relation' AND k.granted
                                       AND k.relation = 'pgfence.effect_reports'::regclass
                                       AND k.mode = 'RowExclusiveLock'
                                       AND k.pid <> pg_catalog.pg_backend_pid()))
        USING ERRCODE = 'PF003';
END;
$$;

-- Records, under tenure (p_lease, p_epoch), the outcome of its attempt of p_effect_key AFTER the external call:
-- p_outcome 'done' (p_detail: the external system's answer), 'failed', or 'unknown' (no answer: a timeout; the
-- attempt is then in doubt until settled). 'unknown' may later become 'done' or 'failed' by the same tenure; a
-- final outcome stands (the same one again: created = false, nothing written; 'unknown' again likewise). Under
-- the task's row lock (_lock_task): a repeat or a settle of this tenure racing this call answers as it would
-- after it. Refused (audited) when the tenure
-- has ended — and then kept as the attempt's late report (pgfence.effect_reports) when the secret is the one
-- that recorded the intent, for the successor to see: evidence, not a write. 'conflict' when the key's last
-- attempt is another tenure's ('not_this_tenure': settle it), settled ('settled') or has another final outcome
-- ('outcome_recorded'); 'not_found' for an unknown key.
CREATE FUNCTION pgfence.record_outcome(p_lease text, p_epoch bigint, p_secret text, p_effect_key text,
                                       p_outcome text, p_detail jsonb)
RETURNS pgfence.effect_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    got record;
    attempt_id bigint;
    r pgfence.write_result;
    e pgfence.effects;
    task_key text;
    ev bigint;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('done', 'failed', 'unknown') THEN
        RAISE EXCEPTION 'pgfence: invalid outcome: must be ''done'', ''failed'' or ''unknown'', got %',
            pgfence._printable(p_outcome) USING ERRCODE = '22023', COLUMN = 'outcome';
    END IF;
    r := pgfence._open_effect_write(p_lease, p_epoch, p_secret, p_effect_key, 'record_outcome'::text, NULL::text,
                                    NULL::text, NULL::integer, p_detail);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        -- (A role without a grant leaves no evidence, whatever it presents.)
        IF r.reason = 'no_grant' THEN
            RETURN pgfence._effect_refusal(r, NULL::text, p_effect_key, false);
        END IF;
        RETURN pgfence._effect_refusal(r, NULL::text, p_effect_key,
                                       pgfence._keep_late_report(p_lease, p_epoch, p_secret, p_effect_key,
                                                                 p_outcome, p_detail));
    END IF;
    -- The key's task, then its row lock (_lock_task: another ledger write of this task in flight — a repeat of
    -- this call, a settle — is waited for), then the read that decides, which sees what that write committed.
    SELECT x.key INTO task_key FROM pgfence.effects y JOIN pgfence.tasks x ON x.id = y.task_id
     WHERE y.lease = p_lease AND y.effect_key = p_effect_key
     LIMIT 1;
    IF FOUND THEN
        PERFORM pgfence._lock_task(p_lease, task_key, 'record_outcome'::text);
    END IF;
    -- One read: the key's last attempt and its task's key.
    SELECT y AS attempt, x.key AS task_key, x.fence AS task_fence INTO got
      FROM pgfence.effects y JOIN pgfence.tasks x ON x.id = y.task_id
     WHERE y.lease = p_lease AND y.effect_key = p_effect_key
     ORDER BY y.attempt DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN pgfence._effect_refusal(ROW('not_found', NULL, p_epoch, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                           NULL, NULL, NULL)::pgfence.write_result,
                                       NULL::text, p_effect_key, false);
    END IF;
    e := got.attempt;
    task_key := got.task_key;
    IF e.epoch <> p_epoch THEN
        RETURN pgfence._effect_result(e, 'conflict'::text, 'not_this_tenure'::text, task_key, false, NULL::bigint,
                                      NULL::bigint);
    ELSIF e.settlement IS NOT NULL THEN
        RETURN pgfence._effect_result(e, 'conflict'::text, 'settled'::text, task_key, false, NULL::bigint,
                                      NULL::bigint);
    ELSIF e.outcome IS NOT NULL AND (e.outcome <> 'unknown' OR p_outcome = 'unknown') THEN
        RETURN pgfence._effect_result(e,
                   CASE WHEN e.outcome = p_outcome AND e.outcome_detail = p_detail THEN 'ok' ELSE 'conflict' END,
                   CASE WHEN e.outcome = p_outcome AND e.outcome_detail = p_detail THEN NULL ELSE 'outcome_recorded' END,
                   task_key, false, NULL::bigint, NULL::bigint);
    END IF;
    -- The attempt's intent raised the task's row fence to this epoch, so the row is not written again; a fence
    -- above it (a newer epoch wrote the task) is refused as row_fence.
    IF got.task_fence > p_epoch THEN
        RETURN pgfence._effect_refusal(pgfence._explain_miss(p_lease, p_epoch, task_key, 'record_outcome'::text),
                                       task_key, p_effect_key, false);
    END IF;
    attempt_id := e.id;
    UPDATE pgfence.effects SET outcome = p_outcome, outcome_detail = p_detail, outcome_at = clock_timestamp()
     WHERE id = attempt_id AND settlement IS NULL AND (outcome IS NULL OR outcome = 'unknown')
    RETURNING * INTO e;
    IF NOT FOUND THEN
        -- Unreachable while the task's row lock is taken before the read (every write of the attempt takes it):
        -- answered as the checks above answer the attempt as it is now.
        SELECT * INTO e FROM pgfence.effects WHERE id = attempt_id;
        RETURN pgfence._effect_result(e,
                   CASE WHEN e.settlement IS NULL AND e.outcome = p_outcome AND e.outcome_detail = p_detail THEN 'ok'
                        ELSE 'conflict' END,
                   CASE WHEN e.settlement IS NOT NULL THEN 'settled'
                        WHEN e.outcome = p_outcome AND e.outcome_detail = p_detail THEN NULL
                        ELSE 'outcome_recorded' END,
                   task_key, false, NULL::bigint, NULL::bigint);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (e.task_id, p_lease, p_epoch, 'effect_' || p_outcome,
            jsonb_build_object('effect_key', p_effect_key, 'attempt', e.attempt, 'detail', p_detail))
    RETURNING id INTO ev;
    RETURN pgfence._effect_result(e, 'ok'::text, NULL::text, task_key, true, ev, NULL::bigint);
END;
$$;

-- Settles, under tenure (p_lease, p_epoch), the last attempt of p_effect_key, which must be in doubt: no outcome
-- and recorded by an ended tenure (an earlier epoch), or outcome 'unknown' (of any tenure, this one included). The
-- caller has asked the external system by the effect key first; p_resolution says what it found:
--   'confirmed': the effect happened (p_detail: what was observed);
--   'retried':   it did not, and is attempted again under the same key: the next attempt is recorded as this
--                tenure's intent, with the same intent, and answered (open) — call the external system, then
--                record_outcome for it;
--   'abandoned': it is given up (p_detail must carry a non-empty text 'reason'). Abandoning says what was seen,
--                not what will be: a request still in transit may yet be applied — abandon only what the
--                external system will refuse from now on (its key cancelled, or past its delivery deadline).
-- Exactly once: an attempt is settled by one call only, and a tenure that has ended is refused by the guard. A
-- settle targets the key's last attempt, so a second settle answers as the first left it: after 'confirmed' or
-- 'abandoned', 'conflict'/'settled' naming the epoch that settled it; after 'retried' the last attempt is the
-- retry — this tenure's second settle answers 'in_flight', a later tenure's settles the retry if it is in doubt
-- or answers 'not_in_doubt'. Under the task's row lock (_lock_task): a second call of this tenure racing this
-- one (a repeat, its final outcome) answers as it would after it. The settle is the task's event 'effect_confirmed' / 'effect_retried' / 'effect_abandoned' with this epoch. Other
-- answers, writing nothing: 'conflict' — 'not_in_doubt' (it has a final outcome) or 'in_flight' (its tenure is
-- this one and has not reported); 'not_found' for an unknown key.
CREATE FUNCTION pgfence.settle_effect(p_lease text, p_epoch bigint, p_secret text, p_effect_key text,
                                      p_resolution text, p_detail jsonb)
RETURNS pgfence.effect_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    attempt_id bigint;
    r pgfence.write_result;
    e pgfence.effects;
    retry pgfence.effects;
    task_key text;
    ev bigint;
    waited bigint;
BEGIN
    IF p_resolution IS NULL OR p_resolution NOT IN ('confirmed', 'retried', 'abandoned') THEN
        RAISE EXCEPTION 'pgfence: invalid resolution: must be ''confirmed'', ''retried'' or ''abandoned'', got %',
            pgfence._printable(p_resolution) USING ERRCODE = '22023', COLUMN = 'resolution';
    END IF;
    IF p_resolution = 'abandoned' AND (jsonb_typeof(p_detail -> 'reason') IS DISTINCT FROM 'string'
                                       OR length(p_detail ->> 'reason') = 0) THEN
        RAISE EXCEPTION 'pgfence: invalid detail: abandoning an effect needs a non-empty text ''reason'''
            USING ERRCODE = '22023', COLUMN = 'detail';
    END IF;
    r := pgfence._open_effect_write(p_lease, p_epoch, p_secret, p_effect_key, 'settle_effect'::text, NULL::text,
                                    NULL::text, NULL::integer, p_detail);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN pgfence._effect_refusal(r, NULL::text, p_effect_key, false);
    END IF;
    SELECT * INTO e FROM pgfence._last_attempt(p_lease, p_effect_key);
    IF NOT FOUND THEN
        RETURN pgfence._effect_refusal(ROW('not_found', NULL, p_epoch, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                           NULL, NULL, NULL)::pgfence.write_result,
                                       NULL::text, p_effect_key, false);
    END IF;
    SELECT t.key INTO task_key FROM pgfence.tasks t WHERE t.id = e.task_id;
    -- The task's row lock (_lock_task: another ledger write of this task in flight — its tenure's final outcome, a
    -- second settle — is waited for), then the key's last attempt read again: what is decided on below.
    PERFORM pgfence._lock_task(p_lease, task_key, 'settle_effect'::text);
    SELECT * INTO e FROM pgfence._last_attempt(p_lease, p_effect_key);
    IF e.settlement IS NOT NULL THEN
        RETURN pgfence._effect_result(e, 'conflict'::text, 'settled'::text, task_key, false, NULL::bigint,
                                      NULL::bigint);
    ELSIF e.outcome IN ('done', 'failed') THEN
        RETURN pgfence._effect_result(e, 'conflict'::text, 'not_in_doubt'::text, task_key, false, NULL::bigint,
                                      NULL::bigint);
    ELSIF NOT pgfence._in_doubt(e.settlement, e.outcome, e.epoch, p_epoch) THEN
        -- Unsettled, no outcome, and this tenure's own: its attempt is in flight.
        RETURN pgfence._effect_result(e, 'conflict'::text, 'in_flight'::text, task_key, false, NULL::bigint,
                                      NULL::bigint);
    END IF;
    UPDATE pgfence.tasks SET fence = p_epoch, updated_at = clock_timestamp()
     WHERE id = e.task_id AND fence <= p_epoch;
    IF NOT FOUND THEN
        RETURN pgfence._effect_refusal(pgfence._explain_miss(p_lease, p_epoch, task_key, 'settle_effect'::text),
                                       task_key, p_effect_key, false);
    END IF;
    -- Exactly once, and only in doubt: every condition decided on above re-checked on the row (another call of
    -- this tenure waited for at the task's row lock; a later tenure's waits for this one at its acquisition).
    attempt_id := e.id;
    UPDATE pgfence.effects
       SET settlement = p_resolution, settled_epoch = p_epoch, settle_detail = p_detail,
           settled_at = clock_timestamp()
     WHERE id = attempt_id AND settlement IS NULL AND (outcome IS NULL OR outcome = 'unknown')
    RETURNING * INTO e;
    IF NOT FOUND THEN
        SELECT * INTO e FROM pgfence.effects WHERE id = attempt_id;
        RETURN pgfence._effect_result(e, 'conflict'::text,
                                      CASE WHEN e.settlement IS NOT NULL THEN 'settled' ELSE 'not_in_doubt' END,
                                      task_key, false, NULL::bigint, NULL::bigint);
    END IF;
    -- In doubt since its tenure ended (an attempt with no outcome) or since its 'unknown' outcome.
    SELECT ceil(extract(epoch FROM e.settled_at
                        - CASE WHEN e.outcome = 'unknown' THEN e.outcome_at ELSE coalesce(h.ended_at, h.expires) END)
                * 1000)::bigint
      INTO waited
      FROM (SELECT (SELECT t.ended_at FROM pgfence.tenures t WHERE t.lease = p_lease AND t.epoch = e.epoch) AS ended_at,
                   (SELECT CASE WHEN l.epoch = e.epoch THEN l.expires_at END FROM pgfence.leases l
                     WHERE l.name = p_lease) AS expires) h;
    IF p_resolution = 'retried' THEN
        INSERT INTO pgfence.effects (task_id, lease, effect_key, attempt, epoch, tenure_hash, intent)
        SELECT e.task_id, p_lease, p_effect_key, e.attempt + 1, p_epoch, s.hash, e.intent
          FROM pgfence.tenure_secrets s WHERE s.lease = p_lease AND s.epoch = p_epoch
        RETURNING * INTO retry;
        IF retry.id IS NULL THEN
            -- Unreachable while the guard holds (it admitted this epoch, whose secret tenure_secrets names): said
            -- loudly rather than committing a retry with no attempt to make.
            RAISE EXCEPTION 'pgfence: no secret of tenure % of lease % to record the retry with', p_epoch,
                pgfence._printable(p_lease) USING ERRCODE = 'XX000';
        END IF;
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (e.task_id, p_lease, p_epoch, 'effect_' || p_resolution,
            jsonb_build_object('effect_key', p_effect_key, 'attempt', e.attempt, 'attempt_epoch', e.epoch,
                               'detail', p_detail, 'waited_ms', waited)
            || CASE WHEN retry.id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('next_attempt', retry.attempt) END)
    RETURNING id INTO ev;
    IF retry.id IS NOT NULL THEN
        e := retry;
    END IF;
    RETURN pgfence._effect_result(e, 'ok'::text, NULL::text, task_key, true, ev, waited);
END;
$$;

-- The effects of lease p_lease in doubt as its current tenure sees them: each unsettled attempt whose outcome is
-- 'unknown', or that has no outcome and whose tenure is no longer live by the guard's rule (_loss_reason: an
-- earlier epoch, or the lease's current tenure released, expired or granted before the last promotion) — with its task, the ended tenure as pgfence.tenure_history tells it (holder, how and
-- when it ended, when it was last heard from: its last accepted write and its last belief report) and its late
-- report, if any. end_reason and ended_at are tenure_history's: NULL until the tenure's end is recorded (a tenure
-- that merely expired with no successor yet, or one still live whose attempt is 'unknown'). Oldest first; nothing for a lease of a cluster the session's role may not read (the rule of
-- row-level security: _reads_all, _readable_clusters). Raises 22023 for a malformed lease name.
CREATE FUNCTION pgfence.in_doubt_effects(p_lease text)
RETURNS TABLE (effect_id bigint, task_id bigint, task_key text, effect_key text, attempt integer, epoch bigint,
               intent jsonb, intended_at timestamptz, outcome text, outcome_detail jsonb, holder text,
               end_reason text, ended_at timestamptz, last_write_at timestamptz, belief_end_cause text,
               last_belief_at timestamptz, late_outcome text, late_detail jsonb, late_reported_at timestamptz,
               late_count bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text := pgfence._lease_problem(p_lease);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    RETURN QUERY
    SELECT e.id, e.task_id, t.key, e.effect_key, e.attempt, e.epoch, e.intent, e.intended_at, e.outcome,
           e.outcome_detail, h.holder, h.end_reason, h.ended_at, h.last_write_at, h.end_cause,
           greatest(h.start_received_at, h.end_received_at), k.outcome, k.detail, k.last_at, k.count
      FROM pgfence.effects e
      JOIN pgfence.tasks t ON t.id = e.task_id
      LEFT JOIN pgfence.leases l ON l.name = e.lease
      LEFT JOIN pgfence.tenure_history h ON h.lease = e.lease AND h.epoch = e.epoch
      LEFT JOIN pgfence.effect_reports k ON k.effect_id = e.id
     WHERE e.lease = p_lease AND e.settlement IS NULL
       AND (pgfence._reads_all() OR pgfence._cluster_of(p_lease) = ANY (pgfence._readable_clusters()))
       AND pgfence._in_doubt(e.settlement, e.outcome, e.epoch, pgfence._live_epoch(l))
     ORDER BY e.id;
END;
$$;

-- Every attempt of every effect of lease p_lease — of task p_task_key only, when it is not NULL — oldest first,
-- with its task's key, its late report if any, and whether it is in doubt now (_in_doubt, as in_doubt_effects
-- decides): the effect ledger as an operator reads it (`pgfence tasks --lease L --task K`, `pgfence history`).
-- Nothing for a lease of a cluster the session's role may not read. Raises 22023 for a malformed lease name or
-- task key.
CREATE FUNCTION pgfence.effect_attempts(p_lease text, p_task_key text)
RETURNS TABLE (effect_id bigint, task_id bigint, task_key text, effect_key text, attempt integer, epoch bigint,
               intent jsonb, intended_at timestamptz, outcome text, outcome_detail jsonb, outcome_at timestamptz,
               settlement text, settled_epoch bigint, settle_detail jsonb, settled_at timestamptz,
               late_outcome text, late_detail jsonb, late_reported_at timestamptz, late_count bigint,
               in_doubt boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text := pgfence._lease_problem(p_lease);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    IF p_task_key IS NOT NULL THEN
        PERFORM pgfence._check_text('task key'::text, p_task_key, pgfence._max_holder_len());
    END IF;
    RETURN QUERY
    SELECT e.id, e.task_id, t.key, e.effect_key, e.attempt, e.epoch, e.intent, e.intended_at, e.outcome,
           e.outcome_detail, e.outcome_at, e.settlement, e.settled_epoch, e.settle_detail, e.settled_at,
           k.outcome, k.detail, k.last_at, k.count,
           pgfence._in_doubt(e.settlement, e.outcome, e.epoch, pgfence._live_epoch(l))
      FROM pgfence.effects e
      JOIN pgfence.tasks t ON t.id = e.task_id
      LEFT JOIN pgfence.leases l ON l.name = e.lease
      LEFT JOIN pgfence.effect_reports k ON k.effect_id = e.id
     WHERE e.lease = p_lease AND (p_task_key IS NULL OR t.key = p_task_key)
       AND (pgfence._reads_all() OR pgfence._cluster_of(p_lease) = ANY (pgfence._readable_clusters()))
     ORDER BY e.id;
END;
$$;
