-- Undoes 000003_guard: drops its functions and the enforcement triggers, in reverse order. The audit rows stay.
DROP FUNCTION pgfence.prune_rejections(interval, integer);
DROP FUNCTION pgfence.enforcement();
DROP FUNCTION pgfence.set_enforcement(boolean, text);
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['leases', 'tenures', 'tenure_secrets', 'beliefs', 'write_marks', 'rejections', 'grants', 'instance', 'effects', 'effect_reports'] LOOP
        EXECUTE format('DROP TRIGGER enforce_owner_truncate ON pgfence.%I', t);
        EXECUTE format('DROP TRIGGER enforce_owner ON pgfence.%I', t);
    END LOOP;
END;
$$;
DROP FUNCTION pgfence._owner_writes_only();
DROP TRIGGER enforce_audit ON pgfence.task_events;
DROP TRIGGER enforce_epoch ON pgfence.task_events;
DROP TRIGGER enforce_truncate ON pgfence.tasks;
DROP TRIGGER enforce_audit ON pgfence.tasks;
DROP TRIGGER enforce_epoch ON pgfence.tasks;
DROP FUNCTION pgfence._enforce_epoch();
DROP FUNCTION pgfence.ungated_write(text, bigint);
DROP FUNCTION pgfence.fence(text, bigint, text, text, text, text);
DROP FUNCTION pgfence._install_guard(text);
DROP FUNCTION pgfence._fence_slow(text, bigint, text, text, text, text);
DROP FUNCTION pgfence._check_labels(text, text, text);
DROP FUNCTION pgfence._guard(text, bigint, text, text, text, text);
DROP FUNCTION pgfence._admit(text, bigint, text, boolean);
DROP FUNCTION pgfence._mark(text, bigint, text);
DROP FUNCTION pgfence._verdict(pgfence.leases, bigint, text, timestamptz, bigint, bigint);
DROP FUNCTION pgfence._admits(text, bigint, text, integer, timestamptz, bigint, boolean);
DROP FUNCTION pgfence._try_guard_lock(integer);
DROP FUNCTION pgfence._known_slot(text);
DROP FUNCTION pgfence._guard_held_setting(integer);
DROP FUNCTION pgfence._read_committed();
DROP FUNCTION pgfence._fence_setting(integer);
DROP FUNCTION pgfence._await_takeover(text, integer);
