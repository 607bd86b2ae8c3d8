-- pgfence._effect_refusal as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._effect_refusal(r pgfence.write_result, p_task_key text, p_effect_key text, p_late boolean)
 RETURNS pgfence.effect_result
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT ROW(r.outcome, r.reason, r.current_epoch, r.current_holder, NULL::bigint, r.task_id,
               coalesce(r.task_key, p_task_key), p_effect_key, NULL::integer, NULL::bigint, NULL::jsonb, NULL::text,
               NULL::jsonb, NULL::bigint, false, NULL::bigint, p_late, NULL::bigint)::pgfence.effect_result
$function$
