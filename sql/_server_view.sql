-- pgfence._server_view as the migrations leave it; defined last in migrations/2026-11-30-000002_lease_protocol/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._server_view(OUT system_identifier text, OUT instance_id uuid, OUT server_addr text, OUT client_addr text, OUT application_name text)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    SELECT i.instance_id INTO instance_id FROM pgfence.instance i;
    server_addr := host(inet_server_addr()) || ':' || inet_server_port();
    client_addr := host(inet_client_addr()) || ':' || inet_client_port();
    application_name := current_setting('application_name', true);
    BEGIN
        SELECT c.system_identifier::text INTO system_identifier FROM pg_control_system() c;
    EXCEPTION WHEN insufficient_privilege THEN
        system_identifier := NULL;
    END;
END;
$function$
