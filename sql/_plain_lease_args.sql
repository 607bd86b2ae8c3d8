-- pgfence._plain_lease_args as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._plain_lease_args(p_lease text, p_epoch bigint)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT p_lease ~ '^[ -.0-~]+/[ -~]+$' AND strpos(p_lease, '/') <= pgfence._max_cluster_len() + 1
           AND octet_length(p_lease) - strpos(p_lease, '/') <= pgfence._max_name_len() AND p_epoch >= 1
$function$
