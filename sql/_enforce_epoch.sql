-- pgfence._enforce_epoch as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._enforce_epoch()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    presented bigint;
    target    text;
    key       text;
    l   pgfence.leases;
    why text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses TRUNCATE on pgfence.%', TG_TABLE_NAME USING ERRCODE = 'PF001';
    END IF;
    -- Separate statements per table: plpgsql plans each one against NEW's row type when it first runs.
    IF TG_TABLE_NAME = 'tasks' AND TG_OP = 'DELETE' THEN
        target := OLD.lease; presented := OLD.fence; key := OLD.key; why := 'delete_refused';
    ELSIF TG_TABLE_NAME = 'tasks' THEN
        target := NEW.lease; presented := NEW.fence; key := NEW.key;
        IF TG_OP = 'UPDATE' AND NEW.lease IS DISTINCT FROM OLD.lease THEN
            why := 'lease_change';
        ELSIF TG_OP = 'UPDATE' AND NEW.fence < OLD.fence THEN
            why := 'row_fence';
        END IF;
    ELSE
        target := NEW.lease; presented := NEW.epoch; key := NEW.task_id::text;
        -- An event belongs to its task's lease: the epoch is checked against that lease, not one the
        -- statement names.
        IF NOT EXISTS (SELECT 1 FROM pgfence.tasks t WHERE t.id = NEW.task_id AND t.lease = NEW.lease) THEN
            why := 'lease_mismatch';
        END IF;
    END IF;
    -- Before anything is read: a role with table privileges may write only the clusters it has a grant on
    -- (this trigger runs before row-level security's check of the new row), and an epoch below 1 was never issued.
    IF NOT pgfence._may_use(pgfence._cluster_of(target)) THEN
        why := 'no_grant';
    ELSIF presented IS NULL OR presented < 1 THEN
        why := 'future_epoch';
    END IF;
    IF why IN ('no_grant', 'future_epoch') THEN
        IF TG_NARGS > 0 AND TG_ARGV[0] = 'audit' THEN
            PERFORM pgfence._reject(target, coalesce(presented, 0), NULL::bigint, NULL::text, why, 'raw_' || lower(TG_OP),
                                    TG_TABLE_NAME::text, key);
            RAISE WARNING 'pgfence: refused raw % on pgfence.% (%); recorded in pgfence.rejections',
                TG_OP, TG_TABLE_NAME, why;
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'pgfence: enforcement refuses this % on pgfence.% (%)', TG_OP, TG_TABLE_NAME, why
            USING ERRCODE = 'PF001';
    END IF;
    -- A transaction that did not present the tenure's secret is refused before it takes the guard lock.
    IF why IS NULL AND pgfence._secret_check(target, presented,
                                             current_setting(pgfence._fence_setting(
                                                 (SELECT x.lock_key FROM pgfence.leases x WHERE x.name = target)),
                                                 true)) = 'bad' THEN
        why := 'bad_secret';
    END IF;
    -- The guard's protocol (as _guard's): the lease's guard lock shared (_try_guard_lock, else _await_takeover),
    -- then the row read in a new snapshot and the verdict on it (_verdict). Knowing the epoch is not enough: the
    -- transaction must have presented the tenure's secret to the guard (the setting pgfence.fence left).
    SELECT * INTO l FROM pgfence.leases WHERE name = target;
    IF FOUND AND why IS DISTINCT FROM 'bad_secret' THEN
        IF NOT pgfence._read_committed() THEN
            RAISE EXCEPTION 'pgfence: writes to pgfence.% need READ COMMITTED isolation; this transaction is %',
                TG_TABLE_NAME, upper(current_setting('transaction_isolation')) USING ERRCODE = 'PF004';
        END IF;
        IF NOT pgfence._try_guard_lock(l.lock_key) THEN
            PERFORM pgfence._await_takeover(target, l.lock_key);
        END IF;
        -- Held to the end of the transaction, whatever is decided below (the marker of _await_takeover).
        PERFORM set_config(pgfence._guard_held_setting(l.lock_key), 'on', true);
        SELECT * INTO l FROM pgfence.leases WHERE name = target;
    END IF;
    IF why IS NULL THEN
        why := pgfence._verdict(l, presented, current_setting(pgfence._fence_setting(l.lock_key), true),
                                clock_timestamp(), pgfence._timeline(), NULL::bigint);
    END IF;
    IF why IS NULL THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_NARGS > 0 AND TG_ARGV[0] = 'audit' THEN
        PERFORM pgfence._reject(target, presented, l.epoch, l.holder, why,
                                'raw_' || lower(TG_OP), TG_TABLE_NAME, key);
        RAISE WARNING 'pgfence: refused raw % on pgfence.% (%, presented epoch %, current %); recorded in pgfence.rejections',
            TG_OP, TG_TABLE_NAME, why, presented, l.epoch;
        RETURN NULL;
    END IF;
    IF why IN ('delete_refused', 'lease_change', 'lease_mismatch', 'bad_secret') THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses this % on pgfence.% (%)', TG_OP, TG_TABLE_NAME, why
            USING ERRCODE = 'PF001';
    END IF;
    RAISE EXCEPTION 'pgfence: stale write to %: presented epoch %, current epoch % (%)',
        target, presented, l.epoch, why USING ERRCODE = 'PF001';
END;
$function$
