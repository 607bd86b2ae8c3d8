-- pgfence._explain_miss as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._explain_miss(p_lease text, p_epoch bigint, p_key text, p_operation text)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
AS $function$
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
$function$
