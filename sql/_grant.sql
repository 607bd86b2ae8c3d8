-- pgfence._grant as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._grant(p_role text, p_cluster text, p_operator boolean)
 RETURNS text[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
