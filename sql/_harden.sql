-- pgfence._harden as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._harden(p_raw_writes boolean DEFAULT NULL::boolean)
 RETURNS text[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
 SET jit TO 'off'
AS $function$
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
$function$
