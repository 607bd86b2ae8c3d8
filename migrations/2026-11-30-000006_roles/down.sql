-- Undoes 000006_roles: drops its functions and policies and turns row-level security off. Every role granted
-- through pgfence.grants first loses the privileges pgfence._grant gave it: without row-level security, SELECT
-- would show it every cluster. Its rows in pgfence.grants stay, so it is back once granted again. What was
-- revoked from PUBLIC stays revoked: granting pgfence's SECURITY DEFINER functions to every role is no state
-- worth returning to.
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN SELECT DISTINCT g.role FROM pgfence.grants g LOOP
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM %s', r);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM %s', r);
        EXECUTE format('REVOKE ALL ON SCHEMA pgfence FROM %s', r);
    END LOOP;
END;
$$;
DROP TRIGGER trusted_writes ON pgfence.grants;
DROP TRIGGER trusted_writes_truncate ON pgfence.grants;
DROP TRIGGER trusted_writes ON pgfence.instance;
DROP TRIGGER trusted_writes_truncate ON pgfence.instance;
DROP TRIGGER trusted_writes_truncate ON pgfence.rejections;
DROP TRIGGER own_rejections_insert ON pgfence.rejections;
DROP TRIGGER own_rejections_update ON pgfence.rejections;
DROP TRIGGER own_rejections_delete ON pgfence.rejections;
DO $$
BEGIN
    IF pg_catalog.to_regclass('pgfence.__diesel_schema_migrations') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS trusted_writes ON pgfence.__diesel_schema_migrations;
        DROP TRIGGER IF EXISTS trusted_writes_truncate ON pgfence.__diesel_schema_migrations;
        ALTER TABLE pgfence.__diesel_schema_migrations DISABLE ROW LEVEL SECURITY;
    END IF;
END;
$$;
DROP FUNCTION pgfence._own_rejections_only();
DROP FUNCTION pgfence._trusted_writes_only();
DROP FUNCTION pgfence._grant_is_valid(pgfence.grants);
DROP FUNCTION pgfence._layout_problems();
DROP FUNCTION pgfence.revoke(text, text);
DROP FUNCTION pgfence.grant_operator(text, text);
DROP FUNCTION pgfence.grant_application(text, text);
DROP FUNCTION pgfence._grant(text, text, boolean);
DROP FUNCTION pgfence._refuse_role(text);
DROP FUNCTION pgfence._harden(boolean);
DROP FUNCTION pgfence._privilege_target(text, oid);
DROP FUNCTION pgfence._granted_privileges();
DROP FUNCTION pgfence._trusted(name);
DROP POLICY readable ON pgfence.instance;
ALTER TABLE pgfence.instance DISABLE ROW LEVEL SECURITY;
DROP POLICY own_grants ON pgfence.grants;
DROP POLICY granted_clusters ON pgfence.rejections;
DROP POLICY granted_clusters ON pgfence.effect_reports;
DROP POLICY granted_clusters ON pgfence.effects;
DROP POLICY granted_clusters ON pgfence.task_events;
DROP POLICY granted_clusters ON pgfence.tasks;
DROP POLICY granted_clusters ON pgfence.tenures;
DROP POLICY granted_clusters ON pgfence.leases;
ALTER TABLE pgfence.effect_reports DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.effects DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.members DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.write_marks DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.beliefs DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tenure_secrets DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.grants DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.rejections DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.task_events DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tasks DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.tenures DISABLE ROW LEVEL SECURITY;
ALTER TABLE pgfence.leases DISABLE ROW LEVEL SECURITY;
