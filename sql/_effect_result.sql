-- pgfence._effect_result as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._effect_result(e pgfence.effects, p_outcome text, p_reason text, p_task_key text, p_created boolean, p_event_id bigint, p_waited_ms bigint)
 RETURNS pgfence.effect_result
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT ROW(p_outcome, p_reason, NULL::bigint, NULL::text, e.id, e.task_id, p_task_key, e.effect_key, e.attempt,
               e.epoch, e.intent, coalesce(e.settlement, e.outcome, 'open'),
               coalesce(e.settle_detail, e.outcome_detail), e.settled_epoch, p_created, p_event_id, false,
               p_waited_ms)::pgfence.effect_result
$function$
