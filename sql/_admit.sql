-- pgfence._admit as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._admit(p_lease text, p_epoch bigint, p_secret text, p_mark boolean)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    known text := pg_catalog.current_setting(pgfence._known_slot(p_lease), true);
    tail  text := ' ' || p_epoch::text || ' ' || p_lease;
    k     integer;
    now   timestamptz;
    tl    bigint;
    r     record;
    kept  text;
BEGIN
    -- "<lock_key> <epoch> <lease>" for this lease and epoch, with a lock key of 1 to 9 digits; else nothing known.
    k := CASE WHEN right(known, length(tail)) = tail AND length(known) - length(tail) BETWEEN 1 AND 9
                   AND ltrim(left(known, length(known) - length(tail)), '0123456789') = ''
              THEN left(known, length(known) - length(tail))::integer END;
    IF k IS NULL OR NOT pgfence._read_committed()
       OR NOT pgfence._try_guard_lock(k) THEN
        RETURN false;
    END IF;
    -- A new statement after the lock, so a new snapshot under READ COMMITTED: every takeover that held the intent
    -- or the guard lock before the lock was granted has committed and shows here. (The clock and the timeline are
    -- read into variables so that _admits is inlined.)
    now := clock_timestamp();
    tl := pgfence._timeline();
    SELECT a.admitted, a.mark INTO r FROM pgfence._admits(p_lease, p_epoch, p_secret, k, now, tl, p_mark) a;
    IF r.admitted THEN
        kept := pg_catalog.set_config(pgfence._fence_setting(k), p_secret, true);
        IF r.mark IS NOT NULL THEN
            PERFORM pgfence._mark(p_lease, p_epoch, r.mark);
        END IF;
        RETURN true;
    END IF;
    kept := pg_catalog.set_config(pgfence._guard_held_setting(k), 'on', true);
    RETURN false;
END;
$function$
