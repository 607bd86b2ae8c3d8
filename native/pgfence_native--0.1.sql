-- pgfence_native 0.1: pgfence_native.fence, the same function as pgfence.fence (same arguments, same result, same
-- answers) whose fast path runs in C. Install it after pgfence's migrations, as a superuser, in each database:
--   CREATE EXTENSION pgfence_native;
-- pgfence's library uses it when it is there (Store::native_guard). Everything it does not admit itself it hands
-- to pgfence.fence, so it answers every call exactly as pgfence.fence does; it answers only to roles that may
-- execute pgfence.fence (checked on every call), so granting EXECUTE on it to PUBLIC gives nobody anything.
\echo Use "CREATE EXTENSION pgfence_native" to load this file. \quit

CREATE FUNCTION pgfence_native.fence(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text,
                                     p_key text)
RETURNS pgfence.write_result
AS 'MODULE_PATHNAME', 'pgfence_native_fence'
LANGUAGE c VOLATILE PARALLEL UNSAFE;

-- What this backend remembers (for tests and operators): the leases whose tenure it has seen admitted, without
-- the secrets.
CREATE FUNCTION pgfence_native.remembered(OUT lease text, OUT epoch bigint, OUT lock_key integer)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pgfence_native_remembered'
LANGUAGE c VOLATILE PARALLEL UNSAFE;

GRANT USAGE ON SCHEMA pgfence_native TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence_native.fence(text, bigint, text, text, text, text) TO PUBLIC;
REVOKE EXECUTE ON FUNCTION pgfence_native.remembered() FROM PUBLIC;
