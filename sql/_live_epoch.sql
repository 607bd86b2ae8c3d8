-- pgfence._live_epoch as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._live_epoch(l pgfence.leases)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN pgfence._loss_reason(l, NULL::text, l.epoch, clock_timestamp(), pgfence._timeline()) IS NULL
                THEN l.epoch END
$function$
