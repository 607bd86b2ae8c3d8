-- pgfence._member_loss as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._member_loss(m pgfence.members, p_incarnation bigint, p_secret text, ts timestamp with time zone)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE
        WHEN m.grp IS NULL OR m.joined_at = '-infinity' THEN 'unknown_member'
        WHEN p_incarnation < m.incarnation THEN 'superseded'
        WHEN p_incarnation > m.incarnation THEN 'unknown_member'
        WHEN NOT pgfence._secret_matches(m.secret_hash, p_secret) THEN 'bad_secret'
        WHEN m.left_at IS NOT NULL THEN 'left'
        WHEN m.expires_at <= ts THEN 'expired'
    END
$function$
