-- pgfence._harden as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._harden(p_raw_writes boolean DEFAULT NULL::boolean)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
 SET jit TO 'off'
AS $function$
DECLARE
    r record;
    -- Whether granted roles may keep raw DML on the task tables: while the raw-SQL enforcement is on (p_raw_writes:
    -- what set_enforcement is about to switch it to).
    raw_writes boolean := coalesce(p_raw_writes, pgfence.enforcement() <> 'off');
    wait_ms bigint := pgfence._lock_wait_ms();
    owner_oid oid := (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgfence');
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    DELETE FROM pgfence.grants g WHERE NOT pgfence._grant_is_valid(g);
    -- A row written in a session that is not trusted (now) can only have got in while someone with the owner's
    -- rights had the trusted_writes trigger disabled (or a trusted administrator was demoted since): said, for the
    -- owner to judge; not removed (a grant pgfence made must never vanish because its granter changed).
    FOR r IN SELECT g.role::oid AS role_oid, g.cluster, g.operator, g.granted_by FROM pgfence.grants g
              WHERE NOT pgfence._trusted(g.granted_by)
    LOOP
        RAISE WARNING 'pgfence: the grant of % on % was written in a session of %, which is not trusted: revoke it unless you made it',
            pgfence._printable(pg_get_userbyid(r.role_oid)),
            CASE WHEN r.cluster IS NULL THEN 'every cluster' ELSE 'cluster ' || pgfence._printable(r.cluster) END
                || CASE WHEN r.operator THEN ' (operator)' ELSE '' END,
            pgfence._printable(r.granted_by::text);
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
                     UNION ALL
                     SELECT 'FUNCTION', p.oid, a.grantor, a.grantee, a.privilege_type, a.is_grantable
                       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                      CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                      WHERE n.nspname = 'pgfence'
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
                RAISE WARNING 'pgfence: revoked % on % from %: pgfence did not grant it',
                    CASE WHEN r.option_only THEN 'the grant option of ' ELSE '' END || r.privilege_type,
                    pgfence._privilege_target(r.kind, r.object),
                    CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE pgfence._printable(pg_get_userbyid(r.grantee)) END;
            END IF;
        END LOOP;
    END LOOP;

    -- Column privileges: pgfence grants none.
    FOR r IN SELECT DISTINCT c.oid AS object, a.attname, x.privilege_type, x.grantee
               FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              CROSS JOIN LATERAL aclexplode(a.attacl) x
              WHERE n.nspname = 'pgfence' AND a.attacl IS NOT NULL AND x.grantee <> owner_oid
    LOOP
        EXECUTE format('REVOKE %s (%I) ON TABLE %s FROM %s CASCADE', r.privilege_type, r.attname,
                       r.object::regclass, CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                                ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
        RAISE WARNING 'pgfence: revoked % (%) on TABLE % from %: pgfence did not grant it', r.privilege_type,
            r.attname, r.object::regclass,
            CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE pgfence._printable(pg_get_userbyid(r.grantee)) END;
    END LOOP;

    FOR r IN SELECT c.relname, t.tgname
               FROM pg_trigger t
               JOIN pg_class c ON c.oid = t.tgrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'pgfence' AND NOT t.tgisinternal
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
        RAISE WARNING 'pgfence: dropped trigger % on pgfence.%: a trigger on a pgfence table runs as its owner; every tenure secret presented while it existed may be known to its author (acquire again)',
            pgfence._printable(r.tgname), r.relname;
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
        RAISE WARNING 'pgfence: enabled trigger % on pgfence.% again: someone with the owner''s rights disabled it',
            pgfence._printable(r.tgname), r.relname;
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
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'pgfence: dropping a foreign trigger waited % ms for its table; blocked by %', wait_ms,
        pgfence._describe_backends(pgfence._table_lockers())
        USING ERRCODE = 'PF003', HINT = 'A long transaction on pgfence tables holds them: let it finish and retry.';
END;
$function$
