-- pgfence._group_channel as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._group_channel(p_group text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT 'pgfence_group_' || left(md5(p_group), 24)
$function$
