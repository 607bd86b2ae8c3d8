-- pgfence._trusted_writes_only as the migrations leave it; defined last in migrations/2026-11-30-000006_roles/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._trusted_writes_only()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF TG_TABLE_NAME = 'grants' AND TG_OP IN ('INSERT', 'UPDATE') THEN
        NEW.granted_by := session_user;
    END IF;
    IF pgfence._trusted(session_user) THEN
        RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    -- (Nested: a record's fields are resolved when the expression naming them is first run.)
    IF TG_TABLE_NAME = 'instance' AND TG_OP = 'UPDATE' THEN
        IF (NEW.singleton, NEW.instance_id, NEW.created_at)
               IS NOT DISTINCT FROM (OLD.singleton, OLD.instance_id, OLD.created_at)
           AND pgfence._may_use(NULL::text, p_operator => true) THEN
            RETURN NEW;
        END IF;
    ELSIF TG_TABLE_NAME = 'grants' AND TG_OP = 'DELETE' THEN
        IF NOT pgfence._grant_is_valid(OLD) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'pgfence: % on pgfence.% refused: only sessions of the schema owner change it (this session logged in as %)',
        TG_OP, TG_TABLE_NAME, pgfence._printable(session_user::text)
        USING ERRCODE = '42501',
              HINT = 'Grants change through pgfence grant / revoke, run as the owner; the takeover grace through set_takeover_grace.';
END;
$function$
