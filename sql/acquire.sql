-- pgfence.acquire as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.acquire(p_lease text, p_holder text, p_ttl_ms bigint)
 RETURNS pgfence.lease_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, 1::bigint);
    PERFORM pgfence._check_text('holder'::text, p_holder, pgfence._max_holder_len());
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_lease_call(p_lease, 0::bigint, 'acquire'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    RETURN pgfence._acquire_checked(p_lease, p_holder, p_ttl_ms, pgfence._timeline(),
                                    (SELECT v FROM pgfence._server_view() v));
END;
$function$
