-- pgfence._task_in_doubt as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._task_in_doubt(p_lease text, p_key text, p_epoch bigint)
 RETURNS SETOF pgfence.effects
 LANGUAGE sql
 STABLE
AS $function$
    SELECT e.* FROM pgfence.tasks t JOIN pgfence.effects e ON e.task_id = t.id
     WHERE t.lease = p_lease AND t.key = p_key AND e.settlement IS NULL
       AND pgfence._in_doubt(e.settlement, e.outcome, e.epoch, p_epoch)
     ORDER BY e.id LIMIT 1
$function$
