-- pgfence.fence as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.fence(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text, p_key text)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    -- The labels first, by the cheap test (the lease and the epoch need none on the fast path: it admits only
    -- the name and the epoch of a held tenure, which were checked when it was acquired).
    IF pgfence._plain_labels(p_operation, p_table, p_key) IS NOT TRUE THEN
        PERFORM pgfence._check_labels(p_operation, p_table, p_key);
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, true) THEN
        RETURN ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL,
                   NULL)::pgfence.write_result;
    END IF;
    RETURN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
END;
$function$
