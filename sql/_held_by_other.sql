-- pgfence._held_by_other as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._held_by_other(l pgfence.leases, p_holder text, ts timestamp with time zone, p_timeline bigint)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT pgfence._loss_reason(l, NULL::text, l.epoch, ts, p_timeline) IS NULL
           AND (l.holder IS DISTINCT FROM p_holder OR l.holder_role IS DISTINCT FROM session_user)
$function$
