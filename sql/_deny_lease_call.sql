-- pgfence._deny_lease_call as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._deny_lease_call(p_lease text, p_epoch bigint, p_operation text, p_operator boolean DEFAULT false)
 RETURNS pgfence.lease_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF pgfence._may_use(pgfence._cluster_of(p_lease), p_operator) THEN
        RETURN NULL;
    END IF;
    PERFORM pgfence._reject(p_lease, coalesce(p_epoch, 0), NULL::bigint, NULL::text, 'no_grant'::text, p_operation, NULL::text, NULL::text,
                            p_may_wait => true);
    RETURN ROW('refused', 'no_grant', NULL, NULL, NULL, NULL)::pgfence.lease_result;
END;
$function$
