-- pgfence._granted_privileges as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._granted_privileges()
 RETURNS TABLE(kind text, object oid, privilege text, operator boolean)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT 'SCHEMA', n.oid, 'USAGE', false FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'
    UNION ALL
    SELECT 'TABLE', t.o, 'SELECT', false
      FROM unnest(ARRAY['pgfence.instance', 'pgfence.leases', 'pgfence.tenures', 'pgfence.tasks',
                        'pgfence.task_events', 'pgfence.rejections', 'pgfence.grants',
                        'pgfence.tenure_history', 'pgfence.group_members', 'pgfence.effects',
                        'pgfence.effect_reports']::regclass[]) AS t(o)
    UNION ALL
    SELECT 'FUNCTION', f.o, 'EXECUTE', false
      FROM unnest(ARRAY['pgfence.acquire(text, text, bigint)', 'pgfence.acquire_many(text[], text, bigint)',
                        'pgfence.renew(text, bigint, text, bigint)',
                        'pgfence.renew_many(text[], bigint[], text[], bigint)',
                        'pgfence.release(text, bigint, text)',
                        -- Judged per cluster by the function itself ('refused' / 'no_grant' without operator
                        -- rights there), so that a missing right on a cluster is one answer for every role.
                        'pgfence.force_release(text)',
                        'pgfence.fence(text, bigint, text, text, text, text)',
                        'pgfence.create_task(text, bigint, text, text, jsonb)',
                        'pgfence.claim_task(text, bigint, text, text, text)',
                        'pgfence.transition_task(text, bigint, text, text, text, text, jsonb)',
                        'pgfence.append_event(text, bigint, text, text, text, jsonb)', 'pgfence.enforcement()',
                        'pgfence.record_intent(text, bigint, text, text, text, jsonb)',
                        'pgfence.record_outcome(text, bigint, text, text, text, jsonb)',
                        'pgfence.settle_effect(text, bigint, text, text, text, jsonb)',
                        'pgfence.in_doubt_effects(text)', 'pgfence.effect_attempts(text, text)',
                        'pgfence.report_belief(text, bigint, text, text, timestamptz, timestamptz, text, text, text)',
                        'pgfence.ungated_write(text, bigint)', 'pgfence.identity()', 'pgfence._reads_all()',
                        'pgfence.join_group(text, text, integer, text[], text[], text[], bigint)',
                        'pgfence.heartbeat(text, text, bigint, text, bigint)',
                        'pgfence.leave_group(text, text, bigint, text)',
                        'pgfence.claim_rebalance(text, text, bigint, text)', 'pgfence.rebalance_inputs(text)',
                        'pgfence.group_names(text, bigint)', 'pgfence.group_assignment(text)',
                        'pgfence.assigned_names(text, text)',
                        'pgfence.assign_group(text, text, bigint, text, bigint, bigint, text[], text[], text[], text[])',
                        'pgfence._readable_clusters()',
                        -- Row-level security policies and CHECK constraints run as the querying role.
                        'pgfence._text_problem(text, integer)', 'pgfence._cluster_problem(text)',
                        'pgfence._lease_problem(text)', 'pgfence._storable_text(text, integer)',
                        'pgfence._storable_cluster(text)', 'pgfence._storable_lease(text)',
                        'pgfence._max_cluster_len()', 'pgfence._max_name_len()',
                        'pgfence._max_holder_len()', 'pgfence._max_label_len()', 'pgfence._max_kind_len()',
                        'pgfence._max_endpoint_len()']::regprocedure[]) AS f(o)
    UNION ALL
    SELECT 'FUNCTION', f.o, 'EXECUTE', true
      FROM unnest(ARRAY['pgfence.set_enforcement(boolean, text)',
                        'pgfence.prune_rejections(interval, integer)',
                        'pgfence.set_takeover_grace(interval)']::regprocedure[]) AS f(o)
$function$
