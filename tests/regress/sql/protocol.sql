-- Every function answers with columns: call it once per statement, `SELECT … FROM pgfence.f(…)` (`SELECT
-- (pgfence.f(…)).*` would call it once per column). Every function that takes a tenure takes (lease, epoch,
-- secret) first, in that order, and all its arguments without defaults (NULL where one does not apply). Its
-- outcome is what was done, a business answer ('held', 'not_held', 'not_found', 'conflict'), or 'refused':
-- nothing was done, and `reason` says why (a refused write, a wrong secret and a missing grant are audited in
-- pgfence.rejections). psql's \gset keeps a row's values in variables.

-- acquire returns the tenure's secret once (64 hex characters); every later call of the tenure presents it.
SELECT outcome, epoch, secret FROM pgfence.acquire('prod-eu-1/scheduler', 'psql-1', 15000) \gset
SELECT :'outcome' AS outcome, :epoch AS epoch, length(:'secret') AS secret_length;

-- The task writes: each checks the tenure and writes in one statement.
SELECT outcome, reason, task_key, task_state, created
  FROM pgfence.create_task('prod-eu-1/scheduler', :epoch, :'secret', 'job-1', '{"x": 1}');
SELECT outcome, task_state, assignee, fence
  FROM pgfence.claim_task('prod-eu-1/scheduler', :epoch, :'secret', 'job-1', 'worker-3');
SELECT outcome, task_state
  FROM pgfence.transition_task('prod-eu-1/scheduler', :epoch, :'secret', 'job-1', 'claimed', 'running', '{}');
SELECT outcome, event_id IS NOT NULL AS appended
  FROM pgfence.append_event('prod-eu-1/scheduler', :epoch, :'secret', 'job-1', 'progress', '{"pct": 50}');
-- A business answer, not a refusal (not audited): the task is no longer pending.
SELECT outcome, reason FROM pgfence.claim_task('prod-eu-1/scheduler', :epoch, :'secret', 'job-1', 'worker-4');

-- Renewing one tenure, or many in one statement (one row per lease, in input order).
SELECT outcome, reason, epoch, expires_in_ms FROM pgfence.renew('prod-eu-1/scheduler', :epoch, :'secret', 15000);
SELECT * FROM pgfence.renew_many(ARRAY['prod-eu-1/scheduler'], ARRAY[:epoch]::bigint[], ARRAY[:'secret'], 15000);

-- Guarding one statement of your own in the same statement (what Store::guarded_write sends; the text for any
-- statement: pgfence::guard::guarded_write_sql). It writes only when the guard passed.
WITH RECURSIVE pgfence_write AS (
       UPDATE shards SET owner = 'node-2' WHERE id = 7 AND (SELECT passed FROM pgfence_guard) RETURNING 1),
     pgfence_guard AS MATERIALIZED (
       SELECT g.outcome = 'ok' AS passed, g.*
         FROM pgfence.fence('prod-eu-1/scheduler', :epoch, :'secret', 'rebalance', 'shards', '7') g)
SELECT g.outcome, g.reason, (SELECT count(*) FROM pgfence_write) AS written FROM pgfence_guard g;

-- Guarding several statements: check first, write only on 'ok', COMMIT either way (keeps the audit row).
BEGIN;
SELECT outcome, reason FROM pgfence.fence('prod-eu-1/scheduler', :epoch, :'secret', 'rebalance', NULL, NULL);
UPDATE shards SET owner = 'node-3' WHERE id = 7;   -- only when the outcome was 'ok'
COMMIT;
SELECT owner FROM shards WHERE id = 7;

-- A new acquisition starts a new tenure (also for the same holder) and fences every earlier one.
SELECT outcome, epoch, secret FROM pgfence.acquire('prod-eu-1/scheduler', 'psql-1', 15000) \gset new_
SELECT :'new_outcome' AS outcome, :new_epoch AS epoch;

-- A stale write (the old epoch, with its own secret) and a forged one (the current epoch, a wrong secret): both
-- refused, neither written.
SELECT outcome, reason, current_epoch
  FROM pgfence.create_task('prod-eu-1/scheduler', :epoch, :'secret', 'job-2', '{}');
SELECT outcome, reason, current_epoch
  FROM pgfence.create_task('prod-eu-1/scheduler', :new_epoch, repeat('0', 64), 'job-2', '{}');
SELECT outcome, reason FROM pgfence.fence('prod-eu-1/scheduler', :epoch, :'secret', 'rebalance', NULL, NULL);
SELECT outcome, reason, epoch FROM pgfence.renew('prod-eu-1/scheduler', :epoch, :'secret', 15000);
SELECT count(*) AS job_2_rows FROM pgfence.tasks WHERE key = 'job-2';

-- The audit: every refusal (stale epoch, wrong secret, no grant), per refused role, counted per reason.
SELECT role, scope, lease, presented_epoch, current_epoch, reason, operation, target_table, target_key, count
  FROM pgfence.rejections ORDER BY id;

-- The holder's own account of its tenure (docs/investigation.md): when it started believing it led.
SELECT * FROM pgfence.report_belief('prod-eu-1/scheduler', :new_epoch, :'new_secret', 'start', now(), now(),
                                    NULL, NULL, NULL);

-- Release ends the tenure at once; releasing it again finds nothing to end (not a refusal).
SELECT outcome, reason, epoch, holder FROM pgfence.release('prod-eu-1/scheduler', :new_epoch, :'new_secret');
SELECT outcome, reason, epoch FROM pgfence.release('prod-eu-1/scheduler', :new_epoch, :'new_secret');

-- An argument list of another signature is an error, never a different call: this is create_task without the
-- secret, as it was once called.
SELECT * FROM pgfence.create_task('prod-eu-1/scheduler', 2, 'job-3', '{}');

-- Tenures from both sides: the database's interval, the holder's reported belief (its own clock), and the last
-- accepted write (`pgfence history` reviews it).
SELECT lease, epoch, holder, end_reason, last_write_at IS NOT NULL AS wrote,
       believed_from IS NOT NULL AS belief_reported
  FROM pgfence.tenure_history WHERE lease = 'prod-eu-1/scheduler' ORDER BY epoch;
