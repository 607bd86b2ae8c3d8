-- pgfence._admits as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._admits(p_lease text, p_epoch bigint, p_secret text, p_lock_key integer, p_now timestamp with time zone, p_timeline bigint, p_mark boolean)
 RETURNS TABLE(admitted boolean, mark text)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT l.lock_key = p_lock_key AND l.epoch = p_epoch AND l.state = 'held' AND l.expires_at > p_now
           AND l.timeline >= p_timeline AND s.epoch = p_epoch AND pgfence._secret_matches(s.hash, p_secret)
           AND (pg_catalog.pg_has_role(session_user, current_user, 'MEMBER')
                OR EXISTS (SELECT 1 FROM pgfence.grants g
                            WHERE (g.cluster = pgfence._cluster_of(p_lease) OR g.cluster IS NULL)
                              AND pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER'))),
           CASE WHEN p_mark THEN NULLIF(m.mark, pg_catalog.current_setting('pgfence.write_mark', true)) END
      FROM pgfence.leases l
      JOIN pgfence.tenure_secrets s ON s.lease = l.name,
           LATERAL (SELECT p_epoch::text || ':' || pg_catalog.date_part('epoch', p_now)::bigint::text || ':'
                           || p_lease AS mark) m
     WHERE l.name = p_lease
$function$
