-- pgfence._owner_writes_only as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._owner_writes_only()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence'), 'MEMBER')
    THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses % on pgfence.% by role %: only the pgfence functions write it',
            TG_OP, TG_TABLE_NAME, quote_literal(regexp_replace(current_user, '[[:cntrl:]]', '?', 'g'))
            USING ERRCODE = 'PF001';
    END IF;
    RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END;
$function$
