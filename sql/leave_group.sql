-- pgfence.leave_group as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.leave_group(p_group text, p_member text, p_incarnation bigint, p_secret text)
 RETURNS pgfence.member_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    refused pgfence.member_result;
    wait_ms bigint := pgfence._lock_wait_ms();
    m pgfence.members;
BEGIN
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'leave_group'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        UPDATE pgfence.members x
           SET left_at = clock_timestamp(), expires_at = least(x.expires_at, clock_timestamp()), flaps = 0
         WHERE x.grp = p_group AND x.member = p_member AND x.incarnation = p_incarnation AND x.left_at IS NULL
           AND x.expires_at > clock_timestamp()
        RETURNING * INTO m;
        IF m.counted OR m.settled_at IS NOT NULL THEN
            PERFORM pgfence._group_changed(p_group, true);
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: leave of member % waited % ms for a row lock; blocked by %',
            pgfence._printable(p_member), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    IF m.grp IS NULL THEN
        -- Expired or superseded between the unlocked read and the update.
        RETURN ROW('refused', 'expired', p_incarnation, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    RETURN ROW('left', NULL, p_incarnation, NULL, false, 0, NULL, NULL, NULL)::pgfence.member_result;
END;
$function$
