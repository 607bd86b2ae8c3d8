-- pgfence.force_release as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.force_release(p_lease text)
 RETURNS pgfence.lease_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, 1::bigint);
    denied := pgfence._deny_lease_call(p_lease, 0::bigint, 'force_release'::text, p_operator => true);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    IF NOT FOUND THEN
        RETURN ROW('not_held', 'unknown_lease', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    ELSIF l.state = 'released' THEN
        RETURN ROW('not_held', 'released', l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    l := pgfence._lock_lease_row(p_lease);
    IF l.state = 'released' THEN
        RETURN ROW('not_held', 'released', l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();
    why := coalesce(pgfence._loss_reason(l, NULL::text, l.epoch, ts, pgfence._timeline()), 'forced'::text);
    UPDATE pgfence.leases SET state = 'released', expires_at = LEAST(expires_at, ts) WHERE name = p_lease;
    PERFORM pgfence._end_tenure(p_lease, l.epoch, LEAST(l.expires_at, ts), why);
    PERFORM pg_notify('pgfence_lease_free', l.lock_key::text);
    RETURN ROW('released', why, l.epoch, l.holder, 0, NULL)::pgfence.lease_result;
END;
$function$
