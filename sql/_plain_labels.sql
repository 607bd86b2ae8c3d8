-- pgfence._plain_labels as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._plain_labels(p_operation text, p_table text, p_key text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT pg_catalog.octet_length(p_operation) OPERATOR(pg_catalog.>=) 1
           AND pg_catalog.octet_length(p_operation) OPERATOR(pg_catalog.<=) pgfence._max_label_len()
           AND coalesce(pg_catalog.octet_length(p_table) OPERATOR(pg_catalog.>=) 1
                        AND pg_catalog.octet_length(p_table) OPERATOR(pg_catalog.<=) pgfence._max_label_len(), true)
           AND coalesce(pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.>=) 1
                        AND pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.<=) pgfence._max_holder_len(), true)
           AND (p_operation OPERATOR(pg_catalog.||) coalesce(p_table, '') OPERATOR(pg_catalog.||) coalesce(p_key, ''))
               OPERATOR(pg_catalog.~) '^[ -~]+$'
$function$
