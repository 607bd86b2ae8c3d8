-- pgfence._acquire_checked as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._acquire_checked(p_lease text, p_holder text, p_ttl_ms bigint, p_timeline bigint, p_view record, p_wait boolean DEFAULT true)
 RETURNS pgfence.lease_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    l   pgfence.leases;
    known boolean;
    ts  timestamptz;
    tl  bigint := p_timeline;
    new_epoch bigint;
    secret text;
    secret_hash bytea;
BEGIN
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    known := FOUND;
    IF known AND pgfence._held_by_other(l, p_holder, clock_timestamp(), tl) THEN
        -- Decided without a lock: a live tenure of another holder stays live until it ends.
        RETURN ROW('held', NULL, l.epoch, l.holder,
                   ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000)::bigint,
                   NULL)::pgfence.lease_result;
    END IF;

    -- The row lock first (a rival taker or a renewal in flight), then the guard lock (guarded writes in flight).
    -- (A lease row is never deleted while pgfence runs: one that was read exists; a new one is inserted.)
    IF p_wait THEN
        l := pgfence._lock_lease_row(p_lease, p_create => NOT known);
    ELSE
        IF NOT known THEN
            INSERT INTO pgfence.leases (name) VALUES (p_lease) ON CONFLICT (name) DO NOTHING;
        END IF;
        SELECT * INTO l FROM pgfence.leases WHERE name = p_lease FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN ROW('busy', NULL, NULL, NULL, NULL, NULL)::pgfence.lease_result;
        END IF;
    END IF;
    -- Read the clock after the lock wait: expiry is judged at the moment we own the row.
    ts := clock_timestamp();
    IF pgfence._held_by_other(l, p_holder, ts, tl) THEN
        RETURN ROW('held', NULL, l.epoch, l.holder,
                   ceil(extract(epoch FROM (l.expires_at - ts)) * 1000)::bigint, NULL)::pgfence.lease_result;
    END IF;
    IF p_wait THEN
        PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ELSIF NOT (pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), -l.lock_key)
               AND pg_catalog.pg_try_advisory_xact_lock(pgfence._guard_lock_class(), l.lock_key)) THEN
        RETURN ROW('busy', NULL, NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    ts := clock_timestamp();

    IF l.epoch > 0 THEN
        PERFORM pgfence._end_tenure(p_lease, l.epoch,
                                    LEAST(l.expires_at, ts),
                                    coalesce(NULLIF(pgfence._loss_reason(l, NULL::text, l.epoch, ts, tl),
                                                    'released'::text), 'reacquired'::text));
    END IF;

    -- Failover safety: after a promotion the server writes WAL on a new timeline, and an asynchronous standby
    -- may have lost the last epochs its old primary issued. Every epoch issued on timeline t is at least
    -- (t - 1) * 2^32 + 1, which exceeds every epoch issued on earlier timelines (fewer than 2^32 acquisitions per
    -- lease and timeline), so epochs keep increasing across failovers even when the counter went backwards.
    new_epoch := GREATEST(l.epoch + 1, (tl - 1) * 4294967296 + 1);
    UPDATE pgfence.leases
       SET holder = p_holder, holder_role = session_user, epoch = new_epoch, state = 'held', ttl_ms = p_ttl_ms,
           timeline = tl,
           expires_at = ts + p_ttl_ms * interval '1 millisecond', acquired_at = ts, renewed_at = ts,
           transitions = transitions + CASE WHEN holder IS DISTINCT FROM p_holder THEN 1 ELSE 0 END
     WHERE name = p_lease;
    INSERT INTO pgfence.tenures (lease, epoch, holder, acquired_at, timeline, system_identifier, instance_id,
                                 server_addr, client_addr, application_name)
    VALUES (p_lease, new_epoch, p_holder, ts, tl, p_view.system_identifier, p_view.instance_id,
            p_view.server_addr, p_view.client_addr, p_view.application_name);
    -- 256 bits from the server's strong random source (two version-4 UUIDs: 244 random bits), as hexadecimal.
    secret := encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    secret_hash := sha256(convert_to(secret, 'UTF8'));
    INSERT INTO pgfence.tenure_secrets (lease, epoch, hash)
    VALUES (p_lease, new_epoch, secret_hash)
    ON CONFLICT (lease) DO UPDATE SET epoch = EXCLUDED.epoch, hash = EXCLUDED.hash;
    INSERT INTO pgfence.beliefs (lease, epoch, report_hash) VALUES (p_lease, new_epoch, secret_hash);
    RETURN ROW('acquired', NULL, new_epoch, p_holder, p_ttl_ms, secret)::pgfence.lease_result;
END;
$function$
