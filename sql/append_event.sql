-- pgfence.append_event as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.append_event(p_lease text, p_epoch bigint, p_secret text, p_key text, p_kind text, p_payload jsonb)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
