-- Replica groups as a client that is not the Rust library meets them (docs/leadership.md, "Spreading leaders
-- over replicas"): a member joins with the names it can lead and heartbeats with its incarnation and secret; a
-- settled member makes the group's assignment due after the quiet time; one member claims it, reads the members
-- that count, stores the names that move; each member reads its own names; the same member name is refused
-- while it is live; a forged heartbeat is refused and audited; bad input is 22023 and writes nothing; another
-- cluster is refused. Only stable columns are shown (times left and secrets change with every run).
\set VERBOSITY terse

SELECT outcome, incarnation, secret, settled, generation, rebalance_in_ms IS NULL AS nothing_pending,
       channel FROM pgfence.join_group('prod-eu-1/controllers', 'pod-a', 1,
    ARRAY['scheduler', 'rollout'], '{}', '{}', 60000) \gset a_
SELECT :'a_outcome' AS outcome, :a_incarnation AS incarnation, :'a_settled' AS settled_at_join,
       :a_generation AS generation, :'a_nothing_pending' AS nothing_pending, :'a_channel' AS channel;
SELECT outcome, settled, generation, rebalance_in_ms BETWEEN 0 AND 1000 AS due_after_the_quiet_time
  FROM pgfence.heartbeat('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret', 60000);
SELECT outcome, reason, expires_in_ms > 0 AS live_one_expires_later
  FROM pgfence.join_group('prod-eu-1/controllers', 'pod-a', 1, ARRAY['scheduler'], '{}', '{}', 60000);
SELECT outcome, secret FROM pgfence.join_group('prod-eu-1/controllers', 'pod-b', 2,
    ARRAY['scheduler', 'rollout'], '{rollout}', '{}', 60000) \gset b_
SELECT :'b_outcome' AS outcome;
SELECT * FROM pgfence.rebalance_inputs('prod-eu-1/controllers');
SELECT outcome, reason, version, generation FROM pgfence.claim_rebalance('prod-eu-1/controllers', 'pod-a',
    :a_incarnation, :'a_secret');
-- Once due: claimed by pod-a (pod-b, which has not settled, is not counted yet).
SELECT pg_sleep(1.1);
SELECT outcome, reason, version, generation FROM pgfence.claim_rebalance('prod-eu-1/controllers', 'pod-a',
    :a_incarnation, :'a_secret');
SELECT outcome, reason FROM pgfence.claim_rebalance('prod-eu-1/controllers', 'pod-b', 1, :'b_secret');
SELECT * FROM pgfence.assign_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret', 1, 0,
    ARRAY['rollout', 'scheduler'], ARRAY['pod-a', 'pod-b'], '{}', ARRAY['pod-a']);
SELECT * FROM pgfence.assign_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret', 1, 0,
    ARRAY['rollout', 'scheduler'], ARRAY['pod-a', 'pod-a'], '{}', ARRAY['pod-a']);
SELECT * FROM pgfence.assigned_names('prod-eu-1/controllers', 'pod-a');
SELECT * FROM pgfence.group_assignment('prod-eu-1/controllers');
-- Stored twice from one claim: the second is refused (the claim ended with the first).
SELECT * FROM pgfence.assign_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret', 1, 1,
    ARRAY['rollout'], ARRAY['pod-a'], '{}', ARRAY['pod-a']);

-- A forged heartbeat: refused, audited under the caller's role.
SELECT outcome, reason FROM pgfence.heartbeat('prod-eu-1/controllers', 'pod-a', :a_incarnation,
    repeat('0', 64), 60000);
SELECT reason, operation, count FROM pgfence.rejections WHERE operation = 'heartbeat';

-- Bad input: 22023, nothing written.
SELECT count(*) AS members FROM pgfence.group_members \gset before_
SELECT * FROM pgfence.join_group('prod-eu-1/controllers', 'pod-c', 0, ARRAY['scheduler'], '{}', '{}', 60000);
SELECT * FROM pgfence.join_group('prod-eu-1/controllers', 'pod-c', 1, '{}', '{}', '{}', 60000);
SELECT * FROM pgfence.join_group('prod-eu-1/controllers', 'pod-c', 1, ARRAY['a', 'a'], '{}', '{}', 60000);
SELECT * FROM pgfence.join_group('prod-eu-1/controllers', 'pod-c', 1, ARRAY['a'], '{b}', '{}', 60000);
SELECT * FROM pgfence.join_group('controllers', 'pod-c', 1, ARRAY['a'], '{}', '{}', 60000);
SELECT * FROM pgfence.heartbeat('prod-eu-1/controllers', 'pod-a', :a_incarnation, NULL, 60000);
SELECT * FROM pgfence.assign_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret', 1, 1,
    ARRAY['rollout'], '{}', '{}', '{}');
SELECT (SELECT count(*) FROM pgfence.group_members) = :before_members AS nothing_written;

-- Another cluster: refused and audited (a read is 42501).
SELECT outcome, reason FROM pgfence.join_group('other/controllers', 'pod-a', 1, ARRAY['x'], '{}', '{}', 60000);
SELECT * FROM pgfence.group_assignment('other/controllers');

-- Leaving in order: a counted member's leave makes the next assignment due at once; leaving again changes
-- nothing.
SELECT outcome FROM pgfence.leave_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret');
SELECT outcome, reason FROM pgfence.leave_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret');
SELECT member FROM pgfence.rebalance_inputs('prod-eu-1/controllers');
SELECT "group", member, live, settled, counted, name_count, assigned FROM pgfence.group_members ORDER BY member;
