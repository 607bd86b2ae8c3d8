-- pgfence._admits as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._admits(p_lease text, p_epoch bigint, p_secret text, p_lock_key integer, p_now timestamp with time zone, p_timeline bigint, p_mark boolean)
 RETURNS TABLE(admitted boolean, mark text)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT l.lock_key = p_lock_key
           AND pgfence._loss_reason(l, NULL::text, p_epoch, p_now, p_timeline) IS NULL
           AND pgfence._secret_verdict(s.epoch, s.hash, p_epoch, p_secret) = 'ok'
           AND u.granted,
           CASE WHEN p_mark THEN NULLIF(m.mark, pg_catalog.current_setting('pgfence.write_mark', true)) END
      FROM pgfence.leases l
      JOIN pgfence.tenure_secrets s ON s.lease = l.name
     CROSS JOIN pgfence._grant_of(pgfence._cluster_of(p_lease), false, current_user) u,
           LATERAL (SELECT p_epoch::text || ':' || pg_catalog.date_part('epoch', p_now)::bigint::text || ':'
                           || p_lease AS mark) m
     WHERE l.name = p_lease
$function$
