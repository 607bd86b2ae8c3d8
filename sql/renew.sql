-- pgfence.renew as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.renew(p_lease text, p_epoch bigint, p_secret text, p_ttl_ms bigint)
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
    secret text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_secret(p_secret);
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_lease_call(p_lease, p_epoch, 'renew'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    tl := pgfence._timeline();

    -- Decided before any lock: only a caller presenting the tenure's secret may wait for the row lock, so a
    -- role without it never holds the row a holder's renewal or a takeover needs (a forged renew left open in a
    -- transaction used to hold it until PF003). A secret is 'bad' for good (its hash never changes); one whose
    -- tenure is not the lease's latest any more is gone (NULL). Everything else is judged on the locked row, as
    -- before: a renewal of the same tenure in flight may extend it past an expiry this unlocked read would see.
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    secret := pgfence._secret_check(p_lease, p_epoch, p_secret);
    IF secret IS DISTINCT FROM 'ok' THEN
        -- Not the live tenure's secret: a loss stays the answer (epochs only grow, a released or expired tenure
        -- stays over; NULL: superseded between the two reads); a live tenure presented with a wrong secret is
        -- refused and audited.
        why := pgfence._loss_reason(l, NULL::text, p_epoch, clock_timestamp(), tl);
        IF why IS NULL AND secret = 'bad' THEN
            PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret'::text, 'renew'::text, NULL::text, NULL::text,
                                    p_may_wait => true);
            RETURN ROW('refused', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
        END IF;
        RETURN ROW('refused', coalesce(why, 'superseded'), l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;

    l := pgfence._lock_lease_row(p_lease);
    ts := clock_timestamp();
    -- Judged again on the locked row: a takeover may have committed while we waited. The secret was 'ok' for
    -- this epoch, and a tenure's secret never changes.
    why := pgfence._loss_reason(l, NULL::text, p_epoch, ts, tl);
    IF why IS NOT NULL THEN
        RETURN ROW('refused', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    UPDATE pgfence.leases
       SET expires_at = ts + p_ttl_ms * interval '1 millisecond', renewed_at = ts, ttl_ms = p_ttl_ms
     WHERE name = p_lease;
    RETURN ROW('renewed', NULL, p_epoch, l.holder, p_ttl_ms, NULL)::pgfence.lease_result;
END;
$function$
