-- pgfence._mark as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._mark(p_lease text, p_epoch bigint, p_mark text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    kept text;
BEGIN
    INSERT INTO pgfence.write_marks AS m (lease, epoch, backend, last_at)
    VALUES (p_lease, p_epoch, pg_catalog.pg_backend_pid(), clock_timestamp())
    ON CONFLICT (lease, epoch, backend) DO UPDATE SET last_at = greatest(m.last_at, EXCLUDED.last_at);
    kept := pg_catalog.set_config('pgfence.write_mark', p_mark, false);
    RETURN true;
END;
$function$
