-- pgfence._reject as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._reject(p_lease text, p_epoch bigint, p_current_epoch bigint, p_current_holder text, p_reason text, p_operation text, p_table text, p_key text, p_may_wait boolean DEFAULT false, p_count bigint DEFAULT 1, p_by_role boolean DEFAULT false)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    previous timestamptz;
    wait_ms  bigint := pgfence._lock_wait_ms();
    by_role  boolean := p_by_role OR p_reason IN ('no_grant', 'unknown_lease', 'future_epoch');
    op       text := p_operation;
    free     smallint;
BEGIN
    IF NOT by_role
       AND NOT EXISTS (SELECT 1 FROM pgfence.tenures t WHERE t.lease = p_lease AND t.epoch = p_epoch
                          AND (SELECT count(*) FROM (SELECT 1 FROM pgfence.tenures n
                                                      WHERE n.lease = p_lease AND n.epoch > p_epoch
                                                      LIMIT 16) newer) < 16) THEN
        by_role := true;
    END IF;
    -- Bounded: a refused transaction left open keeps its aggregated rows locked, and a place in the audit it
    -- took (slot) uncommitted (only the same role's refusals of the same tenure wait for them; two such
    -- transactions refused several times each, in different orders, may deadlock, which PostgreSQL ends with
    -- 40P01; single refusals never do). Each reason is counted in rows of its own, which keep their first
    -- refusal's epochs (after a failover, the tenure's 'failover' row stays the evidence, and refusals once it
    -- is also superseded are counted in a 'superseded' row beside it); the count, the last time and the last
    -- lease and key move.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        IF by_role THEN
            SELECT r.last_rejected_at INTO previous FROM pgfence.rejections r
             WHERE r.scope = 'role' AND r.role = session_user AND r.reason = p_reason;
            INSERT INTO pgfence.rejections (scope, lease, presented_epoch, reason, operation, target_table,
                                            target_key, last_lease, last_target_key, count)
            VALUES ('role', p_lease, p_epoch, p_reason, p_operation, p_table, p_key, p_lease, p_key, p_count)
            ON CONFLICT (role, reason) WHERE scope = 'role' DO UPDATE
               SET count = pgfence.rejections.count + EXCLUDED.count,
                   last_rejected_at = clock_timestamp(),
                   last_lease = EXCLUDED.lease,
                   last_target_key = EXCLUDED.target_key;
        ELSE
            -- Operation labels are the caller's to choose: the first 16 distinct (operation, reason) pairs of a
            -- (role, lease, epoch) get a row each, further ones are counted under ('other', reason).
            FOR attempt IN 1..40 LOOP
                UPDATE pgfence.rejections r
                   SET count = r.count + p_count, last_rejected_at = clock_timestamp(), last_target_key = p_key
                  FROM (SELECT o.id, o.last_rejected_at FROM pgfence.rejections o
                         WHERE o.scope = 'tenure' AND o.role = session_user AND o.lease = p_lease
                           AND o.presented_epoch = p_epoch AND o.operation = op AND o.reason = p_reason) o
                 WHERE r.id = o.id
                RETURNING o.last_rejected_at INTO previous;
                EXIT WHEN FOUND;
                SELECT min(s) INTO free FROM generate_series(0, 15) AS s
                 WHERE NOT EXISTS (SELECT 1 FROM pgfence.rejections o
                                    WHERE o.scope = 'tenure' AND o.role = session_user AND o.lease = p_lease
                                      AND o.presented_epoch = p_epoch AND o.slot = s);
                IF free IS NULL AND op IS DISTINCT FROM 'other' THEN
                    op := 'other';
                    CONTINUE;
                END IF;
                -- Every unique index is an arbiter (no conflict target): the pair's row and the place are
                -- both decided by PostgreSQL's speculative insertion, which never waits while holding its
                -- insertion. (With the place index left out of the arbiters, two first refusals deadlocked: one
                -- inserting waited for the other's transaction on the place index while that one, updating the
                -- label's row, waited for the insertion.) Nothing inserted: another connection of this role
                -- took the pair or the place meanwhile, and its row is committed: look again. Under REPEATABLE
                -- READ a row committed after the snapshot is a serialization error, never a refusal lost.
                INSERT INTO pgfence.rejections (scope, lease, presented_epoch, current_epoch, current_holder,
                                                reason, operation, target_table, target_key, last_lease,
                                                last_target_key, count, slot)
                VALUES ('tenure', p_lease, p_epoch, p_current_epoch, p_current_holder, p_reason, op, p_table,
                        p_key, p_lease, p_key, p_count, coalesce(free, pgfence._tenure_reason_slot(p_reason)))
                ON CONFLICT DO NOTHING;
                EXIT WHEN FOUND;
                IF attempt = 40 THEN
                    RAISE EXCEPTION 'pgfence: refusal of % on lease % found no place in the audit after 40 attempts',
                        pgfence._printable(p_operation), pgfence._printable(p_lease) USING ERRCODE = '40001';
                END IF;
            END LOOP;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: refusal of % on lease % waited % ms for its audit row; blocked by %',
            pgfence._printable(p_operation), pgfence._printable(p_lease), wait_ms,
            pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
                                         WHERE k.locktype = 'relation' AND k.granted
                                           AND k.relation = 'pgfence.rejections'::regclass
                                           AND k.mode = 'RowExclusiveLock'
                                           AND k.pid <> pg_catalog.pg_backend_pid()))
            USING ERRCODE = 'PF003',
                  HINT = 'A transaction of the same role refused for the same reason (and lease, epoch and operation) stays open.';
    END;
    -- Backpressure on a caller retrying in a tight loop: a repeat within a second of the previous refusal
    -- aggregated in the same row answers 10 ms later. Holding the aggregated row meanwhile queues the role's
    -- other connections behind it, so a hammering caller gets about 100 refusals a second per row in all and
    -- leaves the CPU to the current leader. The first refusal is never delayed. Only callers that hold no lock
    -- another role needs may wait (p_may_wait): a wait under the shared guard lock would hold off a takeover.
    IF p_may_wait AND previous IS NOT NULL AND previous > clock_timestamp() - interval '1 second' THEN
        PERFORM pg_sleep(0.01);
    END IF;
    RETURN ROW('refused', p_reason,
               CASE WHEN p_reason = 'no_grant' THEN NULL ELSE p_current_epoch END,
               CASE WHEN p_reason = 'no_grant' THEN NULL ELSE p_current_holder END,
               NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.write_result;
END;
$function$
