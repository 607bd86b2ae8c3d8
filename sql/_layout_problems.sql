-- pgfence._layout_problems as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._layout_problems()
 RETURNS TABLE(severity text, problem text, fix text)
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
