-- pgfence core schema: leases, tenures, tasks, task events and the audit of rejected stale writes.
--
-- Every object lives in the schema `pgfence`. Epochs are never reset or deleted: a lease row, once created,
-- stays forever (a trigger refuses DELETE, TRUNCATE and any lowering of an epoch), and every acquisition issues
-- `epoch + 1` (more after a failover: see pgfence.acquire).
--
-- Clocks: every expiry decision uses `clock_timestamp()` (the database's clock at the moment of the
-- statement), never `now()` (the transaction start) and never a client's clock.
--
-- Locking protocol (why the guard is linearizable against takeovers, and why a takeover is never starved):
--   * every lease has a *guard lock*: the transaction-level advisory lock (1885824613, lock_key) in the
--     two-integer key space (1885824613 = 0x70676665, "pgfe"; lock_key is unique per lease and never reused).
--     Applications must not use advisory locks with that first key;
--   * every guarded write takes the guard lock SHARED, then reads the lease row in a new statement — a new
--     snapshot under READ COMMITTED — and compares epochs; the lock is kept until its transaction ends;
--   * every change of who may write (acquire, release, force_release, and any UPDATE of a lease row's epoch,
--     holder, state or timeline, also a direct one by a role with table privileges: a trigger) takes the guard
--     lock EXCLUSIVE, after the lease row lock.
--   So a takeover waits for guarded writes already past their check, and a guarded write that arrives while a
--   takeover waits or runs waits for it, then reads the row in a snapshot taken after the takeover committed.
--   PostgreSQL's lock manager queues fairly: a shared request never overtakes a waiting exclusive one, so a busy
--   leader's new writes cannot hold a takeover off (row locks such as FOR KEY SHARE give no such guarantee).
--   Advisory locks create no MultiXacts, unlike shared row locks taken by concurrent writers.
--   Renewal only moves `expires_at`: it takes the row lock but never the guard lock, so renewals and guarded
--   writes never wait for each other.
-- Bounded waits: a takeover waits at most `instance.takeover_grace_ms` (default 2 s) for guarded transactions
-- of the ending tenure, then terminates the backends still holding the guard lock (the schema owner needs
-- pg_signal_backend or superuser for that; without it the takeover fails with PF003 naming them). Every other
-- lock wait of a pgfence function is bounded by the grace + 5 s and fails with PF003 naming who blocks.
--
-- Failover: every tenure records the WAL timeline it was granted on. After a promotion (a new timeline) every
-- tenure granted before it is refused ('failover') for writes and renewals, and acquisitions may take it over.
--
-- Trust: see "Trust boundary" below. In short, the schema owner (and superusers) are trusted; every other role
-- uses a cluster only through a grant in pgfence.grants, checked against the session's login role by every entry
-- function before anything else; and a write, renewal or release presents the tenure's secret, of which the
-- database keeps only a SHA-256 that no role but the owner can read.
--
-- SQLSTATEs of pgfence's own errors: PF001 raw write refused (enforcement), PF002 append-only table, PF003 lock
-- wait timed out (the message names the blocking backends), PF004 guarded write outside READ COMMITTED, PF005
-- lease row change refused (delete, truncate, epoch lowered), PF006 a one-statement guarded write that is not
-- gated on its guard, 22023 invalid argument. Refusals that must be
-- audited (no grant on the cluster, a wrong tenure secret, a stale epoch) are results, not errors — an error
-- would roll its own audit row back: outcome 'denied' (reason 'no_grant' or 'bad_secret') or 'stale'.

DO $$
BEGIN
    -- Text checks use Unicode normalization (IS NFC NORMALIZED), which needs a UTF8 database.
    IF pg_catalog.current_setting('server_encoding') <> 'UTF8' THEN
        RAISE EXCEPTION 'pgfence needs a UTF8 database; this one is %', pg_catalog.current_setting('server_encoding')
            USING ERRCODE = '22023';
    END IF;
END;
$$;

CREATE SCHEMA IF NOT EXISTS pgfence;

-- ---------------------------------------------------------------------------------------------------------
-- What pgfence stores: the one definition, shared by the table constraints and the functions' argument checks,
-- and mirrored exactly by the Rust API (src/lease.rs, check_text). A text is 1 to max characters, has no
-- control character (Unicode category Cc: U+0001-U+001F, U+007F-U+009F; PostgreSQL text cannot hold U+0000) and
-- is in Unicode Normalization Form C (refused otherwise, never normalized silently: two spellings of one name
-- would be two leases).

-- These three are plain IMMUTABLE SQL expressions so that PostgreSQL inlines them into the statement that calls
-- them (a SET clause, a sublink or a call of a STABLE function such as format() would prevent that, and a
-- non-inlined SQL function is planned again in every transaction that calls it). Every operator and function in them is qualified with pg_catalog: CHECK constraints
-- evaluate them with the writing role's search_path, which must not be able to shadow one.

-- Why p_value is not a storable text of at most p_max characters (NULL when it is).
CREATE FUNCTION pgfence._text_problem(p_value text, p_max integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_value IS NULL OR pg_catalog.length(p_value) OPERATOR(pg_catalog.=) 0 THEN 'must not be empty'
        WHEN pg_catalog.length(p_value) OPERATOR(pg_catalog.>) p_max
            THEN 'must be at most ' OPERATOR(pg_catalog.||) p_max::text OPERATOR(pg_catalog.||) ' characters, got '
                 OPERATOR(pg_catalog.||) pg_catalog.length(p_value)::text
        WHEN p_value OPERATOR(pg_catalog.~) '[\u0001-\u001f\u007f-\u009f]'
            THEN 'must not contain control characters (NUL, newline, …)'
        WHEN NOT p_value IS NFC NORMALIZED THEN 'must be in Unicode Normalization Form C (NFC)'
    END
$$;

-- Why p_cluster is not a cluster name (1 to 63 characters, no '/'), NULL when it is.
CREATE FUNCTION pgfence._cluster_problem(p_cluster text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(pgfence._text_problem(p_cluster, 63),
                               CASE WHEN pg_catalog.strpos(p_cluster, '/') OPERATOR(pg_catalog.>) 0
                                    THEN 'must not contain ''/''' END)
$$;

-- Why p_lease is not a cluster-qualified lease name ('<cluster>/<name>', the name 1 to 200 characters and split
-- at the first '/'), NULL when it is.
CREATE FUNCTION pgfence._lease_problem(p_lease text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_lease IS NULL OR pg_catalog.strpos(p_lease, '/') OPERATOR(pg_catalog.=) 0
            THEN 'must be cluster-qualified: ''<cluster>/<name>'''
        ELSE coalesce(
            'cluster ' OPERATOR(pg_catalog.||) pgfence._cluster_problem(pg_catalog.split_part(p_lease, '/', 1)),
            'lease name ' OPERATOR(pg_catalog.||)
                pgfence._text_problem(pg_catalog.substr(p_lease, pg_catalog.strpos(p_lease, '/') OPERATOR(pg_catalog.+) 1), 200))
    END
$$;

-- The cluster of a qualified lease name.
CREATE FUNCTION pgfence._cluster_of(p_lease text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT split_part(p_lease, '/', 1)
$$;

-- One row: the identity of this pgfence installation, created once at migrate time, and its settings.
CREATE TABLE pgfence.instance (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    instance_id uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- How long a takeover waits for guarded transactions of the ending tenure before it terminates them.
    takeover_grace_ms bigint NOT NULL DEFAULT 2000 CHECK (takeover_grace_ms BETWEEN 0 AND 600000)
);
INSERT INTO pgfence.instance DEFAULT VALUES;

-- One row per cluster-qualified lease name ('<cluster>/<name>').
CREATE TABLE pgfence.leases (
    name        text PRIMARY KEY CHECK (pgfence._lease_problem(name) IS NULL),
    -- The second key of the lease's guard lock (see the locking protocol above).
    lock_key    integer GENERATED ALWAYS AS IDENTITY UNIQUE,
    holder      text CHECK (holder IS NULL OR pgfence._text_problem(holder, 256) IS NULL),
    epoch       bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    state       text NOT NULL DEFAULT 'released' CHECK (state IN ('held', 'released')),
    ttl_ms      bigint,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz,
    renewed_at  timestamptz,
    -- The WAL timeline the current tenure was granted on: a tenure from an earlier timeline is over.
    timeline    bigint,
    -- The login role that acquired the current tenure: only it may start a new tenure of the same holder name
    -- while this one is live (a restart); any other role waits for the tenure to end.
    holder_role name,
    -- how many times the holder identity changed (client-go's leaderTransitions)
    transitions bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per issued epoch: who held it and how the tenure ended.
CREATE TABLE pgfence.tenures (
    lease       text NOT NULL REFERENCES pgfence.leases (name),
    epoch       bigint NOT NULL CHECK (epoch >= 1),
    holder      text NOT NULL CHECK (pgfence._text_problem(holder, 256) IS NULL),
    acquired_at timestamptz NOT NULL,
    ended_at    timestamptz,
    end_reason  text CHECK (end_reason IN ('released', 'expired', 'forced', 'reacquired', 'failover')),
    timeline    bigint,
    -- The transaction that granted the tenure. The row is updated when the tenure ends, so its xmin names the
    -- ending transaction; this column keeps the acquisition's (its commit time: pg_xact_commit_timestamp).
    acquired_xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (lease, epoch)
);

CREATE TABLE pgfence.tasks (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lease      text NOT NULL REFERENCES pgfence.leases (name),
    key        text NOT NULL CHECK (pgfence._text_problem(key, 256) IS NULL),
    state      text NOT NULL CHECK (state IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled')),
    assignee   text CHECK (assignee IS NULL OR pgfence._text_problem(assignee, 256) IS NULL),
    payload    jsonb NOT NULL DEFAULT '{}',
    -- the highest epoch that ever wrote this row: a write presenting a lower epoch is stale
    fence      bigint NOT NULL CHECK (fence >= 1),
    version    bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (lease, key)
);

-- Append-only: a trigger below refuses UPDATE and DELETE.
CREATE TABLE pgfence.task_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    bigint NOT NULL REFERENCES pgfence.tasks (id),
    lease      text NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch >= 1),
    kind       text NOT NULL CHECK (pgfence._text_problem(kind, 64) IS NULL),
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX task_events_task_idx ON pgfence.task_events (task_id, id);
CREATE INDEX task_events_epoch_idx ON pgfence.task_events (lease, epoch, id);

-- The audit of refusals: writes, renewals and releases refused because they presented a stale epoch or a wrong
-- tenure secret, and calls refused because the role has no grant on the cluster. Every row names the refused
-- login role (`role`, the session_user) and aggregates repeats, so a caller retrying in a tight loop grows a
-- counter, not the table, and one role's refusals never touch another role's rows:
--   * scope 'tenure' (a tenure explains the refusal: superseded, expired, released, failover, holder_mismatch,
--     row_fence, bad_secret): one row per (role, lease, presented epoch, operation). The first refusal's reason
--     and epochs are kept; count, last_rejected_at and last_target_key move.
--   * scope 'role' (no tenure to explain it: no_grant, unknown_lease, future_epoch): one row per (role, reason),
--     whatever the lease, epoch or operation, so a flood of distinct bogus names costs one row per role and
--     reason in all. `lease`, `presented_epoch`, `operation` and `target_*` are the first refusal's; `last_lease`
--     and `last_target_key` the latest's.
-- Every text is bounded by the same limits as the API (so are the arguments it comes from).
CREATE TABLE pgfence.rejections (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role             name NOT NULL DEFAULT session_user,
    scope            text NOT NULL CHECK (scope IN ('tenure', 'role')),
    lease            text NOT NULL CHECK (pgfence._lease_problem(lease) IS NULL),
    presented_epoch  bigint NOT NULL,
    current_epoch    bigint,
    current_holder   text CHECK (current_holder IS NULL OR pgfence._text_problem(current_holder, 256) IS NULL),
    reason           text NOT NULL CHECK (pgfence._text_problem(reason, 64) IS NULL),
    operation        text NOT NULL CHECK (pgfence._text_problem(operation, 64) IS NULL),
    target_table     text CHECK (target_table IS NULL OR pgfence._text_problem(target_table, 64) IS NULL),
    target_key       text CHECK (target_key IS NULL OR pgfence._text_problem(target_key, 256) IS NULL),
    rejected_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_rejected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    count            bigint NOT NULL DEFAULT 1,
    last_lease       text CHECK (last_lease IS NULL OR pgfence._lease_problem(last_lease) IS NULL),
    last_target_key  text CHECK (last_target_key IS NULL OR pgfence._text_problem(last_target_key, 256) IS NULL),
    -- PostgreSQL keeps application_name to printable ASCII and 63 bytes.
    application_name text DEFAULT current_setting('application_name', true),
    client_addr      inet DEFAULT inet_client_addr(),
    backend_pid      integer NOT NULL DEFAULT pg_backend_pid()
);
CREATE INDEX rejections_lease_idx ON pgfence.rejections (lease, id);
CREATE UNIQUE INDEX rejections_tenure_idx ON pgfence.rejections (role, lease, presented_epoch, operation)
    WHERE scope = 'tenure';
CREATE UNIQUE INDEX rejections_role_idx ON pgfence.rejections (role, reason) WHERE scope = 'role';
CREATE INDEX rejections_age_idx ON pgfence.rejections (last_rejected_at);

-- Who may use which cluster. A row grants `role` (and every role that is a member of it) the application rights
-- on `cluster`, or on every cluster when `cluster` is NULL; `operator` adds force-release on it (and, on every
-- cluster, the instance settings and audit retention). Written only by pgfence.grant_application,
-- grant_operator and revoke (the owner's).
CREATE TABLE pgfence.grants (
    role       regrole NOT NULL,
    cluster    text CHECK (cluster IS NULL OR pgfence._cluster_problem(cluster) IS NULL),
    operator   boolean NOT NULL DEFAULT false,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX grants_role_cluster_idx ON pgfence.grants (role, coalesce(cluster, ''));
CREATE INDEX grants_cluster_idx ON pgfence.grants (cluster);

-- The secret of each lease's current tenure, as SHA-256 of its text: acquire returns the secret once, and every
-- write, renewal and release of the tenure presents it. Nobody but the owner can read this table.
CREATE TABLE pgfence.tenure_secrets (
    lease text PRIMARY KEY,
    epoch bigint NOT NULL,
    hash  bytea NOT NULL CHECK (length(hash) = 32)
);

-- ---------------------------------------------------------------------------------------------------------
-- Trust boundary.
--   * The schema owner (the role that migrated) and superusers are trusted with everything.
--   * Every other role acts only through grants in pgfence.grants, per cluster. The principal is the session's
--     login role (session_user), together with every role it is a member of: a session can SET ROLE to any of
--     those and RESET ROLE back at will, so SET ROLE is no boundary within a session, and SECURITY DEFINER
--     functions cannot see the caller's current_user anyway. Tenants that must not act for each other need
--     separate login roles (a pooler that logs in once and SET ROLEs per tenant gives each tenant the union).
--   * Reads go through row-level security: a granted role sees the rows of its clusters only (leases, tenures,
--     tasks, task events, tenure-scope rejections) plus its own refusals. The functions below run as the owner,
--     which row-level security does not filter.

-- Whether the session's login role may use cluster p_cluster (p_operator: with operator rights); NULL
-- p_cluster: every cluster. Superusers and members of the owner of the pgfence schema are trusted with every
-- cluster. The one definition of the rule, as one row: a set-returning SQL function, so that a statement naming
-- it in its FROM clause gets it inlined as a subquery (planned with that statement, and once for all when the
-- statement is a plpgsql one: the guard's pre-check); a scalar SQL function with a subquery is never inlined.
CREATE FUNCTION pgfence._grant_of(p_cluster text, p_operator boolean DEFAULT false) RETURNS TABLE (granted boolean)
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pgfence.grants g
                    WHERE (g.cluster = p_cluster OR g.cluster IS NULL) AND (g.operator OR NOT p_operator)
                      AND pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER'))
           OR pg_catalog.pg_has_role(session_user, (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                                     WHERE n.nspname = 'pgfence'), 'MEMBER')
$$;

-- _grant_of as a boolean, for expressions. plpgsql, not SQL: its statement is planned once per session (an SQL
-- function with a subquery is not inlined, and would be planned again for every statement that calls it).
CREATE FUNCTION pgfence._may_use(p_cluster text, p_operator boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT u.granted FROM pgfence._grant_of(p_cluster, p_operator) u);
END;
$$;

-- For row-level security: whether the session reads every cluster, and which clusters it reads otherwise.
-- SECURITY DEFINER (pgfence.grants is the owner's); each is called once per query, as an InitPlan.
CREATE FUNCTION pgfence._reads_all() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgfence._may_use(NULL)
$$;
CREATE FUNCTION pgfence._readable_clusters() RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(DISTINCT g.cluster) FILTER (WHERE g.cluster IS NOT NULL), '{}')
      FROM pgfence.grants g
     WHERE pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER')
$$;

ALTER TABLE pgfence.leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tenures ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tasks ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.task_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.rejections ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.grants ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tenure_secrets ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted_clusters ON pgfence.leases FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR split_part(name, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
CREATE POLICY granted_clusters ON pgfence.tenures FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
-- The task tables also bound raw writes (by a role some DBA gave table privileges) to the role's clusters; the
-- raw-SQL enforcement below then checks epoch and secret. No policy allows writing any other table: a role
-- other than the owner cannot, whatever its table privileges.
CREATE POLICY granted_clusters ON pgfence.tasks FOR ALL
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]))
    WITH CHECK ((SELECT pgfence._reads_all())
                OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
CREATE POLICY granted_clusters ON pgfence.task_events FOR ALL
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]))
    WITH CHECK ((SELECT pgfence._reads_all())
                OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
-- Tenure-scope refusals of the session's clusters, and the session's own refusals of any scope.
CREATE POLICY granted_clusters ON pgfence.rejections FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR role = session_user
           OR (scope = 'tenure' AND split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[])));
-- A role sees the grants it holds (directly or through membership).
CREATE POLICY own_grants ON pgfence.grants FOR SELECT
    USING (pg_catalog.pg_has_role(session_user, role::oid, 'MEMBER'));
-- No policy on tenure_secrets: no role but the owner reads it (and nobody is granted SELECT on it anyway).

-- Tenures with the time of their last accepted task write (every guarded task write appends an event). A view
-- runs with its owner's rights, which row-level security does not filter: the WHERE clause applies the same rule,
-- and security_barrier makes it run before any condition of the caller's (which could otherwise see, through an
-- error or a function with side effects, rows the rule hides).
CREATE VIEW pgfence.tenure_history WITH (security_barrier) AS
SELECT t.lease, t.epoch, t.holder, t.acquired_at, t.ended_at, t.end_reason,
       -- The newest event of the epoch, found by a backward scan of task_events_epoch_idx.
       (SELECT e.created_at FROM pgfence.task_events e
         WHERE e.lease = t.lease AND e.epoch = t.epoch ORDER BY e.id DESC LIMIT 1) AS last_write_at
  FROM pgfence.tenures t
 WHERE (SELECT pgfence._reads_all()) OR split_part(t.lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]);

-- ---------------------------------------------------------------------------------------------------------
-- Result rows. Functions return one composite value so that a client can call them as
-- `SELECT pgfence.f(...)`, a statement every driver prepares once and reuses.

-- outcome: 'acquired' | 'renewed' | 'held' | 'lost' | 'released' | 'not_held' | 'denied'
-- reason (for 'lost'/'not_held'): 'superseded' | 'expired' | 'released' | 'unknown_lease' | 'future_epoch'
--                                 | 'holder_mismatch' | 'failover'; (for 'denied'): 'no_grant' | 'bad_secret'
-- secret: only with 'acquired': the tenure's secret, returned this once (64 hexadecimal characters).
CREATE TYPE pgfence.lease_result AS (
    outcome       text,
    reason        text,
    epoch         bigint,
    holder        text,
    expires_in_ms bigint,
    secret        text
);

-- outcome: 'ok' | 'stale' | 'not_found' | 'conflict' | 'denied'
-- reason  (for 'stale'): as in lease_result, or 'row_fence'; (for 'conflict'): the task's actual state;
--         (for 'denied'): 'no_grant' | 'bad_secret'
CREATE TYPE pgfence.write_result AS (
    outcome        text,
    reason         text,
    current_epoch  bigint,
    current_holder text,
    task_id        bigint,
    task_key       text,
    task_state     text,
    assignee       text,
    payload        jsonb,
    fence          bigint,
    version        bigint,
    created        boolean,
    event_id       bigint
);

-- ---------------------------------------------------------------------------------------------------------
-- Input checks shared by every function: a bad argument raises 22023 (invalid_parameter_value) and writes
-- nothing.
--
-- Each check is an SQL expression that names the first problem (the error message after 'pgfence: '), NULL
-- when there is none; an entry function joins its arguments' checks with coalesce() into one expression and
-- raises once. Plain SQL without a SET clause, sublink or call of a function more volatile than they are
-- declared (_payload_problem is STABLE, as pg_column_size is), so that PostgreSQL inlines them: in a
-- plpgsql assignment the whole check is then one precomputed expression, evaluated without an executor run
-- (a PERFORM, or a call of a plpgsql function, costs one each). Called only from functions that pin their
-- search_path, where the names in them resolve.
--
-- The write path (fence and the task functions) first runs a cheaper test, _plain_lease_args/_plain_arg, and
-- the full checks only when it fails: plpgsql prepares each expression it evaluates anew in every
-- transaction, and the full checks of four arguments are a large expression (measured: 14 µs of a fence
-- call, against 4 µs for the cheap test). The cheap test is sufficient, not necessary: it passes printable
-- ASCII only (no control character, and always in NFC) within the length bounds, so whatever it passes, the
-- full checks pass too; any other argument (non-ASCII text, a NULL, a bad value) gets the full checks.

-- Whether p_value passes _arg_problem(p_what, p_value, p_max, p_optional) for certain: 1 to p_max printable
-- ASCII characters, or NULL and p_optional. NULL when p_value is NULL and not optional. (The lengths are
-- counted in bytes, which is exact for ASCII; the regular expressions have no bounded repetition, whose
-- matching costs microseconds.)
CREATE FUNCTION pgfence._plain_arg(p_value text, p_max integer, p_optional boolean DEFAULT false) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_optional AND p_value IS NULL) OR (p_value ~ '^[ -~]+$' AND octet_length(p_value) <= p_max)
$$;

-- Whether (p_lease, p_epoch) pass _lease_args_problem for certain: a cluster of 1 to 63 printable ASCII
-- characters other than '/', a '/', a name of 1 to 200 printable ASCII characters, and an epoch of at least 1.
CREATE FUNCTION pgfence._plain_lease_args(p_lease text, p_epoch bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_lease ~ '^[ -.0-~]+/[ -~]+$' AND strpos(p_lease, '/') <= 64
           AND octet_length(p_lease) - strpos(p_lease, '/') <= 200 AND p_epoch >= 1
$$;

-- Why p_value is not a valid p_what argument of at most p_max characters; NULL when it is, and when it is NULL
-- and p_optional.
CREATE FUNCTION pgfence._arg_problem(p_what text, p_value text, p_max integer, p_optional boolean DEFAULT false)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_value IS NOT NULL OR NOT p_optional
                THEN 'invalid ' || p_what || ': ' || pgfence._text_problem(p_value, p_max) END
$$;

-- Why (p_lease, p_epoch) is not a fence's lease and epoch; NULL when it is.
CREATE FUNCTION pgfence._lease_args_problem(p_lease text, p_epoch bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce('invalid lease: ' || pgfence._lease_problem(p_lease),
                    CASE WHEN p_epoch IS NULL OR p_epoch < 1
                         THEN 'epoch must be >= 1, got ' || coalesce(p_epoch::text, '<NULL>') END)
$$;

-- Why a task payload is refused; NULL when it is not. A backstop for SQL callers. The Rust API refuses more
-- than 1 MiB of serialized JSON before sending, which stays below this even for payloads that grow several
-- times when stored as jsonb (arrays of small numbers).
CREATE FUNCTION pgfence._payload_problem(p_payload jsonb) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_column_size(p_payload) > 16777216 THEN 'payload larger than 16 MiB stored' END
$$;

-- The same checks as statements, for the functions off the write path (acquire, renew, release, …).
CREATE FUNCTION pgfence._check_text(p_what text, p_value text, p_max integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text := pgfence._arg_problem(p_what, p_value, p_max);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
    END IF;
END;
$$;

CREATE FUNCTION pgfence._check_lease_args(p_lease text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text := pgfence._lease_args_problem(p_lease, p_epoch);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
    END IF;
END;
$$;

CREATE FUNCTION pgfence._check_ttl(p_ttl_ms bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_ttl_ms IS NULL OR p_ttl_ms < 100 OR p_ttl_ms > 86400000 THEN
        RAISE EXCEPTION 'pgfence: ttl must be between 100 ms and 24 h, got % ms', p_ttl_ms USING ERRCODE = '22023';
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Locks: the guard lock of a lease, bounded waits, and naming who blocks.

-- The WAL timeline the server writes on now (the first 8 hex digits of the current WAL file name). Unlike
-- pg_control_checkpoint(), it changes at the moment of a promotion, not at the next checkpoint.
CREATE FUNCTION pgfence._timeline() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

-- The bound of every lock wait of a pgfence function other than the takeover's grace: a takeover holds the lease
-- row for at most the grace plus the time to end blockers, so anything queued behind it gets that much and more.
CREATE FUNCTION pgfence._lock_wait_ms() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT i.takeover_grace_ms + 5000 FROM pgfence.instance i
$$;

-- A stored or client-supplied text made safe to put in a message: control characters replaced, length bounded,
-- quoted.
CREATE FUNCTION pgfence._printable(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_text IS NULL THEN 'null'
                ELSE quote_literal(regexp_replace(left(p_text, 64), '[[:cntrl:]]', '?', 'g')) END
$$;

-- Describes backends for an error message: pid, application_name, state and role (never a query text).
CREATE FUNCTION pgfence._describe_backends(p_pids integer[]) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(format('pid %s (application_name %s, state %s, role %s)', a.pid,
                                      pgfence._printable(a.application_name), coalesce(a.state, 'unknown'),
                                      pgfence._printable(a.usename::text)), ', ' ORDER BY a.pid),
                    'no backend any more (the blocker has just ended)')
      FROM pg_catalog.pg_stat_activity a
     WHERE a.pid = ANY (p_pids)
$$;

-- The backends other than this one that hold (p_granted) or wait for (NOT p_granted) a lease's guard lock.
CREATE FUNCTION pgfence._guard_lockers(p_lock_key integer, p_granted boolean) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}')
      FROM pg_catalog.pg_locks k
     WHERE k.locktype = 'advisory' AND k.classid = 1885824613::oid AND k.objid = p_lock_key::oid
       AND k.objsubid = 2 AND k.granted = p_granted AND k.pid <> pg_catalog.pg_backend_pid()
       AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
$$;

-- The backends holding a lease row's lock: the transaction in the row's xmax when it is a plain one, else every
-- other backend in a transaction that holds a row-level lock mode on pgfence.leases (a MultiXact locker set).
CREATE FUNCTION pgfence._row_lockers(p_lease text) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    WITH exact AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'transactionid' AND k.granted AND k.pid <> pg_catalog.pg_backend_pid()
           AND k.transactionid = (SELECT l.xmax FROM pgfence.leases l WHERE l.name = p_lease)
    ), candidates AS (
        SELECT k.pid FROM pg_catalog.pg_locks k
         WHERE k.locktype = 'relation' AND k.relation = 'pgfence.leases'::regclass AND k.granted
           AND k.mode IN ('RowShareLock', 'RowExclusiveLock') AND k.pid <> pg_catalog.pg_backend_pid()
    )
    SELECT coalesce((SELECT array_agg(DISTINCT pid) FROM exact),
                    (SELECT array_agg(DISTINCT pid) FROM candidates), '{}')
$$;

-- The backends other than this one holding a lock on a pgfence table (what a DDL statement of pgfence waits for).
CREATE FUNCTION pgfence._table_lockers() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}')
      FROM pg_catalog.pg_locks k
      JOIN pg_catalog.pg_class c ON c.oid = k.relation
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE k.locktype = 'relation' AND k.granted AND n.nspname = 'pgfence'
       AND k.pid <> pg_catalog.pg_backend_pid()
$$;

-- Locks a lease row (FOR NO KEY UPDATE: it does not conflict with the FOR KEY SHARE of foreign-key checks) for
-- a change, waiting at most _lock_wait_ms(); p_create first inserts the row if it is missing (a concurrent insert
-- of the same name is waited for, bounded too). Returns the locked row (all NULL when there is no such lease).
CREATE FUNCTION pgfence._lock_lease_row(p_lease text, p_create boolean DEFAULT false) RETURNS pgfence.leases
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
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
$$;

-- The slow path of a guard: the shared guard lock is not free at once (a takeover holds it or waits for it).
-- Waits at most _lock_wait_ms(), then fails naming who blocks.
CREATE FUNCTION pgfence._wait_guard_lock(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885824613, p_lock_key);
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: guarded write on lease % waited % ms for its guard lock; held by %; queued before it: %',
        pgfence._printable(p_lease), wait_ms,
        pgfence._describe_backends(pgfence._guard_lockers(p_lock_key, true)),
        pgfence._describe_backends(pgfence._guard_lockers(p_lock_key, false))
        USING ERRCODE = 'PF003',
              HINT = 'A takeover of this lease is in flight or its transaction stays open.';
END;
$$;

-- Takes a lease's guard lock EXCLUSIVE for a change of who may write: waits for guarded transactions already
-- past their check, at most the takeover grace; then terminates the backends still holding it (their tenure is
-- ending: a transaction still open that long after must not commit after its successor's) and waits for them to
-- go. Fails with PF003 naming the blockers if it cannot end them (the schema owner lacks pg_signal_backend) or
-- they keep it. The caller holds the lease row lock, so no second takeover of the lease runs meanwhile.
CREATE FUNCTION pgfence._take_guard_lock(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    grace_ms bigint;
    victims  integer[];
    ended    text;
BEGIN
    IF pg_catalog.pg_try_advisory_xact_lock(1885824613, p_lock_key) THEN
        RETURN;
    END IF;
    SELECT i.takeover_grace_ms INTO grace_ms FROM pgfence.instance i;
    BEGIN
        -- lock_timeout 0 would mean "wait forever".
        PERFORM set_config('lock_timeout', greatest(grace_ms, 1) || 'ms', true);
        PERFORM pg_catalog.pg_advisory_xact_lock(1885824613, p_lock_key);
        RETURN;
    EXCEPTION WHEN lock_not_available THEN
        NULL;
    END;
    -- Signal the holders without waiting for them to exit (timeout 0) and queue again at once: a guard arriving
    -- meanwhile queues behind us instead of slipping in while we wait for the exits. One that took the lock in
    -- the instant between our two requests is ended in the next round.
    FOR round IN 1..3 LOOP
        victims := pgfence._guard_lockers(p_lock_key, true);
        ended := pgfence._describe_backends(victims);
        BEGIN
            PERFORM pg_catalog.pg_terminate_backend(v, 0) FROM unnest(victims) AS v;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'pgfence: takeover of lease % waited the % ms grace for guarded transactions of the ending tenure and may not end them: %',
                pgfence._printable(p_lease), grace_ms, ended
                USING ERRCODE = 'PF003',
                      HINT = 'Grant pg_signal_backend to the owner of the pgfence schema, or end those backends.';
        END;
        RAISE WARNING 'pgfence: takeover of lease % ended guarded transactions still open % ms into the grace: %',
            pgfence._printable(p_lease), grace_ms, ended;
        BEGIN
            -- A terminated backend exits and releases its locks within milliseconds.
            PERFORM set_config('lock_timeout', '1000ms', true);
            PERFORM pg_catalog.pg_advisory_xact_lock(1885824613, p_lock_key);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    RAISE EXCEPTION 'pgfence: takeover of lease % still blocked after ending the holders of its guard lock; held by %',
        pgfence._printable(p_lease), pgfence._describe_backends(pgfence._guard_lockers(p_lock_key, true))
        USING ERRCODE = 'PF003';
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Lease protocol. Every entry function reads the lease row without a lock first: an answer that a plain read
-- already decides for good ('held' by another live tenure, 'not_held') takes no lock, so a caller that leaves
-- its transaction open afterwards blocks nobody.

-- Why a lease is not (or no longer) held by (holder, epoch), judged on a locked or freshly read row, at time ts
-- (the database clock), on WAL timeline p_timeline.
CREATE FUNCTION pgfence._loss_reason(l pgfence.leases, p_holder text, p_epoch bigint, ts timestamptz,
                                     p_timeline bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN l.name IS NULL THEN 'unknown_lease'
        WHEN p_epoch < l.epoch THEN 'superseded'
        WHEN p_epoch > l.epoch THEN 'future_epoch'
        WHEN p_holder IS NOT NULL AND l.holder IS DISTINCT FROM p_holder THEN 'holder_mismatch'
        WHEN l.state = 'released' THEN 'released'
        -- Granted before the last promotion: its ending may have been lost with the old primary's tail.
        WHEN l.timeline < p_timeline THEN 'failover'
        WHEN l.expires_at <= ts THEN 'expired'
        ELSE NULL
    END
$$;

-- Whether a live tenure of another holder blocks an acquisition by p_holder.
-- Another holder is another holder name, or the same name used by another login role: knowing a holder's name
-- (readable by every role of the cluster) must not let a role end its tenure.
CREATE FUNCTION pgfence._held_by_other(l pgfence.leases, p_holder text, ts timestamptz, p_timeline bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT l.state = 'held' AND l.expires_at > ts
           AND (l.holder IS DISTINCT FROM p_holder OR l.holder_role IS DISTINCT FROM session_user)
           AND l.timeline >= p_timeline
$$;

-- Acquire by compare-and-set: succeeds when the lease is new, released, expired (by the database clock) or
-- held by a tenure granted before the last promotion, and issues epoch + 1. The same holder acquiring again
-- while it holds also gets a new epoch: an acquisition always starts a new tenure and fences every earlier one
-- (a restarted process reusing its holder name must not inherit the writes in flight of its previous
-- incarnation). To extend a tenure, renew it. An acquisition returns the new tenure's secret, once: every
-- write, renewal and release of the tenure presents it (the database keeps only its SHA-256).
CREATE FUNCTION pgfence.acquire(p_lease text, p_holder text, p_ttl_ms bigint)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l   pgfence.leases;
    ts  timestamptz;
    tl  bigint;
    new_epoch bigint;
    secret text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, 1);
    PERFORM pgfence._check_text('holder', p_holder, 256);
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_lease_call(p_lease, 0, 'acquire');
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    tl := pgfence._timeline();

    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    IF FOUND AND pgfence._held_by_other(l, p_holder, clock_timestamp(), tl) THEN
        -- Decided without a lock: a live tenure of another holder stays live until it ends.
        RETURN ROW('held', NULL, l.epoch, l.holder,
                   ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000)::bigint,
                   NULL)::pgfence.lease_result;
    END IF;

    -- The row lock first (a rival taker or a renewal in flight), then the guard lock (guarded writes in flight).
    l := pgfence._lock_lease_row(p_lease, p_create => true);
    -- Read the clock after the lock wait: expiry is judged at the moment we own the row.
    ts := clock_timestamp();
    IF pgfence._held_by_other(l, p_holder, ts, tl) THEN
        RETURN ROW('held', NULL, l.epoch, l.holder,
                   ceil(extract(epoch FROM (l.expires_at - ts)) * 1000)::bigint, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();

    IF l.epoch > 0 THEN
        UPDATE pgfence.tenures
           SET ended_at = CASE WHEN l.state = 'held' AND l.expires_at <= ts THEN l.expires_at ELSE ts END,
               end_reason = CASE WHEN l.state = 'held' AND l.timeline < tl THEN 'failover'
                                 WHEN l.state = 'held' AND l.expires_at <= ts THEN 'expired'
                                 ELSE 'reacquired' END
         WHERE lease = p_lease AND epoch = l.epoch AND ended_at IS NULL;
    END IF;

    -- Failover safety: after a promotion the server writes WAL on a new timeline, and an asynchronous standby
    -- may have lost the last epochs its old primary issued. Every epoch issued on timeline t is at least
    -- (t - 1) * 2^32 + 1, which exceeds every epoch issued on earlier timelines (fewer than 2^32 acquisitions per
    -- lease and timeline), so epochs keep increasing across failovers even when the counter went backwards.
    new_epoch := GREATEST(l.epoch + 1, (tl - 1) * 4294967296 + 1);
    UPDATE pgfence.leases
       SET holder = p_holder, holder_role = session_user, epoch = new_epoch, state = 'held', ttl_ms = p_ttl_ms,
           timeline = tl,
           expires_at = ts + p_ttl_ms * interval '1 millisecond', acquired_at = ts, renewed_at = ts,
           transitions = transitions + CASE WHEN holder IS DISTINCT FROM p_holder THEN 1 ELSE 0 END
     WHERE name = p_lease;
    INSERT INTO pgfence.tenures (lease, epoch, holder, acquired_at, timeline)
    VALUES (p_lease, new_epoch, p_holder, ts, tl);
    -- 256 bits from the server's strong random source (two version-4 UUIDs: 244 random bits), as hexadecimal.
    secret := encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    INSERT INTO pgfence.tenure_secrets (lease, epoch, hash)
    VALUES (p_lease, new_epoch, sha256(convert_to(secret, 'UTF8')))
    ON CONFLICT (lease) DO UPDATE SET epoch = EXCLUDED.epoch, hash = EXCLUDED.hash;
    RETURN ROW('acquired', NULL, new_epoch, p_holder, p_ttl_ms, secret)::pgfence.lease_result;
END;
$$;

-- Renew: extends the expiry only while holder and epoch match, the lease has not expired and the tenure was
-- granted on the current timeline, and p_secret is the tenure's. It takes the row lock (bounded: it waits only
-- for a takeover or another renewal in flight) but never the guard lock, so it never waits for guarded writes.
-- A wrong secret is refused ('denied', 'bad_secret') and audited.
CREATE FUNCTION pgfence.renew(p_lease text, p_holder text, p_epoch bigint, p_secret text, p_ttl_ms bigint)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_text('holder', p_holder, 256);
    PERFORM pgfence._check_ttl(p_ttl_ms);
    denied := pgfence._deny_lease_call(p_lease, p_epoch, 'renew');
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;

    l := pgfence._lock_lease_row(p_lease);
    ts := clock_timestamp();
    why := pgfence._loss_reason(l, p_holder, p_epoch, ts, pgfence._timeline());
    IF why IS NOT NULL THEN
        RETURN ROW('lost', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) IS DISTINCT FROM 'ok' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret', 'renew', NULL, NULL);
        RETURN ROW('denied', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    UPDATE pgfence.leases
       SET expires_at = ts + p_ttl_ms * interval '1 millisecond', renewed_at = ts, ttl_ms = p_ttl_ms
     WHERE name = p_lease;
    RETURN ROW('renewed', NULL, p_epoch, p_holder, p_ttl_ms, NULL)::pgfence.lease_result;
END;
$$;

-- Renews many tenures of one holder in one statement: a process holding N leases (a sharded controller)
-- renews them all with one statement per tick. One row per input lease, in input order: 'renewed', 'lost'
-- (with the reason) or 'denied' ('no_grant' for a cluster the role has no grant on, 'bad_secret'). Every input
-- is checked as renew checks it (22023, nothing renewed), and a tenure listed twice gets the same answer twice.
CREATE FUNCTION pgfence.renew_many(p_leases text[], p_epochs bigint[], p_secrets text[], p_holder text,
                                   p_ttl_ms bigint)
RETURNS TABLE (lease text, outcome text, reason text, epoch bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    ts timestamptz;
    tl bigint;
    wait_ms bigint := pgfence._lock_wait_ms();
    refused text[];
BEGIN
    PERFORM pgfence._check_text('holder', p_holder, 256);
    PERFORM pgfence._check_ttl(p_ttl_ms);
    IF p_leases IS NULL OR p_epochs IS NULL OR p_secrets IS NULL OR cardinality(p_leases) <> cardinality(p_epochs)
       OR cardinality(p_leases) <> cardinality(p_secrets) THEN
        RAISE EXCEPTION 'pgfence: renew_many needs as many epochs and secrets as leases' USING ERRCODE = '22023';
    END IF;
    PERFORM pgfence._check_lease_args(i.lease, i.epoch) FROM unnest(p_leases, p_epochs) AS i(lease, epoch);

    -- Clusters the role has no grant on: their leases are refused, audited (one aggregated row per role).
    refused := ARRAY(SELECT DISTINCT c FROM unnest(p_leases) AS n, pgfence._cluster_of(n) AS c
                      WHERE NOT pgfence._may_use(c));
    PERFORM pgfence._reject(i.lease, i.epoch, NULL, NULL, 'no_grant', 'renew', NULL, NULL)
       FROM unnest(p_leases, p_epochs) AS i(lease, epoch)
      WHERE pgfence._cluster_of(i.lease) = ANY (refused);

    -- Lock the rows in name order (two holders renewing overlapping sets cannot deadlock), bounded.
    BEGIN
        PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
        PERFORM 1 FROM pgfence.leases l
          WHERE l.name = ANY (p_leases) AND NOT pgfence._cluster_of(l.name) = ANY (refused)
          ORDER BY l.name FOR NO KEY UPDATE OF l;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: renew_many waited % ms for lease row locks; blocked by %', wait_ms,
            pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT p), '{}')
                                          FROM unnest(p_leases) AS n, unnest(pgfence._row_lockers(n)) AS p))
            USING ERRCODE = 'PF003';
    END;
    ts := clock_timestamp();
    tl := pgfence._timeline();

    -- Live tenures presented with a wrong secret: refused and audited like a renew.
    PERFORM pgfence._reject(i.lease, i.epoch, l.epoch, l.holder, 'bad_secret', 'renew', NULL, NULL)
       FROM unnest(p_leases, p_epochs, p_secrets) AS i(lease, epoch, secret)
       JOIN pgfence.leases l ON l.name = i.lease
      WHERE NOT pgfence._cluster_of(i.lease) = ANY (refused)
        AND pgfence._loss_reason(l, p_holder, i.epoch, ts, tl) IS NULL
        AND pgfence._secret_check(i.lease, i.epoch, i.secret) IS DISTINCT FROM 'ok';

    RETURN QUERY
    WITH input AS (
        SELECT i.lease, i.epoch, i.secret, i.ord, pgfence._cluster_of(i.lease) = ANY (refused) AS refused
          FROM unnest(p_leases, p_epochs, p_secrets) WITH ORDINALITY AS i(lease, epoch, secret, ord)
    ), judged AS (
        SELECT i.lease, i.epoch, i.ord, l.epoch AS current_epoch,
               CASE WHEN i.refused THEN 'no_grant'
                    ELSE coalesce(pgfence._loss_reason(l, p_holder, i.epoch, ts, tl),
                                  CASE WHEN pgfence._secret_check(i.lease, i.epoch, i.secret) IS DISTINCT FROM 'ok'
                                       THEN 'bad_secret' END) END AS why
          FROM input i
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
           CASE WHEN j.why IS NULL THEN 'renewed' WHEN j.why IN ('no_grant', 'bad_secret') THEN 'denied'
                ELSE 'lost' END,
           j.why,
           CASE WHEN j.why = 'no_grant' THEN NULL ELSE j.current_epoch END
      FROM judged j
     ORDER BY j.ord;
END;
$$;

-- Release: ends the tenure (holder, epoch) at once so a successor can acquire immediately. Idempotent, and it
-- never touches a successor's tenure: releasing an epoch that is no longer current is a no-op ('not_held').
-- It waits for the tenure's guarded writes in flight (at most the takeover grace, then ends them). Only the
-- tenure's secret ends it: a wrong one is refused ('denied', 'bad_secret') and audited.
CREATE FUNCTION pgfence.release(p_lease text, p_holder text, p_epoch bigint, p_secret text)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    tl bigint;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, p_epoch);
    PERFORM pgfence._check_text('holder', p_holder, 256);
    denied := pgfence._deny_lease_call(p_lease, p_epoch, 'release');
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    tl := pgfence._timeline();

    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, p_holder, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why NOT IN ('expired', 'failover') THEN
        RETURN ROW('not_held', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    -- Decided for good ('bad' is final), before any lock.
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) = 'bad' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret', 'release', NULL, NULL,
                                p_may_wait => true);
        RETURN ROW('denied', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    l := pgfence._lock_lease_row(p_lease);
    why := pgfence._loss_reason(l, p_holder, p_epoch, clock_timestamp(), tl);
    IF why IS NOT NULL AND why NOT IN ('expired', 'failover') THEN
        RETURN ROW('not_held', why, l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    IF pgfence._secret_check(p_lease, p_epoch, p_secret) IS DISTINCT FROM 'ok' THEN
        PERFORM pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, 'bad_secret', 'release', NULL, NULL);
        RETURN ROW('denied', 'bad_secret', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();

    UPDATE pgfence.leases SET state = 'released', expires_at = LEAST(expires_at, ts) WHERE name = p_lease;
    UPDATE pgfence.tenures
       SET ended_at = LEAST(l.expires_at, ts),
           end_reason = CASE WHEN why = 'failover' THEN 'failover'
                             WHEN l.expires_at <= ts THEN 'expired' ELSE 'released' END
     WHERE lease = p_lease AND epoch = p_epoch AND ended_at IS NULL;
    -- Wake waiting candidates (delivered at commit) so a successor acquires in milliseconds, not a poll later.
    -- The payload is the lease's lock key, not its name: any role may LISTEN, and only roles that can read the
    -- lease row (a grant on its cluster) can tell which lease it is.
    PERFORM pg_notify('pgfence_lease_free', l.lock_key::text);
    RETURN ROW('released', why, p_epoch, p_holder, 0, NULL)::pgfence.lease_result;
END;
$$;

-- Operator override: ends whatever tenure is current so its epoch can no longer write. The epoch is kept (the
-- next acquisition issues epoch + 1). Waits for the tenure's guarded writes in flight (at most the takeover
-- grace, then ends them). Needs operator rights on the lease's cluster ('denied' / 'no_grant' otherwise).
CREATE FUNCTION pgfence.force_release(p_lease text)
RETURNS pgfence.lease_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l  pgfence.leases;
    ts timestamptz;
    why text;
    denied pgfence.lease_result;
BEGIN
    PERFORM pgfence._check_lease_args(p_lease, 1);
    denied := pgfence._deny_lease_call(p_lease, 0, 'force_release', p_operator => true);
    IF denied.outcome IS NOT NULL THEN
        RETURN denied;
    END IF;
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    IF NOT FOUND THEN
        RETURN ROW('not_held', 'unknown_lease', NULL, NULL, NULL, NULL)::pgfence.lease_result;
    ELSIF l.state = 'released' THEN
        RETURN ROW('not_held', 'released', l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    l := pgfence._lock_lease_row(p_lease);
    IF l.state = 'released' THEN
        RETURN ROW('not_held', 'released', l.epoch, l.holder, NULL, NULL)::pgfence.lease_result;
    END IF;
    PERFORM pgfence._take_guard_lock(p_lease, l.lock_key);
    ts := clock_timestamp();
    why := CASE WHEN l.timeline < pgfence._timeline() THEN 'failover'
                WHEN l.expires_at <= ts THEN 'expired' ELSE 'forced' END;
    UPDATE pgfence.leases SET state = 'released', expires_at = LEAST(expires_at, ts) WHERE name = p_lease;
    UPDATE pgfence.tenures
       SET ended_at = LEAST(l.expires_at, ts), end_reason = why
     WHERE lease = p_lease AND epoch = l.epoch AND ended_at IS NULL;
    PERFORM pg_notify('pgfence_lease_free', l.lock_key::text);
    RETURN ROW('released', why, l.epoch, l.holder, 0, NULL)::pgfence.lease_result;
END;
$$;

-- Every change of who may write a lease (epoch, holder, state, timeline) takes its guard lock EXCLUSIVE, also
-- when a role with table privileges UPDATEs the row directly: it waits for guarded transactions in flight and
-- holds off new ones until it commits; like theirs, its wait is bounded by the grace, after which it ends the
-- guard holders. The functions above take the lock themselves first; for them this is a re-grant. Epochs never go down and lease rows are never
-- deleted (invariant 1: a deleted row would restart at epoch 0).
CREATE FUNCTION pgfence._lease_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'pgfence: lease rows are never deleted (their epochs must keep increasing)'
            USING ERRCODE = 'PF005';
    END IF;
    IF NEW.epoch < OLD.epoch OR NEW.name <> OLD.name OR NEW.lock_key <> OLD.lock_key THEN
        RAISE EXCEPTION 'pgfence: refused change of lease %: epochs never go down, names and lock keys never change',
            pgfence._printable(OLD.name) USING ERRCODE = 'PF005';
    END IF;
    -- Bounded like a takeover: the grace, then the guard holders are ended (a no-op re-grant for the functions,
    -- which took the lock already).
    PERFORM pgfence._take_guard_lock(OLD.name, OLD.lock_key);
    RETURN NEW;
END;
$$;
CREATE TRIGGER lease_change BEFORE UPDATE ON pgfence.leases FOR EACH ROW
    WHEN (OLD.epoch IS DISTINCT FROM NEW.epoch OR OLD.holder IS DISTINCT FROM NEW.holder
          OR OLD.state IS DISTINCT FROM NEW.state OR OLD.timeline IS DISTINCT FROM NEW.timeline
          OR OLD.name IS DISTINCT FROM NEW.name OR OLD.lock_key IS DISTINCT FROM NEW.lock_key)
    EXECUTE FUNCTION pgfence._lease_change();
CREATE TRIGGER lease_delete BEFORE DELETE ON pgfence.leases FOR EACH ROW EXECUTE FUNCTION pgfence._lease_change();
CREATE TRIGGER lease_truncate BEFORE TRUNCATE ON pgfence.leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._lease_change();

-- Refuses a call of an instance-wide operator function (a setting or a retention that spans clusters) unless
-- the session's role has operator rights on every cluster (42501).
CREATE FUNCTION pgfence._require_instance_operator(p_function text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT pgfence._may_use(NULL, p_operator => true) THEN
        RAISE EXCEPTION 'pgfence: % needs operator rights on every cluster; role % has none', p_function,
            pgfence._printable(session_user::text)
            USING ERRCODE = '42501',
                  HINT = 'The schema owner grants them: pgfence grant --operator --all-clusters --role <role>.';
    END IF;
END;
$$;

-- The takeover grace (an operator setting): how long a takeover waits for guarded transactions of the ending
-- tenure before it terminates them. Returns the new value in milliseconds.
CREATE FUNCTION pgfence.set_takeover_grace(p_grace interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ms bigint;
BEGIN
    PERFORM pgfence._require_instance_operator('set_takeover_grace');
    IF p_grace IS NULL OR p_grace < interval '0' OR p_grace > interval '10 minutes' THEN
        RAISE EXCEPTION 'pgfence: takeover grace must be between 0 and 10 minutes' USING ERRCODE = '22023';
    END IF;
    ms := ceil(extract(epoch FROM p_grace) * 1000)::bigint;
    UPDATE pgfence.instance SET takeover_grace_ms = ms;
    RETURN ms;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- The guard.

-- Records one refusal in pgfence.rejections, aggregated per the refused role (see the table), and returns the
-- write_result: 'denied' for no_grant and bad_secret, 'stale' otherwise. The row commits with the statement
-- that called it.
CREATE FUNCTION pgfence._reject(p_lease text, p_epoch bigint, p_current_epoch bigint, p_current_holder text,
                                p_reason text, p_operation text, p_table text, p_key text,
                                p_may_wait boolean DEFAULT false)
RETURNS pgfence.write_result
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    previous timestamptz;
    wait_ms  bigint := pgfence._lock_wait_ms();
    by_role  boolean := p_reason IN ('no_grant', 'unknown_lease', 'future_epoch');
    op       text := p_operation;
BEGIN
    -- Operation labels are the caller's to choose: past 16 distinct ones for one (role, lease, epoch), further
    -- labels are aggregated under 'other', so one tenure costs at most 17 rows per role.
    IF NOT by_role
       AND NOT EXISTS (SELECT 1 FROM pgfence.rejections r
                        WHERE r.scope = 'tenure' AND r.role = session_user AND r.lease = p_lease
                          AND r.presented_epoch = p_epoch AND r.operation = p_operation)
       AND (SELECT count(*) FROM pgfence.rejections r
             WHERE r.scope = 'tenure' AND r.role = session_user AND r.lease = p_lease
               AND r.presented_epoch = p_epoch) >= 16 THEN
        op := 'other';
    END IF;
    IF by_role THEN
        SELECT r.last_rejected_at INTO previous FROM pgfence.rejections r
         WHERE r.scope = 'role' AND r.role = session_user AND r.reason = p_reason;
    ELSE
        SELECT r.last_rejected_at INTO previous FROM pgfence.rejections r
         WHERE r.scope = 'tenure' AND r.role = session_user AND r.lease = p_lease AND r.presented_epoch = p_epoch
           AND r.operation = op;
    END IF;
    -- Bounded: a refused transaction left open keeps its aggregated row locked. The first refusal's reason and
    -- epochs are kept (after a failover, 'failover' stays the evidence even once the tenure is also
    -- superseded); the count, the last time and the last lease and key move.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        IF by_role THEN
            INSERT INTO pgfence.rejections (scope, lease, presented_epoch, reason, operation, target_table,
                                            target_key, last_lease, last_target_key)
            VALUES ('role', p_lease, p_epoch, p_reason, p_operation, p_table, p_key, p_lease, p_key)
            ON CONFLICT (role, reason) WHERE scope = 'role' DO UPDATE
               SET count = pgfence.rejections.count + 1,
                   last_rejected_at = clock_timestamp(),
                   last_lease = EXCLUDED.lease,
                   last_target_key = EXCLUDED.target_key;
        ELSE
            INSERT INTO pgfence.rejections (scope, lease, presented_epoch, current_epoch, current_holder, reason,
                                            operation, target_table, target_key, last_lease, last_target_key)
            VALUES ('tenure', p_lease, p_epoch, p_current_epoch, p_current_holder, p_reason, op, p_table,
                    p_key, p_lease, p_key)
            ON CONFLICT (role, lease, presented_epoch, operation) WHERE scope = 'tenure' DO UPDATE
               SET count = pgfence.rejections.count + 1,
                   last_rejected_at = clock_timestamp(),
                   last_target_key = EXCLUDED.target_key;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: refusal of % on lease % waited % ms for its audit row; blocked by %',
            pgfence._printable(p_operation), pgfence._printable(p_lease), wait_ms,
            pgfence._describe_backends((SELECT coalesce(array_agg(DISTINCT k.pid), '{}') FROM pg_catalog.pg_locks k
                                         WHERE k.locktype = 'relation' AND k.granted
                                           AND k.relation = 'pgfence.rejections'::regclass
                                           AND k.mode = 'RowExclusiveLock'
                                           AND k.pid <> pg_catalog.pg_backend_pid()))
            USING ERRCODE = 'PF003',
                  HINT = 'A transaction of the same role refused for the same reason (or lease, epoch and operation) stays open.';
    END;
    -- Backpressure on a caller retrying in a tight loop: a repeat within a second of the previous refusal
    -- aggregated in the same row answers 10 ms later. Holding the aggregated row meanwhile queues the role's
    -- other connections behind it, so a hammering caller gets about 100 refusals a second per row in all and
    -- leaves the CPU to the current leader. The first refusal is never delayed. Only callers that hold no guard
    -- lock may wait (p_may_wait): a wait under the shared guard lock would hold off a takeover.
    IF p_may_wait AND previous IS NOT NULL AND previous > clock_timestamp() - interval '1 second' THEN
        PERFORM pg_sleep(0.01);
    END IF;
    RETURN ROW(CASE WHEN p_reason IN ('no_grant', 'bad_secret') THEN 'denied' ELSE 'stale' END, p_reason,
               CASE WHEN p_reason = 'no_grant' THEN NULL ELSE p_current_epoch END,
               CASE WHEN p_reason = 'no_grant' THEN NULL ELSE p_current_holder END,
               NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.write_result;
END;
$$;

-- Refuses a call of a role without a grant on the lease's cluster (p_operator: operator rights needed): records
-- it and returns the lease_result 'denied' / 'no_grant'; NULL when the role may go on.
CREATE FUNCTION pgfence._deny_lease_call(p_lease text, p_epoch bigint, p_operation text,
                                         p_operator boolean DEFAULT false)
RETURNS pgfence.lease_result
LANGUAGE plpgsql AS $$
BEGIN
    IF pgfence._may_use(pgfence._cluster_of(p_lease), p_operator) THEN
        RETURN NULL;
    END IF;
    PERFORM pgfence._reject(p_lease, coalesce(p_epoch, 0), NULL, NULL, 'no_grant', p_operation, NULL, NULL,
                            p_may_wait => true);
    RETURN ROW('denied', 'no_grant', NULL, NULL, NULL, NULL)::pgfence.lease_result;
END;
$$;

-- Whether p_secret is the secret whose SHA-256 is p_hash. Secrets longer than 128 characters are not even
-- hashed. (Comparing hashes leaks nothing an attacker can steer: it cannot choose the hash of its guess.)
-- STABLE, as convert_to is: an IMMUTABLE declaration would keep PostgreSQL from inlining it.
CREATE FUNCTION pgfence._secret_matches(p_hash bytea, p_secret text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(p_secret IS NOT NULL AND length(p_secret) <= 128
                    AND p_hash = pg_catalog.sha256(pg_catalog.convert_to(p_secret, 'UTF8')), false)
$$;

-- Whether p_secret is the secret of tenure (p_lease, p_epoch): 'ok', 'bad', or NULL when that tenure is not the
-- lease's latest (its secret is gone: it has been superseded). A tenure's secret never changes, so 'ok' and
-- 'bad' are final.
CREATE FUNCTION pgfence._secret_check(p_lease text, p_epoch bigint, p_secret text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.epoch <> p_epoch THEN NULL
                WHEN pgfence._secret_matches(s.hash, p_secret) THEN 'ok'
                ELSE 'bad' END
      FROM pgfence.tenure_secrets s
     WHERE s.lease = p_lease
$$;

-- The name of the transaction-local setting in which pgfence.fence leaves the presented secret for the raw-SQL
-- enforcement triggers (per lease: one transaction may be fenced by several leases).
CREATE FUNCTION pgfence._fence_setting(p_lock_key integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgfence.tenure_secret_' || p_lock_key::text
$$;

-- Checks that the session's role may use p_lease's cluster, that p_epoch is the current, held, unexpired epoch
-- of p_lease, granted on the current timeline, and that p_secret is its tenure's secret; and keeps the lease's
-- guard lock SHARED until the end of the calling transaction, so no takeover can commit before the caller's
-- write. Returns NULL when all holds; otherwise records the refusal and returns the 'denied' or 'stale' result.
-- Needs READ COMMITTED (PF004 otherwise): under REPEATABLE READ or SERIALIZABLE the transaction's snapshot may
-- predate a takeover that committed before the lock was granted.
CREATE FUNCTION pgfence._guard(p_lease text, p_epoch bigint, p_secret text, p_operation text, p_table text,
                               p_key text)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
DECLARE
    l   pgfence.leases;
    why text;
    pre record;
    secret_ok boolean;
    kept text;
BEGIN
    -- What makes a presented epoch stale is permanent: epochs only grow, a released tenure stays released, an
    -- expired one can never be renewed and timelines only grow. (One conservative exception: a renewal that
    -- judged the tenure live just before its expiry and commits just after it extends a tenure that a guard
    -- reading in between refuses as 'expired'. Nobody could acquire meanwhile — the renewal holds the row — so
    -- this refuses a write that would have been safe, never the reverse.) So if even an unlocked read shows the epoch
    -- stale, it is stale for good: refusing it without the guard lock keeps a hammering stale holder off the
    -- lock that the current leader's writes share and that a takeover waits for. (Under READ COMMITTED the read
    -- is fresh, so 'future_epoch' too is decided: that epoch has not been issued.)
    -- First, before any read: under REPEATABLE READ or SERIALIZABLE even a refusal could misreport (an old
    -- snapshot's current epoch) or fail with a bare 40001 on the aggregated audit row.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgfence: guarded writes need READ COMMITTED isolation; this transaction is %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'PF004',
                  HINT = 'Run the guarded write in a READ COMMITTED transaction (BEGIN ISOLATION LEVEL READ COMMITTED).';
    END IF;
    -- The pre-check, in one statement (each statement of a function costs an executor run): the role's grant on
    -- the cluster (the rule inlined here, not a call of _may_use: that would be a second executor run), the
    -- lease, the hash of its current tenure's secret and the WAL timeline.
    SELECT u.granted, pgfence._timeline() AS tl, x AS lease, s.epoch AS secret_epoch, s.hash AS secret_hash
      INTO pre
      FROM pgfence._grant_of(pgfence._cluster_of(p_lease)) AS u
      LEFT JOIN pgfence.leases x ON x.name = p_lease
      LEFT JOIN pgfence.tenure_secrets s ON s.lease = p_lease;
    IF NOT pre.granted THEN
        RETURN pgfence._reject(p_lease, p_epoch, NULL, NULL, 'no_grant', p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    l := pre.lease;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), pre.tl);
    IF why IS NULL AND pre.secret_epoch = p_epoch THEN
        -- A forged fence is refused before it takes the guard lock, like a stale one (a tenure's secret never
        -- changes, so the answer is final either way).
        secret_ok := pgfence._secret_matches(pre.secret_hash, p_secret);
        IF NOT secret_ok THEN
            why := 'bad_secret';
        END IF;
    END IF;
    IF why IS NOT NULL THEN
        RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key,
                               p_may_wait => true);
    END IF;
    -- Fair: a try-lock fails while a takeover waits for the exclusive lock, like a queued request would wait.
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(1885824613, l.lock_key) THEN
        PERFORM pgfence._wait_guard_lock(p_lease, l.lock_key);
    END IF;
    -- A new statement, so a new snapshot under READ COMMITTED: every takeover that held the exclusive lock before
    -- we were granted the shared one has committed (a transaction's locks are released after its commit is
    -- visible) and shows here.
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    why := pgfence._loss_reason(l, NULL, p_epoch, clock_timestamp(), pre.tl);
    -- The secret is undecided here only when the tenure was superseded between the pre-check's reads, which the
    -- read above reports; checked again all the same.
    IF why IS NULL AND secret_ok IS NOT TRUE
       AND pgfence._secret_check(p_lease, p_epoch, p_secret) IS DISTINCT FROM 'ok' THEN
        why := 'bad_secret';
    END IF;
    IF why IS NULL THEN
        -- For the rest of the transaction, raw writes of this tenure pass the raw-SQL enforcement. An assignment,
        -- not PERFORM: a plpgsql expression without an executor run.
        kept := pg_catalog.set_config(pgfence._fence_setting(l.lock_key), p_secret, true);
        RETURN NULL;
    END IF;
    RETURN pgfence._reject(p_lease, p_epoch, l.epoch, l.holder, why, p_operation, p_table, p_key);
END;
$$;

-- The guard for a caller's own transaction (the generic fenced transaction):
--   BEGIN; SELECT outcome FROM pgfence.fence('prod/scheduler', 7, '<secret>', 'rebalance');  -- 'ok', else no
--   ... your writes, only if 'ok' ...; COMMIT;
-- On 'stale' or 'denied' the refusal row is already written: COMMIT (not ROLLBACK) to keep it. On 'ok' the
-- secret is also kept for the rest of the transaction (a transaction-local setting of this session), so raw
-- writes to pgfence.tasks and pgfence.task_events pass the raw-SQL enforcement.
CREATE FUNCTION pgfence.fence(p_lease text, p_epoch bigint, p_secret text,
                              p_operation text DEFAULT 'fenced_transaction', p_table text DEFAULT NULL,
                              p_key text DEFAULT NULL)
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    r pgfence.write_result;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND pgfence._plain_arg(p_operation, 64)
        AND pgfence._plain_arg(p_table, 64, p_optional => true)
        AND pgfence._plain_arg(p_key, 256, p_optional => true)) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch),
                            pgfence._arg_problem('operation', p_operation, 64),
                            pgfence._arg_problem('target table', p_table, 64, p_optional => true),
                            pgfence._arg_problem('target key', p_key, 256, p_optional => true));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
        END IF;
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, p_operation, p_table, p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    RETURN ROW('ok', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.write_result;
END;
$$;


-- The safety net of the one-statement guarded write (Store::guarded_write; see pgfence.fence above): the caller's
-- statement changed rows although its guard refused, so its SQL does not test pgfence_guard.passed. Raising
-- rolls the whole statement back, the refusal's audit row with it: a refused write never commits, and the caller
-- learns that its statement is not gated (SQLSTATE PF006).
CREATE FUNCTION pgfence.ungated_write(p_outcome text, p_written bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: a guarded write changed % rows although its guard answered %: the statement does not test pgfence_guard.passed',
        p_written, pgfence._printable(p_outcome)
        USING ERRCODE = 'PF006',
              HINT = 'Add AND (SELECT passed FROM pgfence_guard) to its WHERE clause (INSERT: INSERT ... SELECT ... WHERE it).';
END;
$$;


CREATE FUNCTION pgfence._task_result(t pgfence.tasks, p_outcome text, p_reason text, p_epoch bigint,
                                     p_created boolean, p_event_id bigint)
RETURNS pgfence.write_result
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_outcome, p_reason, p_epoch, NULL, t.id, t.key, t.state, t.assignee, t.payload, t.fence,
               t.version, p_created, p_event_id)::pgfence.write_result
$$;

-- A guarded task UPDATE matched no row: tell apart a missing task, a row written by a newer epoch (stale,
-- audited) and a business-guard failure (conflict, not audited).
CREATE FUNCTION pgfence._explain_miss(p_lease text, p_epoch bigint, p_key text, p_operation text)
RETURNS pgfence.write_result
LANGUAGE plpgsql AS $$
DECLARE
    t pgfence.tasks;
BEGIN
    SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key;
    IF NOT FOUND THEN
        RETURN ROW('not_found', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
               ::pgfence.write_result;
    END IF;
    IF t.fence > p_epoch THEN
        RETURN pgfence._reject(p_lease, p_epoch, t.fence, NULL, 'row_fence', p_operation, 'tasks', p_key);
    END IF;
    RETURN pgfence._task_result(t, 'conflict', t.state, p_epoch, false, NULL);
END;
$$;

-- Creates a pending task and its 'created' event, idempotent by (lease, key): a retry returns the existing
-- task with created = false and adds no event.
CREATE FUNCTION pgfence.create_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_payload jsonb DEFAULT '{}')
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND pgfence._plain_arg(p_key, 256)
        AND pgfence._payload_problem(p_payload) IS NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch),
                            pgfence._arg_problem('task key', p_key, 256),
                            pgfence._payload_problem(p_payload));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
        END IF;
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, 'create_task', 'tasks', p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    INSERT INTO pgfence.tasks (lease, key, state, payload, fence)
    VALUES (p_lease, p_key, 'pending', coalesce(p_payload, '{}'), p_epoch)
    ON CONFLICT (lease, key) DO NOTHING
    RETURNING * INTO t;
    IF NOT FOUND THEN
        SELECT * INTO t FROM pgfence.tasks WHERE lease = p_lease AND key = p_key;
        RETURN pgfence._task_result(t, 'ok', NULL, p_epoch, false, NULL);
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, 'created', t.payload) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok', NULL, p_epoch, true, ev);
END;
$$;

-- Claims a pending task for an assignee: the pending guard, the row fence and the 'claimed' event in one step.
CREATE FUNCTION pgfence.claim_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_assignee text)
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND pgfence._plain_arg(p_key, 256)
        AND pgfence._plain_arg(p_assignee, 256)) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch),
                            pgfence._arg_problem('task key', p_key, 256),
                            pgfence._arg_problem('assignee', p_assignee, 256));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
        END IF;
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, 'claim_task', 'tasks', p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    UPDATE pgfence.tasks
       SET state = 'claimed', assignee = p_assignee, fence = p_epoch, version = version + 1,
           updated_at = clock_timestamp()
     WHERE lease = p_lease AND key = p_key AND state = 'pending' AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN pgfence._explain_miss(p_lease, p_epoch, p_key, 'claim_task');
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, 'claimed', jsonb_build_object('assignee', p_assignee)) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok', NULL, p_epoch, false, ev);
END;
$$;

-- Moves a task from p_from to p_to (the business guard) and records the event p_kind with p_payload.
CREATE FUNCTION pgfence.transition_task(p_lease text, p_epoch bigint, p_secret text, p_key text, p_from text,
                                        p_to text, p_payload jsonb DEFAULT '{}')
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND pgfence._plain_arg(p_key, 256)
        AND pgfence._payload_problem(p_payload) IS NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch),
                            pgfence._arg_problem('task key', p_key, 256),
                            pgfence._payload_problem(p_payload));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
        END IF;
    END IF;
    IF p_from IS NULL OR p_to IS NULL
       OR p_from NOT IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled')
       OR p_to NOT IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgfence: unknown task state % -> %', p_from, p_to USING ERRCODE = '22023';
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, 'transition_task', 'tasks', p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    UPDATE pgfence.tasks
       SET state = p_to, fence = p_epoch, version = version + 1, updated_at = clock_timestamp(),
           assignee = CASE WHEN p_to = 'pending' THEN NULL ELSE assignee END
     WHERE lease = p_lease AND key = p_key AND state = p_from AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN pgfence._explain_miss(p_lease, p_epoch, p_key, 'transition_task');
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, p_to, coalesce(p_payload, '{}')) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok', NULL, p_epoch, false, ev);
END;
$$;

-- Appends an event to a task. The task row is fenced too (fence raised to p_epoch), so an older epoch can
-- never write this task again.
CREATE FUNCTION pgfence.append_event(p_lease text, p_epoch bigint, p_secret text, p_key text, p_kind text,
                                     p_payload jsonb DEFAULT '{}')
RETURNS pgfence.write_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    r pgfence.write_result;
    t pgfence.tasks;
    ev bigint;
BEGIN
    IF (pgfence._plain_lease_args(p_lease, p_epoch) AND pgfence._plain_arg(p_key, 256)
        AND pgfence._plain_arg(p_kind, 64) AND pgfence._payload_problem(p_payload) IS NULL) IS NOT TRUE THEN
        problem := coalesce(pgfence._lease_args_problem(p_lease, p_epoch),
                            pgfence._arg_problem('task key', p_key, 256),
                            pgfence._arg_problem('event kind', p_kind, 64),
                            pgfence._payload_problem(p_payload));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023';
        END IF;
    END IF;
    r := pgfence._guard(p_lease, p_epoch, p_secret, 'append_event', 'task_events', p_key);
    IF r.outcome IS NOT NULL THEN  -- (a composite IS NOT NULL only when all its fields are)
        RETURN r;
    END IF;
    UPDATE pgfence.tasks SET fence = p_epoch, updated_at = clock_timestamp()
     WHERE lease = p_lease AND key = p_key AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN pgfence._explain_miss(p_lease, p_epoch, p_key, 'append_event');
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, p_kind, coalesce(p_payload, '{}')) RETURNING id INTO ev;
    RETURN pgfence._task_result(t, 'ok', NULL, p_epoch, false, ev);
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Raw-SQL enforcement (off by default; `SELECT pgfence.set_enforcement(true)`): every INSERT or UPDATE of
-- pgfence.tasks must carry the lease's current epoch in `fence`, every INSERT into pgfence.task_events in
-- `epoch` (and name its task's lease), in a transaction that presented that tenure's secret to pgfence.fence
-- (or another guarded function) first; DELETE/TRUNCATE of tasks and moving a task to another lease are
-- refused; and every other pgfence table (leases, tenures, tenure_secrets, rejections, grants, instance) may
-- be written only by the schema owner — that is, through the pgfence functions — whatever table privileges a
-- role was given. The pgfence functions satisfy this by construction. Two modes for the task tables:
--   'error': the statement fails with SQLSTATE PF001 (its transaction aborts, so nothing can be recorded);
--   'audit': the offending row is skipped, the refusal is recorded in pgfence.rejections (operation
--            'raw_insert' / 'raw_update' / 'raw_delete') and a WARNING tells the client.
-- TRUNCATE is always refused with an error (a statement-level trigger cannot skip rows).

CREATE FUNCTION pgfence._enforce_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    presented bigint;
    target    text;
    key       text;
    l   pgfence.leases;
    why text;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses TRUNCATE on pgfence.%', TG_TABLE_NAME USING ERRCODE = 'PF001';
    END IF;
    -- Separate statements per table: plpgsql plans each one against NEW's row type when it first runs.
    IF TG_TABLE_NAME = 'tasks' AND TG_OP = 'DELETE' THEN
        target := OLD.lease; presented := OLD.fence; key := OLD.key; why := 'delete_refused';
    ELSIF TG_TABLE_NAME = 'tasks' THEN
        target := NEW.lease; presented := NEW.fence; key := NEW.key;
        IF TG_OP = 'UPDATE' AND NEW.lease IS DISTINCT FROM OLD.lease THEN
            why := 'lease_change';
        ELSIF TG_OP = 'UPDATE' AND NEW.fence < OLD.fence THEN
            why := 'row_fence';
        END IF;
    ELSE
        target := NEW.lease; presented := NEW.epoch; key := NEW.task_id::text;
        -- An event belongs to its task's lease: the epoch is checked against that lease, not one the
        -- statement names.
        IF NOT EXISTS (SELECT 1 FROM pgfence.tasks t WHERE t.id = NEW.task_id AND t.lease = NEW.lease) THEN
            why := 'lease_mismatch';
        END IF;
    END IF;
    -- Before anything is read: a role with table privileges may write only the clusters it has a grant on
    -- (this trigger runs before row-level security's check of the new row), and an epoch below 1 was never issued.
    IF NOT pgfence._may_use(pgfence._cluster_of(target)) THEN
        why := 'no_grant';
    ELSIF presented IS NULL OR presented < 1 THEN
        why := 'future_epoch';
    END IF;
    IF why IN ('no_grant', 'future_epoch') THEN
        IF TG_NARGS > 0 AND TG_ARGV[0] = 'audit' THEN
            PERFORM pgfence._reject(target, coalesce(presented, 0), NULL, NULL, why, 'raw_' || lower(TG_OP),
                                    TG_TABLE_NAME, key);
            RAISE WARNING 'pgfence: refused raw % on pgfence.% (%); recorded in pgfence.rejections',
                TG_OP, TG_TABLE_NAME, why;
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'pgfence: enforcement refuses this % on pgfence.% (%)', TG_OP, TG_TABLE_NAME, why
            USING ERRCODE = 'PF001';
    END IF;
    -- A transaction that did not present the tenure's secret is refused before it takes the guard lock.
    IF why IS NULL AND pgfence._secret_check(target, presented,
                                             current_setting(pgfence._fence_setting(
                                                 (SELECT x.lock_key FROM pgfence.leases x WHERE x.name = target)),
                                                 true)) = 'bad' THEN
        why := 'bad_secret';
    END IF;
    -- The guard's protocol: the lease's guard lock shared, then the row read in a new snapshot.
    SELECT * INTO l FROM pgfence.leases WHERE name = target;
    IF FOUND AND why IS DISTINCT FROM 'bad_secret' THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgfence: writes to pgfence.% need READ COMMITTED isolation; this transaction is %',
                TG_TABLE_NAME, upper(current_setting('transaction_isolation')) USING ERRCODE = 'PF004';
        END IF;
        IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(1885824613, l.lock_key) THEN
            PERFORM pgfence._wait_guard_lock(target, l.lock_key);
        END IF;
        SELECT * INTO l FROM pgfence.leases WHERE name = target;
    END IF;
    IF why IS NULL THEN
        why := pgfence._loss_reason(l, NULL, presented, clock_timestamp(), pgfence._timeline());
    END IF;
    -- Knowing the epoch is not enough: the transaction must have presented the tenure's secret to the guard.
    IF why IS NULL AND pgfence._secret_check(target, presented,
                                             current_setting(pgfence._fence_setting(l.lock_key), true))
                       IS DISTINCT FROM 'ok' THEN
        why := 'bad_secret';
    END IF;
    IF why IS NULL THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_NARGS > 0 AND TG_ARGV[0] = 'audit' THEN
        PERFORM pgfence._reject(target, presented, l.epoch, l.holder, why,
                                'raw_' || lower(TG_OP), TG_TABLE_NAME, key);
        RAISE WARNING 'pgfence: refused raw % on pgfence.% (%, presented epoch %, current %); recorded in pgfence.rejections',
            TG_OP, TG_TABLE_NAME, why, presented, l.epoch;
        RETURN NULL;
    END IF;
    IF why IN ('delete_refused', 'lease_change', 'lease_mismatch', 'bad_secret') THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses this % on pgfence.% (%)', TG_OP, TG_TABLE_NAME, why
            USING ERRCODE = 'PF001';
    END IF;
    RAISE EXCEPTION 'pgfence: stale write to %: presented epoch %, current epoch % (%)',
        target, presented, l.epoch, why USING ERRCODE = 'PF001';
END;
$$;

CREATE TRIGGER enforce_epoch BEFORE INSERT OR UPDATE OR DELETE ON pgfence.tasks
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('error');
CREATE TRIGGER enforce_audit BEFORE INSERT OR UPDATE OR DELETE ON pgfence.tasks
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('audit');
CREATE TRIGGER enforce_truncate BEFORE TRUNCATE ON pgfence.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._enforce_epoch();
CREATE TRIGGER enforce_epoch BEFORE INSERT ON pgfence.task_events
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('error');
CREATE TRIGGER enforce_audit BEFORE INSERT ON pgfence.task_events
    FOR EACH ROW EXECUTE FUNCTION pgfence._enforce_epoch('audit');
ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_epoch;
ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_audit;
ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_truncate;
ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_epoch;
ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_audit;

-- The other tables: only the schema owner writes them (SECURITY INVOKER on purpose: current_user is the role
-- whose statement writes, which is the owner inside every pgfence function).
CREATE FUNCTION pgfence._owner_writes_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence'), 'MEMBER')
    THEN
        RAISE EXCEPTION 'pgfence: enforcement refuses % on pgfence.% by role %: only the pgfence functions write it',
            TG_OP, TG_TABLE_NAME, quote_literal(regexp_replace(current_user, '[[:cntrl:]]', '?', 'g'))
            USING ERRCODE = 'PF001';
    END IF;
    RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END;
$$;
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['leases', 'tenures', 'tenure_secrets', 'rejections', 'grants', 'instance'] LOOP
        EXECUTE format('CREATE TRIGGER enforce_owner BEFORE INSERT OR UPDATE OR DELETE ON pgfence.%I '
                       'FOR EACH ROW EXECUTE FUNCTION pgfence._owner_writes_only()', t);
        EXECUTE format('CREATE TRIGGER enforce_owner_truncate BEFORE TRUNCATE ON pgfence.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence._owner_writes_only()', t);
        EXECUTE format('ALTER TABLE pgfence.%I DISABLE TRIGGER enforce_owner', t);
        -- TRUNCATE bypasses row-level security: refused to other roles whether enforcement is on or not.
    END LOOP;
END;
$$;

CREATE FUNCTION pgfence._append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgfence: pgfence.% is append-only', TG_TABLE_NAME USING ERRCODE = 'PF002';
END;
$$;
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON pgfence.task_events
    FOR EACH ROW EXECUTE FUNCTION pgfence._append_only();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON pgfence.task_events
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._append_only();

-- Its table locks (ALTER TABLE … TRIGGER, LOCK TABLE) wait at most _lock_wait_ms(), then fail with PF003
-- naming the backends that hold locks on pgfence tables.
CREATE FUNCTION pgfence.set_enforcement(p_on boolean, p_mode text DEFAULT 'error') RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    t text;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    PERFORM pgfence._require_instance_operator('set_enforcement');
    IF p_mode IS NULL OR p_mode NOT IN ('error', 'audit') THEN
        RAISE EXCEPTION 'pgfence: enforcement mode must be ''error'' or ''audit'', got %', pgfence._printable(p_mode)
            USING ERRCODE = '22023';
    END IF;
    PERFORM pgfence._harden();
    -- Lock both task tables up front, in the order readers join them (tasks, then task_events).
    LOCK TABLE pgfence.tasks, pgfence.task_events IN SHARE ROW EXCLUSIVE MODE;
    FOREACH t IN ARRAY ARRAY['leases', 'tenures', 'tenure_secrets', 'rejections', 'grants', 'instance'] LOOP
        EXECUTE format('ALTER TABLE pgfence.%I %s TRIGGER enforce_owner', t,
                       CASE WHEN p_on THEN 'ENABLE' ELSE 'DISABLE' END);
    END LOOP;
    ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_epoch;
    ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_audit;
    ALTER TABLE pgfence.tasks DISABLE TRIGGER enforce_truncate;
    ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_epoch;
    ALTER TABLE pgfence.task_events DISABLE TRIGGER enforce_audit;
    IF p_on AND p_mode = 'error' THEN
        ALTER TABLE pgfence.tasks ENABLE TRIGGER enforce_epoch;
        ALTER TABLE pgfence.task_events ENABLE TRIGGER enforce_epoch;
    ELSIF p_on THEN
        ALTER TABLE pgfence.tasks ENABLE TRIGGER enforce_audit;
        ALTER TABLE pgfence.task_events ENABLE TRIGGER enforce_audit;
    END IF;
    IF p_on THEN
        ALTER TABLE pgfence.tasks ENABLE TRIGGER enforce_truncate;
    END IF;
    RETURN p_on;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: set_enforcement waited % ms for a table lock; blocked by %', wait_ms,
        pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'A long transaction on pgfence tables holds them: let it finish and retry.';
END;
$$;

CREATE FUNCTION pgfence.enforcement() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT CASE t.tgname WHEN 'enforce_epoch' THEN 'error' ELSE 'audit' END
                       FROM pg_catalog.pg_trigger t
                      WHERE t.tgrelid = 'pgfence.tasks'::regclass AND t.tgname IN ('enforce_epoch', 'enforce_audit')
                        AND t.tgenabled <> 'D'
                      LIMIT 1), 'off')
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Identity: which server and which pgfence installation this is. SECURITY DEFINER so that roles without
-- access to pg_control_system() can still read the system identifier.
CREATE FUNCTION pgfence.identity(
    OUT system_identifier text, OUT database text, OUT instance_id text, OUT in_recovery boolean,
    OUT timeline bigint, OUT server_version text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    database := current_database();
    in_recovery := pg_is_in_recovery();
    server_version := current_setting('server_version');
    SELECT i.instance_id::text INTO instance_id FROM pgfence.instance i;
    BEGIN
        SELECT c.system_identifier::text INTO system_identifier FROM pg_control_system() c;
        -- On a primary, the timeline WAL is written on now; a standby cannot ask that, so the last checkpoint's.
        IF in_recovery THEN
            SELECT c.timeline_id INTO timeline FROM pg_control_checkpoint() c;
        ELSE
            timeline := pgfence._timeline();
        END IF;
    EXCEPTION WHEN insufficient_privilege THEN
        system_identifier := NULL;
        timeline := NULL;
    END;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Audit retention: deletes at most p_batch aggregated rejections last seen before now - p_older_than, and
-- returns how many it deleted. Callers loop until it returns 0; each call is a short transaction.
CREATE FUNCTION pgfence.prune_rejections(p_older_than interval, p_batch integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pgfence._require_instance_operator('prune_rejections');
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_batch IS NULL OR p_batch < 1 OR p_batch > 1000000 THEN
        RAISE EXCEPTION 'pgfence: prune needs a non-negative age and a batch of 1 to 1000000 rows'
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM pgfence.rejections
     WHERE id IN (SELECT id FROM pgfence.rejections
                   WHERE last_rejected_at < clock_timestamp() - p_older_than
                   ORDER BY last_rejected_at LIMIT p_batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Privileges. Everything belongs to the role that ran the migration (the owner). Nothing is granted to
-- PUBLIC. pgfence.grant_application records a grant per cluster in pgfence.grants and gives the role, once,
-- EXECUTE on the lease and guarded-write functions (SECURITY DEFINER, search_path pinned: they act as the owner,
-- and check the grant per call) and SELECT on the tables (filtered by row-level security) — and no INSERT,
-- UPDATE, DELETE or TRUNCATE on any of them, so the functions are its only write path. pgfence.grant_operator
-- adds force_release (per cluster) and, for every-cluster operators only, set_enforcement, prune_rejections
-- and set_takeover_grace.

REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON SCHEMA pgfence FROM PUBLIC;

-- Table privileges that amount to the owner's rights, and what they may have left behind. A trigger on a pgfence
-- table fires inside the pgfence functions, as the owner: whoever may create one (TRIGGER) can run anything as
-- the owner. TRUNCATE bypasses row-level security and REFERENCES can block writes. So these privileges are
-- revoked from every role but the owner, and triggers pgfence did not create are dropped (with a WARNING naming
-- them). Run by every grant, revoke and enforcement change, and at the end of the migration.
-- Its DROP TRIGGER waits at most _lock_wait_ms() for the table (PF003 naming who holds it).
CREATE FUNCTION pgfence._harden() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min' AS $$
DECLARE
    r record;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    FOR r IN SELECT c.relname, a.privilege_type,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.rolname) END AS grantee
               FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               CROSS JOIN LATERAL aclexplode(c.relacl) a
               LEFT JOIN pg_roles g ON g.oid = a.grantee
              WHERE n.nspname = 'pgfence' AND c.relkind IN ('r', 'v', 'p') AND a.grantee <> c.relowner
                AND a.privilege_type IN ('TRIGGER', 'TRUNCATE', 'REFERENCES')
    LOOP
        EXECUTE format('REVOKE %s ON pgfence.%I FROM %s', r.privilege_type, r.relname, r.grantee);
    END LOOP;
    FOR r IN SELECT c.relname, t.tgname
               FROM pg_trigger t
               JOIN pg_class c ON c.oid = t.tgrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'pgfence' AND NOT t.tgisinternal
                AND t.tgname NOT IN ('lease_change', 'lease_delete', 'lease_truncate', 'enforce_epoch',
                                     'enforce_audit', 'enforce_truncate', 'append_only', 'append_only_truncate',
                                     'enforce_owner', 'enforce_owner_truncate')
    LOOP
        EXECUTE format('DROP TRIGGER %I ON pgfence.%I', r.tgname, r.relname);
        RAISE WARNING 'pgfence: dropped trigger % on pgfence.%: a trigger on a pgfence table runs as its owner',
            pgfence._printable(r.tgname), r.relname;
    END LOOP;
    -- Grants of roles that were dropped (their oid could one day be reused).
    DELETE FROM pgfence.grants g WHERE NOT EXISTS (SELECT 1 FROM pg_roles pr WHERE pr.oid = g.role::oid);
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: dropping a foreign trigger waited % ms for its table; blocked by %', wait_ms,
        pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'A long transaction on pgfence tables holds them: let it finish and retry.';
END;
$$;

-- Records a grant of p_cluster (NULL: every cluster) to p_role and gives it the object privileges. Refuses
-- (22023) PUBLIC, pseudo-roles and predefined pg_* roles (every role would get the rights), superusers and
-- BYPASSRLS roles (no grant can bound what they read or do), and the owner and its members (trusted already).
CREATE FUNCTION pgfence._grant(p_role text, p_cluster text, p_operator boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pg_roles;
    problem text := CASE WHEN p_cluster IS NOT NULL THEN pgfence._cluster_problem(p_cluster) END;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid cluster: %', problem USING ERRCODE = '22023';
    END IF;
    IF pgfence._text_problem(p_role, 63) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid role: %', pgfence._text_problem(p_role, 63) USING ERRCODE = '22023';
    END IF;
    IF lower(p_role) IN ('public', 'current_user', 'current_role', 'session_user', 'user', 'none')
       OR starts_with(p_role, 'pg_') THEN
        RAISE EXCEPTION 'pgfence: refusing to grant to %: PUBLIC, pseudo-roles and predefined pg_* roles stand for many roles',
            pgfence._printable(p_role)
            USING ERRCODE = '22023', HINT = 'Grant to a role of the application, e.g. CREATE ROLE app LOGIN.';
    END IF;
    SELECT * INTO r FROM pg_roles WHERE rolname = p_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: role % does not exist', pgfence._printable(p_role) USING ERRCODE = '42704';
    END IF;
    IF r.rolsuper OR r.rolbypassrls THEN
        RAISE EXCEPTION 'pgfence: refusing to grant to %: a superuser or BYPASSRLS role is not bounded by grants',
            pgfence._printable(p_role) USING ERRCODE = '22023';
    END IF;
    IF pg_has_role(r.oid, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence'), 'MEMBER') THEN
        RAISE EXCEPTION 'pgfence: refusing to grant to %: it owns the pgfence schema (or is a member of its owner) and is trusted already',
            pgfence._printable(p_role) USING ERRCODE = '22023';
    END IF;
    PERFORM pgfence._harden();
    INSERT INTO pgfence.grants (role, cluster, operator) VALUES (r.oid::regrole, p_cluster, p_operator)
    ON CONFLICT (role, coalesce(cluster, '')) DO UPDATE SET operator = pgfence.grants.operator OR EXCLUDED.operator;
    EXECUTE format('GRANT USAGE ON SCHEMA pgfence TO %I', p_role);
    EXECUTE format('GRANT SELECT ON pgfence.instance, pgfence.leases, pgfence.tenures, pgfence.tasks, '
                   'pgfence.task_events, pgfence.rejections, pgfence.grants, pgfence.tenure_history TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgfence.acquire(text, text, bigint), '
                   'pgfence.renew(text, text, bigint, text, bigint), '
                   'pgfence.renew_many(text[], bigint[], text[], text, bigint), '
                   'pgfence.release(text, text, bigint, text), pgfence.fence(text, bigint, text, text, text, text), '
                   'pgfence.create_task(text, bigint, text, text, jsonb), '
                   'pgfence.claim_task(text, bigint, text, text, text), '
                   'pgfence.transition_task(text, bigint, text, text, text, text, jsonb), '
                   'pgfence.append_event(text, bigint, text, text, text, jsonb), pgfence.enforcement(), '
                   'pgfence.ungated_write(text, bigint), '
                   'pgfence.identity(), pgfence._reads_all(), pgfence._readable_clusters(), '
                   -- Row-level security policies and CHECK constraints run as the querying role.
                   'pgfence._text_problem(text, integer), pgfence._cluster_problem(text), '
                   'pgfence._lease_problem(text) TO %I', p_role);
    IF p_operator THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgfence.force_release(text), '
                       'pgfence.set_enforcement(boolean, text), pgfence.prune_rejections(interval, integer), '
                       'pgfence.set_takeover_grace(interval) TO %I', p_role);
    END IF;
END;
$$;

-- Grants p_role the application rights on cluster p_cluster (NULL: every cluster): acquire, renew, release
-- and guarded writes of that cluster's leases, and reading its rows.
CREATE FUNCTION pgfence.grant_application(p_role text, p_cluster text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgfence._grant(p_role, p_cluster, false)
$$;

-- Grants p_role the application and operator rights on cluster p_cluster (NULL: every cluster, which adds the
-- instance settings and audit retention).
CREATE FUNCTION pgfence.grant_operator(p_role text, p_cluster text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgfence._grant(p_role, p_cluster, true)
$$;

-- Removes p_role's grant of p_cluster (NULL: its every-cluster grant); once the role has no grant left, also
-- its object privileges. Returns how many grants it removed (0 or 1).
CREATE FUNCTION pgfence.revoke(p_role text, p_cluster text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    oid_ oid := (SELECT r.oid FROM pg_roles r WHERE r.rolname = p_role);
BEGIN
    IF oid_ IS NULL THEN
        RAISE EXCEPTION 'pgfence: role % does not exist', pgfence._printable(p_role) USING ERRCODE = '42704';
    END IF;
    PERFORM pgfence._harden();
    DELETE FROM pgfence.grants g WHERE g.role = oid_::regrole AND g.cluster IS NOT DISTINCT FROM p_cluster;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF NOT EXISTS (SELECT 1 FROM pgfence.grants g WHERE g.role = oid_::regrole) THEN
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM %I', p_role);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM %I', p_role);
        EXECUTE format('REVOKE ALL ON SCHEMA pgfence FROM %I', p_role);
    ELSIF NOT EXISTS (SELECT 1 FROM pgfence.grants g WHERE g.role = oid_::regrole AND g.operator) THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION pgfence.force_release(text), '
                       'pgfence.set_enforcement(boolean, text), pgfence.prune_rejections(interval, integer), '
                       'pgfence.set_takeover_grace(interval) FROM %I', p_role);
    END IF;
    RETURN n;
END;
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

SELECT pgfence._harden();
