-- pgfence._check_group_read as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._check_group_read(p_group text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    IF pgfence._lease_problem(p_group) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid group: %', pgfence._lease_problem(p_group)
            USING ERRCODE = '22023', COLUMN = 'group';
    END IF;
    IF NOT pgfence._may_use(pgfence._cluster_of(p_group)) THEN
        RAISE EXCEPTION 'pgfence: role % has no grant on cluster %', pgfence._printable(session_user::text),
            pgfence._printable(pgfence._cluster_of(p_group)) USING ERRCODE = '42501';
    END IF;
END;
$function$
