-- pgfence._in_doubt_result as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._in_doubt_result(e pgfence.effects, p_key text)
 RETURNS pgfence.write_result
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT ROW('in_doubt', e.effect_key, e.epoch, NULL::text, e.task_id, p_key, NULL::text, NULL::text, NULL::jsonb,
               NULL::bigint, NULL::bigint, NULL::boolean, NULL::bigint)::pgfence.write_result
$function$
