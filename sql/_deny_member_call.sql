-- pgfence._deny_member_call as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._deny_member_call(p_group text, p_operation text)
 RETURNS pgfence.member_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF pgfence._may_use(pgfence._cluster_of(p_group)) THEN
        RETURN NULL;
    END IF;
    PERFORM pgfence._reject(p_group, 0::bigint, NULL::bigint, NULL::text, 'no_grant'::text, p_operation, NULL::text, NULL::text, p_may_wait => true,
                            p_by_role => true);
    RETURN ROW('refused', 'no_grant', NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
END;
$function$
