-- pgfence._install_guard as the migrations leave it; defined last in migrations/2026-11-30-000003_guard/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._install_guard(p_shape text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    shape text := coalesce(p_shape, CASE WHEN current_setting('server_version_num')::integer >= 180000
                                         THEN 'sql' ELSE 'plpgsql' END);
    installed text;
BEGIN
    IF shape NOT IN ('plpgsql', 'sql') THEN
        RAISE EXCEPTION 'pgfence: the guard''s shape is ''plpgsql'' or ''sql'', not %', pgfence._printable(shape)
            USING ERRCODE = '22023';
    END IF;
    SELECT l.lanname INTO installed
      FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
     WHERE p.oid = to_regprocedure('pgfence.fence(text, bigint, text, text, text, text)');
    IF installed IS NOT DISTINCT FROM shape THEN
        RETURN shape;
    END IF;
    IF shape = 'plpgsql' THEN
        EXECUTE $shape$
CREATE OR REPLACE FUNCTION pgfence.fence(p_lease text, p_epoch bigint, p_secret text, p_operation text,
                                         p_table text, p_key text)
RETURNS pgfence.write_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
BEGIN
    -- The labels first, by the cheap test (the lease and the epoch need none on the fast path: it admits only
    -- the name and the epoch of a held tenure, which were checked when it was acquired).
    IF pgfence._plain_labels(p_operation, p_table, p_key) IS NOT TRUE THEN
        PERFORM pgfence._check_labels(p_operation, p_table, p_key);
    END IF;
    IF pgfence._admit(p_lease, p_epoch, p_secret, true) THEN
        RETURN ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL,
                   NULL)::pgfence.write_result;
    END IF;
    RETURN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
END;
$fence$
$shape$;
    ELSE
        EXECUTE $shape$
CREATE OR REPLACE FUNCTION pgfence.fence(p_lease text, p_epoch bigint, p_secret text, p_operation text,
                                         p_table text, p_key text)
RETURNS pgfence.write_result
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fence$
-- 1. The guard lock, for the lock key the session remembers for this lease and epoch ("<lock_key> <epoch>
--    <lease>" in its _known_slot, 1 to 9 digits), when the labels pass (else 22023) and the isolation is READ
--    COMMITTED; pgfence.fast_lock says whether it was taken ('' when not).
SELECT pg_catalog.set_config('pgfence.fast_lock',
           CASE WHEN ((pgfence._plain_labels(p_operation, p_table, p_key)
                       OR pgfence._check_labels(p_operation, p_table, p_key))
                      AND pgfence._read_committed()) IS NOT TRUE
                     OR k.k IS NULL
                THEN ''
                WHEN pgfence._try_guard_lock(k.k) THEN k.k::pg_catalog.text
                ELSE '' END,
           true)
  FROM (SELECT CASE WHEN m.known OPERATOR(pg_catalog.=)
                             (m.prefix OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_epoch::pg_catalog.text
                              OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_lease)
                         AND pg_catalog.octet_length(m.prefix) OPERATOR(pg_catalog.>=) 1
                         AND pg_catalog.octet_length(m.prefix) OPERATOR(pg_catalog.<=) 9
                         AND pg_catalog.ltrim(m.prefix, '0123456789') OPERATOR(pg_catalog.=) ''
                    THEN m.prefix::integer END AS k
          FROM (SELECT s.known, pg_catalog.split_part(s.known, ' ', 1) AS prefix
                  FROM (SELECT pg_catalog.current_setting(pgfence._known_slot(p_lease), true) AS known
                        OFFSET 0) s
                OFFSET 0) m
        OFFSET 0) k;
-- 2. On a new snapshot, taken after the lock: the verdict of _admits on the lease's row, its secret's hash and
--    the grants; admitted, or the marker of the held lock and the full guard.
SELECT CASE
           WHEN x.k IS NULL
               THEN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key)
           WHEN a.admitted IS NOT TRUE
               THEN CASE WHEN pg_catalog.set_config(pgfence._guard_held_setting(x.k), 'on', true) IS NOT NULL
                         THEN pgfence._fence_slow(p_lease, p_epoch, p_secret, p_operation, p_table, p_key) END
           WHEN pg_catalog.set_config(pgfence._fence_setting(x.k), p_secret, true) IS NULL
               THEN NULL
           WHEN a.mark IS NOT NULL AND pgfence._mark(p_lease, p_epoch, a.mark) IS NOT TRUE
               THEN NULL
           ELSE ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL,
                    NULL)::pgfence.write_result
       END
  FROM (SELECT CASE WHEN pg_catalog.current_setting('pgfence.fast_lock') OPERATOR(pg_catalog.<>) ''
                    THEN pg_catalog.current_setting('pgfence.fast_lock')::integer END AS k
          OFFSET 0) x
  LEFT JOIN LATERAL (
      SELECT l.lock_key OPERATOR(pg_catalog.=) x.k
             -- _loss_reason(l, NULL, p_epoch, now, timeline) IS NULL:
             AND l.epoch OPERATOR(pg_catalog.=) p_epoch
             AND l.state OPERATOR(pg_catalog.<>) 'released'
             AND l.timeline OPERATOR(pg_catalog.>=) t.tl
             AND l.expires_at OPERATOR(pg_catalog.>) t.now
             -- _secret_verdict(s.epoch, s.hash, p_epoch, p_secret) = 'ok':
             AND s.epoch OPERATOR(pg_catalog.=) p_epoch
             AND pg_catalog.length(p_secret) OPERATOR(pg_catalog.<=) 128
             AND s.hash OPERATOR(pg_catalog.=) pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8'))
             -- _grant_of(_cluster_of(p_lease), false, current_user): the owner's members, or a grant row.
             AND (pg_catalog.pg_has_role(session_user, current_user, 'MEMBER')
                  OR EXISTS (SELECT FROM pgfence.grants g
                              WHERE (g.cluster OPERATOR(pg_catalog.=) pg_catalog.split_part(p_lease, '/', 1)
                                     OR g.cluster IS NULL)
                                AND pg_catalog.pg_has_role(session_user, g.role::pg_catalog.oid, 'MEMBER')))
             AS admitted,
             -- The write mark of this second, unless the session recorded it already (_mark).
             CASE WHEN t.mark OPERATOR(pg_catalog.=) pg_catalog.current_setting('pgfence.write_mark', true)
                  THEN NULL ELSE t.mark END AS mark
        FROM pgfence.leases l
        JOIN pgfence.tenure_secrets s ON s.lease OPERATOR(pg_catalog.=) l.name,
             (SELECT c.now, pgfence._timeline() AS tl,
                     p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ':'
                     OPERATOR(pg_catalog.||) pg_catalog.date_part('epoch', c.now)::bigint::pg_catalog.text
                     OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) p_lease AS mark
                FROM (SELECT pg_catalog.clock_timestamp() AS now OFFSET 0) c OFFSET 0) t
       WHERE l.name OPERATOR(pg_catalog.=) p_lease AND x.k IS NOT NULL) a ON true
$fence$
$shape$;
    END IF;
    RETURN shape;
END;
$function$
