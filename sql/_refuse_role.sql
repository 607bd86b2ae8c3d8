-- pgfence._refuse_role as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._refuse_role(p_role text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
