-- pgfence.record_outcome as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.record_outcome(p_lease text, p_epoch bigint, p_secret text, p_effect_key text, p_outcome text, p_detail jsonb)
 RETURNS pgfence.effect_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
