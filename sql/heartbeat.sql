-- pgfence.heartbeat as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.heartbeat(p_group text, p_member text, p_incarnation bigint, p_secret text, p_ttl_ms bigint)
 RETURNS pgfence.member_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    refused pgfence.member_result;
    m pgfence.members;
    g pgfence.groups;
    ts timestamptz;
    why text;
    wait_ms bigint := pgfence._lock_wait_ms();
    newly_settled boolean;
BEGIN
    PERFORM pgfence._check_ttl(p_ttl_ms);
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'heartbeat'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member FOR NO KEY UPDATE;
        ts := clock_timestamp();
        -- Judged again on the locked row (a join of a later incarnation may have committed meanwhile).
        why := pgfence._member_loss(m, p_incarnation, p_secret, ts);
        IF why IS NOT NULL THEN
            RETURN ROW('refused', why, m.incarnation, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
        END IF;
        newly_settled := m.settled_at IS NULL AND ts >= m.settle_at;
        UPDATE pgfence.members x
           SET renewed_at = ts, expires_at = ts + p_ttl_ms * interval '1 millisecond', ttl_ms = p_ttl_ms,
               settled_at = CASE WHEN newly_settled THEN ts ELSE x.settled_at END,
               -- A member settled for 10 ttls is stable again: its next expiry is a first flap.
               flaps = CASE WHEN x.settled_at IS NOT NULL AND ts - x.settled_at > 10 * p_ttl_ms * interval '1 millisecond'
                            THEN 0 ELSE x.flaps END
         WHERE x.grp = p_group AND x.member = p_member
        RETURNING * INTO m;
        IF newly_settled THEN
            PERFORM pgfence._group_changed(p_group, false);
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: heartbeat of member % waited % ms for a row lock; blocked by %',
            pgfence._printable(p_member), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group;
    RETURN ROW('renewed', NULL, m.incarnation, NULL, m.settled_at IS NOT NULL, p_ttl_ms, g.generation,
               pgfence._rebalance_in_ms(g), NULL)::pgfence.member_result;
END;
$function$
