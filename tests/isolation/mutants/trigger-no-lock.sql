-- MUTANT (never applied in the normal run; use PGFENCE_MUTANT_SQL=tests/isolation/mutants/trigger-no-lock.sql or
-- run.sh --mutants): the lease_change trigger without its exclusive guard lock. A direct UPDATE of a lease's
-- epoch then neither waits for guarded writes in flight nor holds off new ones: the direct-bump permutations of
-- the takeover spec must fail.
CREATE OR REPLACE FUNCTION pgfence._lease_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'pgfence: lease rows are never deleted (their epochs must keep increasing)'
            USING ERRCODE = 'PF005';
    END IF;
    IF NEW.epoch < OLD.epoch OR NEW.name <> OLD.name OR NEW.lock_key <> OLD.lock_key THEN
        RAISE EXCEPTION 'pgfence: refused change of lease %: epochs never go down, names and lock keys never change',
            pgfence._printable(OLD.name) USING ERRCODE = 'PF005';
    END IF;
    -- (mutant: no guard lock)
    RETURN NEW;
END;
$$;
