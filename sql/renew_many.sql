-- pgfence.renew_many as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.renew_many(p_leases text[], p_epochs bigint[], p_secrets text[], p_ttl_ms bigint)
 RETURNS TABLE(lease text, outcome text, reason text, epoch bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    ts timestamptz;
    tl bigint;
    wait_ms bigint := pgfence._lock_wait_ms();
    refused text[];
    whys text[];
    live text[];
    r record;
    first boolean := true;
BEGIN
    PERFORM pgfence._check_ttl(p_ttl_ms);
    IF p_leases IS NULL OR p_epochs IS NULL OR p_secrets IS NULL OR cardinality(p_leases) <> cardinality(p_epochs)
       OR cardinality(p_leases) <> cardinality(p_secrets) THEN
        RAISE EXCEPTION 'pgfence: renew_many needs as many epochs and secrets as leases'
            USING ERRCODE = '22023', COLUMN = 'leases';
    END IF;
    -- A NULL secret is bad input, as renew's: 22023 before anything is written (not an audited bad_secret).
    IF array_position(p_secrets, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: renew_many: secret % of %: %', array_position(p_secrets, NULL),
            cardinality(p_secrets), pgfence._secret_problem(NULL::text) USING ERRCODE = '22023', COLUMN = 'secret';
    END IF;
    PERFORM pgfence._check_lease_args(i.lease, i.epoch) FROM unnest(p_leases, p_epochs) AS i(lease, epoch);
    tl := pgfence._timeline();

    -- Clusters the role has no grant on: their leases are refused.
    -- Asked once per distinct cluster, not once per lease: the grant check is most of a renewal's server time
    -- (about 0.2 ms a call), and a member renews every lease it leads in this one statement.
    refused := ARRAY(SELECT d.c FROM (SELECT DISTINCT pgfence._cluster_of(n) AS c FROM unnest(p_leases) AS n) d
                      WHERE NOT pgfence._may_use(d.c));

    -- The unlocked judgment of every entry whose secret is not its tenure's (see renew): refused for good. The
    -- rest presented their tenure's secret: the only rows this call locks, judged on the locked rows.
    whys := ARRAY(
        SELECT CASE WHEN pgfence._cluster_of(i.lease) = ANY (refused) THEN 'no_grant'
                    WHEN s.secret = 'ok' THEN NULL
                    ELSE coalesce(pgfence._loss_reason(l, NULL::text, i.epoch, clock_timestamp(), tl),
                                  CASE s.secret WHEN 'bad' THEN 'bad_secret' ELSE 'superseded' END) END
          FROM unnest(p_leases, p_epochs, p_secrets) WITH ORDINALITY AS i(lease, epoch, secret, ord)
          LEFT JOIN pgfence.leases l ON l.name = i.lease
          CROSS JOIN LATERAL (SELECT pgfence._secret_check(i.lease, i.epoch, i.secret) AS secret) s
         ORDER BY i.ord);

    -- The audit: one call per distinct refusal with its count, not one per entry (the aggregated row would be
    -- updated N times in one statement, each update slower than the last). Only the first may answer later
    -- (backpressure, as on every refused path: no lock is held yet), so a call waits at most once.
    -- (A role-scope refusal, no_grant, is one row whatever the lease: one call for all of them.)
    FOR r IN SELECT min(i.lease) AS lease, min(i.epoch) AS epoch, i.why, count(*) AS n
               FROM unnest(p_leases, p_epochs, whys) AS i(lease, epoch, why)
              WHERE i.why = 'no_grant'
              GROUP BY i.why
             UNION ALL
             (SELECT i.lease, i.epoch, i.why, count(*) AS n
               FROM unnest(p_leases, p_epochs, whys) AS i(lease, epoch, why)
              WHERE i.why = 'bad_secret'
              GROUP BY i.lease, i.epoch, i.why ORDER BY i.lease, i.epoch)
    LOOP
        PERFORM pgfence._reject(r.lease, r.epoch, CASE WHEN r.why = 'bad_secret' THEN l.epoch END,
                                CASE WHEN r.why = 'bad_secret' THEN l.holder END, r.why, 'renew'::text, NULL::text, NULL::text,
                                p_may_wait => first, p_count => r.n)
           FROM (SELECT NULL) AS one LEFT JOIN pgfence.leases l ON l.name = r.lease;
        first := false;
    END LOOP;

    -- Lock the live rows in name order (two holders renewing overlapping sets cannot deadlock), bounded.
    live := ARRAY(SELECT DISTINCT i.lease FROM unnest(p_leases, whys) AS i(lease, why) WHERE i.why IS NULL);
    IF cardinality(live) > 0 THEN
        BEGIN
            PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            PERFORM 1 FROM pgfence.leases l WHERE l.name = ANY (live) ORDER BY l.name FOR NO KEY UPDATE OF l;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgfence: renew_many waited % ms for lease row locks; blocked by %', wait_ms,
                pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT p), '{}')
                                              FROM unnest(live) AS n, unnest(pgfence._row_lockers(n)) AS p))
                USING ERRCODE = 'PF003';
        END;
    END IF;
    ts := clock_timestamp();

    RETURN QUERY
    WITH judged AS (
        -- Live entries judged again on the locked rows (a takeover may have committed while we waited; their
        -- secrets were 'ok' for these epochs, and a tenure's secret never changes); the others keep their
        -- unlocked judgment.
        SELECT i.lease, i.ord, l.epoch AS current_epoch,
               coalesce(i.why, pgfence._loss_reason(l, NULL::text, i.epoch, ts, tl)) AS why
          FROM unnest(p_leases, p_epochs, whys) WITH ORDINALITY AS i(lease, epoch, why, ord)
          LEFT JOIN pgfence.leases l ON l.name = i.lease
    ), renewed AS (
        UPDATE pgfence.leases l
           SET expires_at = ts + p_ttl_ms * interval '1 millisecond', renewed_at = ts, ttl_ms = p_ttl_ms
         WHERE l.name IN (SELECT j.lease FROM judged j WHERE j.why IS NULL)
        RETURNING l.name
    )
    -- `judged` reads the rows as they were before this statement's UPDATE (locked by us: nobody else changed
    -- them), so one tenure listed twice is answered the same twice, and one holder may present two tenures of
    -- one lease (an old one it has not noticed is superseded, and the new one). The UPDATE runs whatever the
    -- outer query reads of it (a data-modifying CTE always runs to completion).
    SELECT j.lease,
           CASE WHEN j.why IS NULL THEN 'renewed' ELSE 'refused' END,
           j.why,
           CASE WHEN j.why = 'no_grant' THEN NULL ELSE j.current_epoch END
      FROM judged j
     ORDER BY j.ord;
END;
$function$
