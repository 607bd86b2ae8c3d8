-- MUTANT 3 of the history checker's proof (tests/history.rs): the superseded check off by one.
--
-- pgfence._loss_reason exactly as in migrations/2026-11-30-000001_pgfence_core/up.sql, except that an epoch is
-- 'superseded' only when it is below the current one minus one (`p_epoch < l.epoch - 1` instead of
-- `p_epoch < l.epoch`; `p_epoch > l.epoch` is still 'future_epoch'). The holder of epoch n - 1 then passes every
-- guard while epoch n is held and live: its writes commit after its successor's acquisition (invariant 3), except
-- where a task row's own fence refuses them. Applied with PGFENCE_MUTANT_SQL=tests/mutants/superseded_off_by_one.sql.

CREATE OR REPLACE FUNCTION pgfence._loss_reason(l pgfence.leases, p_holder text, p_epoch bigint, ts timestamptz,
                                     p_timeline bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN l.name IS NULL THEN 'unknown_lease'
        -- MUTANT: off by one (was p_epoch < l.epoch): the epoch just below the current one is not superseded.
        WHEN p_epoch < l.epoch - 1 THEN 'superseded'
        WHEN p_epoch > l.epoch THEN 'future_epoch'
        WHEN p_holder IS NOT NULL AND l.holder IS DISTINCT FROM p_holder THEN 'holder_mismatch'
        WHEN l.state = 'released' THEN 'released'
        -- Granted before the last promotion: its ending may have been lost with the old primary's tail.
        WHEN l.timeline < p_timeline THEN 'failover'
        WHEN l.expires_at <= ts THEN 'expired'
        ELSE NULL
    END
$$;
