-- pgfence.effect_attempts as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.effect_attempts(p_lease text, p_task_key text)
 RETURNS TABLE(effect_id bigint, task_id bigint, task_key text, effect_key text, attempt integer, epoch bigint, intent jsonb, intended_at timestamp with time zone, outcome text, outcome_detail jsonb, outcome_at timestamp with time zone, settlement text, settled_epoch bigint, settle_detail jsonb, settled_at timestamp with time zone, late_outcome text, late_detail jsonb, late_reported_at timestamp with time zone, late_count bigint, in_doubt boolean)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    problem text := pgfence._lease_problem(p_lease);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    IF p_task_key IS NOT NULL THEN
        PERFORM pgfence._check_text('task key'::text, p_task_key, pgfence._max_holder_len());
    END IF;
    RETURN QUERY
    SELECT e.id, e.task_id, t.key, e.effect_key, e.attempt, e.epoch, e.intent, e.intended_at, e.outcome,
           e.outcome_detail, e.outcome_at, e.settlement, e.settled_epoch, e.settle_detail, e.settled_at,
           k.outcome, k.detail, k.last_at, k.count,
           pgfence._in_doubt(e.settlement, e.outcome, e.epoch, pgfence._live_epoch(l))
      FROM pgfence.effects e
      JOIN pgfence.tasks t ON t.id = e.task_id
      LEFT JOIN pgfence.leases l ON l.name = e.lease
      LEFT JOIN pgfence.effect_reports k ON k.effect_id = e.id
     WHERE e.lease = p_lease AND (p_task_key IS NULL OR t.key = p_task_key)
       AND (pgfence._reads_all() OR pgfence._cluster_of(p_lease) = ANY (pgfence._readable_clusters()))
     ORDER BY e.id;
END;
$function$
