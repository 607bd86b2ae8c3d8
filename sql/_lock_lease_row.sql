-- pgfence._lock_lease_row as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._lock_lease_row(p_lease text, p_create boolean DEFAULT false)
 RETURNS pgfence.leases
 LANGUAGE plpgsql
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    l pgfence.leases;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    -- Local to this function (its SET clause restores the caller's value on exit).
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    IF p_create THEN
        INSERT INTO pgfence.leases (name) VALUES (p_lease) ON CONFLICT (name) DO NOTHING;
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease FOR NO KEY UPDATE;
    RETURN l;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: waited % ms for the row lock of lease %; blocked by %', wait_ms,
        pgfence._printable(p_lease), pgfence._describe_backends(pgfence._row_lockers(p_lease))
        USING ERRCODE = 'PF003',
              HINT = 'A transaction holding the lease row stays open: end it (pg_terminate_backend) or let it finish.';
END;
$function$
