-- pgfence.report_belief as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.report_belief(p_lease text, p_epoch bigint, p_secret text, p_event text, p_at timestamp with time zone, p_sent_at timestamp with time zone, p_endpoint text, p_cause text, p_detail text, OUT outcome text, OUT reason text)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    b pgfence.beliefs;
    arrived timestamptz := clock_timestamp();
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    -- Bounded: another report of the same tenure in an open transaction is waited for at most this long.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_secret(p_secret);
    IF p_event IS NULL OR p_event NOT IN ('start', 'end') THEN
        RAISE EXCEPTION 'pgfence: invalid belief event: must be ''start'' or ''end'', got %',
            pgfence._printable(p_event) USING ERRCODE = '22023', COLUMN = 'belief event';
    END IF;
    IF p_at IS NULL OR NOT isfinite(p_at) OR p_sent_at IS NULL OR NOT isfinite(p_sent_at) THEN
        RAISE EXCEPTION 'pgfence: invalid belief time: the time and the send time must be finite'
            USING ERRCODE = '22023', COLUMN = 'belief time';
    END IF;
    IF p_endpoint IS NOT NULL THEN
        PERFORM pgfence._check_text('endpoint'::text, p_endpoint, pgfence._max_endpoint_len());
    END IF;
    IF p_event = 'start' AND (p_cause IS NOT NULL OR p_detail IS NOT NULL) THEN
        RAISE EXCEPTION 'pgfence: invalid belief cause: a start has none'
            USING ERRCODE = '22023', COLUMN = 'belief cause';
    END IF;
    IF p_event = 'end' AND (p_cause IS NULL
                            OR p_cause NOT IN ('released', 'lost', 'deadline', 'write_refused', 'shutdown')) THEN
        RAISE EXCEPTION 'pgfence: invalid belief cause: must be released, lost, deadline, write_refused or shutdown, got %',
            pgfence._printable(p_cause) USING ERRCODE = '22023', COLUMN = 'belief cause';
    END IF;
    IF p_detail IS NOT NULL THEN
        PERFORM pgfence._check_text('belief detail'::text, p_detail, pgfence._max_label_len());
    END IF;
    IF NOT pgfence._may_use(pgfence._cluster_of(p_lease)) THEN
        PERFORM pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'no_grant'::text, 'report_belief'::text, NULL::text, NULL::text,
                                p_may_wait => true);
        outcome := 'refused'; reason := 'no_grant';
        RETURN;
    END IF;
    -- Decided before any lock, on an unlocked read (the hash never changes): a role without the tenure's
    -- secret never holds the belief row. A tenure that does not exist explains nothing: its refusal is
    -- aggregated per role (a flood of bogus names or epochs costs one row), like an unknown lease's.
    SELECT * INTO b FROM pgfence.beliefs WHERE lease = p_lease AND epoch = p_epoch;
    IF NOT FOUND THEN
        PERFORM pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'bad_secret'::text, 'report_belief'::text, NULL::text, NULL::text,
                                p_may_wait => true, p_by_role => true);
        outcome := 'refused'; reason := 'bad_secret';
        RETURN;
    END IF;
    IF NOT pgfence._secret_matches(b.report_hash, p_secret) THEN
        PERFORM pgfence._reject(p_lease, p_epoch, NULL::bigint, NULL::text, 'bad_secret'::text, 'report_belief'::text, NULL::text, NULL::text,
                                p_may_wait => true);
        outcome := 'refused'; reason := 'bad_secret';
        RETURN;
    END IF;
    SELECT * INTO b FROM pgfence.beliefs WHERE lease = p_lease AND epoch = p_epoch FOR NO KEY UPDATE;
    IF p_event = 'start' THEN
        IF b.start_received_at IS NOT NULL THEN
            outcome := 'kept';
            RETURN;
        END IF;
        UPDATE pgfence.beliefs
           SET believed_from = p_at, start_sent_at = p_sent_at, start_received_at = arrived,
               endpoint = p_endpoint
         WHERE lease = p_lease AND epoch = p_epoch;
    ELSE
        IF b.end_received_at IS NOT NULL THEN
            outcome := 'kept';
            RETURN;
        END IF;
        UPDATE pgfence.beliefs
           SET believed_until = p_at, end_cause = p_cause, end_detail = p_detail, end_sent_at = p_sent_at,
               end_received_at = arrived
         WHERE lease = p_lease AND epoch = p_epoch;
    END IF;
    outcome := 'recorded';
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: a belief report of lease % waited % ms for its row; blocked by %',
        pgfence._printable(p_lease), wait_ms, pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'Another report of this tenure is in an open transaction.';
END;
$function$
