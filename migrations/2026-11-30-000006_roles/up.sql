-- pgfence migration 6 of 6, roles: row-level security on every table, the privileges (nothing for PUBLIC),
-- grants per cluster (grant_application, grant_operator, revoke) and the hardening every grant runs (_harden).
-- Applied last: its REVOKE and _harden cover every object the migrations before it created.
-- Called from Rust by src/admin.rs (Store::grant_application, grant_operator, revoke).

-- ---------------------------------------------------------------------------------------------------------
-- Row-level security: a granted role reads the rows of its clusters only (the rule: pgfence._reads_all and
-- pgfence._readable_clusters, 000001_schema).

ALTER TABLE pgfence.leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tenures ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tasks ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.task_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.rejections ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.grants ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tenure_secrets ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.beliefs ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.write_marks ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.members ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.groups ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.assignments ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.name_sets ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.effects ENABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.effect_reports ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted_clusters ON pgfence.leases FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR split_part(name, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
CREATE POLICY granted_clusters ON pgfence.tenures FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
-- The task tables also bound raw writes (by a role some DBA gave table privileges) to the role's clusters; the
-- raw-SQL enforcement (000003_guard) then checks epoch and secret. No policy allows writing any other table: a role
-- other than the owner cannot, whatever its table privileges.
CREATE POLICY granted_clusters ON pgfence.tasks FOR ALL
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]))
    WITH CHECK ((SELECT pgfence._reads_all())
                OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
CREATE POLICY granted_clusters ON pgfence.task_events FOR ALL
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]))
    WITH CHECK ((SELECT pgfence._reads_all())
                OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
-- The effect ledger and its late reports: read by cluster, written by the pgfence functions only.
CREATE POLICY granted_clusters ON pgfence.effects FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
CREATE POLICY granted_clusters ON pgfence.effect_reports FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[]));
-- Tenure-scope refusals of the session's clusters, and the session's own refusals of any scope.
CREATE POLICY granted_clusters ON pgfence.rejections FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR role = session_user
           OR (scope = 'tenure' AND split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[])));
-- A role sees the grants it holds (directly or through membership).
CREATE POLICY own_grants ON pgfence.grants FOR SELECT
    USING (pg_catalog.pg_has_role(session_user, role::oid, 'MEMBER'));
-- No policy on tenure_secrets, beliefs, write_marks, members, groups, assignments and name_sets: no role but the
-- owner reads them (and nobody is granted SELECT on them anyway); roles read beliefs and marks through
-- pgfence.tenure_history, members through pgfence.group_members, both filtered by cluster, and groups through
-- the membership functions, which check the grant.
-- The instance row (identity and settings) is read by every granted role and written by nobody but the owner
-- (set_takeover_grace), whatever table privileges a role was given; the migration record only by the owner.
ALTER TABLE pgfence.instance ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON pgfence.instance FOR SELECT USING (true);
-- (The migration record is diesel's; a harness of another kind may keep none.)
DO $$
BEGIN
    IF pg_catalog.to_regclass('pgfence.__diesel_schema_migrations') IS NOT NULL THEN
        ALTER TABLE pgfence.__diesel_schema_migrations ENABLE ROW LEVEL SECURITY;
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Trusted sessions. Row-level security stops a role that a careless GRANT gave table privileges from writing
-- as itself; it does not stop code that runs as the owner: a trigger such a role created on a pgfence table in
-- the window before the next _harden fires inside the pgfence functions, with the owner's rights. What that code
-- cannot change is the session's login role (session_user: changing it needs a superuser session). So the
-- tables that decide who may do what (grants, the instance settings, the migration record) and the audit accept
-- changes only from sessions whose login role is trusted, or, for the audit, the refused role's own rows.

-- Whether p_role is trusted with everything: a superuser, or a member of the pgfence schema's owner. False for a
-- role that does not exist (any more).
CREATE FUNCTION pgfence._trusted(p_role name) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_role) THEN false
                ELSE (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = p_role)
                     OR pg_catalog.pg_has_role(p_role, (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                                         WHERE n.nspname = 'pgfence'), 'MEMBER') END
$$;

-- Whether a grant row still stands: its role exists (a dropped role's oid could one day be reused). Who wrote it
-- is decided when it is written (the trusted_writes trigger); granted_by stays as evidence, and a grant made by an
-- administrator who is later dropped or demoted stands.
CREATE FUNCTION pgfence._grant_is_valid(g pgfence.grants) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = g.role::oid)
$$;

-- Refuses (42501) a change of grants, the instance row or the migration record from a session whose login role is
-- not trusted, with two exceptions: an every-cluster operator's set_takeover_grace (the grace, nothing else of
-- the instance row), and removing grant rows pgfence did not make (_harden). Stamps every grant row with the
-- session's login role, whatever the statement said.
CREATE FUNCTION pgfence._trusted_writes_only() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_TABLE_NAME = 'grants' AND TG_OP IN ('INSERT', 'UPDATE') THEN
        NEW.granted_by := session_user;
    END IF;
    IF pgfence._trusted(session_user) THEN
        RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    -- (Nested: a record's fields are resolved when the expression naming them is first run.)
    IF TG_TABLE_NAME = 'instance' AND TG_OP = 'UPDATE' THEN
        IF (NEW.singleton, NEW.instance_id, NEW.created_at)
               IS NOT DISTINCT FROM (OLD.singleton, OLD.instance_id, OLD.created_at)
           AND pgfence._may_use(NULL::text, p_operator => true) THEN
            RETURN NEW;
        END IF;
    ELSIF TG_TABLE_NAME = 'grants' AND TG_OP = 'DELETE' THEN
        IF NOT pgfence._grant_is_valid(OLD) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'pgfence: % on pgfence.% refused: only sessions of the schema owner change it (this session logged in as %)',
        TG_OP, TG_TABLE_NAME, pgfence._printable(session_user::text)
        USING ERRCODE = '42501',
              HINT = 'Grants change through pgfence grant / revoke, run as the owner; the takeover grace through set_takeover_grace.';
END;
$$;
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['grants', 'instance', '__diesel_schema_migrations'] LOOP
        CONTINUE WHEN pg_catalog.to_regclass('pgfence.' || quote_ident(t)) IS NULL;
        EXECUTE format('CREATE TRIGGER trusted_writes BEFORE INSERT OR UPDATE OR DELETE ON pgfence.%I '
                       'FOR EACH ROW EXECUTE FUNCTION pgfence._trusted_writes_only()', t);
        EXECUTE format('CREATE TRIGGER trusted_writes_truncate BEFORE TRUNCATE ON pgfence.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence._trusted_writes_only()', t);
    END LOOP;
END;
$$;

-- The audit only grows: a session adds refusals of its own login role (_reject: a new row, or a larger count and
-- a later time on one of its rows), and only a trusted session or an every-cluster operator removes rows
-- (prune_rejections). A trigger run as the owner inside a refused role's own call cannot lower that role's
-- counts or rewrite what its rows say either. Statement-level, over the rows the statement changed (a prune of a
-- million rows pays one check, not a million).
CREATE FUNCTION pgfence._own_rejections_only() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bent boolean;
BEGIN
    IF pgfence._trusted(session_user) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        bent := EXISTS (SELECT 1 FROM changed_new c WHERE c.role <> session_user OR c.count < 1);
    ELSIF TG_OP = 'UPDATE' THEN
        bent := EXISTS (SELECT 1 FROM changed_old o JOIN changed_new c ON c.id = o.id
                         WHERE o.role <> session_user OR c.count < o.count
                            OR (c.role, c.scope, c.lease, c.presented_epoch, c.current_epoch, c.current_holder,
                                c.reason, c.operation, c.target_table, c.target_key, c.rejected_at, c.slot)
                               IS DISTINCT FROM
                               (o.role, o.scope, o.lease, o.presented_epoch, o.current_epoch, o.current_holder,
                                o.reason, o.operation, o.target_table, o.target_key, o.rejected_at, o.slot))
                OR (SELECT count(*) FROM changed_new) <> (SELECT count(*) FROM changed_old);
    ELSE
        bent := NOT pgfence._may_use(NULL::text, p_operator => true);
    END IF;
    IF bent THEN
        RAISE EXCEPTION 'pgfence: % of audit rows refused: the audit only grows by the refused role''s own refusals (this session logged in as %)',
            TG_OP, pgfence._printable(session_user::text)
            USING ERRCODE = '42501';
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER own_rejections_insert AFTER INSERT ON pgfence.rejections REFERENCING NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._own_rejections_only();
CREATE TRIGGER own_rejections_update AFTER UPDATE ON pgfence.rejections
    REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._own_rejections_only();
CREATE TRIGGER own_rejections_delete AFTER DELETE ON pgfence.rejections REFERENCING OLD TABLE AS changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._own_rejections_only();
CREATE TRIGGER trusted_writes_truncate BEFORE TRUNCATE ON pgfence.rejections
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence._trusted_writes_only();

-- ---------------------------------------------------------------------------------------------------------
-- Privileges. Everything belongs to the role that ran the migration (the owner). Nothing is granted to
-- PUBLIC. pgfence.grant_application records a grant per cluster in pgfence.grants and gives the role, once,
-- EXECUTE on the lease and guarded-write functions (SECURITY DEFINER, search_path pinned: they act as the owner,
-- and check the grant per call; force_release too, which refuses ('refused' / 'no_grant', audited) a role
-- without operator rights on the lease's cluster, as it does an operator of another cluster) and SELECT on the
-- tables (filtered by row-level security) — and no INSERT, UPDATE, DELETE or TRUNCATE on any of them, so the
-- functions are its only write path. pgfence.grant_operator adds set_enforcement, prune_rejections and
-- set_takeover_grace, which are instance-wide: they raise 42501 unless the role is an every-cluster operator,
-- the same error PostgreSQL raises for a role without EXECUTE on them.

REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON SCHEMA pgfence FROM PUBLIC;

-- The privileges pgfence grants, the one list: a granted role gets every row with operator = false; a role with
-- an operator grant also the rows with operator = true. _grant grants them and _harden revokes every privilege on
-- pgfence's objects that is not on it (for a role with grants) or not the owner's.
-- (object: a schema, a relation or a function, as the text GRANT takes after ON.)
CREATE FUNCTION pgfence._granted_privileges()
RETURNS TABLE (kind text, object oid, privilege text, operator boolean)
LANGUAGE sql STABLE AS $$
    SELECT 'SCHEMA', n.oid, 'USAGE', false FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgfence'
    UNION ALL
    SELECT 'TABLE', t.o, 'SELECT', false
      FROM unnest(ARRAY['pgfence.instance', 'pgfence.leases', 'pgfence.tenures', 'pgfence.tasks',
                        'pgfence.task_events', 'pgfence.rejections', 'pgfence.grants',
                        'pgfence.tenure_history', 'pgfence.group_members', 'pgfence.effects',
                        'pgfence.effect_reports']::regclass[]) AS t(o)
    UNION ALL
    SELECT 'FUNCTION', f.o, 'EXECUTE', false
      FROM unnest(ARRAY['pgfence.acquire(text, text, bigint)', 'pgfence.acquire_many(text[], text, bigint)',
                        'pgfence.renew(text, bigint, text, bigint)',
                        'pgfence.renew_many(text[], bigint[], text[], bigint)',
                        'pgfence.release(text, bigint, text)',
                        -- Judged per cluster by the function itself ('refused' / 'no_grant' without operator
                        -- rights there), so that a missing right on a cluster is one answer for every role.
                        'pgfence.force_release(text)',
                        'pgfence.fence(text, bigint, text, text, text, text)',
                        'pgfence.create_task(text, bigint, text, text, jsonb)',
                        'pgfence.claim_task(text, bigint, text, text, text)',
                        'pgfence.transition_task(text, bigint, text, text, text, text, jsonb)',
                        'pgfence.append_event(text, bigint, text, text, text, jsonb)', 'pgfence.enforcement()',
                        'pgfence.record_intent(text, bigint, text, text, text, jsonb)',
                        'pgfence.record_outcome(text, bigint, text, text, text, jsonb)',
                        'pgfence.settle_effect(text, bigint, text, text, text, jsonb)',
                        'pgfence.in_doubt_effects(text)', 'pgfence.effect_attempts(text, text)',
                        'pgfence.report_belief(text, bigint, text, text, timestamptz, timestamptz, text, text, text)',
                        'pgfence.ungated_write(text, bigint)', 'pgfence.identity()', 'pgfence._reads_all()',
                        'pgfence.join_group(text, text, integer, text[], text[], text[], bigint)',
                        'pgfence.heartbeat(text, text, bigint, text, bigint)',
                        'pgfence.leave_group(text, text, bigint, text)',
                        'pgfence.claim_rebalance(text, text, bigint, text)', 'pgfence.rebalance_inputs(text)',
                        'pgfence.group_names(text, bigint)', 'pgfence.group_assignment(text)',
                        'pgfence.assigned_names(text, text)',
                        'pgfence.assign_group(text, text, bigint, text, bigint, bigint, text[], text[], text[], text[])',
                        'pgfence._readable_clusters()',
                        -- Row-level security policies and CHECK constraints run as the querying role.
                        'pgfence._text_problem(text, integer)', 'pgfence._cluster_problem(text)',
                        'pgfence._lease_problem(text)', 'pgfence._storable_text(text, integer)',
                        'pgfence._storable_cluster(text)', 'pgfence._storable_lease(text)',
                        'pgfence._max_cluster_len()', 'pgfence._max_name_len()',
                        'pgfence._max_holder_len()', 'pgfence._max_label_len()', 'pgfence._max_kind_len()',
                        'pgfence._max_endpoint_len()']::regprocedure[]) AS f(o)
    UNION ALL
    SELECT 'FUNCTION', f.o, 'EXECUTE', true
      FROM unnest(ARRAY['pgfence.set_enforcement(boolean, text)',
                        'pgfence.prune_rejections(interval, integer)',
                        'pgfence.set_takeover_grace(interval)']::regprocedure[]) AS f(o)
$$;

-- The text GRANT and REVOKE take after ON for a pgfence object.
CREATE FUNCTION pgfence._privilege_target(p_kind text, p_object oid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE p_kind WHEN 'SCHEMA' THEN 'SCHEMA pgfence'
                       WHEN 'FUNCTION' THEN 'ROUTINE ' || p_object::regprocedure::text
                       ELSE p_kind || ' ' || p_object::regclass::text END
$$;

-- Repairs the schema, its privileges and pgfence's rows to what pgfence made, and says what it changed: each
-- change is a WARNING and an element of the array it returns (the same text without the "pgfence: " prefix), so
-- that the CLI can show the operator what the server log alone would otherwise hold. Run by every grant, revoke
-- and enforcement change, and at the end of the migration (the CLI's migrate runs it again and prints it). It
-- removes:
--   * triggers on pgfence tables that pgfence did not create (a trigger runs as the owner inside every pgfence
--     function that writes its table);
--   * every object in the schema that another role owns — function, procedure, aggregate, operator, table, view,
--     sequence, type, domain, collation, conversion, text search configuration or dictionary, statistics
--     object, operator class or family — created while that role had CREATE on the schema: pgfence's own
--     SECURITY DEFINER code must never run it (it calls its functions with arguments of exactly their
--     parameters' types, so no overload is picked, but the owner may call one by hand). Plain DROP, never
--     CASCADE: what depends on such an object is dropped with it only when it is foreign too and in the list;
--     an object something else depends on stays and is named with what blocks it;
--   * grant rows pgfence did not make (written in a session whose login role is not trusted, which the
--     trusted_writes trigger refuses, or of a role that was dropped: its oid could one day be reused);
--   * every privilege on the schema, its tables, views, sequences and functions that is not the owner's and not
--     on _granted_privileges' list for a role with a grant — a careless GRANT ALL, DML, TRIGGER, TRUNCATE,
--     REFERENCES, EXECUTE on a function not meant for roles, CREATE on the schema, PUBLIC's — with CASCADE, so
--     whatever a role passed on WITH GRANT OPTION goes too, and every grant option (pgfence grants none);
-- and it enables pgfence's own protective triggers again if someone disabled them, and keeps the owner's
-- default privileges from making a function created later executable by PUBLIC (so by every granted role,
-- which has USAGE on the schema).
-- What it cannot undo, and what it therefore cannot prevent in the window between a careless GRANT and its next
-- run: what code of another role did while it ran as the owner through such a trigger (docs/security.md).
-- Its DROPs wait at most _lock_wait_ms() for a table (PF003 naming who holds it).
-- p_raw_writes: whether the raw-SQL enforcement is (about to be) on; NULL: as it is now.
CREATE FUNCTION pgfence._harden(p_raw_writes boolean DEFAULT NULL) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10min'
-- Its catalog queries are planned with large row estimates (set-returning functions), which would have them
-- JIT-compiled: measured 2.6 s of compilation for 3 ms of work.
SET jit = off AS $$
DECLARE
    r record;
    raw_writes boolean;
    wait_ms bigint := pgfence._lock_wait_ms();
    owner_oid oid := (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence');
    repairs text[] := ARRAY[]::text[];
    said text;
    blocked text[];
    dropped boolean;
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);

    FOR r IN SELECT c.relname, t.tgname
               FROM pg_trigger t
               JOIN pg_class c ON c.oid = t.tgrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'pgfence' AND NOT t.tgisinternal AND c.relowner = owner_oid
                -- pgfence's own: one of its names, calling one of its functions (a name alone can be borrowed).
                AND NOT (t.tgname IN ('lease_change', 'lease_delete', 'lease_truncate', 'enforce_epoch',
                                      'enforce_audit', 'enforce_truncate', 'append_only', 'append_only_truncate',
                                      'enforce_owner', 'enforce_owner_truncate', 'trusted_writes',
                                      'trusted_writes_truncate', 'own_rejections_insert', 'own_rejections_update',
                                      'own_rejections_delete')
                         AND EXISTS (SELECT 1 FROM pg_proc f
                                      WHERE f.oid = t.tgfoid AND f.pronamespace = n.oid AND f.proowner = owner_oid
                                        AND f.proname IN ('_lease_change', '_enforce_epoch', '_append_only',
                                                          '_owner_writes_only', '_trusted_writes_only',
                                                          '_own_rejections_only')))
    LOOP
        EXECUTE format('DROP TRIGGER %I ON pgfence.%I', r.tgname, r.relname);
        said := format('dropped trigger %s on pgfence.%s: a trigger on a pgfence table runs as its owner; every '
                       'tenure secret presented while it existed may be known to its author (acquire again)',
                       pgfence._printable(r.tgname::text), r.relname);
        repairs := repairs || said;
        RAISE WARNING 'pgfence: %', said;
    END LOOP;

    -- Objects of other roles, in passes: a drop that another foreign object blocks (a function whose type is
    -- foreign too, a view on a foreign table) succeeds once that one is gone. Objects that exist only as a part
    -- of another (an array or row type, a range's constructors, an extension's members: an internal or extension
    -- dependency) go with it and are not listed.
    FOR pass IN 1..10 LOOP
        dropped := false;
        blocked := ARRAY[]::text[];
        FOR r IN WITH s AS (SELECT n.oid FROM pg_namespace n WHERE n.nspname = 'pgfence'),
                 objects(catalog, object, owner, rank, kind, name) AS (
                     SELECT 'pg_statistic_ext'::regclass, x.oid, x.stxowner, 0, 'STATISTICS',
                            format('pgfence.%I', x.stxname)
                       FROM pg_statistic_ext x, s WHERE x.stxnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_proc'::regclass, p.oid, p.proowner, 1,
                            CASE p.prokind WHEN 'a' THEN 'AGGREGATE' WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                            format('pgfence.%I(%s)', p.proname, pg_get_function_identity_arguments(p.oid))
                       FROM pg_proc p, s WHERE p.pronamespace = s.oid
                     UNION ALL
                     SELECT 'pg_operator'::regclass, o.oid, o.oprowner, 1, 'OPERATOR',
                            format('pgfence.%s(%s, %s)', o.oprname,
                                   CASE WHEN o.oprleft = 0 THEN 'NONE' ELSE format_type(o.oprleft, NULL) END,
                                   format_type(o.oprright, NULL))
                       FROM pg_operator o, s WHERE o.oprnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_opclass'::regclass, c.oid, c.opcowner, 1, 'OPERATOR CLASS',
                            format('pgfence.%I USING %I', c.opcname, a.amname)
                       FROM pg_opclass c JOIN pg_am a ON a.oid = c.opcmethod, s WHERE c.opcnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_opfamily'::regclass, f.oid, f.opfowner, 2, 'OPERATOR FAMILY',
                            format('pgfence.%I USING %I', f.opfname, a.amname)
                       FROM pg_opfamily f JOIN pg_am a ON a.oid = f.opfmethod, s WHERE f.opfnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_class'::regclass, c.oid, c.relowner, CASE WHEN c.relkind IN ('v', 'm') THEN 2 ELSE 3 END,
                            CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                           WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                            format('pgfence.%I', c.relname)
                       FROM pg_class c, s WHERE c.relnamespace = s.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
                     UNION ALL
                     SELECT 'pg_type'::regclass, t.oid, t.typowner, 4,
                            CASE WHEN t.typtype = 'd' THEN 'DOMAIN' ELSE 'TYPE' END, format('pgfence.%I', t.typname)
                       FROM pg_type t, s WHERE t.typnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_collation'::regclass, c.oid, c.collowner, 5, 'COLLATION',
                            format('pgfence.%I', c.collname)
                       FROM pg_collation c, s WHERE c.collnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_conversion'::regclass, c.oid, c.conowner, 5, 'CONVERSION',
                            format('pgfence.%I', c.conname)
                       FROM pg_conversion c, s WHERE c.connamespace = s.oid
                     UNION ALL
                     SELECT 'pg_ts_config'::regclass, c.oid, c.cfgowner, 5, 'TEXT SEARCH CONFIGURATION',
                            format('pgfence.%I', c.cfgname)
                       FROM pg_ts_config c, s WHERE c.cfgnamespace = s.oid
                     UNION ALL
                     SELECT 'pg_ts_dict'::regclass, d.oid, d.dictowner, 6, 'TEXT SEARCH DICTIONARY',
                            format('pgfence.%I', d.dictname)
                       FROM pg_ts_dict d, s WHERE d.dictnamespace = s.oid
                 )
                 SELECT o.kind, o.name, o.owner
                   FROM objects o
                  WHERE o.owner <> owner_oid
                    AND NOT EXISTS (SELECT 1 FROM pg_depend d
                                     WHERE d.classid = o.catalog AND d.objid = o.object AND d.deptype IN ('i', 'e'))
                  ORDER BY o.rank, o.name
        LOOP
            BEGIN
                EXECUTE format('DROP %s %s', r.kind, r.name);
                said := format('dropped %s %s, owned by %s: another role''s object in the schema pgfence, made '
                               'while that role could create there; nothing may call it as the owner', lower(r.kind), quote_literal(regexp_replace(left(r.name, 500), '[[:cntrl:]]', '?', 'g')),
                               pgfence._printable(pg_get_userbyid(r.owner)::text));
                repairs := repairs || said;
                RAISE WARNING 'pgfence: %', said;
                dropped := true;
            EXCEPTION
                WHEN dependent_objects_still_exist THEN
                    blocked := blocked || format('could not drop %s %s, owned by %s: %s; drop it as its owner or a '
                                                 'superuser once you have checked what depends on it',
                                                 lower(r.kind),
                                                 quote_literal(regexp_replace(left(r.name, 500), '[[:cntrl:]]', '?', 'g')),
                                                 pgfence._printable(pg_get_userbyid(r.owner)::text),
                                                 quote_literal(regexp_replace(left(SQLERRM, 500), '[[:cntrl:]]', '?', 'g')));
                -- Gone with an object dropped before it in this pass.
                WHEN undefined_object OR undefined_function OR undefined_table THEN NULL;
            END;
        END LOOP;
        EXIT WHEN NOT dropped OR cardinality(blocked) = 0;
    END LOOP;
    FOREACH said IN ARRAY blocked LOOP
        repairs := repairs || said;
        RAISE WARNING 'pgfence: %', said;
    END LOOP;

    -- Whether granted roles may keep raw DML on the task tables: while the raw-SQL enforcement is on (p_raw_writes:
    -- what set_enforcement is about to switch it to).
    raw_writes := coalesce(p_raw_writes, pgfence.enforcement() <> 'off'::text);
    DELETE FROM pgfence.grants g WHERE NOT pgfence._grant_is_valid(g);
    -- A row written in a session that is not trusted (now) can only have got in while someone with the owner's
    -- rights had the trusted_writes trigger disabled (or a trusted administrator was demoted since): said, for the
    -- owner to judge; not removed (a grant pgfence made must never vanish because its granter changed).
    FOR r IN SELECT g.role::oid AS role_oid, g.cluster, g.operator, g.granted_by FROM pgfence.grants g
              WHERE NOT pgfence._trusted(g.granted_by)
    LOOP
        said := format('the grant of %s on %s was written in a session of %s, which is not trusted: revoke it '
                       'unless you made it', pgfence._printable(pg_get_userbyid(r.role_oid)::text),
                       CASE WHEN r.cluster IS NULL THEN 'every cluster'
                            ELSE 'cluster ' || pgfence._printable(r.cluster) END
                           || CASE WHEN r.operator THEN ' (operator)' ELSE '' END,
                       pgfence._printable(r.granted_by::text));
        repairs := repairs || said;
        RAISE WARNING 'pgfence: %', said;
    END LOOP;

    -- Grant options first (revoking one with CASCADE takes what was passed on with it), then the rest; a
    -- privilege passed on by a role other than the owner is gone once that role's grant option is.
    FOR pass IN 1..2 LOOP
        FOR r IN WITH acl AS (
                     SELECT 'SCHEMA' AS kind, n.oid AS object, a.grantor, a.grantee, a.privilege_type,
                            a.is_grantable
                       FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
                      WHERE n.nspname = 'pgfence'
                     UNION ALL
                     SELECT CASE WHEN c.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.oid, a.grantor,
                            a.grantee, a.privilege_type, a.is_grantable
                       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      CROSS JOIN LATERAL aclexplode(c.relacl) a
                      WHERE n.nspname = 'pgfence' AND c.relkind IN ('r', 'v', 'p', 'S', 'm', 'f')
                        AND c.relowner = owner_oid
                     UNION ALL
                     -- (Of the owner's objects only: what another role owns that the drops above could not
                     -- remove is its own to grant, and was named.)
                     SELECT 'FUNCTION', p.oid, a.grantor, a.grantee, a.privilege_type, a.is_grantable
                       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                      CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                      WHERE n.nspname = 'pgfence' AND p.proowner = owner_oid
                 ), granted AS (
                     SELECT g.role::oid AS grantee, bool_or(g.operator) AS operator FROM pgfence.grants g
                      GROUP BY g.role
                 ), expected AS (
                     SELECT e.kind, e.object, e.privilege, g.grantee
                       FROM pgfence._granted_privileges() e JOIN granted g ON g.operator OR NOT e.operator
                     UNION ALL
                     -- Raw SQL on the task tables, which a DBA may give a granted role on purpose: left while
                     -- the raw-SQL enforcement judges every such write (bounded to the role's clusters by
                     -- row-level security), revoked while it is off.
                     -- (A member of a granted role acts with its grants: it may hold them too.)
                     SELECT 'TABLE', t.o, p.p, m.oid
                       FROM granted g JOIN pg_roles m ON pg_has_role(m.oid, g.grantee, 'MEMBER'),
                            unnest(ARRAY['pgfence.tasks', 'pgfence.task_events']::regclass[]) AS t(o),
                            unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(p)
                      WHERE raw_writes
                 )
                 SELECT DISTINCT a.grantor = owner_oid AS by_owner, a.kind, a.object, a.privilege_type, a.grantee,
                        a.is_grantable AND EXISTS (SELECT 1 FROM expected e
                                                    WHERE e.object = a.object AND e.privilege = a.privilege_type
                                                      AND e.grantee = a.grantee) AS option_only
                   FROM acl a
                  WHERE a.grantee <> owner_oid
                    AND (a.is_grantable OR NOT EXISTS (SELECT 1 FROM expected e
                                                        WHERE e.object = a.object
                                                          AND e.privilege = a.privilege_type
                                                          AND e.grantee = a.grantee))
                    AND (pass = 2 OR a.is_grantable)
                  -- What the owner granted first: revoking a grant option with CASCADE takes what was passed on.
                  ORDER BY 1 DESC
        LOOP
            EXECUTE format('REVOKE %s%s ON %s FROM %s CASCADE',
                           CASE WHEN r.option_only THEN 'GRANT OPTION FOR ' ELSE '' END, r.privilege_type,
                           pgfence._privilege_target(r.kind, r.object),
                           CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
            IF r.grantee <> 0 OR r.kind <> 'FUNCTION' OR r.privilege_type <> 'EXECUTE' THEN
                said := format('revoked %s on %s from %s: pgfence did not grant it',
                               CASE WHEN r.option_only THEN 'the grant option of ' ELSE '' END || r.privilege_type,
                               pgfence._privilege_target(r.kind, r.object),
                               CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                    ELSE pgfence._printable(pg_get_userbyid(r.grantee)::text) END);
                repairs := repairs || said;
                RAISE WARNING 'pgfence: %', said;
            END IF;
        END LOOP;
    END LOOP;

    -- Column privileges: pgfence grants none.
    FOR r IN SELECT DISTINCT c.oid AS object, a.attname, x.privilege_type, x.grantee
               FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              CROSS JOIN LATERAL aclexplode(a.attacl) x
              WHERE n.nspname = 'pgfence' AND a.attacl IS NOT NULL AND x.grantee <> owner_oid
                AND c.relowner = owner_oid
    LOOP
        EXECUTE format('REVOKE %s (%I) ON TABLE %s FROM %s CASCADE', r.privilege_type, r.attname,
                       r.object::regclass, CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                                ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
        said := format('revoked %s (%s) on TABLE %s from %s: pgfence did not grant it', r.privilege_type,
                       pgfence._printable(r.attname::text), r.object::regclass,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE pgfence._printable(pg_get_userbyid(r.grantee)::text) END);
        repairs := repairs || said;
        RAISE WARNING 'pgfence: %', said;
    END LOOP;

    -- pgfence's protective triggers are always on (the enforcement triggers are switched by set_enforcement).
    FOR r IN SELECT c.relname, t.tgname
               FROM pg_trigger t
               JOIN pg_class c ON c.oid = t.tgrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'pgfence' AND NOT t.tgisinternal AND t.tgenabled <> 'O'
                AND t.tgname IN ('lease_change', 'lease_delete', 'lease_truncate', 'append_only',
                                 'append_only_truncate', 'enforce_owner_truncate', 'trusted_writes',
                                 'trusted_writes_truncate', 'own_rejections_insert', 'own_rejections_update',
                                 'own_rejections_delete')
    LOOP
        EXECUTE format('ALTER TABLE pgfence.%I ENABLE TRIGGER %I', r.relname, r.tgname);
        said := format('enabled trigger %s on pgfence.%s again: someone with the owner''s rights disabled it',
                       pgfence._printable(r.tgname::text), r.relname);
        repairs := repairs || said;
        RAISE WARNING 'pgfence: %', said;
    END LOOP;

    -- Functions the owner creates later (a new migration) are executable by nobody but the owner until a grant
    -- says otherwise. A per-schema default cannot take away PUBLIC's EXECUTE (PostgreSQL adds per-schema
    -- defaults to the global ones), so this is the owner's global default: a reason to keep a dedicated owner.
    IF NOT EXISTS (SELECT 1 FROM pg_default_acl d
                    WHERE d.defaclrole = owner_oid AND d.defaclnamespace = 0 AND d.defaclobjtype = 'f'
                      AND NOT EXISTS (SELECT 1 FROM aclexplode(d.defaclacl) a WHERE a.grantee = 0)) THEN
        IF current_user = pg_get_userbyid(owner_oid) THEN
            ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
        END IF;
    END IF;
    RETURN repairs;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: dropping a foreign trigger or object waited % ms for its table; blocked by %', wait_ms,
        pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'A long transaction on pgfence tables holds them: let it finish and retry.';
END;
$$;

-- The roles grants and revokes may change, one rule for both: raises 22023 (`pgfence: invalid role: …`) for a
-- malformed name, PUBLIC, pseudo-roles and predefined pg_* roles (they stand for many roles), superusers and
-- BYPASSRLS roles (no grant can bound what they read or do), and the owner and its members (trusted already: a
-- revoke would take the owner's own privileges on its objects, and every pgfence call would then fail 42501);
-- 42704 when no such role exists. Called by _grant and revoke before they change anything.
CREATE FUNCTION pgfence._refuse_role(p_role text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pg_roles;
    -- 63: PostgreSQL's longest identifier (NAMEDATALEN - 1), not a limit of pgfence's.
    problem text := pgfence._text_problem(p_role, 63::integer);
BEGIN
    IF problem IS NULL AND (lower(p_role) IN ('public', 'current_user', 'current_role', 'session_user', 'user', 'none')
                            OR starts_with(p_role, 'pg_')) THEN
        problem := 'PUBLIC, pseudo-roles and predefined pg_* roles stand for many roles: grant to a role of the application';
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid role: %', problem
            USING ERRCODE = '22023',
                COLUMN = 'role', HINT = 'Grant to a role of the application, e.g. CREATE ROLE app LOGIN.';
    END IF;
    SELECT * INTO r FROM pg_roles WHERE rolname = p_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: role % does not exist', pgfence._printable(p_role) USING ERRCODE = '42704';
    END IF;
    IF r.rolsuper OR r.rolbypassrls THEN
        problem := format('%s is a superuser or BYPASSRLS role: no grant bounds what it reads or does',
                          pgfence._printable(p_role));
    ELSIF pg_has_role(r.oid, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence'), 'MEMBER') THEN
        problem := format('%s owns the pgfence schema (or is a member of its owner): it is trusted already, and '
                          'its privileges are not granted nor revoked', pgfence._printable(p_role));
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid role: %', problem USING ERRCODE = '22023', COLUMN = 'role';
    END IF;
END;
$$;

-- Records a grant of p_cluster (NULL: every cluster) to p_role and gives it the object privileges; returns what
-- _harden repaired. Refuses the roles _refuse_role refuses.
CREATE FUNCTION pgfence._grant(p_role text, p_cluster text, p_operator boolean) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r pg_roles;
    privilege record;
    problem text := CASE WHEN p_cluster IS NOT NULL THEN pgfence._cluster_problem(p_cluster) END;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid cluster: %', problem USING ERRCODE = '22023', COLUMN = 'cluster';
    END IF;
    PERFORM pgfence._refuse_role(p_role);
    SELECT * INTO r FROM pg_roles WHERE rolname = p_role;
    INSERT INTO pgfence.grants (role, cluster, operator) VALUES (r.oid::regrole, p_cluster, p_operator)
    ON CONFLICT (role, coalesce(cluster, '')) DO UPDATE SET operator = pgfence.grants.operator OR EXCLUDED.operator;
    FOR privilege IN SELECT * FROM pgfence._granted_privileges() e WHERE NOT e.operator OR p_operator LOOP
        EXECUTE format('GRANT %s ON %s TO %I', privilege.privilege,
                       pgfence._privilege_target(privilege.kind, privilege.object), p_role);
    END LOOP;
    -- After the grant: what the role holds beyond it (and everything else pgfence did not make) goes; what
    -- went is the answer.
    RETURN pgfence._harden(NULL::boolean);
END;
$$;

-- Grants p_role the application rights on cluster p_cluster (NULL: every cluster): acquire, renew, release
-- and guarded writes of that cluster's leases, and reading its rows. Returns what _harden repaired (empty: nothing).
CREATE FUNCTION pgfence.grant_application(p_role text, p_cluster text) RETURNS text[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgfence._grant(p_role, p_cluster, false::boolean)
$$;

-- Grants p_role the application and operator rights on cluster p_cluster (NULL: every cluster, which adds the
-- instance settings and audit retention). Returns what _harden repaired.
CREATE FUNCTION pgfence.grant_operator(p_role text, p_cluster text) RETURNS text[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgfence._grant(p_role, p_cluster, true::boolean)
$$;

-- Removes p_role's grant of p_cluster (NULL: its every-cluster grant); once the role has no grant left, also
-- its object privileges. Returns how many grants it removed (0 or 1) and what _harden repaired. Refuses
-- (changing nothing) a malformed cluster and the roles _refuse_role refuses, as _grant does.
CREATE FUNCTION pgfence.revoke(p_role text, p_cluster text, OUT removed integer, OUT repairs text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    privilege record;
    oid_ oid;
    problem text := CASE WHEN p_cluster IS NOT NULL THEN pgfence._cluster_problem(p_cluster) END;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid cluster: %', problem USING ERRCODE = '22023', COLUMN = 'cluster';
    END IF;
    oid_ := (SELECT r.oid FROM pg_roles r WHERE r.rolname = p_role);
    -- The roles grant refuses; but a role that holds a grant (it became a superuser, BYPASSRLS or a member of
    -- the owner after it was granted) may lose it — never the owner itself, whose privileges are pgfence's.
    IF oid_ IS NULL OR oid_ = (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence')
       OR NOT EXISTS (SELECT 1 FROM pgfence.grants g WHERE g.role = oid_::regrole) THEN
        PERFORM pgfence._refuse_role(p_role);
    END IF;
    repairs := pgfence._harden(NULL::boolean);
    DELETE FROM pgfence.grants g WHERE g.role = oid_::regrole AND g.cluster IS NOT DISTINCT FROM p_cluster;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF NOT EXISTS (SELECT 1 FROM pgfence.grants g WHERE g.role = oid_::regrole) THEN
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM %I', p_role);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM %I', p_role);
        EXECUTE format('REVOKE ALL ON SCHEMA pgfence FROM %I', p_role);
    ELSIF NOT EXISTS (SELECT 1 FROM pgfence.grants g WHERE g.role = oid_::regrole AND g.operator) THEN
        FOR privilege IN SELECT * FROM pgfence._granted_privileges() e WHERE e.operator LOOP
            EXECUTE format('REVOKE %s ON %s FROM %I', privilege.privilege,
                           pgfence._privilege_target(privilege.kind, privilege.object), p_role);
        END LOOP;
    END IF;
    removed := n;
END;
$$;

-- What the advisory-lock and role layout lacks, as rows (severity 'error' or 'warning', problem, fix); none when
-- it is the hardened layout of docs/security.md. 'error': the schema owner may not execute an advisory-lock
-- function pgfence takes (the SECURITY DEFINER functions run as the owner: acquire, the guard and the takeovers
-- would fail 42501). 'warning': PUBLIC may still execute advisory-lock functions (any role that can connect can
-- hold a lease's guard key: guarded writes then fail PF003 after the lock-wait bound); the owner is neither a
-- superuser nor a member of pg_signal_backend (a takeover blocked past its grace cannot end the blocker and fails
-- PF003). Owner-only; called from Rust by src/store/migrate.rs (Store::migrate, Store::layout_problems) and src/admin.rs
-- (the grants). The list of functions pgfence takes is also in src/store/migrate.rs (ADVISORY_FUNCTIONS_NEEDED), for the
-- check before the first migration.
CREATE FUNCTION pgfence._layout_problems() RETURNS TABLE (severity text, problem text, fix text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH owner AS (
        SELECT n.nspowner AS oid, quote_ident(pg_get_userbyid(n.nspowner)) AS name
          FROM pg_namespace n WHERE n.nspname = 'pgfence'
    ), needed AS (
        SELECT f::regprocedure AS f
          FROM unnest(ARRAY['pg_catalog.pg_advisory_lock(bigint)',
                            'pg_catalog.pg_advisory_xact_lock(integer, integer)',
                            'pg_catalog.pg_try_advisory_xact_lock(integer, integer)',
                            'pg_catalog.pg_advisory_xact_lock_shared(integer, integer)',
                            'pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)',
                            'pg_catalog.pg_try_advisory_lock_shared(integer, integer)',
                            'pg_catalog.pg_advisory_unlock_shared(integer, integer)']) f
    ), missing AS (
        SELECT string_agg(n.f::text, ', ' ORDER BY n.f::text) AS list
          FROM needed n, owner o WHERE NOT has_function_privilege(o.oid, n.f, 'EXECUTE')
    ), public_lock AS (
        SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text) AS list
          FROM pg_proc p
         WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname ~ '^pg_(try_)?advisory_'
           AND p.proname !~ 'unlock'
           AND (p.proacl IS NULL
                OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a
                            WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
    )
    SELECT 'error',
           format('the schema owner %s may not execute %s, which pgfence''s functions call as the owner: '
                  'acquire, guarded writes, takeovers and migrate would fail 42501', o.name, m.list),
           format('GRANT EXECUTE ON FUNCTION %s TO %s (as a superuser, in this database)', m.list, o.name)
      FROM missing m, owner o WHERE m.list IS NOT NULL
    UNION ALL
    SELECT 'warning',
           format('PUBLIC may execute %s: any role that can connect can hold a lease''s guard lock, so that its '
                  'guarded writes fail PF003 after the lock-wait bound and its takeovers wait their grace', p.list),
           format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC; GRANT EXECUTE ON FUNCTION %s TO %s '
                  '(as a superuser, in this database; see docs/security.md)', p.list,
                  (SELECT string_agg(n.f::text, ', ' ORDER BY n.f::text) FROM needed n), o.name)
      FROM public_lock p, owner o WHERE p.list IS NOT NULL
    UNION ALL
    SELECT 'warning',
           format('the schema owner %s is neither a superuser nor a member of pg_signal_backend: a takeover '
                  'that a guarded transaction blocks past its grace cannot end it and fails PF003', o.name),
           format('GRANT pg_signal_backend TO %s', o.name)
      FROM owner o JOIN pg_roles r ON r.oid = o.oid
     WHERE NOT r.rolsuper AND NOT pg_has_role(o.oid, 'pg_signal_backend', 'USAGE')
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;

SELECT pgfence._harden(NULL::boolean);
