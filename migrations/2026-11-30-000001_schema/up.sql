-- pgfence migration 1 of 6, the schema: the pgfence schema, its tables, indexes and result types; the text and
-- argument checks that table constraints and functions share; the lock-wait and message helpers; the trust rule
-- (which clusters a session's role may use) and the audit's one writer (_reject); the installation's identity.
-- Called from Rust by src/store/ (Store::migrate applies every migration in order; pgfence.identity());
-- src/validate.rs mirrors the text checks. The other concerns build on it: 000002_lease_protocol,
-- 000003_guard, 000004_tasks, 000005_membership, 000006_roles.
--
-- pgfence stores leases, tenures, tasks, task events and the audit of refused writes.
--
-- Every object lives in the schema `pgfence`. Epochs are never reset or deleted: a lease row, once created,
-- stays forever (a trigger refuses DELETE, TRUNCATE and any lowering of an epoch), and every acquisition issues
-- `epoch + 1` (more after a failover: see pgfence.acquire).
--
-- Clocks: every expiry decision uses `clock_timestamp()` (the database's clock at the moment of the
-- statement), never `now()` (the transaction start) and never a client's clock.
--
-- Locking protocol (why the guard is linearizable against takeovers, and why a takeover is never starved):
--   * every lease has a *guard lock*: the transaction-level advisory lock (_guard_lock_class(), lock_key) in the
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
-- would roll its own audit row back: outcome 'refused', the reason saying why ('no_grant', 'bad_secret',
-- 'superseded', ...). A NULL tenure secret is an invalid argument (22023), not a refusal.

DO $$
BEGIN
    -- Text checks use Unicode normalization (IS NFC NORMALIZED), which needs a UTF8 database.
    IF pg_catalog.current_setting('server_encoding') <> 'UTF8' THEN
        RAISE EXCEPTION 'pgfence needs a UTF8 database; this one is %', pg_catalog.current_setting('server_encoding')
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- The schema: created here, or, when it exists already (Store::migrate creates it first, for diesel's record of
-- applied migrations), checked to be the migrating role's alone: a schema another role made before pgfence was
-- installed (or an object of another role in it, or a CREATE on it for another role) would let that role replace
-- pgfence's functions, the trust root. Store::migrate runs the same check before it applies anything (the
-- query in src/store/migrate.rs); this is its backstop for a harness that did not.
DO $$
DECLARE
    problems text;
    me oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user);
    s oid := (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence');
BEGIN
    IF s IS NULL THEN
        CREATE SCHEMA pgfence;
        RETURN;
    END IF;
    SELECT pg_catalog.string_agg(p.problem, '; ') INTO problems FROM (
        SELECT pg_catalog.format('the schema is owned by %s, not by %s (the role migrating)',
                   pg_catalog.quote_literal(pg_catalog.pg_get_userbyid(n.nspowner)),
                   pg_catalog.quote_literal(current_user::text)) AS problem
          FROM pg_catalog.pg_namespace n WHERE n.oid = s AND n.nspowner <> me
        UNION ALL
        SELECT pg_catalog.format('the schema grants %s to %s (granted by %s)', a.privilege_type,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE pg_catalog.quote_literal(pg_catalog.pg_get_userbyid(a.grantee)) END,
                   pg_catalog.quote_literal(pg_catalog.pg_get_userbyid(a.grantor)))
          FROM pg_catalog.pg_namespace n CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
         WHERE n.oid = s AND a.grantee <> me AND (a.grantor <> me OR a.privilege_type = 'CREATE')
        UNION ALL
        SELECT pg_catalog.format('%s is owned by %s', o.what,
                   pg_catalog.quote_literal(pg_catalog.pg_get_userbyid(o.owner)))
          FROM (SELECT 'relation pgfence.' || pg_catalog.quote_ident(c.relname), c.relowner
                  FROM pg_catalog.pg_class c WHERE c.relnamespace = s
                UNION ALL SELECT 'function ' || p.oid::pg_catalog.regprocedure::text, p.proowner
                  FROM pg_catalog.pg_proc p WHERE p.pronamespace = s
                UNION ALL SELECT 'type pgfence.' || pg_catalog.quote_ident(t.typname), t.typowner
                  FROM pg_catalog.pg_type t WHERE t.typnamespace = s
                UNION ALL SELECT 'operator pgfence.' || o.oprname, o.oprowner
                  FROM pg_catalog.pg_operator o WHERE o.oprnamespace = s
                UNION ALL SELECT 'collation pgfence.' || pg_catalog.quote_ident(c.collname), c.collowner
                  FROM pg_catalog.pg_collation c WHERE c.collnamespace = s
                UNION ALL SELECT 'conversion pgfence.' || pg_catalog.quote_ident(c.conname), c.conowner
                  FROM pg_catalog.pg_conversion c WHERE c.connamespace = s
                UNION ALL SELECT 'operator family pgfence.' || pg_catalog.quote_ident(f.opfname), f.opfowner
                  FROM pg_catalog.pg_opfamily f WHERE f.opfnamespace = s
                UNION ALL SELECT 'operator class pgfence.' || pg_catalog.quote_ident(c.opcname), c.opcowner
                  FROM pg_catalog.pg_opclass c WHERE c.opcnamespace = s
                UNION ALL SELECT 'text search configuration pgfence.' || pg_catalog.quote_ident(c.cfgname), c.cfgowner
                  FROM pg_catalog.pg_ts_config c WHERE c.cfgnamespace = s
                UNION ALL SELECT 'text search dictionary pgfence.' || pg_catalog.quote_ident(d.dictname), d.dictowner
                  FROM pg_catalog.pg_ts_dict d WHERE d.dictnamespace = s
                UNION ALL SELECT 'statistics object pgfence.' || pg_catalog.quote_ident(x.stxname), x.stxowner
                  FROM pg_catalog.pg_statistic_ext x WHERE x.stxnamespace = s) o(what, owner)
         WHERE o.owner <> me) p;
    IF problems IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: refusing to install into a schema pgfence that another role controls: %',
            pg_catalog.regexp_replace(problems, '[[:cntrl:]]', '?', 'g')
            USING ERRCODE = '42501',
                  HINT = 'DROP SCHEMA pgfence (as its owner or a superuser) when it holds nothing of yours, or remove '
                         'what another role owns or was granted in it, then migrate again.';
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- The constants: each limit and the guard lock's class, one function each, named at every place that uses it.
-- IMMUTABLE SQL returning a literal: PostgreSQL inlines the call and folds it to the constant when it plans the
-- statement, so a named limit costs what the literal did. The Rust API has the same values as public constants
-- (pgfence::MAX_NAME_LEN, …, pgfence::GUARD_LOCK_CLASS); tests/sql_source.rs compares them with these on a
-- migrated database. The limits that table CHECK constraints name are executable by the granted roles (a
-- constraint runs as the role that writes the row; see _granted_privileges).

-- The first key of every guard lock and intent lock: the guard lock of a lease is the transaction-level advisory
-- lock (_guard_lock_class(), lock_key), its intent lock (_guard_lock_class(), -lock_key), in the two-integer key
-- space (0x70676665, "pgfe"; pg_locks shows it as classid). native/pgfence_native.c names it PGFENCE_LOCK_CLASS.
CREATE FUNCTION pgfence._guard_lock_class() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 1885824613';
-- Longest cluster name, in characters.
CREATE FUNCTION pgfence._max_cluster_len() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 63';
-- Longest lease (and group) name after its cluster, in characters.
CREATE FUNCTION pgfence._max_name_len() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 200';
-- Longest holder, member, task key, assignee and audited target key, in characters.
CREATE FUNCTION pgfence._max_holder_len() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 256';
-- Longest label: an operation, a target table, a refusal reason, a belief's detail, in characters.
CREATE FUNCTION pgfence._max_label_len() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 64';
-- Longest task event kind, in characters.
CREATE FUNCTION pgfence._max_kind_len() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 64';
-- Longest endpoint a holder reports with its belief, in characters.
CREATE FUNCTION pgfence._max_endpoint_len() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 512';
-- Shortest and longest ttl of a tenure, in milliseconds.
CREATE FUNCTION pgfence._min_ttl_ms() RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 100::bigint';
CREATE FUNCTION pgfence._max_ttl_ms() RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 86400000::bigint';

-- ---------------------------------------------------------------------------------------------------------
-- What pgfence stores: the one definition, shared by the table constraints and the functions' argument checks,
-- and mirrored exactly by the Rust API (src/validate.rs, check_text). A text is 1 to max characters, has no
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

-- Why p_cluster is not a cluster name (1 to _max_cluster_len() characters, no '/'), NULL when it is.
CREATE FUNCTION pgfence._cluster_problem(p_cluster text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(pgfence._text_problem(p_cluster, pgfence._max_cluster_len()),
                               CASE WHEN pg_catalog.strpos(p_cluster, '/') OPERATOR(pg_catalog.>) 0
                                    THEN 'must not contain ''/''' END)
$$;

-- Why p_lease is not a cluster-qualified lease name ('<cluster>/<name>', the name 1 to _max_name_len() characters and split
-- at the first '/'), NULL when it is.
CREATE FUNCTION pgfence._lease_problem(p_lease text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_lease IS NULL OR pg_catalog.strpos(p_lease, '/') OPERATOR(pg_catalog.=) 0
            THEN 'must be cluster-qualified: ''<cluster>/<name>'''
        ELSE coalesce(
            'cluster ' OPERATOR(pg_catalog.||) pgfence._cluster_problem(pg_catalog.split_part(p_lease, '/', 1)),
            'lease name ' OPERATOR(pg_catalog.||)
                pgfence._text_problem(pg_catalog.substr(p_lease, pg_catalog.strpos(p_lease, '/') OPERATOR(pg_catalog.+) 1),
                                      pgfence._max_name_len()))
    END
$$;

-- The same rules as the table constraints ask them: whether the value may be stored. plpgsql on purpose: every
-- statement that writes a table prepares its CHECK expressions anew (prepared statements and plpgsql bodies too),
-- and an inlinable SQL function in one is parsed and inlined each time — with _lease_problem's nested calls, about
-- 0.3 ms of every INSERT or UPDATE of a lease row, half of the statement (docs/performance.md, "Table
-- constraints"); a plpgsql function plans its expression once per session. Qualified calls only, as above.
CREATE FUNCTION pgfence._storable_text(p_value text, p_max integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN pgfence._text_problem(p_value, p_max) IS NULL;
END;
$$;

CREATE FUNCTION pgfence._storable_cluster(p_cluster text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN pgfence._cluster_problem(p_cluster) IS NULL;
END;
$$;

CREATE FUNCTION pgfence._storable_lease(p_lease text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN pgfence._lease_problem(p_lease) IS NULL;
END;
$$;

-- The cluster of a qualified lease name.
CREATE FUNCTION pgfence._cluster_of(p_lease text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT split_part(p_lease, '/', 1)
$$;

-- The audit's place (pgfence.rejections.slot) for the 'other' row of a refusal reason that a tenure explains:
-- 16 to 25, one per reason; NULL for any other reason (those are never of scope 'tenure'). The ten reasons are
-- every reason pgfence's functions refuse a tenure's write, renewal or release for (the guard, renew,
-- renew_many, release, report_belief, the task writes and the raw-SQL enforcement).
CREATE FUNCTION pgfence._tenure_reason_slot(p_reason text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (15 OPERATOR(pg_catalog.+) pg_catalog.array_position(
               ARRAY['superseded', 'expired', 'released', 'failover', 'holder_mismatch', 'bad_secret', 'row_fence',
                     'delete_refused', 'lease_change', 'lease_mismatch']::text[], p_reason))::smallint
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
    name        text PRIMARY KEY CHECK (pgfence._storable_lease(name)),
    -- The second key of the lease's guard lock (see the locking protocol above).
    lock_key    integer GENERATED ALWAYS AS IDENTITY UNIQUE CHECK (lock_key > 0),  -- (_guard_lock_class(), -lock_key) is the intent lock
    holder      text CHECK (holder IS NULL OR pgfence._storable_text(holder, pgfence._max_holder_len())),
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
    holder      text NOT NULL CHECK (pgfence._storable_text(holder, pgfence._max_holder_len())),
    acquired_at timestamptz NOT NULL,
    ended_at    timestamptz,
    end_reason  text CHECK (end_reason IN ('released', 'expired', 'forced', 'reacquired', 'failover')),
    timeline    bigint,
    -- The transaction that granted the tenure. The row is updated when the tenure ends, so its xmin names the
    -- ending transaction; this column keeps the acquisition's (its commit time: pg_xact_commit_timestamp).
    acquired_xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    -- The acquiring connection as the server saw it (pgfence._server_view): the server's system identifier and
    -- pgfence instance, the address and port it was reached at and the client's (a pooler's, when one is in
    -- between; NULL over a Unix socket), and the session's application_name (client-chosen: escape it to print).
    system_identifier text,
    instance_id       uuid,
    server_addr       text,
    client_addr       text,
    application_name  text,
    PRIMARY KEY (lease, epoch)
);

-- What each holder believed, as it reports it (pgfence.report_belief): when it started believing it led the
-- tenure (the acquisition reply) and when it stopped (a loss noticed, its local deadline, a release, a refused
-- write, a shutdown), by ITS OWN wall clock (UTC), and the endpoint it used as it saw it (host:port/dbname,
-- without credentials). Each report also carries the holder's clock when it was sent and gets the database
-- clock when it arrived, which bound the two clocks' offset without trusting either (docs/investigation.md).
-- Reports are best effort and after the fact: one that never arrives (a killed process) leaves its columns
-- NULL — an unknown, never an invented end. The row is created with the tenure; only the owner reads it (its
-- report_hash lets a holder report after a successor replaced its tenure's secret); roles read
-- pgfence.tenure_history.
CREATE TABLE pgfence.beliefs (
    lease             text NOT NULL,
    epoch             bigint NOT NULL,
    -- SHA-256 of the tenure's secret, as in tenure_secrets, kept after the tenure ends.
    report_hash       bytea NOT NULL CHECK (length(report_hash) = 32),
    endpoint          text CHECK (endpoint IS NULL OR pgfence._storable_text(endpoint, pgfence._max_endpoint_len())),
    believed_from     timestamptz,
    start_sent_at     timestamptz,
    start_received_at timestamptz,
    believed_until    timestamptz,
    end_cause         text CHECK (end_cause IN ('released', 'lost', 'deadline', 'write_refused', 'shutdown')),
    end_detail        text CHECK (end_detail IS NULL OR pgfence._storable_text(end_detail, pgfence._max_label_len())),
    end_sent_at       timestamptz,
    end_received_at   timestamptz,
    PRIMARY KEY (lease, epoch),
    FOREIGN KEY (lease, epoch) REFERENCES pgfence.tenures (lease, epoch)
);

-- The last admitted guarded write of each tenure, per database session (backend), for the writes pgfence
-- cannot see itself: pgfence.fence (a fenced transaction, Store::guarded_write's statement, the SQL guard)
-- marks the first write it admits in each second (database clock, read after the guard admitted it), and a
-- session setting (pgfence.write_mark) remembers the last mark, so the session's other writes of that second
-- pay one comparison. So the last write a tenure had admitted is at most one second after its latest mark.
-- What a mark stands for: a committed transaction whose guard admitted a write of the tenure. The mark is
-- written in the writer's transaction, so a transaction rolled back leaves none (its session setting is rolled
-- back with it); but the database cannot see what a fenced transaction or a guarded statement then wrote, so
-- one that committed having changed no row (a guarded_write whose WHERE matched nothing) leaves a mark all the
-- same: a mark may be later than the tenure's last changed row, never earlier. The task functions never mark:
-- every task write that writes appends an event (exact), and one that writes nothing (not_found, conflict, a
-- row_fence refusal, a create_task retry that found its task) leaves neither. Writes of an epoch can only
-- commit before a successor's acquisition (the guard lock), so these rows are final once it committed.
CREATE TABLE pgfence.write_marks (
    lease   text NOT NULL,
    epoch   bigint NOT NULL,
    backend integer NOT NULL,
    last_at timestamptz NOT NULL,
    PRIMARY KEY (lease, epoch, backend)
);

CREATE TABLE pgfence.tasks (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lease      text NOT NULL REFERENCES pgfence.leases (name),
    key        text NOT NULL CHECK (pgfence._storable_text(key, pgfence._max_holder_len())),
    state      text NOT NULL CHECK (state IN ('pending', 'claimed', 'running', 'succeeded', 'failed', 'cancelled')),
    assignee   text CHECK (assignee IS NULL OR pgfence._storable_text(assignee, pgfence._max_holder_len())),
    payload    jsonb NOT NULL DEFAULT '{}',
    -- the highest epoch that ever wrote this row: a write presenting a lower epoch is stale
    fence      bigint NOT NULL CHECK (fence >= 1),
    version    bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (lease, key)
);

-- Append-only: a trigger (000004_tasks) refuses UPDATE and DELETE.
CREATE TABLE pgfence.task_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    bigint NOT NULL REFERENCES pgfence.tasks (id),
    lease      text NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch >= 1),
    kind       text NOT NULL CHECK (pgfence._storable_text(kind, pgfence._max_kind_len())),
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX task_events_task_idx ON pgfence.task_events (task_id, id);
CREATE INDEX task_events_epoch_idx ON pgfence.task_events (lease, epoch, id);

-- The effect ledger: what a tenure was about to do outside the database for a task (an external call: launch a
-- workload, call a runtime), recorded under its fence BEFORE the call (the intent), and what came of it AFTER (the
-- outcome: 'done' with the external system's answer, 'failed', or 'unknown' after a timeout). One row per attempt
-- of an effect key, the idempotency key the external system is asked about: stable across retries and successors,
-- unique per lease, one task's. An attempt without an outcome whose tenure ended, or whose outcome is 'unknown', is
-- in doubt until one tenure settles it, once (settlement): 'confirmed' (the effect happened: settle_detail says what
-- was observed), 'retried' (the next attempt of the same key, under the settling epoch) or 'abandoned' (a reason).
-- Written only by the pgfence functions (000004_tasks: record_intent, record_outcome, settle_effect).
CREATE TABLE pgfence.effects (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id        bigint NOT NULL REFERENCES pgfence.tasks (id),
    lease          text NOT NULL,
    effect_key     text NOT NULL CHECK (pgfence._storable_text(effect_key, pgfence._max_holder_len())),
    attempt        integer NOT NULL CHECK (attempt >= 1),
    -- The tenure that recorded the intent, and the SHA-256 of its secret (as in tenure_secrets, kept after the
    -- tenure ends): a late outcome is kept as evidence only from that tenure.
    epoch          bigint NOT NULL CHECK (epoch >= 1),
    tenure_hash    bytea NOT NULL CHECK (length(tenure_hash) = 32),
    intent         jsonb NOT NULL,
    intended_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    outcome        text CHECK (outcome IN ('done', 'failed', 'unknown')),
    outcome_detail jsonb,
    outcome_at     timestamptz,
    settlement     text CHECK (settlement IN ('confirmed', 'retried', 'abandoned')),
    settled_epoch  bigint,
    settle_detail  jsonb,
    settled_at     timestamptz,
    UNIQUE (lease, effect_key, attempt),
    CHECK ((outcome IS NULL) = (outcome_at IS NULL) AND (outcome IS NULL) = (outcome_detail IS NULL)),
    CHECK ((settlement IS NULL) = (settled_epoch IS NULL) AND (settlement IS NULL) = (settled_at IS NULL)
           AND (settlement IS NULL) = (settle_detail IS NULL)),
    CHECK (settled_epoch IS NULL OR settled_epoch >= epoch)
);
CREATE INDEX effects_task_idx ON pgfence.effects (task_id, id);
-- The unsettled attempts without a final outcome, the only ones that can be in doubt: by task (what a task write
-- checks) and by lease (what a successor lists).
CREATE INDEX effects_open_task_idx ON pgfence.effects (task_id)
    WHERE settlement IS NULL AND (outcome IS NULL OR outcome = 'unknown');
CREATE INDEX effects_open_lease_idx ON pgfence.effects (lease, id)
    WHERE settlement IS NULL AND (outcome IS NULL OR outcome = 'unknown');

-- Late reports: an outcome that an attempt's own tenure sent after the tenure had ended. Refused as a write
-- (audited in pgfence.rejections like every stale write) and kept here as evidence for the successor, which it
-- may spare a question to the external system; it changes nothing else. One row per attempt: a final answer
-- ('done', 'failed') replaces an earlier 'unknown', never the reverse; repeats are counted.
CREATE TABLE pgfence.effect_reports (
    effect_id bigint PRIMARY KEY REFERENCES pgfence.effects (id),
    lease     text NOT NULL,
    epoch     bigint NOT NULL,
    outcome   text NOT NULL CHECK (outcome IN ('done', 'failed', 'unknown')),
    detail    jsonb NOT NULL,
    role      name NOT NULL DEFAULT session_user,
    first_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    count     bigint NOT NULL DEFAULT 1 CHECK (count >= 1)
);
CREATE INDEX effect_reports_lease_idx ON pgfence.effect_reports (lease, effect_id);

-- The audit of refusals: writes, renewals and releases refused because they presented a stale epoch or a wrong
-- tenure secret, and calls refused because the role has no grant on the cluster. Every row names the refused
-- login role (`role`, the session_user) and aggregates repeats, so a caller retrying in a tight loop grows a
-- counter, not the table, and one role's refusals never touch another role's rows:
--   * scope 'tenure' (a tenure explains the refusal: superseded, expired, released, failover, holder_mismatch,
--     bad_secret, row_fence, and the raw-SQL enforcement's delete_refused, lease_change, lease_mismatch — the
--     ten of _tenure_reason_slot): one row per (role, lease, presented epoch, operation, reason), so every
--     reason is counted apart (a forgery is never counted as a stale write). The first refusal's epochs are
--     kept; count, last_rejected_at and last_target_key move. At most 26 rows per (role, lease, presented
--     epoch): the first 16 (operation, reason) pairs take the places 0 to 15, and the refusals of any further
--     pair are counted in the row ('other', reason) in that reason's place (16 to 25).
--   * scope 'role' (no tenure to explain it: no_grant, unknown_lease, future_epoch): one row per (role, reason),
--     whatever the lease, epoch or operation, so a flood of distinct bogus names costs one row per role and
--     reason in all. `lease`, `presented_epoch`, `operation` and `target_*` are the first refusal's; `last_lease`
--     and `last_target_key` the latest's.
-- Every text is bounded by the same limits as the API (so are the arguments it comes from).
CREATE TABLE pgfence.rejections (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role             name NOT NULL DEFAULT session_user,
    scope            text NOT NULL CHECK (scope IN ('tenure', 'role')),
    lease            text NOT NULL CHECK (pgfence._storable_lease(lease)),
    presented_epoch  bigint NOT NULL,
    current_epoch    bigint,
    current_holder   text CHECK (current_holder IS NULL OR pgfence._storable_text(current_holder, pgfence._max_holder_len())),
    reason           text NOT NULL CHECK (pgfence._storable_text(reason, pgfence._max_label_len())),
    operation        text NOT NULL CHECK (pgfence._storable_text(operation, pgfence._max_label_len())),
    target_table     text CHECK (target_table IS NULL OR pgfence._storable_text(target_table, pgfence._max_label_len())),
    target_key       text CHECK (target_key IS NULL OR pgfence._storable_text(target_key, pgfence._max_holder_len())),
    rejected_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_rejected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    count            bigint NOT NULL DEFAULT 1,
    last_lease       text CHECK (last_lease IS NULL OR pgfence._storable_lease(last_lease)),
    last_target_key  text CHECK (last_target_key IS NULL OR pgfence._storable_text(last_target_key, pgfence._max_holder_len())),
    -- PostgreSQL keeps application_name to printable ASCII and 63 bytes.
    application_name text DEFAULT current_setting('application_name', true),
    client_addr      inet DEFAULT inet_client_addr(),
    backend_pid      integer NOT NULL DEFAULT pg_backend_pid(),
    -- Tenure scope: which of the 26 places of its (role, lease, presented epoch) the row takes (0 to 15 for the
    -- first 16 (operation, reason) pairs, 16 to 25 for the row ('other', reason) of each reason a tenure
    -- explains: _tenure_reason_slot). A unique index on it bounds the rows of one tenure and role however many
    -- connections insert new pairs at once (a count read before the insert could not).
    slot             smallint CHECK (slot BETWEEN 0 AND 25),
    CHECK ((scope = 'tenure') = (slot IS NOT NULL)),
    CHECK (scope = 'role' OR pgfence._tenure_reason_slot(reason) IS NOT NULL),
    CHECK (slot < 16 OR (operation = 'other' AND slot = pgfence._tenure_reason_slot(reason)))
);
CREATE INDEX rejections_lease_idx ON pgfence.rejections (lease, id);
CREATE UNIQUE INDEX rejections_tenure_idx ON pgfence.rejections (role, lease, presented_epoch, operation, reason)
    WHERE scope = 'tenure';
CREATE UNIQUE INDEX rejections_slot_idx ON pgfence.rejections (role, lease, presented_epoch, slot)
    WHERE scope = 'tenure';
CREATE UNIQUE INDEX rejections_role_idx ON pgfence.rejections (role, reason) WHERE scope = 'role';
CREATE INDEX rejections_age_idx ON pgfence.rejections (last_rejected_at);

-- Who may use which cluster. A row grants `role` (and every role that is a member of it) the application rights
-- on `cluster`, or on every cluster when `cluster` is NULL; `operator` adds force-release on it (and, on every
-- cluster, the instance settings and audit retention). Written only by pgfence.grant_application,
-- grant_operator and revoke (the owner's).
CREATE TABLE pgfence.grants (
    role       regrole NOT NULL,
    cluster    text CHECK (cluster IS NULL OR pgfence._storable_cluster(cluster)),
    operator   boolean NOT NULL DEFAULT false,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The login role of the session that wrote the row, set by a trigger whatever the statement says
    -- (000006_roles): a row written in a session whose login role is not trusted is refused, and removed by
    -- _harden should one ever get in.
    granted_by name NOT NULL DEFAULT session_user
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
-- Result rows. Functions return one composite value so that a client calls them with one statement that every
-- driver prepares once and reuses, `SELECT * FROM pgfence.f(...)`, and reads the fields by name.

-- outcome: 'acquired' | 'renewed' | 'released' (done) | 'held' (acquire: another holder's live tenure) |
--          'not_held' (release, force_release: no live tenure of that epoch to end) | 'refused' (the presented
--          tenure, or the role, may not do this; audited) | 'busy' (acquire_many only: another transaction holds
--          the lease's row or guard lock; nothing done for it, acquire it alone)
-- reason (for 'refused'): 'no_grant' | 'bad_secret' | 'superseded' | 'expired' | 'released' | 'unknown_lease'
--                         | 'future_epoch' | 'failover'; (for 'not_held'): the same loss reasons;
--        (for 'released'): NULL, or 'expired' / 'failover' when the tenure had already ended that way
-- secret: only with 'acquired': the tenure's secret, returned this once (64 hexadecimal characters).
CREATE TYPE pgfence.lease_result AS (
    outcome       text,
    reason        text,
    epoch         bigint,
    holder        text,
    expires_in_ms bigint,
    secret        text
);

-- outcome: 'ok' | 'refused' (not written, audited) | 'not_found' | 'conflict' (not written, not audited: business
--          answers of a tenure that may write) | 'in_doubt' (claim_task, transition_task: not written, the task
--          has an unsettled effect of an ended tenure, or one whose outcome is 'unknown': settle it first)
-- reason  (for 'refused'): as in lease_result, or 'row_fence'; (for 'conflict'): the task's actual state; (for
--          'in_doubt'): the effect key in doubt, and current_epoch the epoch of the tenure that recorded it
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

-- The answer of the effect ledger's writes (record_intent, record_outcome, settle_effect): the attempt after the
-- write, or why nothing was written.
-- outcome: 'ok' | 'refused' (not written, audited; reason as in write_result) | 'not_found' (no such task or effect
--          key: nothing written) | 'conflict' (not written, not audited; reason: 'done' — the key's effect is done
--          or confirmed, 'intent_differs' — in flight under this tenure with another intent, 'other_task' — the
--          key is another task's, 'settled' — settled already (settled_epoch says by whom), 'not_in_doubt' — it
--          has a final outcome, 'in_flight' — its own tenure is the current one and has not reported,
--          'not_this_tenure' — an outcome for an attempt of another tenure, 'outcome_recorded' — another outcome
--          stands) | 'in_doubt' (not written: the task has an unsettled effect of an ended tenure, or one whose
--          outcome is 'unknown'; effect_key names it, epoch and attempt are its)
-- state: the attempt's state — 'open' (no outcome yet), 'done', 'failed', 'unknown', 'confirmed', 'retried',
--        'abandoned'; detail: its outcome's or settlement's detail. For a settle 'retried' the answer is the new
--        attempt (open, under the settling epoch); waited_ms: how long the settled attempt had been in doubt, from
--        the end of its tenure (or its 'unknown' outcome) to the settle, by the database clock.
-- late_report: for a refused record_outcome, whether it was kept as the attempt's late report.
CREATE TYPE pgfence.effect_result AS (
    outcome        text,
    reason         text,
    current_epoch  bigint,
    current_holder text,
    effect_id      bigint,
    task_id        bigint,
    task_key       text,
    effect_key     text,
    attempt        integer,
    epoch          bigint,
    intent         jsonb,
    state          text,
    detail         jsonb,
    settled_epoch  bigint,
    created        boolean,
    event_id       bigint,
    late_report    boolean,
    waited_ms      bigint
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

-- Whether the labels of a guarded write (operation, target table, target key: what pgfence.fence records in the
-- audit) pass their _arg_problem checks for certain: one regular expression over the three, not one each. Every
-- name and operator qualified (no BETWEEN: it names its operators unqualified): the guard's SQL shape
-- (pgfence._install_guard, 000003_guard) inlines it under its caller's search_path.
CREATE FUNCTION pgfence._plain_labels(p_operation text, p_table text, p_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.octet_length(p_operation) OPERATOR(pg_catalog.>=) 1
           AND pg_catalog.octet_length(p_operation) OPERATOR(pg_catalog.<=) pgfence._max_label_len()
           AND coalesce(pg_catalog.octet_length(p_table) OPERATOR(pg_catalog.>=) 1
                        AND pg_catalog.octet_length(p_table) OPERATOR(pg_catalog.<=) pgfence._max_label_len(), true)
           AND coalesce(pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.>=) 1
                        AND pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.<=) pgfence._max_holder_len(), true)
           AND (p_operation OPERATOR(pg_catalog.||) coalesce(p_table, '') OPERATOR(pg_catalog.||) coalesce(p_key, ''))
               OPERATOR(pg_catalog.~) '^[ -~]+$'
$$;

-- Whether (p_lease, p_epoch) pass _lease_args_problem for certain: a cluster of 1 to _max_cluster_len() printable
-- ASCII characters other than '/', a '/', a name of 1 to _max_name_len() printable ASCII characters, and an epoch
-- of at least 1.
CREATE FUNCTION pgfence._plain_lease_args(p_lease text, p_epoch bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_lease ~ '^[ -.0-~]+/[ -~]+$' AND strpos(p_lease, '/') <= pgfence._max_cluster_len() + 1
           AND octet_length(p_lease) - strpos(p_lease, '/') <= pgfence._max_name_len() AND p_epoch >= 1
$$;

-- Why p_value is not a valid p_what argument of at most p_max characters; NULL when it is, and when it is NULL
-- and p_optional.
CREATE FUNCTION pgfence._arg_problem(p_what text, p_value text, p_max integer, p_optional boolean DEFAULT false)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_value IS NOT NULL OR NOT p_optional
                THEN 'invalid ' || p_what || ': ' || pgfence._text_problem(p_value, p_max) END
$$;

-- The argument a problem names: the words after 'invalid ' at its start, up to ': ' or to the position of an
-- element ('invalid lease: …' names 'lease', 'invalid name 2 of 3: …' names 'name'), '' when it names none. Every
-- 22023 refusal whose message is a problem carries it in the error's COLUMN field, so that a client knows the
-- refused argument without reading the message.
CREATE FUNCTION pgfence._argument_of(p_problem text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(substring(p_problem FROM '^invalid ([a-z]+(?: [a-z]+)*)(?: [0-9]+ of [0-9]+)?: '), '')
$$;

-- Why (p_lease, p_epoch) is not a fence's lease and epoch; NULL when it is.
CREATE FUNCTION pgfence._lease_args_problem(p_lease text, p_epoch bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce('invalid lease: ' || pgfence._lease_problem(p_lease),
                    CASE WHEN p_epoch IS NULL OR p_epoch < 1
                         THEN 'invalid epoch: must be >= 1, got ' || coalesce(p_epoch::text, '<NULL>') END)
$$;

-- Why p_secret is not a tenure secret argument; NULL when it may be one. Only NULL is refused here (22023, nothing
-- written): it is no value a client meant to send. Any other value is judged against the tenure's hash, and a
-- wrong one is a refusal ('bad_secret', audited).
CREATE FUNCTION pgfence._secret_problem(p_secret text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_secret IS NULL THEN 'invalid secret: the tenure''s secret is required, got <NULL>' END
$$;

-- Why a task payload is refused; NULL when it is not. A backstop for SQL callers. The Rust API refuses more
-- than 1 MiB of serialized JSON before sending, which stays below this even for payloads that grow several
-- times when stored as jsonb (arrays of small numbers).
CREATE FUNCTION pgfence._payload_problem(p_payload jsonb) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_column_size(p_payload) > 16777216 THEN 'invalid payload: larger than 16 MiB stored' END
$$;

-- The same checks as statements, for the functions off the write path (acquire, renew, release, …).
CREATE FUNCTION pgfence._check_text(p_what text, p_value text, p_max integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text := pgfence._arg_problem(p_what, p_value, p_max);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
END;
$$;

CREATE FUNCTION pgfence._check_lease_args(p_lease text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text := pgfence._lease_args_problem(p_lease, p_epoch);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: %', problem USING ERRCODE = '22023', COLUMN = pgfence._argument_of(problem);
    END IF;
END;
$$;

CREATE FUNCTION pgfence._check_secret(p_secret text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_secret IS NULL THEN
        RAISE EXCEPTION 'pgfence: %', pgfence._secret_problem(p_secret) USING ERRCODE = '22023', COLUMN = 'secret';
    END IF;
END;
$$;

CREATE FUNCTION pgfence._check_ttl(p_ttl_ms bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_ttl_ms IS NULL OR p_ttl_ms < pgfence._min_ttl_ms() OR p_ttl_ms > pgfence._max_ttl_ms() THEN
        RAISE EXCEPTION 'pgfence: ttl must be between % ms and % h, got % ms', pgfence._min_ttl_ms(),
            pgfence._max_ttl_ms() / 3600000, p_ttl_ms USING ERRCODE = '22023', COLUMN = 'ttl';
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Lock waits and the messages that name who blocks, shared by every concern.

-- The WAL timeline the server writes on now (the first 8 hex digits of the current WAL file name). Unlike
-- pg_control_checkpoint(), it changes at the moment of a promotion, not at the next checkpoint. Every name and
-- operator qualified: the guard's SQL shape (pgfence._install_guard, 000003_guard) inlines it under its caller's
-- search_path.
CREATE FUNCTION pgfence._timeline() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' OPERATOR(pg_catalog.||)
            pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
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
     WHERE k.locktype = 'advisory' AND k.classid = pgfence._guard_lock_class()::oid AND k.objid = p_lock_key::oid
       AND k.objsubid = 2 AND k.granted = p_granted AND k.pid <> pg_catalog.pg_backend_pid()
       AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
$$;

-- The backends other than this one that hold (p_granted) or wait for (NOT p_granted) a lease's intent lock
-- (_guard_lock_class(), -lock_key): a takeover of the lease holds it exclusive from its start to its end.
CREATE FUNCTION pgfence._intent_lockers(p_lock_key integer, p_granted boolean) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT k.pid), '{}')
      FROM pg_catalog.pg_locks k
     WHERE k.locktype = 'advisory' AND k.classid = pgfence._guard_lock_class()::oid AND k.objid = (-p_lock_key)::oid
       AND k.objsubid = 2 AND k.granted = p_granted AND k.pid <> pg_catalog.pg_backend_pid()
       AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
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

-- The owner of the pgfence schema, read from the catalog: the role whose members are trusted with every cluster.
-- A function, not a subquery, where _grant_of uses it: a statement that inlines _grant_of and knows the owner
-- (p_owner) then has no subplan to set up on every execution, only a call it never makes.
CREATE FUNCTION pgfence._owner() RETURNS name
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.pg_get_userbyid(n.nspowner) FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'
$$;

-- Whether the session's login role may use cluster p_cluster (p_operator: with operator rights); NULL
-- p_cluster: every cluster. Superusers and members of the owner of the pgfence schema are trusted with every
-- cluster. The one definition of the rule, used by every path that judges a grant (the guard's pre-check and its
-- fast path _admits, the raw-SQL enforcement through _may_use, the lease and membership calls); the native guard's
-- granted() answers as it does (tests/native/differential.rs). As one row: a set-returning SQL function, so that
-- a statement naming it in its FROM clause gets it inlined as a subquery (planned with that statement, and once
-- for all when the statement is a plpgsql one); a scalar SQL function with a subquery is never inlined.
-- p_owner: the owner of the pgfence schema when the caller knows it for free — a SECURITY DEFINER function of the
-- owner passes current_user — so the owner's test costs no catalog read; NULL: read from the catalog (_owner: the
-- only safe answer outside the owner's functions, e.g. under row-level security). The owner's
-- test comes first: the owner's own sessions never scan the grants.
CREATE FUNCTION pgfence._grant_of(p_cluster text, p_operator boolean DEFAULT false, p_owner name DEFAULT NULL)
RETURNS TABLE (granted boolean)
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.pg_has_role(session_user,
                                  coalesce(p_owner, pgfence._owner()), 'MEMBER')
           OR EXISTS (SELECT 1 FROM pgfence.grants g
                       WHERE (g.cluster = p_cluster OR g.cluster IS NULL) AND (g.operator OR NOT p_operator)
                         AND pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER'))
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
    SELECT pgfence._may_use(NULL::text)
$$;
CREATE FUNCTION pgfence._readable_clusters() RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(DISTINCT g.cluster) FILTER (WHERE g.cluster IS NOT NULL), '{}')
      FROM pgfence.grants g
     WHERE pg_catalog.pg_has_role(session_user, g.role::oid, 'MEMBER')
$$;

-- Refuses a call of an instance-wide operator function (a setting or a retention that spans clusters) unless
-- the session's role has operator rights on every cluster (42501).
CREATE FUNCTION pgfence._require_instance_operator(p_function text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT pgfence._may_use(NULL::text, p_operator => true) THEN
        RAISE EXCEPTION 'pgfence: % needs operator rights on every cluster; role % has none', p_function,
            pgfence._printable(session_user::text)
            USING ERRCODE = '42501',
                  HINT = 'The schema owner grants them: pgfence grant --operator --all-clusters --role <role>.';
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- The audit: every refusal of every entry function is recorded through _reject (its table: pgfence.rejections,
-- above).

-- Records p_count refusals (one, unless a caller aggregates its own: renew_many) in pgfence.rejections,
-- aggregated per the refused role (see the table), and returns the write_result 'refused' with the reason. The
-- row commits with the statement that called it.
-- What one role can make the audit grow by, whatever it presents (docs/security.md, "An audit nobody can bend"):
--   * scope 'role': one row per reason;
--   * scope 'tenure': only for a refusal that one of the lease's 16 newest tenures explains — an epoch that was
--     never issued (one below the current epoch in a failover's jump, say) or an older one is aggregated per
--     role (p_by_role forces that too: a caller that knows no tenure explains its refusal) — and at most 26
--     rows per such tenure (16 (operation, reason) pairs and one 'other' row for each of the ten reasons a
--     tenure explains, bounded by the slot index), so at most 16 × 26 rows per lease.
CREATE FUNCTION pgfence._reject(p_lease text, p_epoch bigint, p_current_epoch bigint, p_current_holder text,
                                p_reason text, p_operation text, p_table text, p_key text,
                                p_may_wait boolean DEFAULT false, p_count bigint DEFAULT 1,
                                p_by_role boolean DEFAULT false)
RETURNS pgfence.write_result
LANGUAGE plpgsql SET lock_timeout = '10min' AS $$
DECLARE
    previous timestamptz;
    wait_ms  bigint := pgfence._lock_wait_ms();
    by_role  boolean := p_by_role OR p_reason IN ('no_grant', 'unknown_lease', 'future_epoch');
    op       text := p_operation;
    free     smallint;
BEGIN
    IF NOT by_role
       AND NOT EXISTS (SELECT 1 FROM pgfence.tenures t WHERE t.lease = p_lease AND t.epoch = p_epoch
                          AND (SELECT count(*) FROM (SELECT 1 FROM pgfence.tenures n
                                                      WHERE n.lease = p_lease AND n.epoch > p_epoch
                                                      LIMIT 16) newer) < 16) THEN
        by_role := true;
    END IF;
    -- Bounded: a refused transaction left open keeps its aggregated rows locked, and a place in the audit it
    -- took (slot) uncommitted (only the same role's refusals of the same tenure wait for them; two such
    -- transactions refused several times each, in different orders, may deadlock, which PostgreSQL ends with
    -- 40P01; single refusals never do). Each reason is counted in rows of its own, which keep their first
    -- refusal's epochs (after a failover, the tenure's 'failover' row stays the evidence, and refusals once it
    -- is also superseded are counted in a 'superseded' row beside it); the count, the last time and the last
    -- lease and key move.
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        IF by_role THEN
            SELECT r.last_rejected_at INTO previous FROM pgfence.rejections r
             WHERE r.scope = 'role' AND r.role = session_user AND r.reason = p_reason;
            INSERT INTO pgfence.rejections (scope, lease, presented_epoch, reason, operation, target_table,
                                            target_key, last_lease, last_target_key, count)
            VALUES ('role', p_lease, p_epoch, p_reason, p_operation, p_table, p_key, p_lease, p_key, p_count)
            ON CONFLICT (role, reason) WHERE scope = 'role' DO UPDATE
               SET count = pgfence.rejections.count + EXCLUDED.count,
                   last_rejected_at = clock_timestamp(),
                   last_lease = EXCLUDED.lease,
                   last_target_key = EXCLUDED.target_key;
        ELSE
            -- Operation labels are the caller's to choose: the first 16 distinct (operation, reason) pairs of a
            -- (role, lease, epoch) get a row each, further ones are counted under ('other', reason).
            FOR attempt IN 1..40 LOOP
                UPDATE pgfence.rejections r
                   SET count = r.count + p_count, last_rejected_at = clock_timestamp(), last_target_key = p_key
                  FROM (SELECT o.id, o.last_rejected_at FROM pgfence.rejections o
                         WHERE o.scope = 'tenure' AND o.role = session_user AND o.lease = p_lease
                           AND o.presented_epoch = p_epoch AND o.operation = op AND o.reason = p_reason) o
                 WHERE r.id = o.id
                RETURNING o.last_rejected_at INTO previous;
                EXIT WHEN FOUND;
                SELECT min(s) INTO free FROM generate_series(0, 15) AS s
                 WHERE NOT EXISTS (SELECT 1 FROM pgfence.rejections o
                                    WHERE o.scope = 'tenure' AND o.role = session_user AND o.lease = p_lease
                                      AND o.presented_epoch = p_epoch AND o.slot = s);
                IF free IS NULL AND op IS DISTINCT FROM 'other' THEN
                    op := 'other';
                    CONTINUE;
                END IF;
                -- Every unique index is an arbiter (no conflict target): the pair's row and the place are
                -- both decided by PostgreSQL's speculative insertion, which never waits while holding its
                -- insertion. (With the place index left out of the arbiters, two first refusals deadlocked: one
                -- inserting waited for the other's transaction on the place index while that one, updating the
                -- label's row, waited for the insertion.) Nothing inserted: another connection of this role
                -- took the pair or the place meanwhile, and its row is committed: look again. Under REPEATABLE
                -- READ a row committed after the snapshot is a serialization error, never a refusal lost.
                INSERT INTO pgfence.rejections (scope, lease, presented_epoch, current_epoch, current_holder,
                                                reason, operation, target_table, target_key, last_lease,
                                                last_target_key, count, slot)
                VALUES ('tenure', p_lease, p_epoch, p_current_epoch, p_current_holder, p_reason, op, p_table,
                        p_key, p_lease, p_key, p_count, coalesce(free, pgfence._tenure_reason_slot(p_reason)))
                ON CONFLICT DO NOTHING;
                EXIT WHEN FOUND;
                IF attempt = 40 THEN
                    RAISE EXCEPTION 'pgfence: refusal of % on lease % found no place in the audit after 40 attempts',
                        pgfence._printable(p_operation), pgfence._printable(p_lease) USING ERRCODE = '40001';
                END IF;
            END LOOP;
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
                  HINT = 'A transaction of the same role refused for the same reason (and lease, epoch and operation) stays open.';
    END;
    -- Backpressure on a caller retrying in a tight loop: a repeat within a second of the previous refusal
    -- aggregated in the same row answers 10 ms later. Holding the aggregated row meanwhile queues the role's
    -- other connections behind it, so a hammering caller gets about 100 refusals a second per row in all and
    -- leaves the CPU to the current leader. The first refusal is never delayed. Only callers that hold no lock
    -- another role needs may wait (p_may_wait): a wait under the shared guard lock would hold off a takeover.
    IF p_may_wait AND previous IS NOT NULL AND previous > clock_timestamp() - interval '1 second' THEN
        PERFORM pg_sleep(0.01);
    END IF;
    RETURN ROW('refused', p_reason,
               CASE WHEN p_reason = 'no_grant' THEN NULL ELSE p_current_epoch END,
               CASE WHEN p_reason = 'no_grant' THEN NULL ELSE p_current_holder END,
               NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgfence.write_result;
END;
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
