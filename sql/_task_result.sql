-- pgfence._task_result as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._task_result(t pgfence.tasks, p_outcome text, p_reason text, p_epoch bigint, p_created boolean, p_event_id bigint)
 RETURNS pgfence.write_result
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT ROW(p_outcome, p_reason, p_epoch, NULL, t.id, t.key, t.state, t.assignee, t.payload, t.fence,
               t.version, p_created, p_event_id)::pgfence.write_result
$function$
