-- pgfence.create_task as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.create_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_payload jsonb)
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
$function$
