-- pgfence._name_set as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._name_set(p_names text[])
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    id bigint := pgfence._known_name_set(p_names);
BEGIN
    IF id IS NULL THEN
        INSERT INTO pgfence.name_sets AS s (digest, names)
        VALUES (sha256(convert_to(array_to_string(p_names, E'\n', ''), 'UTF8')), p_names)
        ON CONFLICT (digest) DO NOTHING
        RETURNING s.set_id INTO id;
        -- Stored by a concurrent join meanwhile.
        id := coalesce(id, pgfence._known_name_set(p_names));
    END IF;
    RETURN id;
END;
$function$
