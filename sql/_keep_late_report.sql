-- pgfence._keep_late_report as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._keep_late_report(p_lease text, p_epoch bigint, p_secret text, p_effect_key text, p_outcome text, p_detail jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    e pgfence.effects;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    SELECT * INTO e FROM pgfence.effects x
     WHERE x.lease = p_lease AND x.effect_key = p_effect_key AND x.epoch = p_epoch
     ORDER BY x.attempt DESC LIMIT 1;
    IF NOT FOUND OR NOT pgfence._secret_matches(e.tenure_hash, p_secret) THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    INSERT INTO pgfence.effect_reports AS k (effect_id, lease, epoch, outcome, detail)
    VALUES (e.id, p_lease, p_epoch, p_outcome, p_detail)
    ON CONFLICT (effect_id) DO UPDATE
       SET count = k.count + 1, last_at = clock_timestamp(),
           outcome = CASE WHEN k.outcome = 'unknown' THEN EXCLUDED.outcome ELSE k.outcome END,
           detail = CASE WHEN k.outcome = 'unknown' THEN EXCLUDED.detail ELSE k.detail END;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: the late report of % attempt % waited % ms for another report of it; blocked by %',
        pgfence._printable(p_effect_key), e.attempt, wait_ms,
        pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
                                     WHERE k.locktype = 'relation' AND k.granted
                                       AND k.relation = 'pgfence.effect_reports'::regclass
                                       AND k.mode = 'RowExclusiveLock'
                                       AND k.pid <> pg_catalog.pg_backend_pid()))
        USING ERRCODE = 'PF003';
END;
$function$
