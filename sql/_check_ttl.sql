-- pgfence._check_ttl as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._check_ttl(p_ttl_ms bigint)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    IF p_ttl_ms IS NULL OR p_ttl_ms < pgfence._min_ttl_ms() OR p_ttl_ms > pgfence._max_ttl_ms() THEN
        RAISE EXCEPTION 'pgfence: ttl must be between % ms and % h, got % ms', pgfence._min_ttl_ms(),
            pgfence._max_ttl_ms() / 3600000, p_ttl_ms USING ERRCODE = '22023', COLUMN = 'ttl';
    END IF;
END;
$function$
