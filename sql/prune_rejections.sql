-- pgfence.prune_rejections as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.prune_rejections(p_older_than interval, p_batch integer DEFAULT 10000)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    n integer;
BEGIN
    PERFORM pgfence._require_instance_operator('prune_rejections'::text);
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_batch IS NULL OR p_batch < 1 OR p_batch > 1000000 THEN
        RAISE EXCEPTION 'pgfence: prune needs a non-negative age and a batch of 1 to 1000000 rows'
            USING ERRCODE = '22023', COLUMN = 'age or batch';
    END IF;
    DELETE FROM pgfence.rejections
     WHERE id IN (SELECT id FROM pgfence.rejections
                   WHERE last_rejected_at < clock_timestamp() - p_older_than
                   ORDER BY last_rejected_at LIMIT p_batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$function$
