-- pgfence.record_intent as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.record_intent(p_lease text, p_epoch bigint, p_secret text, p_task_key text, p_effect_key text, p_intent jsonb)
 RETURNS pgfence.effect_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
