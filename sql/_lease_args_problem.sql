-- pgfence._lease_args_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._lease_args_problem(p_lease text, p_epoch bigint)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT coalesce('invalid lease: ' || pgfence._lease_problem(p_lease),
                    CASE WHEN p_epoch IS NULL OR p_epoch < 1
                         THEN 'invalid epoch: must be >= 1, got ' || coalesce(p_epoch::text, '<NULL>') END)
$function$
