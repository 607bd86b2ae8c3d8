-- pgfence migration 4 of 6, tasks: the guarded task writes (create_task, claim_task, transition_task,
-- append_event: each one statement that checks the fence, writes the task row and appends its event) and the
-- trigger that keeps pgfence.task_events append-only.
-- Called from Rust by src/tasks.rs.

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
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
        END IF;
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, false) THEN
        RETURN NULL;
    END IF;
    RETURN pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
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
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    r := pgfence._open_task_write(p_lease, p_epoch, p_secret, p_key, 'claim_task'::text, 'tasks'::text, 'assignee'::text, p_assignee,
                                  pgfence._max_holder_len(), NULL::jsonb);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
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
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    -- First: the shared opening runs the guard right after the other checks, and a bad state is refused before
    -- the guard, writing nothing.
    IF p_from IS NULL OR p_to IS NULL
       OR p_from NOT IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled')
       OR p_to NOT IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgfence: unknown task state % -> %', p_from, p_to USING ERRCODE = '22023';
    END IF;
    r := pgfence._open_task_write(p_lease, p_epoch, p_secret, p_key, 'transition_task'::text, 'tasks'::text, NULL::text, NULL::text, NULL::integer,
                                  p_payload);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
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
