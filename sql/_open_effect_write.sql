-- pgfence._open_effect_write as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._open_effect_write(p_lease text, p_epoch bigint, p_secret text, p_effect_key text, p_operation text, p_what text, p_text text, p_max integer, p_detail jsonb)
 RETURNS pgfence.write_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    problem text;
BEGIN
    -- The cheap test first, the full checks (which name the problem) only when it fails, as the task writes do.
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND p_secret IS NOT NULL
        AND pgfence._plain_arg(p_effect_key, pgfence._max_holder_len())
        AND pgfence._plain_arg(p_text, p_max, p_optional => p_what IS NULL)
        AND p_detail IS NOT NULL AND pgfence._payload_problem(p_detail) IS NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch), pgfence._secret_problem(p_secret),
                            pgfence._arg_problem('effect key'::text, p_effect_key, pgfence._max_holder_len()),
                            pgfence._arg_problem(p_what, p_text, p_max, p_optional => p_what IS NULL),
                            CASE WHEN p_detail IS NULL THEN 'a jsonb argument is required (''{}'' for none)' END,
                            pgfence._payload_problem(p_detail));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
        END IF;
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, false) THEN
        RETURN NULL;
    END IF;
    RETURN pgfence._guard(p_lease, p_epoch, p_secret, p_operation, 'effects'::text, p_effect_key);
END;
$function$
