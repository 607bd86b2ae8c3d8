-- pgfence.claim_rebalance as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.claim_rebalance(p_group text, p_member text, p_incarnation bigint, p_secret text)
 RETURNS pgfence.rebalance_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    refused pgfence.member_result;
    g pgfence.groups;
    waiting pgfence.rebalance_result;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'claim_rebalance'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN ROW(refused.outcome, refused.reason, NULL, NULL, NULL)::pgfence.rebalance_result;
    END IF;
    -- Unlocked first: most calls find it not due or claimed, and take no lock.
    SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group;
    waiting := pgfence._claim_wait(g, p_member);
    IF waiting.outcome IS NOT NULL THEN
        RETURN waiting;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: claim of group % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_group), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    -- Judged again on the locked row: another member may have claimed or assigned meanwhile.
    waiting := pgfence._claim_wait(g, p_member);
    IF waiting.outcome IS NOT NULL THEN
        RETURN waiting;
    END IF;
    UPDATE pgfence.groups x
       SET claimed_by = p_member, claimed_until = clock_timestamp() + pgfence._claim_ms(g) * interval '1 millisecond'
     WHERE x.grp = p_group
    RETURNING * INTO g;
    RETURN ROW('claim', NULL, g.version, g.generation, pgfence._claim_ms(g))::pgfence.rebalance_result;
END;
$function$
