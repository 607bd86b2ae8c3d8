-- pgfence._describe_backends as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._describe_backends(p_pids integer[])
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(string_agg(format('pid %s (application_name %s, state %s, role %s)', a.pid,
                                      pgfence._printable(a.application_name), coalesce(a.state, 'unknown'),
                                      pgfence._printable(a.usename::text)), ', ' ORDER BY a.pid),
                    'no backend any more (the blocker has just ended)')
      FROM pg_catalog.pg_stat_activity a
     WHERE a.pid = ANY (p_pids)
$function$
