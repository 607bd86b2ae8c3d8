-- pgfence._roster_digest as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._roster_digest(p_group text)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT md5(coalesce(string_agg(row(g.member, g.weight, g.settled, g.names, g.pinned, g.excluded, g.leads)::text,
                                   ',' ORDER BY g.member), ''))
      FROM pgfence.group_members g
     WHERE g."group" = p_group AND g.live
$function$
