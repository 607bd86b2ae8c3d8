-- pgfence.revoke as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.revoke(p_role text, p_cluster text, OUT removed integer, OUT repairs text[])
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
