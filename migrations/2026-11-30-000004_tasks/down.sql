-- Undoes 000004_tasks: drops its triggers and functions, in reverse order. Tasks, their events and the effect
-- ledger stay.
DROP FUNCTION pgfence.effect_attempts(text, text);
DROP FUNCTION pgfence.in_doubt_effects(text);
DROP FUNCTION pgfence.settle_effect(text, bigint, text, text, text, jsonb);
DROP FUNCTION pgfence.record_outcome(text, bigint, text, text, text, jsonb);
DROP FUNCTION pgfence._keep_late_report(text, bigint, text, text, text, jsonb);
DROP FUNCTION pgfence.record_intent(text, bigint, text, text, text, jsonb);
DROP FUNCTION pgfence._last_attempt(text, text);
DROP FUNCTION pgfence._open_effect_write(text, bigint, text, text, text, text, text, integer, jsonb);
DROP FUNCTION pgfence._effect_refusal(pgfence.write_result, text, text, boolean);
DROP FUNCTION pgfence._effect_result(pgfence.effects, text, text, text, boolean, bigint, bigint);
DROP FUNCTION pgfence._in_doubt_result(pgfence.effects, text);
DROP FUNCTION pgfence._task_in_doubt(text, text, bigint);
DROP FUNCTION pgfence._live_epoch(pgfence.leases);
DROP FUNCTION pgfence._in_doubt(text, text, bigint, bigint);
DROP TRIGGER append_only_truncate ON pgfence.task_events;
DROP TRIGGER append_only ON pgfence.task_events;
DROP FUNCTION pgfence._append_only();
DROP FUNCTION pgfence.append_event(text, bigint, text, text, text, jsonb);
DROP FUNCTION pgfence.transition_task(text, bigint, text, text, text, text, jsonb);
DROP FUNCTION pgfence.claim_task(text, bigint, text, text, text);
DROP FUNCTION pgfence.create_task(text, bigint, text, text, jsonb);
DROP FUNCTION pgfence._open_task_write(text, bigint, text, text, text, text, text, text, integer, jsonb);
DROP FUNCTION pgfence._explain_miss(text, bigint, text, text);
DROP FUNCTION pgfence._task_result(pgfence.tasks, text, text, bigint, boolean, bigint);
DROP FUNCTION pgfence._lock_task(text, text, text);
DROP FUNCTION pgfence._task_lockers(text, text);
