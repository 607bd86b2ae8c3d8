-- pgfence.in_doubt_effects as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.in_doubt_effects(p_lease text)
 RETURNS TABLE(effect_id bigint, task_id bigint, task_key text, effect_key text, attempt integer, epoch bigint, intent jsonb, intended_at timestamp with time zone, outcome text, outcome_detail jsonb, holder text, end_reason text, ended_at timestamp with time zone, last_write_at timestamp with time zone, belief_end_cause text, last_belief_at timestamp with time zone, late_outcome text, late_detail jsonb, late_reported_at timestamp with time zone, late_count bigint)
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
    RETURN QUERY
    SELECT e.id, e.task_id, t.key, e.effect_key, e.attempt, e.epoch, e.intent, e.intended_at, e.outcome,
           e.outcome_detail, h.holder, h.end_reason, h.ended_at, h.last_write_at, h.end_cause,
           greatest(h.start_received_at, h.end_received_at), k.outcome, k.detail, k.last_at, k.count
      FROM pgfence.effects e
      JOIN pgfence.tasks t ON t.id = e.task_id
      LEFT JOIN pgfence.leases l ON l.name = e.lease
      LEFT JOIN pgfence.tenure_history h ON h.lease = e.lease AND h.epoch = e.epoch
      LEFT JOIN pgfence.effect_reports k ON k.effect_id = e.id
     WHERE e.lease = p_lease AND e.settlement IS NULL
       AND (pgfence._reads_all() OR pgfence._cluster_of(p_lease) = ANY (pgfence._readable_clusters()))
       AND pgfence._in_doubt(e.settlement, e.outcome, e.epoch, pgfence._live_epoch(l))
     ORDER BY e.id;
END;
$function$
