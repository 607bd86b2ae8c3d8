-- pgfence._require_instance_operator as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._require_instance_operator(p_function text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    IF NOT pgfence._may_use(NULL::text, p_operator => true) THEN
        RAISE EXCEPTION 'pgfence: % needs operator rights on every cluster; role % has none', p_function,
            pgfence._printable(session_user::text)
            USING ERRCODE = '42501',
                  HINT = 'The schema owner grants them: pgfence grant --operator --all-clusters --role <role>.';
    END IF;
END;
$function$
