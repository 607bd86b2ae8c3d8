-- pgfence.acquire_many as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.acquire_many(p_leases text[], p_holder text, p_ttl_ms bigint)
 RETURNS TABLE(lease text, outcome text, reason text, epoch bigint, holder text, expires_in_ms bigint, secret text, in_doubt integer, gap_us bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    tl bigint;
    view record;
    refused text[];
    r pgfence.lease_result;
    n text;
BEGIN
    IF p_leases IS NULL OR cardinality(p_leases) = 0 OR cardinality(p_leases) > pgfence._max_acquire_batch()
       OR array_position(p_leases, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: acquire_many takes 1 to % leases, none NULL', pgfence._max_acquire_batch()
            USING ERRCODE = '22023', COLUMN = 'leases';
    END IF;
    IF (SELECT count(DISTINCT x) FROM unnest(p_leases) x) <> cardinality(p_leases) THEN
        RAISE EXCEPTION 'pgfence: acquire_many names a lease twice' USING ERRCODE = '22023', COLUMN = 'leases';
    END IF;
    PERFORM pgfence._check_lease_args(x, 1::bigint) FROM unnest(p_leases) x;
    PERFORM pgfence._check_text('holder'::text, p_holder, pgfence._max_holder_len());
    PERFORM pgfence._check_ttl(p_ttl_ms);
    -- One audited refusal per cluster without a grant (acquire's answer, through the same function).
    refused := ARRAY(SELECT d.c FROM (SELECT pgfence._cluster_of(x) AS c, min(x) AS first
                                        FROM unnest(p_leases) x GROUP BY 1) d
                      WHERE (pgfence._deny_lease_call(d.first, 0::bigint, 'acquire'::text)).outcome IS NOT NULL);
    tl := pgfence._timeline();
    SELECT * INTO view FROM pgfence._server_view();
    FOR n IN SELECT x FROM unnest(p_leases) x ORDER BY x LOOP
        IF pgfence._cluster_of(n) = ANY (refused) THEN
            RETURN QUERY SELECT n, 'refused'::text, 'no_grant'::text, NULL::bigint, NULL::text, NULL::bigint,
                                NULL::text, NULL::integer, NULL::bigint;
            CONTINUE;
        END IF;
        r := pgfence._acquire_checked(n, p_holder, p_ttl_ms, tl, view, p_wait => false);
        IF r.outcome <> 'acquired' THEN
            RETURN QUERY SELECT n, r.outcome, r.reason, r.epoch, r.holder, r.expires_in_ms, NULL::text,
                                NULL::integer, NULL::bigint;
            CONTINUE;
        END IF;
        RETURN QUERY
        SELECT n, r.outcome, r.reason, r.epoch, r.holder, r.expires_in_ms, r.secret,
               -- Nothing can be in doubt without an unsettled attempt (one index probe, the usual answer);
               -- otherwise the ledger's own list is counted.
               CASE WHEN EXISTS (SELECT 1 FROM pgfence.effects e WHERE e.lease = n AND e.settlement IS NULL
                                   AND (e.outcome IS NULL OR e.outcome = 'unknown'))
                    THEN (SELECT count(*)::integer FROM pgfence.in_doubt_effects(n)) ELSE 0 END,
               (SELECT CASE WHEN p.end_reason = 'released'
                            THEN (extract(epoch FROM (t.acquired_at - p.ended_at)) * 1000000)::bigint END
                  FROM pgfence.tenures p, pgfence.tenures t
                 WHERE p.lease = n AND t.lease = n AND t.epoch = r.epoch AND p.epoch < r.epoch
                 ORDER BY p.epoch DESC LIMIT 1);
    END LOOP;
END;
$function$
