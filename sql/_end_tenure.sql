-- pgfence._end_tenure as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._end_tenure(p_lease text, p_epoch bigint, p_ended_at timestamp with time zone, p_reason text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE pgfence.tenures SET ended_at = p_ended_at, end_reason = p_reason
     WHERE lease = p_lease AND epoch = p_epoch AND ended_at IS NULL;
END;
$function$
