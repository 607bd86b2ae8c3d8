-- pgfence._append_only as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._append_only()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'pgfence: pgfence.% is append-only', TG_TABLE_NAME USING ERRCODE = 'PF002';
END;
$function$
