-- pgfence migration 5 of 5, roles: row-level security on every table, the privileges (nothing for PUBLIC),
-- grants per cluster (grant_application, grant_operator, revoke) and the hardening every grant runs (_harden).
-- Applied last: its REVOKE and _harden cover every object the migrations before it created.
-- Called from Rust by src/fence.rs (Store::grant_application, grant_operator, revoke).

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
-- Tenure-scope refusals of the session's clusters, and the session's own refusals of any scope.
CREATE POLICY granted_clusters ON pgfence.rejections FOR SELECT
    USING ((SELECT pgfence._reads_all()) OR role = session_user
           OR (scope = 'tenure' AND split_part(lease, '/', 1) = ANY ((SELECT pgfence._readable_clusters())::text[])));
-- A role sees the grants it holds (directly or through membership).
CREATE POLICY own_grants ON pgfence.grants FOR SELECT
    USING (pg_catalog.pg_has_role(session_user, role::oid, 'MEMBER'));
-- No policy on tenure_secrets, beliefs and write_marks: no role but the owner reads them (and nobody is granted
-- SELECT on them anyway); roles read beliefs and marks through pgfence.tenure_history, filtered by cluster.

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
                   'pgfence.report_belief(text, bigint, text, text, timestamptz, timestamptz, text, text, text), '
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

-- What the advisory-lock and role layout lacks, as rows (severity 'error' or 'warning', problem, fix); none when
-- it is the hardened layout of docs/security.md. 'error': the schema owner may not execute an advisory-lock
-- function pgfence takes (the SECURITY DEFINER functions run as the owner: acquire, the guard and the takeovers
-- would fail 42501). 'warning': PUBLIC may still execute advisory-lock functions (any role that can connect can
-- hold a lease's guard key: guarded writes then fail PF003 after the lock-wait bound); the owner is neither a
-- superuser nor a member of pg_signal_backend (a takeover blocked past its grace cannot end the blocker and fails
-- PF003). Owner-only; called from Rust by src/store.rs (Store::migrate, Store::layout_problems) and src/fence.rs
-- (the grants). The list of functions pgfence takes is also in src/store.rs (ADVISORY_FUNCTIONS_NEEDED), for the
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
                            'pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)']) f
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

SELECT pgfence._harden();
