-- Undoes 000002_lease_protocol: drops its view, triggers and functions, in reverse order. The rows stay: lease
-- rows keep their epochs, so a later acquisition still issues a larger one.
DROP FUNCTION pgfence.report_belief(text, bigint, text, text, timestamptz, timestamptz, text, text, text);
DROP VIEW pgfence.tenure_history;
DROP FUNCTION pgfence.set_takeover_grace(interval);
DROP TRIGGER lease_truncate ON pgfence.leases;
DROP TRIGGER lease_delete ON pgfence.leases;
DROP TRIGGER lease_change ON pgfence.leases;
DROP FUNCTION pgfence._lease_change();
DROP FUNCTION pgfence.force_release(text);
DROP FUNCTION pgfence.release(text, bigint, text);
DROP FUNCTION pgfence.renew_many(text[], bigint[], text[], bigint);
DROP FUNCTION pgfence.renew(text, bigint, text, bigint);
DROP FUNCTION pgfence.acquire_many(text[], text, bigint);
DROP FUNCTION pgfence._max_acquire_batch();
DROP FUNCTION pgfence.acquire(text, text, bigint);
DROP FUNCTION pgfence._acquire_checked(text, text, bigint, bigint, record, boolean);
DROP FUNCTION pgfence._server_view();
DROP FUNCTION pgfence._deny_lease_call(text, bigint, text, boolean);
DROP FUNCTION pgfence._end_tenure(text, bigint, timestamptz, text);
DROP FUNCTION pgfence._secret_check(text, bigint, text);
DROP FUNCTION pgfence._secret_verdict(bigint, bytea, bigint, text);
DROP FUNCTION pgfence._secret_matches(bytea, text);
DROP FUNCTION pgfence._held_by_other(pgfence.leases, text, timestamptz, bigint);
DROP FUNCTION pgfence._loss_reason(pgfence.leases, text, bigint, timestamptz, bigint);
DROP FUNCTION pgfence._take_guard_lock(text, integer);
DROP FUNCTION pgfence._lock_lease_row(text, boolean);
DROP FUNCTION pgfence._row_lockers(text);
