-- pgfence.settle_effect as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.settle_effect(p_lease text, p_epoch bigint, p_secret text, p_effect_key text, p_resolution text, p_detail jsonb)
 RETURNS pgfence.effect_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
