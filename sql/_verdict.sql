-- pgfence._verdict as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._verdict(l pgfence.leases, p_epoch bigint, p_secret text, p_now timestamp with time zone, p_timeline bigint, p_matched_epoch bigint)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(pgfence._loss_reason(l, NULL::text, p_epoch, p_now, p_timeline),
                    CASE WHEN l.epoch IS DISTINCT FROM p_matched_epoch
                              AND pgfence._secret_check(l.name, p_epoch, p_secret) IS DISTINCT FROM 'ok'
                         THEN 'bad_secret' END)
$function$
