-- Undoes 000004_tasks: drops its triggers and functions, in reverse order. Tasks and their events stay.
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
