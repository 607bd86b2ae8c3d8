-- pgfence.join_group as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.join_group(p_group text, p_member text, p_weight integer, p_names text[], p_pinned text[], p_excluded text[], p_ttl_ms bigint)
 RETURNS pgfence.member_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    known bigint := CASE WHEN cardinality(p_names) <= pgfence._max_group_names()
                         THEN pgfence._known_name_set(p_names) END;
    problem text := pgfence._member_problem(p_group, p_member, p_weight, p_names, p_pinned, p_excluded,
                                            known IS NOT NULL);
    denied pgfence.member_result;
    m pgfence.members;
    prior pgfence.members;
    g pgfence.groups;
    ts timestamptz;
    secret text;
    set_of bigint;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_member_call(p_group, 'join_group'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    -- Decided without a lock: a live member stays live until it leaves or expires.
    SELECT * INTO prior FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
    IF FOUND AND prior.left_at IS NULL AND prior.expires_at > clock_timestamp() THEN
        RETURN ROW('refused', 'member_taken', NULL, NULL, NULL,
                   ceil(extract(epoch FROM (prior.expires_at - clock_timestamp())) * 1000)::bigint,
                   NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    set_of := coalesce(known, pgfence._name_set(p_names));
    INSERT INTO pgfence.groups (grp, channel, ttl_ms)
    VALUES (p_group, pgfence._group_channel(p_group), p_ttl_ms)
    ON CONFLICT (grp) DO NOTHING;
    secret := encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    -- The row locks: of the member's row, only joiners of this name and the member's own heartbeat or leave
    -- (each decided on its secret first) take it; of the group's row, joins, settles, leaves, claims and
    -- assignments, each for one statement. Bounded all the same.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        ts := clock_timestamp();
        INSERT INTO pgfence.members AS x (grp, member, weight, set_id, pinned, excluded, secret_hash, ttl_ms,
                                          joined_at, renewed_at, expires_at, settle_at, settled_at)
        VALUES (p_group, p_member, p_weight, set_of, p_pinned, p_excluded, sha256(convert_to(secret, 'UTF8')),
                p_ttl_ms, ts, ts, ts + p_ttl_ms * interval '1 millisecond', ts, NULL)
        ON CONFLICT (grp, member) DO UPDATE
           SET incarnation = x.incarnation + 1, weight = EXCLUDED.weight, set_id = EXCLUDED.set_id,
               pinned = EXCLUDED.pinned, excluded = EXCLUDED.excluded, member_role = session_user,
               secret_hash = EXCLUDED.secret_hash, ttl_ms = EXCLUDED.ttl_ms, joined_at = ts, renewed_at = ts,
               expires_at = EXCLUDED.expires_at, left_at = NULL,
               flaps = pgfence._flaps_after(x, ts),
               settle_at = ts + pgfence._settle_delay(pgfence._flaps_after(x, ts), EXCLUDED.ttl_ms),
               settled_at = NULL
         -- Only a member that left or expired is replaced (one that joined meanwhile is not).
         WHERE x.left_at IS NOT NULL OR x.expires_at <= ts
        RETURNING * INTO m;
        -- A member the stored assignment counts, back with another spec: assigned again after the quiet time.
        IF m.grp IS NOT NULL AND m.counted AND (prior.weight, prior.set_id, prior.pinned, prior.excluded)
                                               IS DISTINCT FROM (m.weight, m.set_id, m.pinned, m.excluded) THEN
            PERFORM pgfence._group_changed(p_group, false);
        END IF;
        UPDATE pgfence.groups x SET ttl_ms = p_ttl_ms WHERE x.grp = p_group AND x.ttl_ms <> p_ttl_ms;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: join of member % to group % waited % ms for a row lock; blocked by %',
            pgfence._printable(p_member), pgfence._printable(p_group), wait_ms,
            pgfence._describe_backends(pgfence._member_lockers()) USING ERRCODE = 'PF003',
            HINT = 'Another membership call of this group is in a transaction left open: end it.';
    END;
    IF m.grp IS NULL THEN
        SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
        RETURN ROW('refused', 'member_taken', NULL, NULL, NULL,
                   greatest(ceil(extract(epoch FROM (m.expires_at - clock_timestamp())) * 1000)::bigint, 0),
                   NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group;
    RETURN ROW('joined', NULL, m.incarnation, secret, m.settled_at IS NOT NULL, p_ttl_ms, g.generation,
               pgfence._rebalance_in_ms(g), g.channel)::pgfence.member_result;
END;
$function$
