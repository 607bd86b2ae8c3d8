-- pgfence._check_labels as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._check_labels(p_operation text, p_table text, p_key text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    problem text;
BEGIN
    problem := coalesce(pgfence._arg_problem('operation'::text, p_operation, pgfence._max_label_len()),
                        pgfence._arg_problem('target table'::text, p_table, pgfence._max_label_len(),
                                             p_optional => true),
                        pgfence._arg_problem('target key'::text, p_key, pgfence._max_holder_len(),
                                             p_optional => true));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    RETURN true;
END;
$function$
