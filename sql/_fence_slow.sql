-- pgfence._fence_slow as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._fence_slow(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text, p_key text)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    problem text;
    mark text;
    r pgfence.write_result;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND p_secret IS NOT NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch), pgfence._secret_problem(p_secret));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem
                USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
        END IF;
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    -- The write mark (see _mark), as the fast path leaves it.
    mark := p_epoch::text || ':' || pg_catalog.date_part('epoch', clock_timestamp())::bigint::text || ':'
            || p_lease;
    IF mark IS DISTINCT FROM pg_catalog.current_setting('pgfence.write_mark', true) THEN
        PERFORM pgfence._mark(p_lease, p_epoch, mark);
    END IF;
    RETURN ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.write_result;
END;
$function$
