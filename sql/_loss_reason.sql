-- pgfence._loss_reason as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._loss_reason(l pgfence.leases, p_holder text, p_epoch bigint, ts timestamp with time zone, p_timeline bigint)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE
        WHEN l.name IS NULL THEN 'unknown_lease'
        WHEN p_epoch < l.epoch THEN 'superseded'
        WHEN p_epoch > l.epoch THEN 'future_epoch'
        WHEN p_holder IS NOT NULL AND l.holder IS DISTINCT FROM p_holder THEN 'holder_mismatch'
        WHEN l.state = 'released' THEN 'released'
        -- Granted before the last promotion: its ending may have been lost with the old primary's tail.
        WHEN l.timeline < p_timeline THEN 'failover'
        WHEN l.expires_at <= ts THEN 'expired'
        ELSE NULL
    END
$function$
