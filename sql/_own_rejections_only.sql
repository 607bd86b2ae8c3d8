-- pgfence._own_rejections_only as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._own_rejections_only()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    bent boolean;
BEGIN
    IF pgfence._trusted(session_user) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        bent := EXISTS (SELECT 1 FROM changed_new c WHERE c.role <> session_user OR c.count < 1);
    ELSIF TG_OP = 'UPDATE' THEN
        bent := EXISTS (SELECT 1 FROM changed_old o JOIN changed_new c ON c.id = o.id
                         WHERE o.role <> session_user OR c.count < o.count
                            OR (c.role, c.scope, c.lease, c.presented_epoch, c.current_epoch, c.current_holder,
                                c.reason, c.operation, c.target_table, c.target_key, c.rejected_at, c.slot)
                               IS DISTINCT FROM
                               (o.role, o.scope, o.lease, o.presented_epoch, o.current_epoch, o.current_holder,
                                o.reason, o.operation, o.target_table, o.target_key, o.rejected_at, o.slot))
                OR (SELECT count(*) FROM changed_new) <> (SELECT count(*) FROM changed_old);
    ELSE
        bent := NOT pgfence._may_use(NULL::text, p_operator => true);
    END IF;
    IF bent THEN
        RAISE EXCEPTION 'pgfence: % of audit rows refused: the audit only grows by the refused role''s own refusals (this session logged in as %)',
            TG_OP, pgfence._printable(session_user::text)
            USING ERRCODE = '42501';
    END IF;
    RETURN NULL;
END;
$function$
