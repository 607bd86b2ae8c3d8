-- Replica groups as a client that is not the Rust library meets them (docs/leadership.md, "Spreading leaders
-- over replicas"): a member joins with the names it can lead and heartbeats with its incarnation and secret; the
-- roster is what every member computes the assignment from; the same member name is refused while it is live;
-- a forged heartbeat is refused and audited; bad input is 22023 and writes nothing; another cluster is refused.
-- Only stable columns are shown (times left and digests change with every run).
\set VERBOSITY terse

SELECT outcome, incarnation, secret, settled FROM pgfence.join_group('prod-eu-1/controllers', 'pod-a', 1,
    ARRAY['scheduler', 'rollout'], '{}', '{}', 60000) \gset a_
SELECT :'a_outcome' AS outcome, :a_incarnation AS incarnation, :'a_settled' AS settled_at_join;
SELECT outcome, settled, roster_digest IS NOT NULL AS has_digest
  FROM pgfence.heartbeat('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret', 60000);
SELECT outcome, reason, expires_in_ms > 0 AS live_one_expires_later
  FROM pgfence.join_group('prod-eu-1/controllers', 'pod-a', 1, ARRAY['scheduler'], '{}', '{}', 60000);
SELECT outcome FROM pgfence.join_group('prod-eu-1/controllers', 'pod-b', 2, ARRAY['scheduler', 'rollout'],
    '{rollout}', '{}', 60000);
SELECT member, weight, settled, names, pinned, excluded, leads FROM pgfence.roster('prod-eu-1/controllers');

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
SELECT (SELECT count(*) FROM pgfence.group_members) = :before_members AS nothing_written;

-- Another cluster: refused and audited (a read is 42501).
SELECT outcome, reason FROM pgfence.join_group('other/controllers', 'pod-a', 1, ARRAY['x'], '{}', '{}', 60000);
SELECT * FROM pgfence.roster('other/controllers');

-- Leaving in order: out of the roster at once; leaving again changes nothing.
SELECT outcome FROM pgfence.leave_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret');
SELECT outcome, reason FROM pgfence.leave_group('prod-eu-1/controllers', 'pod-a', :a_incarnation, :'a_secret');
SELECT member FROM pgfence.roster('prod-eu-1/controllers');
SELECT "group", member, live, settled FROM pgfence.group_members ORDER BY member;
