-- pgfence._member_call as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._member_call(p_group text, p_member text, p_incarnation bigint, p_secret text, p_operation text)
 RETURNS pgfence.member_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    denied pgfence.member_result;
    m pgfence.members;
    why text;
BEGIN
    IF pgfence._lease_problem(p_group) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid group: %', pgfence._lease_problem(p_group)
            USING ERRCODE = '22023', COLUMN = 'group';
    END IF;
    PERFORM pgfence._check_text('member'::text, p_member, pgfence._max_holder_len());
    IF p_incarnation IS NULL OR p_incarnation < 1 THEN
        RAISE EXCEPTION 'pgfence: invalid incarnation: must be at least 1'
            USING ERRCODE = '22023', COLUMN = 'incarnation';
    END IF;
    PERFORM pgfence._check_secret(p_secret);
    denied := pgfence._deny_member_call(p_group, p_operation);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
    why := pgfence._member_loss(m, p_incarnation, p_secret, clock_timestamp());
    IF why = 'bad_secret' THEN
        PERFORM pgfence._reject(p_group, p_incarnation, NULL::bigint, NULL::text, 'bad_secret'::text, p_operation, NULL::text, p_member,
                                p_may_wait => true, p_by_role => true);
    END IF;
    IF why IS NOT NULL THEN
        RETURN ROW('refused', why, m.incarnation, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    RETURN NULL;
END;
$function$
