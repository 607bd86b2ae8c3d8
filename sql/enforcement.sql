-- pgfence.enforcement as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.enforcement()
 RETURNS text
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT coalesce((SELECT CASE t.tgname WHEN 'enforce_epoch' THEN 'error' ELSE 'audit' END
                       FROM pg_catalog.pg_trigger t
                      WHERE t.tgrelid = 'pgfence.tasks'::regclass AND t.tgname IN ('enforce_epoch', 'enforce_audit')
                        AND t.tgenabled <> 'D'
                      LIMIT 1), 'off')
$function$
