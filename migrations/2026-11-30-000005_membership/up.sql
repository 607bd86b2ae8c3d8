-- pgfence migration 5 of 6, membership: replica groups. Each replica that spreads its controllers announces
-- itself as a member of a named group ('<cluster>/<group>') with the names it can lead (a name set, stored once
-- however many members declare it), a weight, pins and exclusions, and a ttl renewed by heartbeats (database
-- clock). The group's assignment (which member should lead each name) is stored: computed once per change of the
-- group by one member (src/leader/assign/, claimed here with pgfence.claim_rebalance and written with
-- pgfence.assign_group), read by each member as its own names (pgfence.assigned_names), announced on the group's
-- own notification channel. Membership is no fence — every write is still fenced by its lease's epoch.
-- Called from Rust by src/membership/ (join_group, heartbeat, leave_group, claim_rebalance, rebalance_inputs,
-- group_names, group_assignment, assign_group, assigned_names; the renewal loop of src/leader/pg/ sends the
-- heartbeat in the statement that renews the member's leases). Roles read pgfence.group_members (filtered by
-- cluster).
--
-- What each statement costs, and why it is shaped so (docs/leadership.md, "Fleets"): a heartbeat reads its own
-- member row, its group's row and one index probe for an expired member — O(log) whatever the group's size; a
-- member reads only its own assignment (O(names it is assigned)); a change (join, settle, leave, expiry) is
-- assigned once, by one member, writing only the names that move.

-- The limits of membership (see the constants in 000001_schema), also in src/limits.rs (MAX_WEIGHT,
-- MAX_GROUP_NAMES; tests/sql_source.rs compares them).
CREATE FUNCTION pgfence._max_member_weight() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 1000';
CREATE FUNCTION pgfence._max_group_names() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 131072';

-- The name sets members declare, each stored once (content-addressed by the SHA-256 of its names in the order
-- given, one per line: names hold no control characters). Immutable: a member that declares other names refers
-- to another set. Checked once, when first stored.
CREATE TABLE pgfence.name_sets (
    set_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest     bytea NOT NULL UNIQUE CHECK (length(digest) = 32),
    names      text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per group: its notification channel, the version of its members' inputs (bumped by every change that
-- calls for a new assignment), the version and generation of the stored assignment, and who claimed the next
-- rebalance. A change is assigned after a quiet time (least(1 s, ttl / 4) with no further change, at most one
-- ttl after the first pending one) so that replicas started together are assigned once; a leave or an expiry
-- (urgent) at once.
CREATE TABLE pgfence.groups (
    grp              text PRIMARY KEY CHECK (pgfence._storable_lease(grp)),
    channel          text NOT NULL,
    ttl_ms           bigint NOT NULL,
    version          bigint NOT NULL DEFAULT 0,
    assigned_version bigint NOT NULL DEFAULT 0,
    generation       bigint NOT NULL DEFAULT 0,
    changed_at       timestamptz,
    pending_since    timestamptz,
    urgent           boolean NOT NULL DEFAULT false,
    claimed_by       text,
    claimed_until    timestamptz,
    assigned_at      timestamptz
);

-- The stored assignment: the member each name of the group is assigned to (by member name: a member that joins
-- again under its name finds its names where it left them, unless the group was assigned without it meanwhile).
CREATE TABLE pgfence.assignments (
    grp    text NOT NULL REFERENCES pgfence.groups (grp),
    name   text NOT NULL,
    member text NOT NULL,
    PRIMARY KEY (grp, name)
);
CREATE INDEX assignments_member ON pgfence.assignments (grp, member);

-- One row per (group, member name). A row outlives its member (left or expired) so that the next join under
-- the name knows whether the last one ended in order (a flap otherwise); the secret of the current incarnation
-- is kept as its SHA-256 only, and no role but the owner reads this table (roles read pgfence.group_members).
CREATE TABLE pgfence.members (
    grp         text NOT NULL REFERENCES pgfence.groups (grp),
    member      text NOT NULL CHECK (pgfence._storable_text(member, pgfence._max_holder_len())),
    -- How many joins this name has seen: a heartbeat presents its incarnation, so an earlier incarnation's
    -- heartbeat is answered 'superseded', not audited as a forgery.
    incarnation bigint NOT NULL DEFAULT 1 CHECK (incarnation >= 1),
    weight      integer NOT NULL CHECK (weight BETWEEN 1 AND pgfence._max_member_weight()),
    set_id      bigint NOT NULL REFERENCES pgfence.name_sets (set_id),
    pinned      text[] NOT NULL,
    excluded    text[] NOT NULL,
    -- The login role that joined: only it may join again under this name while the member is live.
    member_role name NOT NULL DEFAULT session_user,
    secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32),
    ttl_ms      bigint NOT NULL,
    joined_at   timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- Counted for the assignment (settled) from its first heartbeat at or after settle_at: its first heartbeat
    -- for a member whose last incarnation ended in order, later for a flapping one (see pgfence.join_group).
    settle_at   timestamptz NOT NULL,
    settled_at  timestamptz,
    left_at     timestamptz,
    -- Counted by the stored assignment (written by pgfence.assign_group): its expiry calls for a new one.
    counted     boolean NOT NULL DEFAULT false,
    -- Consecutive incarnations that ended by expiry rather than by leaving (decays after a stable while).
    flaps       integer NOT NULL DEFAULT 0 CHECK (flaps >= 0),
    PRIMARY KEY (grp, member)
);
-- The one probe every heartbeat makes: has a counted member of the group expired?
CREATE INDEX members_counted_expiry ON pgfence.members (grp, expires_at) WHERE counted;

-- The name set stored for exactly p_names (in that order), or NULL.
CREATE FUNCTION pgfence._known_name_set(p_names text[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT s.set_id FROM pgfence.name_sets s
     WHERE s.digest = sha256(convert_to(array_to_string(p_names, E'\n', ''), 'UTF8')) AND s.names = p_names
$$;

-- Why the arguments of a join are not acceptable (NULL when they are): the same rules as src/membership/mod.rs.
-- The names of a set already stored (p_known) were checked when it was stored: only their number is.
CREATE FUNCTION pgfence._member_problem(p_group text, p_member text, p_weight integer, p_names text[],
                                        p_pinned text[], p_excluded text[], p_known boolean)
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
           FROM (VALUES ('name', CASE WHEN p_known THEN '{}'::text[] ELSE p_names END), ('pin', p_pinned),
                        ('exclusion', p_excluded)) AS k(kind, arr),
                unnest(k.arr) WITH ORDINALITY AS n(name, ord)
          WHERE n.name IS NULL OR pgfence._text_problem(n.name, pgfence._max_name_len()) IS NOT NULL
          LIMIT 1),
        (SELECT format('invalid %s: %s is listed twice', k.kind, pgfence._printable(d.name))
           FROM (VALUES ('names', CASE WHEN p_known THEN '{}'::text[] ELSE p_names END), ('pins', p_pinned),
                        ('exclusions', p_excluded)) AS k(kind, arr),
                LATERAL (SELECT n.name FROM unnest(k.arr) AS n(name) GROUP BY n.name HAVING count(*) > 1
                          LIMIT 1) d
          LIMIT 1),
        (SELECT format('invalid pin: %s is not one of the member''s names', pgfence._printable(p.name))
           FROM unnest(p_pinned) AS p(name) WHERE NOT p.name = ANY (p_names) LIMIT 1),
        (SELECT format('invalid pin: %s is also excluded', pgfence._printable(p.name))
           FROM unnest(p_pinned) AS p(name) WHERE p.name = ANY (p_excluded) LIMIT 1))
$$;

-- The name set of p_names (checked by the caller), stored if new.
CREATE FUNCTION pgfence._name_set(p_names text[]) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    id bigint := pgfence._known_name_set(p_names);
BEGIN
    IF id IS NULL THEN
        INSERT INTO pgfence.name_sets AS s (digest, names)
        VALUES (sha256(convert_to(array_to_string(p_names, E'\n', ''), 'UTF8')), p_names)
        ON CONFLICT (digest) DO NOTHING
        RETURNING s.set_id INTO id;
        -- Stored by a concurrent join meanwhile.
        id := coalesce(id, pgfence._known_name_set(p_names));
    END IF;
    RETURN id;
END;
$$;

-- The notification channel of group p_group: members LISTEN to their own group only (any role may LISTEN: the
-- payloads say 'changed <milliseconds until the rebalance may be claimed>' or 'assigned <generation>', nothing
-- else).
CREATE FUNCTION pgfence._group_channel(p_group text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgfence_group_' || left(md5(p_group), 24)
$$;

-- The backends other than this one in a transaction holding a row lock of pgfence.members or pgfence.groups
-- (joins, heartbeats and leaves of a member, claims and assignments of a group: each for one statement): who a
-- bounded wait for such a row names when it ends.
CREATE FUNCTION pgfence._member_lockers() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
     WHERE k.locktype = 'relation' AND k.relation IN ('pgfence.members'::regclass, 'pgfence.groups'::regclass)
       AND k.granted AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
$$;

-- When the group g is due for a new assignment (database clock): now when a counted member expired or left, or a
-- leave asked for it; after the quiet time for any other change; NULL when the stored assignment is current.
CREATE FUNCTION pgfence._rebalance_due(g pgfence.groups) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN g.urgent OR EXISTS (SELECT 1 FROM pgfence.members m
                                  WHERE m.grp = g.grp AND m.counted AND m.expires_at <= clock_timestamp())
             THEN clock_timestamp()
        WHEN g.version > g.assigned_version
             THEN least(g.changed_at + least(1000, g.ttl_ms / 4) * interval '1 millisecond',
                        g.pending_since + g.ttl_ms * interval '1 millisecond')
    END
$$;

-- Milliseconds until the group g may be rebalanced by someone (0: now), or NULL when nothing is pending: the due
-- time, or the end of another member's claim.
CREATE FUNCTION pgfence._rebalance_in_ms(g pgfence.groups) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest(0, ceil(extract(epoch FROM (greatest(d.due, CASE WHEN g.claimed_until > clock_timestamp()
                                                                      THEN g.claimed_until END)
                                                - clock_timestamp())) * 1000))::bigint
      FROM (SELECT pgfence._rebalance_due(g) AS due) d
     WHERE d.due IS NOT NULL
$$;

-- The group p_group's members' inputs changed (a settle, a leave, another spec): a new assignment is due (at
-- once when p_urgent, after the quiet time otherwise). Tells the group's members, with how long until the
-- rebalance may be claimed: each member asks for the claim then, not at every change (during a rolling start of
-- 100 replicas, every join woke every member to ask at once: 3,664 claim requests before the first assignment,
-- where one per member at the due time does). The caller bounds the wait for the group's row.
CREATE FUNCTION pgfence._group_changed(p_group text, p_urgent boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    gr pgfence.groups;
BEGIN
    UPDATE pgfence.groups g
       SET version = g.version + 1, changed_at = clock_timestamp(),
           pending_since = coalesce(g.pending_since, clock_timestamp()), urgent = g.urgent OR p_urgent
     WHERE g.grp = p_group
    RETURNING g.* INTO gr;
    PERFORM pg_notify(gr.channel, 'changed ' || coalesce(pgfence._rebalance_in_ms(gr), 0));
END;
$$;

-- The outcome of a membership call: 'joined', 'renewed', 'left' or 'refused' with a reason; the incarnation and
-- secret of a join (the secret once: the database keeps its SHA-256); whether the member is settled; how long
-- until it (or, for 'member_taken', the live member under that name) expires, by the database clock; the
-- generation of the group's stored assignment (a member whose own read is older reads pgfence.assigned_names
-- again); how long until the group may be rebalanced (NULL: nothing pending); the group's notification channel
-- (on a join).
CREATE TYPE pgfence.member_result AS (
    outcome         text,
    reason          text,
    incarnation     bigint,
    secret          text,
    settled         boolean,
    expires_in_ms   bigint,
    generation      bigint,
    rebalance_in_ms bigint,
    channel         text
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
    RETURN ROW('refused', 'no_grant', NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
END;
$$;

-- Refuses a read of group p_group without a grant on its cluster (42501: a read, not a refusal to audit), and a
-- malformed group name (22023).
CREATE FUNCTION pgfence._check_group_read(p_group text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pgfence._lease_problem(p_group) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid group: %', pgfence._lease_problem(p_group)
            USING ERRCODE = '22023', COLUMN = 'group';
    END IF;
    IF NOT pgfence._may_use(pgfence._cluster_of(p_group)) THEN
        RAISE EXCEPTION 'pgfence: role % has no grant on cluster %', pgfence._printable(session_user::text),
            pgfence._printable(pgfence._cluster_of(p_group)) USING ERRCODE = '42501';
    END IF;
END;
$$;

-- Every member row with what an operator needs: whether it is live and settled now (database clock), whether the
-- stored assignment counts it, how long until it expires, its names (the set it declared), the names the stored
-- assignment gives it, and which of those it leads now — a live tenure of the lease '<cluster>/<name>' held
-- under the member's name by the member's role (by expiry: a tenure granted before a promotion counts until its
-- holder's next renewal is refused). Costs O(names assigned) per row. Filtered by cluster like every table a
-- role reads. (Functions a view calls run with the reading role's rights: the two called here are granted to
-- every granted role, 000006_roles.)
CREATE VIEW pgfence.group_members WITH (security_barrier) AS
SELECT m.grp AS "group", m.member, m.incarnation, m.weight, s.names, cardinality(s.names) AS name_count,
       m.pinned, m.excluded,
       m.left_at IS NULL AND m.expires_at > clock_timestamp() AS live,
       m.settled_at IS NOT NULL AND m.left_at IS NULL AND m.expires_at > clock_timestamp() AS settled,
       m.counted,
       ceil(extract(epoch FROM (m.expires_at - clock_timestamp())) * 1000)::bigint AS expires_in_ms,
       ARRAY(SELECT a.name FROM pgfence.assignments a WHERE a.grp = m.grp AND a.member = m.member
              ORDER BY a.name) AS assigned,
       ARRAY(SELECT a.name FROM pgfence.assignments a
               JOIN pgfence.leases l ON l.name = split_part(m.grp, '/', 1) || '/' || a.name
              WHERE a.grp = m.grp AND a.member = m.member
                AND l.holder = m.member AND l.holder_role = m.member_role AND l.state = 'held'
                AND l.expires_at > clock_timestamp()
              ORDER BY a.name) AS leads,
       m.joined_at, m.renewed_at, m.settled_at, m.left_at, m.flaps, m.ttl_ms
  FROM pgfence.members m JOIN pgfence.name_sets s ON s.set_id = m.set_id
 WHERE (SELECT pgfence._reads_all()) OR split_part(m.grp, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]);

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
-- the names it can lead. Answers 'joined' with a new incarnation and its secret (once), the group's generation,
-- channel and pending rebalance, or 'refused' with 'member_taken' and how long until the live member of that
-- name expires — the same name from two processes never counts twice: the second waits until the first leaves
-- or expires — or 'no_grant'. Bad arguments are 22023, nothing written.
-- A member counts for the assignment only once settled — at its first heartbeat: it has shown that it renews,
-- and replicas started together have all joined by then —, or when the stored assignment still gives it names
-- (it joins again after losing its membership: it finds its names where it left them).
-- Hysteresis: a member whose previous incarnation expired (rather than left) within the last 10 ttls is a flap,
-- settled only at its first heartbeat ttl * 2^(flaps - 1) after the join, at most 8 ttls.
-- The names are stored once per distinct set (pgfence.name_sets): a join declaring a set already stored sends it
-- again but is not checked name by name again.
CREATE FUNCTION pgfence.join_group(p_group text, p_member text, p_weight integer, p_names text[],
                                   p_pinned text[], p_excluded text[], p_ttl_ms bigint)
RETURNS pgfence.member_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    known bigint := CASE WHEN cardinality(p_names) <= pgfence._max_group_names()
                         THEN pgfence._known_name_set(p_names) END;
    problem text := pgfence._member_problem(p_group, p_member, p_weight, p_names, p_pinned, p_excluded,
                                            known IS NOT NULL);
    denied pgfence.member_result;
    m pgfence.members;
    prior pgfence.members;
    g pgfence.groups;
    ts timestamptz;
    secret text;
    set_of bigint;
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
    SELECT * INTO prior FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
    IF FOUND AND prior.left_at IS NULL AND prior.expires_at > clock_timestamp() THEN
        RETURN ROW('refused', 'member_taken', NULL, NULL, NULL,
                   ceil(extract(epoch FROM (prior.expires_at - clock_timestamp())) * 1000)::bigint,
                   NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    set_of := coalesce(known, pgfence._name_set(p_names));
    INSERT INTO pgfence.groups (grp, channel, ttl_ms)
    VALUES (p_group, pgfence._group_channel(p_group), p_ttl_ms)
    ON CONFLICT (grp) DO NOTHING;
    secret := encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    -- The row locks: of the member's row, only joiners of this name and the member's own heartbeat or leave
    -- (each decided on its secret first) take it; of the group's row, joins, settles, leaves, claims and
    -- assignments, each for one statement. Bounded all the same.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        ts := clock_timestamp();
        INSERT INTO pgfence.members AS x (grp, member, weight, set_id, pinned, excluded, secret_hash, ttl_ms,
                                          joined_at, renewed_at, expires_at, settle_at, settled_at)
        VALUES (p_group, p_member, p_weight, set_of, p_pinned, p_excluded, sha256(convert_to(secret, 'UTF8')),
                p_ttl_ms, ts, ts, ts + p_ttl_ms * interval '1 millisecond', ts, NULL)
        ON CONFLICT (grp, member) DO UPDATE
           SET incarnation = x.incarnation + 1, weight = EXCLUDED.weight, set_id = EXCLUDED.set_id,
               pinned = EXCLUDED.pinned, excluded = EXCLUDED.excluded, member_role = session_user,
               secret_hash = EXCLUDED.secret_hash, ttl_ms = EXCLUDED.ttl_ms, joined_at = ts, renewed_at = ts,
               expires_at = EXCLUDED.expires_at, left_at = NULL,
               flaps = pgfence._flaps_after(x, ts),
               settle_at = ts + pgfence._settle_delay(pgfence._flaps_after(x, ts), EXCLUDED.ttl_ms),
               settled_at = NULL
         -- Only a member that left or expired is replaced (one that joined meanwhile is not).
         WHERE x.left_at IS NOT NULL OR x.expires_at <= ts
        RETURNING * INTO m;
        -- A member the stored assignment counts, back with another spec: assigned again after the quiet time.
        IF m.grp IS NOT NULL AND m.counted AND (prior.weight, prior.set_id, prior.pinned, prior.excluded)
                                               IS DISTINCT FROM (m.weight, m.set_id, m.pinned, m.excluded) THEN
            PERFORM pgfence._group_changed(p_group, false);
        END IF;
        UPDATE pgfence.groups x SET ttl_ms = p_ttl_ms WHERE x.grp = p_group AND x.ttl_ms <> p_ttl_ms;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: join of member % to group % waited % ms for a row lock; blocked by %',
            pgfence._printable(p_member), pgfence._printable(p_group), wait_ms,
            pgfence._describe_backends(pgfence._member_lockers()) USING ERRCODE = 'PF003',
            HINT = 'Another membership call of this group is in a transaction left open: end it.';
    END;
    IF m.grp IS NULL THEN
        SELECT * INTO m FROM pgfence.members x WHERE x.grp = p_group AND x.member = p_member;
        RETURN ROW('refused', 'member_taken', NULL, NULL, NULL,
                   greatest(ceil(extract(epoch FROM (m.expires_at - clock_timestamp())) * 1000)::bigint, 0),
                   NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group;
    RETURN ROW('joined', NULL, m.incarnation, secret, m.settled_at IS NOT NULL, p_ttl_ms, g.generation,
               pgfence._rebalance_in_ms(g), g.channel)::pgfence.member_result;
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

-- The checks heartbeat, leave, claim and assign share: arguments (22023), grant, and the unlocked judgment of
-- the member; a refusal to answer (audited when the secret is bad), or NULL when the caller is the live member.
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
        RETURN ROW('refused', why, m.incarnation, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    RETURN NULL;
END;
$$;

-- Heartbeat: extends a live member by p_ttl_ms (database clock), presenting its incarnation and secret, and
-- settles it once its settle time has come (a change of the group: notified on its channel). Answers 'renewed'
-- with whether it is settled, the generation of the group's stored assignment and how long until the group may
-- be rebalanced (NULL: nothing pending), or 'refused' with the reason (_member_loss; 'no_grant'). An expired or
-- left member is not revived: it joins again (and an expiry counts as a flap). Decided on an unlocked read
-- first: only the member itself ever waits for its row. Costs O(log) whatever the group's size: its own row,
-- its group's row, and one probe of an index for an expired counted member.
CREATE FUNCTION pgfence.heartbeat(p_group text, p_member text, p_incarnation bigint, p_secret text,
                                  p_ttl_ms bigint)
RETURNS pgfence.member_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    refused pgfence.member_result;
    m pgfence.members;
    g pgfence.groups;
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
        ts := clock_timestamp();
        -- Judged again on the locked row (a join of a later incarnation may have committed meanwhile).
        why := pgfence._member_loss(m, p_incarnation, p_secret, ts);
        IF why IS NOT NULL THEN
            RETURN ROW('refused', why, m.incarnation, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
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
            PERFORM pgfence._group_changed(p_group, false);
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: heartbeat of member % waited % ms for a row lock; blocked by %',
            pgfence._printable(p_member), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group;
    RETURN ROW('renewed', NULL, m.incarnation, NULL, m.settled_at IS NOT NULL, p_ttl_ms, g.generation,
               pgfence._rebalance_in_ms(g), NULL)::pgfence.member_result;
END;
$$;

-- Leave: ends a live member at once (an orderly end: its next join under the name is no flap); when it counted
-- for the assignment, the group is due for a new one at once (notified on its channel), so the others take its
-- names while it drains. Answers 'left', or 'refused' with the reason (leaving twice: 'left').
CREATE FUNCTION pgfence.leave_group(p_group text, p_member text, p_incarnation bigint, p_secret text)
RETURNS pgfence.member_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    refused pgfence.member_result;
    wait_ms bigint := pgfence._lock_wait_ms();
    m pgfence.members;
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
           AND x.expires_at > clock_timestamp()
        RETURNING * INTO m;
        IF m.counted OR m.settled_at IS NOT NULL THEN
            PERFORM pgfence._group_changed(p_group, true);
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: leave of member % waited % ms for a row lock; blocked by %',
            pgfence._printable(p_member), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    IF m.grp IS NULL THEN
        -- Expired or superseded between the unlocked read and the update.
        RETURN ROW('refused', 'expired', p_incarnation, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.member_result;
    END IF;
    RETURN ROW('left', NULL, p_incarnation, NULL, false, 0, NULL, NULL, NULL)::pgfence.member_result;
END;
$$;

-- The answer of a rebalance call: 'claim' (this member computes the next assignment: from the stored one of
-- this generation, for the inputs of this version, within in_ms), 'not_due' (in_ms until it is due, NULL when
-- nothing is pending), 'claimed' (another member claimed it: in_ms until that claim lapses), 'assigned' (the new
-- generation is stored), 'stale' (the stored assignment changed since the claim, a member it names is no longer
-- live ('member_gone'), or a live member the stored assignment counts is left out ('member_back'): claim again),
-- or 'refused' with a membership loss or 'no_grant'.
CREATE TYPE pgfence.rebalance_result AS (
    outcome    text,
    reason     text,
    version    bigint,
    generation bigint,
    in_ms      bigint
);

-- How long a claim to rebalance the group g lasts: long enough for the largest group's computation, short
-- enough that a claimant that died is replaced soon.
CREATE FUNCTION pgfence._claim_ms(g pgfence.groups) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(2000, least(g.ttl_ms / 2, 10000))
$$;

-- Why p_member may not claim the rebalance of group g now: 'not_due' (nothing pending, or not yet) or 'claimed'
-- (another member's claim is live), with how long to wait; NULL when it may.
CREATE FUNCTION pgfence._claim_wait(g pgfence.groups, p_member text) RETURNS pgfence.rebalance_result
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN d.due IS NULL OR d.due > clock_timestamp()
            THEN ROW('not_due', NULL, g.version, g.generation, pgfence._rebalance_in_ms(g))::pgfence.rebalance_result
        WHEN g.claimed_until > clock_timestamp() AND g.claimed_by IS DISTINCT FROM p_member
            THEN ROW('claimed', NULL, g.version, g.generation, pgfence._rebalance_in_ms(g))::pgfence.rebalance_result
    END
      FROM (SELECT pgfence._rebalance_due(g) AS due) d
$$;

-- Claim: the live member p_member asks to compute the group's next assignment. Answers 'claim' when it is due and
-- nobody else holds a live claim, else 'not_due' or 'claimed' with how long to wait. Every member of a group may
-- ask (they learn when one is due from their heartbeats and from 'changed' on the group's channel); one gets it.
CREATE FUNCTION pgfence.claim_rebalance(p_group text, p_member text, p_incarnation bigint, p_secret text)
RETURNS pgfence.rebalance_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    refused pgfence.member_result;
    g pgfence.groups;
    waiting pgfence.rebalance_result;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'claim_rebalance'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN ROW(refused.outcome, refused.reason, NULL, NULL, NULL)::pgfence.rebalance_result;
    END IF;
    -- Unlocked first: most calls find it not due or claimed, and take no lock.
    SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group;
    waiting := pgfence._claim_wait(g, p_member);
    IF waiting.outcome IS NOT NULL THEN
        RETURN waiting;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: claim of group % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_group), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    -- Judged again on the locked row: another member may have claimed or assigned meanwhile.
    waiting := pgfence._claim_wait(g, p_member);
    IF waiting.outcome IS NOT NULL THEN
        RETURN waiting;
    END IF;
    UPDATE pgfence.groups x
       SET claimed_by = p_member, claimed_until = clock_timestamp() + pgfence._claim_ms(g) * interval '1 millisecond'
     WHERE x.grp = p_group
    RETURNING * INTO g;
    RETURN ROW('claim', NULL, g.version, g.generation, pgfence._claim_ms(g))::pgfence.rebalance_result;
END;
$$;

-- The assignment's inputs: every live member of the group that counts — settled, or counted by the stored
-- assignment (a member that joined again keeps its names) —, with its weight, name set, pins and exclusions.
-- Needs a grant on the group's cluster (42501 otherwise: a read, not a refusal to audit).
CREATE FUNCTION pgfence.rebalance_inputs(p_group text)
RETURNS TABLE (member text, weight integer, set_id bigint, pinned text[], excluded text[], settled boolean,
               counted boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    RETURN QUERY
    SELECT m.member, m.weight, m.set_id, m.pinned, m.excluded, m.settled_at IS NOT NULL, m.counted
      FROM pgfence.members m
     WHERE m.grp = p_group AND m.left_at IS NULL AND m.expires_at > clock_timestamp()
       AND (m.settled_at IS NOT NULL OR m.counted)
     ORDER BY m.member;
END;
$$;

-- The names of set p_set_id, declared by a member of group p_group (a set is read through a group its reader
-- may use). Immutable: a reader keeps what it read. NULL when no member of the group declares it.
CREATE FUNCTION pgfence.group_names(p_group text, p_set_id bigint) RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    RETURN (SELECT s.names FROM pgfence.name_sets s
             WHERE s.set_id = p_set_id
               AND EXISTS (SELECT 1 FROM pgfence.members m WHERE m.grp = p_group AND m.set_id = p_set_id));
END;
$$;

-- The stored assignment of the group: each name and the member it is assigned to, in name order, with the
-- generation of the assignment (on every row; one row with NULL name and member when no name is assigned, none
-- for a group nobody joined). Costs O(names).
CREATE FUNCTION pgfence.group_assignment(p_group text)
RETURNS TABLE (generation bigint, name text, member text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    RETURN QUERY
    SELECT g.generation, a.name, a.member
      FROM pgfence.groups g LEFT JOIN pgfence.assignments a ON a.grp = g.grp
     WHERE g.grp = p_group
     ORDER BY a.name;
END;
$$;

-- A member's own part of the stored assignment: the generation and the names it is assigned, in name order
-- (an empty array for none; generation 0 before the group's first assignment), and how many members the stored
-- assignment counts. Costs O(its names + members).
CREATE FUNCTION pgfence.assigned_names(p_group text, p_member text, OUT generation bigint, OUT names text[],
                                       OUT members integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgfence._check_group_read(p_group);
    PERFORM pgfence._check_text('member'::text, p_member, pgfence._max_holder_len());
    -- One snapshot for all three: the generation is that of the names read.
    SELECT coalesce(g.generation, 0),
           ARRAY(SELECT a.name FROM pgfence.assignments a WHERE a.grp = p_group AND a.member = p_member
                  ORDER BY a.name),
           (SELECT count(*) FROM pgfence.members m WHERE m.grp = p_group AND m.counted)
      INTO generation, names, members
      FROM (SELECT 1) one LEFT JOIN pgfence.groups g ON g.grp = p_group;
END;
$$;

-- Assign: the member holding the claim stores the next assignment, computed from the stored one of generation
-- p_generation for the inputs of version p_version: the names that move (p_names to p_owners), the names no
-- member may lead any more (p_removed), and the members it counted (p_counted: their expiry calls for the next
-- one). Answers 'assigned' with the new generation and notifies the group's members ('assigned <generation>'),
-- or 'stale' when the stored assignment is no longer of generation p_generation or a member it names is no
-- longer live (claim again), or refuses a caller that is not the live member or holds no live claim. A change of
-- the inputs after p_version keeps the group due: it is assigned again after its quiet time. Costs O(names that
-- move + members).
CREATE FUNCTION pgfence.assign_group(p_group text, p_member text, p_incarnation bigint, p_secret text,
                                     p_version bigint, p_generation bigint, p_names text[], p_owners text[],
                                     p_removed text[], p_counted text[])
RETURNS pgfence.rebalance_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    refused pgfence.member_result;
    g pgfence.groups;
    gone text;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    IF p_version IS NULL OR p_version < 0 THEN
        RAISE EXCEPTION 'pgfence: invalid version: must be at least 0' USING ERRCODE = '22023', COLUMN = 'version';
    END IF;
    IF p_generation IS NULL OR p_generation < 0 THEN
        RAISE EXCEPTION 'pgfence: invalid generation: must be at least 0'
            USING ERRCODE = '22023', COLUMN = 'generation';
    END IF;
    IF p_names IS NULL OR p_owners IS NULL OR p_removed IS NULL OR p_counted IS NULL
       OR cardinality(p_names) <> cardinality(p_owners)
       OR array_position(p_names, NULL) IS NOT NULL OR array_position(p_owners, NULL) IS NOT NULL
       OR array_position(p_removed, NULL) IS NOT NULL OR array_position(p_counted, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid assignment: names and owners are arrays of one length, and no array holds NULL'
            USING ERRCODE = '22023', COLUMN = 'assignment';
    END IF;
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'assign_group'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN ROW(refused.outcome, refused.reason, NULL, NULL, NULL)::pgfence.rebalance_result;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: assignment of group % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_group), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    IF g.claimed_by IS DISTINCT FROM p_member OR g.claimed_until <= clock_timestamp() THEN
        RETURN ROW('refused', 'not_claimed', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    IF g.generation <> p_generation OR p_version > g.version THEN
        RETURN ROW('stale', 'generation', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    -- Every member named must count now (live; settled, or counted before).
    SELECT o.member INTO gone
      FROM (SELECT DISTINCT u.member FROM unnest(p_owners || p_counted) AS u(member)) o
     WHERE NOT EXISTS (SELECT 1 FROM pgfence.members m
                        WHERE m.grp = p_group AND m.member = o.member AND m.left_at IS NULL
                          AND m.expires_at > clock_timestamp() AND (m.settled_at IS NOT NULL OR m.counted))
     LIMIT 1;
    IF gone IS NOT NULL THEN
        RETURN ROW('stale', 'member_gone', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    -- And every member counted by the stored assignment that is live now must be counted by this one: a member
    -- the claimant read as expired may have joined again since (a counted member's rejoin changes no version),
    -- and a computation without it would move its names away only for the next one to move them back.
    SELECT m.member INTO gone
      FROM pgfence.members m
     WHERE m.grp = p_group AND m.counted AND m.left_at IS NULL AND m.expires_at > clock_timestamp()
       AND m.member <> ALL (p_counted)
     LIMIT 1;
    IF gone IS NOT NULL THEN
        RETURN ROW('stale', 'member_back', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    DELETE FROM pgfence.assignments a WHERE a.grp = p_group AND a.name = ANY (p_removed);
    INSERT INTO pgfence.assignments AS a (grp, name, member)
    SELECT p_group, w.name, w.member FROM unnest(p_names, p_owners) AS w(name, member)
    ON CONFLICT (grp, name) DO UPDATE SET member = EXCLUDED.member WHERE a.member <> EXCLUDED.member;
    UPDATE pgfence.members m SET counted = (m.member = ANY (p_counted))
     WHERE m.grp = p_group AND m.counted <> (m.member = ANY (p_counted));
    UPDATE pgfence.groups x
       SET generation = x.generation + 1, assigned_version = p_version, assigned_at = clock_timestamp(),
           pending_since = CASE WHEN x.version > p_version THEN x.pending_since END,
           urgent = x.urgent AND x.version > p_version, claimed_by = NULL, claimed_until = NULL
     WHERE x.grp = p_group
    RETURNING * INTO g;
    PERFORM pg_notify(g.channel, 'assigned ' || g.generation);
    RETURN ROW('assigned', NULL, g.version, g.generation, NULL)::pgfence.rebalance_result;
END;
$$;
