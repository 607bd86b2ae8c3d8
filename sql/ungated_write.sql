-- pgfence.ungated_write as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.ungated_write(p_outcome text, p_written bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    RAISE EXCEPTION 'pgfence: a guarded write changed % rows although its guard answered %: the statement does not test pgfence_guard.passed',
        p_written, pgfence._printable(p_outcome)
        USING ERRCODE = 'PF006',
              HINT = 'Add AND (SELECT passed FROM pgfence_guard) to its WHERE clause (INSERT: INSERT ... SELECT ... WHERE it).';
END;
$function$
