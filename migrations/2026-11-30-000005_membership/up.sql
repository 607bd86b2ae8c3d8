-- pgfence migration 5 of 6, membership: replica groups. Each replica that spreads its controllers announces
-- itself as a member of a named group ('<cluster>/<group>') with the names it can lead, a weight, pins and
-- exclusions, and a ttl renewed by heartbeats (database clock). Every member reads the same roster (the live
-- members and which names each leads now) and derives the same balanced assignment from it
-- (src/leader/assign/); membership is no fence — every write is still fenced by its lease's epoch.
-- Called from Rust by src/membership/ (join_group, heartbeat, leave_group, roster; the renewal loop of
-- src/leader/pg/ sends the heartbeat in the statement that renews the member's leases). Roles read
-- pgfence.group_members (filtered by cluster).

-- The limits of membership (see the constants in 000001_schema), also in src/membership/mod.rs (MAX_WEIGHT,
-- MAX_GROUP_NAMES; tests/sql_source.rs compares them).
CREATE FUNCTION pgfence._max_member_weight() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 1000';
CREATE FUNCTION pgfence._max_group_names() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 4096';

-- One row per (group, member name). A row outlives its member (left or expired) so that the next join under
-- the name knows whether the last one ended in order (a flap otherwise); the secret of the current incarnation
-- is kept as its SHA-256 only, and no role but the owner reads this table (roles read pgfence.group_members).
CREATE TABLE pgfence.members (
    grp         text NOT NULL CHECK (pgfence._lease_problem(grp) IS NULL),
    member      text NOT NULL CHECK (pgfence._text_problem(member, pgfence._max_holder_len()) IS NULL),
    -- How many joins this name has seen: a heartbeat presents its incarnation, so an earlier incarnation's
    -- heartbeat is answered 'superseded', not audited as a forgery.
    incarnation bigint NOT NULL DEFAULT 1 CHECK (incarnation >= 1),
    weight      integer NOT NULL CHECK (weight BETWEEN 1 AND pgfence._max_member_weight()),
    names       text[] NOT NULL,
    pinned      text[] NOT NULL,
    excluded    text[] NOT NULL,
    -- The login role that joined: only it may join again under this name while the member is live.
    member_role name NOT NULL DEFAULT session_user,
    secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32),
    ttl_ms      bigint NOT NULL,
    joined_at   timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- Counted for acquisitions (settled) from its first heartbeat at or after settle_at: its first heartbeat for
    -- a member whose last incarnation ended in order, later for a flapping one (see pgfence.join_group).
    settle_at   timestamptz NOT NULL,
    settled_at  timestamptz,
    left_at     timestamptz,
    -- Consecutive incarnations that ended by expiry rather than by leaving (decays after a stable while).
    flaps       integer NOT NULL DEFAULT 0 CHECK (flaps >= 0),
    PRIMARY KEY (grp, member)
);

-- Why the arguments of a join are not acceptable (NULL when they are): the same rules as src/membership/mod.rs.
CREATE FUNCTION pgfence._member_problem(p_group text, p_member text, p_weight integer, p_names text[],
                                        p_pinned text[], p_excluded text[])
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        'invalid group: ' || pgfence._lease_problem(p_group),
        pgfence._arg_problem('member'::text, p_member, pgfence._max_holder_len()),
        CASE WHEN p_weight IS NULL OR p_weight < 1 OR p_weight > pgfence._max_member_weight()
             THEN format('invalid weight: must be between 1 and %s, got %s', pgfence._max_member_weight(),
                         coalesce(p_weight::text, 'NULL')) END,
        CASE WHEN p_names IS NULL OR p_pinned IS NULL OR p_excluded IS NULL
             THEN 'invalid names: the names, pins and exclusions must be arrays (empty for none)' END,
        CASE WHEN cardinality(p_names) = 0 THEN 'invalid names: a member leads at least one name' END,
        CASE WHEN cardinality(p_names) + cardinality(p_pinned) + cardinality(p_excluded) > pgfence._max_group_names()
             THEN format('invalid names: at most %s names, pins and exclusions in all, got %s',
                         pgfence._max_group_names(),
                         cardinality(p_names) + cardinality(p_pinned) + cardinality(p_excluded)) END,
        (SELECT format('invalid %s %s of %s: %s', k.kind, n.ord, cardinality(k.arr),
                       CASE WHEN n.name IS NULL THEN 'must not be NULL'
                            ELSE pgfence._text_problem(n.name, pgfence._max_name_len()) END)
           FROM (VALUES ('name', p_names), ('pin', p_pinned), ('exclusion', p_excluded)) AS k(kind, arr),
                unnest(k.arr) WITH ORDINALITY AS n(name, ord)
          WHERE n.name IS NULL OR pgfence._text_problem(n.name, pgfence._max_name_len()) IS NOT NULL
          LIMIT 1),
        (SELECT format('invalid %s: %s is listed twice', k.kind, pgfence._printable(d.name))
           FROM (VALUES ('names', p_names), ('pins', p_pinned), ('exclusions', p_excluded)) AS k(kind, arr),
                LATERAL (SELECT n.name FROM unnest(k.arr) AS n(name) GROUP BY n.name HAVING count(*) > 1
                          LIMIT 1) d
          LIMIT 1),
        (SELECT format('invalid pin: %s is not one of the member''s names', pgfence._printable(p.name))
           FROM unnest(p_pinned) AS p(name) WHERE NOT p.name = ANY (p_names) LIMIT 1),
        (SELECT format('invalid pin: %s is also excluded', pgfence._printable(p.name))
           FROM unnest(p_pinned) AS p(name) WHERE p.name = ANY (p_excluded) LIMIT 1))
$$;

-- The backends other than this one in a transaction holding a row lock of pgfence.members (only joins,
-- heartbeats and leaves of a member take one, each for one statement): who a bounded wait for a member's row
-- names when it ends.
CREATE FUNCTION pgfence._member_lockers() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
     WHERE k.locktype = 'relation' AND k.relation = 'pgfence.members'::regclass AND k.granted
       AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
$$;

-- The outcome of a membership call: 'joined', 'renewed', 'left' or 'refused' with a reason; the incarnation and
-- secret of a join (the secret once: the database keeps its SHA-256); whether the member is settled; how long
-- until it (or, for 'member_taken', the live member under that name) expires, by the database clock; the
-- roster's digest on a heartbeat (it changes when a member joins, leaves, expires or settles, or when a name of
-- the group changes hands: then the member reads pgfence.roster again).
CREATE TYPE pgfence.member_result AS (
    outcome       text,
    reason        text,
    incarnation   bigint,
    secret        text,
    settled       boolean,
    expires_in_ms bigint,
    roster_digest text
);

-- Refuses a membership call of a role without a grant on the group's cluster: records it (role scope: a group
-- has no tenures) and answers 'refused' / 'no_grant'; NULL when the role may go on.
CREATE FUNCTION pgfence._deny_member_call(p_group text, p_operation text) RETURNS pgfence.member_result
LANGUAGE plpgsql AS $$
BEGIN
    IF pgfence._may_use(pgfence._cluster_of(p_group)) THEN
        RETURN NULL;
    END IF;
    PERFORM pgfence._reject(p_group, 0::bigint, NULL::bigint, NULL::text, 'no_grant'::text, p_operation, NULL::text, NULL::text, p_may_wait => true,
                            p_by_role => true);
    RETURN ROW('refused', 'no_grant', NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
END;
$$;

-- Every member row with what an operator (and the assignment) needs: whether it is live and settled now (database
-- clock), how long until it expires, and which of its names it leads now — a live tenure of the lease
-- '<cluster>/<name>' held under the member's name by the member's role (by expiry: a tenure granted before a
-- promotion counts until its holder's next renewal is refused, which keeps the name with its holder meanwhile).
-- Filtered by cluster like every table a role reads. (Functions a view calls run with the reading role's
-- rights: the two called here are granted to every granted role, 000006_roles.)
CREATE VIEW pgfence.group_members WITH (security_barrier) AS
SELECT m.grp AS "group", m.member, m.incarnation, m.weight, m.names, m.pinned, m.excluded,
       m.left_at IS NULL AND m.expires_at > clock_timestamp() AS live,
       m.settled_at IS NOT NULL AND m.left_at IS NULL AND m.expires_at > clock_timestamp() AS settled,
       ceil(extract(epoch FROM (m.expires_at - clock_timestamp())) * 1000)::bigint AS expires_in_ms,
       ARRAY(SELECT n.name FROM unnest(m.names) AS n(name)
               JOIN pgfence.leases l ON l.name = split_part(m.grp, '/', 1) || '/' || n.name
              WHERE l.holder = m.member AND l.holder_role = m.member_role AND l.state = 'held'
                AND l.expires_at > clock_timestamp()
              ORDER BY n.name) AS leads,
       m.joined_at, m.renewed_at, m.settled_at, m.left_at, m.flaps, m.ttl_ms
  FROM pgfence.members m
 WHERE (SELECT pgfence._reads_all()) OR split_part(m.grp, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]);

-- The live roster of a group, the assignment's one input: every live member with its weight, whether it is
-- settled, its names, pins and exclusions, and the names it leads now; in member order. Needs a grant on the
-- group's cluster (42501 otherwise: a read, not a refusal to audit).
CREATE FUNCTION pgfence.roster(p_group text)
RETURNS TABLE (member text, weight integer, settled boolean, names text[], pinned text[], excluded text[],
               leads text[], expires_in_ms bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pgfence._lease_problem(p_group) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid group: %', pgfence._lease_problem(p_group)
            USING ERRCODE = '22023', COLUMN = 'group';
    END IF;
    IF NOT pgfence._may_use(pgfence._cluster_of(p_group)) THEN
        RAISE EXCEPTION 'pgfence: role % has no grant on cluster %', pgfence._printable(session_user::text),
            pgfence._printable(pgfence._cluster_of(p_group)) USING ERRCODE = '42501';
    END IF;
    RETURN QUERY
    SELECT g.member, g.weight, g.settled, g.names, g.pinned, g.excluded, g.leads, g.expires_in_ms
      FROM pgfence.group_members g
     WHERE g."group" = p_group AND g.live
     ORDER BY g.member;
END;
$$;

-- What the heartbeat's digest covers: every fact of the roster the assignment reads (not the times).
CREATE FUNCTION pgfence._roster_digest(p_group text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT md5(coalesce(string_agg(row(g.member, g.weight, g.settled, g.names, g.pinned, g.excluded, g.leads)::text,
                                   ',' ORDER BY g.member), ''))
      FROM pgfence.group_members g
     WHERE g."group" = p_group AND g.live
$$;

-- A member's flap count once its row m is replaced by a join at ts: one more when the last incarnation expired
-- (did not leave) within the last 10 of its ttls, else 0.
CREATE FUNCTION pgfence._flaps_after(m pgfence.members, ts timestamptz) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN m.left_at IS NULL AND m.expires_at > ts - 10 * m.ttl_ms * interval '1 millisecond'
                THEN m.flaps + 1 ELSE 0 END
$$;

-- How long after joining a member with p_flaps flaps is settled: at once with none, else ttl * 2^(flaps - 1),
-- at most 8 ttls.
CREATE FUNCTION pgfence._settle_delay(p_flaps integer, p_ttl_ms bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_flaps = 0 THEN interval '0'
                ELSE (p_ttl_ms * (1 << (least(p_flaps, 4) - 1))) * interval '1 millisecond' END
$$;

-- Join: the member p_member of group p_group ('<cluster>/<group>') is live for p_ttl_ms (database clock) with
-- the names it can lead. Answers 'joined' with a new incarnation and its secret (once), or 'refused' with
-- 'member_taken' and how long until the live member of that name expires — the same name from two processes
-- never counts twice: the second waits until the first leaves or expires — or 'no_grant'. Bad arguments are
-- 22023, nothing written.
-- A member counts for the assignment at once (nobody takes its share meanwhile) but is settled — may acquire —
-- only at its first heartbeat: it has shown that it renews, and replicas started together have all joined by
-- then, so the first to start does not take every name only to hand most of them over a moment later.
-- Hysteresis: a member whose previous incarnation expired (rather than left) within the last 10 ttls is a flap,
-- settled only at its first heartbeat ttl * 2^(flaps - 1) after the join, at most 8 ttls.
-- Notifies pgfence_members (empty payload: any role may LISTEN).
CREATE FUNCTION pgfence.join_group(p_group text, p_member text, p_weight integer, p_names text[],
                                   p_pinned text[], p_excluded text[], p_ttl_ms bigint)
RETURNS pgfence.member_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    problem text := pgfence._member_problem(p_group, p_member, p_weight, p_names, p_pinned, p_excluded);
    denied pgfence.member_result;
    m pgfence.members;
    ts timestamptz;
    secret text;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_member_call(p_group, 'join_group'::text);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    -- Decided without a lock: a live member stays live until it leaves or expires.
    SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
    IF FOUND AND m.left_at IS NULL AND m.expires_at > clock_timestamp() THEN
        RETURN ROW('refused', 'member_taken', NULL, NULL, NULL,
                   ceil(extract(epoch FROM (m.expires_at - clock_timestamp())) * 1000)::bigint,
                   NULL)::pgfence.member_result;
    END IF;
    secret := encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    -- The row lock of the upsert: only joiners of this name and the member's own heartbeat or leave (each
    -- decided on its secret first) take it, each for one statement; bounded all the same.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        ts := clock_timestamp();
        INSERT INTO pgfence.members AS x (grp, member, weight, names, pinned, excluded, secret_hash, ttl_ms,
                                          joined_at, renewed_at, expires_at, settle_at, settled_at)
        VALUES (p_group, p_member, p_weight, p_names, p_pinned, p_excluded, sha256(convert_to(secret, 'UTF8')),
                p_ttl_ms, ts, ts, ts + p_ttl_ms * interval '1 millisecond', ts, NULL)
        ON CONFLICT (grp, member) DO UPDATE
           SET incarnation = x.incarnation + 1, weight = EXCLUDED.weight, names = EXCLUDED.names,
               pinned = EXCLUDED.pinned, excluded = EXCLUDED.excluded, member_role = session_user,
               secret_hash = EXCLUDED.secret_hash, ttl_ms = EXCLUDED.ttl_ms, joined_at = ts, renewed_at = ts,
               expires_at = EXCLUDED.expires_at, left_at = NULL,
               flaps = pgfence._flaps_after(x, ts),
               settle_at = ts + pgfence._settle_delay(pgfence._flaps_after(x, ts), EXCLUDED.ttl_ms),
               settled_at = NULL
         -- Only a member that left or expired is replaced (one that joined meanwhile is not).
         WHERE x.left_at IS NOT NULL OR x.expires_at <= ts
        RETURNING * INTO m;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: join of member % to group % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_member), pgfence._printable(p_group), wait_ms,
            pgfence._describe_backends(pgfence._member_lockers()) USING ERRCODE = 'PF003',
            HINT = 'Another join of the same member name is in a transaction left open: end it.';
    END;
    IF m.grp IS NULL THEN
        SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
        RETURN ROW('refused', 'member_taken', NULL, NULL, NULL,
                   greatest(ceil(extract(epoch FROM (m.expires_at - clock_timestamp())) * 1000)::bigint, 0),
                   NULL)::pgfence.member_result;
    END IF;
    PERFORM pg_notify('pgfence_members', '');
    RETURN ROW('joined', NULL, m.incarnation, secret, m.settled_at IS NOT NULL, p_ttl_ms,
               NULL)::pgfence.member_result;
END;
$$;

-- Why (p_group, p_member, p_incarnation, p_secret) is not the live member, judged on row m at ts; NULL when it is.
-- 'unknown_member', 'superseded' (a later incarnation joined), 'bad_secret' (this incarnation, another secret:
-- audited), 'left', 'expired'.
CREATE FUNCTION pgfence._member_loss(m pgfence.members, p_incarnation bigint, p_secret text, ts timestamptz)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN m.grp IS NULL OR m.joined_at = '-infinity' THEN 'unknown_member'
        WHEN p_incarnation < m.incarnation THEN 'superseded'
        WHEN p_incarnation > m.incarnation THEN 'unknown_member'
        WHEN NOT pgfence._secret_matches(m.secret_hash, p_secret) THEN 'bad_secret'
        WHEN m.left_at IS NOT NULL THEN 'left'
        WHEN m.expires_at <= ts THEN 'expired'
    END
$$;

-- The checks heartbeat and leave share: arguments (22023), grant, and the unlocked judgment of the member; a
-- refusal to answer (audited when the secret is bad), or NULL when the caller is the live member.
CREATE FUNCTION pgfence._member_call(p_group text, p_member text, p_incarnation bigint, p_secret text,
                                     p_operation text)
RETURNS pgfence.member_result
LANGUAGE plpgsql AS $$
DECLARE
    denied pgfence.member_result;
    m pgfence.members;
    why text;
BEGIN
    IF pgfence._lease_problem(p_group) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid group: %', pgfence._lease_problem(p_group)
            USING ERRCODE = '22023', COLUMN = 'group';
    END IF;
    PERFORM pgfence._check_text('member'::text, p_member, pgfence._max_holder_len());
    IF p_incarnation IS NULL OR p_incarnation < 1 THEN
        RAISE EXCEPTION 'pgfence: invalid incarnation: must be at least 1'
            USING ERRCODE = '22023', COLUMN = 'incarnation';
    END IF;
    PERFORM pgfence._check_secret(p_secret);
    denied := pgfence._deny_member_call(p_group, p_operation);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
    why := pgfence._member_loss(m, p_incarnation, p_secret, clock_timestamp());
    IF why = 'bad_secret' THEN
        PERFORM pgfence._reject(p_group, p_incarnation, NULL::bigint, NULL::text, 'bad_secret'::text, p_operation, NULL::text, p_member,
                                p_may_wait => true, p_by_role => true);
    END IF;
    IF why IS NOT NULL THEN
        RETURN ROW('refused', why, m.incarnation, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    RETURN NULL;
END;
$$;

-- Heartbeat: extends a live member by p_ttl_ms (database clock), presenting its incarnation and secret, and
-- settles it once its settle time has come (notifying pgfence_members). Answers 'renewed' with whether it is
-- settled and the roster's digest, or 'refused' with the reason (_member_loss; 'no_grant'). An expired or left
-- member is not revived: it joins again (and an expiry counts as a flap). Decided on an unlocked read first: only
-- the member itself ever waits for its row.
CREATE FUNCTION pgfence.heartbeat(p_group text, p_member text, p_incarnation bigint, p_secret text,
                                  p_ttl_ms bigint)
RETURNS pgfence.member_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    refused pgfence.member_result;
    m pgfence.members;
    ts timestamptz;
    why text;
    wait_ms bigint := pgfence._lock_wait_ms();
    newly_settled boolean;
BEGIN
    PERFORM pgfence._check_ttl(p_ttl_ms);
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'heartbeat'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: heartbeat of member % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_member), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    ts := clock_timestamp();
    -- Judged again on the locked row (a join of a later incarnation may have committed meanwhile).
    why := pgfence._member_loss(m, p_incarnation, p_secret, ts);
    IF why IS NOT NULL THEN
        RETURN ROW('refused', why, m.incarnation, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    newly_settled := m.settled_at IS NULL AND ts >= m.settle_at;
    UPDATE pgfence.members x
       SET renewed_at = ts, expires_at = ts + p_ttl_ms * interval '1 millisecond', ttl_ms = p_ttl_ms,
           settled_at = CASE WHEN newly_settled THEN ts ELSE x.settled_at END,
           -- A member settled for 10 ttls is stable again: its next expiry is a first flap.
           flaps = CASE WHEN x.settled_at IS NOT NULL AND ts - x.settled_at > 10 * p_ttl_ms * interval '1 millisecond'
                        THEN 0 ELSE x.flaps END
     WHERE x.grp = p_group AND x.member = p_member
    RETURNING * INTO m;
    IF newly_settled THEN
        PERFORM pg_notify('pgfence_members', '');
    END IF;
    RETURN ROW('renewed', NULL, m.incarnation, NULL, m.settled_at IS NOT NULL, p_ttl_ms,
               pgfence._roster_digest(p_group))::pgfence.member_result;
END;
$$;

-- Leave: ends a live member at once (an orderly end: its next join under the name is no flap) and notifies
-- pgfence_members, so the others rebalance at once. Answers 'left', or 'refused' with the reason (leaving twice:
-- 'left').
CREATE FUNCTION pgfence.leave_group(p_group text, p_member text, p_incarnation bigint, p_secret text)
RETURNS pgfence.member_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    refused pgfence.member_result;
    wait_ms bigint := pgfence._lock_wait_ms();
    n bigint;
BEGIN
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'leave_group'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        UPDATE pgfence.members x
           SET left_at = clock_timestamp(), expires_at = least(x.expires_at, clock_timestamp()), flaps = 0
         WHERE x.grp = p_group AND x.member = p_member AND x.incarnation = p_incarnation AND x.left_at IS NULL
           AND x.expires_at > clock_timestamp();
        GET DIAGNOSTICS n = ROW_COUNT;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: leave of member % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_member), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    IF n = 0 THEN
        -- Expired or superseded between the unlocked read and the update.
        RETURN ROW('refused', 'expired', p_incarnation, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    PERFORM pg_notify('pgfence_members', '');
    RETURN ROW('left', NULL, p_incarnation, NULL, false, 0, NULL)::pgfence.member_result;
END;
$$;
