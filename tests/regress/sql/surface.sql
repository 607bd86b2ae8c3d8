-- The SQL surface's rules, as a client that is not the Rust library meets them:
--   1. an argument list of an older signature is an error (42883, or 22P02 where a holder name lands in an
--      epoch), never a call of the new signature, and writes nothing (no audit row, no task);
--   2. a NULL secret is bad input (22023) in every function that takes a tenure, and writes nothing;
--   3. every refusal of a presented tenure is the outcome 'refused', with the reason;
--   4. the same missing right is the same answer to every role: a missing right on a cluster is 'refused' /
--      'no_grant' (audited), a missing instance-wide right is 42501.
-- Messages only, no statement positions: no statement's text (with a secret in it) is echoed with an error.
\set VERBOSITY terse

SELECT outcome, epoch, secret FROM pgfence.acquire('prod-eu-1/surface', 'psql-2', 60000) \gset
SELECT :'outcome' AS outcome, :epoch AS epoch;
SELECT outcome FROM pgfence.create_task('prod-eu-1/surface', :epoch, :'secret', 'job', '{}');
SELECT count(*) AS audit_rows FROM pgfence.rejections \gset before_
SELECT count(*) AS tasks FROM pgfence.tasks \gset before_

-- 1. Old argument lists: (lease, epoch, key, ...) without the secret, (lease, holder, epoch, secret, ...) with the
--    holder, and the calls that defaults used to complete.
SELECT * FROM pgfence.fence('prod-eu-1/surface', 1);
SELECT * FROM pgfence.fence('prod-eu-1/surface', 1, 'rebalance');
SELECT * FROM pgfence.fence('prod-eu-1/surface', 1, 'rebalance', 'shards', '7');
SELECT * FROM pgfence.fence('prod-eu-1/surface', 1, 'a-secret', 'rebalance');
SELECT * FROM pgfence.create_task('prod-eu-1/surface', 1, 'job-old');
SELECT * FROM pgfence.create_task('prod-eu-1/surface', 1, 'job-old', '{}');
SELECT * FROM pgfence.claim_task('prod-eu-1/surface', 1, 'job', 'worker');
SELECT * FROM pgfence.transition_task('prod-eu-1/surface', 1, 'job', 'pending', 'running');
SELECT * FROM pgfence.transition_task('prod-eu-1/surface', 1, 'job', 'pending', 'running', '{}');
SELECT * FROM pgfence.append_event('prod-eu-1/surface', 1, 'job', 'note');
SELECT * FROM pgfence.append_event('prod-eu-1/surface', 1, 'job', 'note', '{}');
SELECT * FROM pgfence.renew('prod-eu-1/surface', 'psql-2', 1, 'a-secret', 60000);
SELECT * FROM pgfence.renew('prod-eu-1/surface', 'psql-2', 1, 60000);
SELECT * FROM pgfence.release('prod-eu-1/surface', 'psql-2', 1, 'a-secret');
SELECT * FROM pgfence.release('prod-eu-1/surface', 'psql-2', 1);
SELECT * FROM pgfence.renew_many(ARRAY['prod-eu-1/surface'], ARRAY[1]::bigint[], ARRAY['a-secret'], 'psql-2', 60000);
SELECT * FROM pgfence.report_belief('prod-eu-1/surface', 1, 'a-secret', 'start', now(), now());
SELECT (SELECT count(*) FROM pgfence.rejections) = :before_audit_rows AS nothing_audited,
       (SELECT count(*) FROM pgfence.tasks) = :before_tasks AS nothing_written;

-- 2. A NULL secret.
SELECT * FROM pgfence.fence('prod-eu-1/surface', :epoch, NULL, 'rebalance', NULL, NULL);
SELECT * FROM pgfence.create_task('prod-eu-1/surface', :epoch, NULL, 'job-null', '{}');
SELECT * FROM pgfence.claim_task('prod-eu-1/surface', :epoch, NULL, 'job', 'worker');
SELECT * FROM pgfence.transition_task('prod-eu-1/surface', :epoch, NULL, 'job', 'pending', 'running', '{}');
SELECT * FROM pgfence.append_event('prod-eu-1/surface', :epoch, NULL, 'job', 'note', '{}');
SELECT * FROM pgfence.renew('prod-eu-1/surface', :epoch, NULL, 60000);
SELECT * FROM pgfence.release('prod-eu-1/surface', :epoch, NULL);
SELECT * FROM pgfence.report_belief('prod-eu-1/surface', :epoch, NULL, 'start', now(), now(), NULL, NULL, NULL);
SELECT * FROM pgfence.renew_many(ARRAY['prod-eu-1/surface'], ARRAY[:epoch]::bigint[], NULL, 60000);
SELECT * FROM pgfence.renew_many(ARRAY['prod-eu-1/surface', 'prod-eu-1/surface'], ARRAY[:epoch, :epoch]::bigint[],
                                 ARRAY[:'secret', NULL], 60000);
SELECT (SELECT count(*) FROM pgfence.rejections) = :before_audit_rows AS nothing_audited,
       (SELECT count(*) FROM pgfence.tasks) = :before_tasks AS nothing_written;

-- 3. One outcome for every refusal of a presented tenure: a wrong secret of the live tenure, then an epoch
--    that was never issued.
SELECT outcome, reason FROM pgfence.fence('prod-eu-1/surface', :epoch, 'forged', 'rebalance', NULL, NULL);
SELECT outcome, reason FROM pgfence.append_event('prod-eu-1/surface', :epoch, 'forged', 'job', 'note', '{}');
SELECT outcome, reason FROM pgfence.renew('prod-eu-1/surface', :epoch, 'forged', 60000);
SELECT outcome, reason FROM pgfence.release('prod-eu-1/surface', :epoch, 'forged');
SELECT outcome, reason FROM pgfence.report_belief('prod-eu-1/surface', :epoch, 'forged', 'start', now(), now(),
                                                  NULL, NULL, NULL);
SELECT lease, outcome, reason
  FROM pgfence.renew_many(ARRAY['prod-eu-1/surface', 'prod-eu-1/surface', 'prod-eu-1/nowhere', 'other/x'],
                          ARRAY[:epoch, :epoch + 1, 1, 1]::bigint[], ARRAY[:'secret', :'secret', 'x', 'x'], 60000);
SELECT outcome, reason FROM pgfence.fence('prod-eu-1/surface', :epoch + 1, :'secret', 'rebalance', NULL, NULL);
SELECT outcome, reason FROM pgfence.renew('prod-eu-1/surface', :epoch + 1, :'secret', 60000);

-- 4. Rights. app has an application grant on prod-eu-1: force_release needs operator rights there.
SELECT outcome, reason FROM pgfence.force_release('prod-eu-1/surface');
SELECT pgfence.set_takeover_grace('1 second');
-- ops is an operator, of cluster other only: the same answers.
\c - ops
\set VERBOSITY terse
SELECT outcome, reason FROM pgfence.force_release('prod-eu-1/surface');
SELECT outcome, reason FROM pgfence.acquire('prod-eu-1/surface', 'ops-1', 60000);
SELECT pgfence.set_takeover_grace('1 second');
-- nobody has no grant at all: not a pgfence client (no privilege on the schema).
\c - nobody
\set VERBOSITY terse
SELECT outcome, reason FROM pgfence.force_release('prod-eu-1/surface');
-- The refusals by role and reason, and the tenure untouched.
\c - postgres
SELECT role, scope, reason, operation, count FROM pgfence.rejections
 WHERE lease LIKE 'prod-eu-1/surface%' OR last_lease LIKE 'prod-eu-1/surface%' OR reason = 'no_grant'
 ORDER BY role, scope, reason, operation;
SELECT epoch, state, holder FROM pgfence.leases WHERE name = 'prod-eu-1/surface';
