-- pgfence.claim_task as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.claim_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_assignee text)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
