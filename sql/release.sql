-- pgfence.release as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.release(p_lease text, p_epoch bigint, p_secret text)
 RETURNS pgfence.lease_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    tl bigint;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_secret(p_secret);
    denied := pgfence._deny_lease_call(p_lease, p_epoch, 'release'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    tl := pgfence._timeline();

    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why NOT IN ('expired', 'failover') THEN
        RETURN ROW('not_held', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    -- Decided for good ('bad' is final), before any lock.
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) = 'bad' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret'::text, 'release'::text, NULL::text, NULL::text,
                                p_may_wait => true);
        RETURN ROW('refused', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    l := pgfence._lock_lease_row(p_lease);
    why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why NOT IN ('expired', 'failover') THEN
        RETURN ROW('not_held', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) IS DISTINCT FROM 'ok' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret'::text, 'release'::text, NULL::text, NULL::text);
        RETURN ROW('refused', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();

    UPDATE pgfence.leases SET state = 'released', expires_at = LEAST(expires_at, ts) WHERE name = p_lease;
    PERFORM pgfence._end_tenure(p_lease, p_epoch, LEAST(l.expires_at, ts),
                                coalesce(pgfence._loss_reason(l, NULL::text, p_epoch, ts, tl), 'released'::text));
    -- Wake waiting candidates (delivered at commit) so a successor acquires in milliseconds, not a poll later.
    -- The payload is the lease's lock key, not its name: any role may LISTEN, and only roles that can read the
    -- lease row (a grant on its cluster) can tell which lease it is.
    PERFORM pg_notify('pgfence_lease_free', l.lock_key::text);
    RETURN ROW('released', why, p_epoch, l.holder, 0, NULL)::pgfence.lease_result;
END;
$function$
