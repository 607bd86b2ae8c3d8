-- pgfence._may_use as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._may_use(p_cluster text, p_operator boolean DEFAULT false)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN (SELECT u.granted FROM pgfence._grant_of(p_cluster, p_operator) u);
END;
$function$
