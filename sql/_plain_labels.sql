-- pgfence._plain_labels as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._plain_labels(p_operation text, p_table text, p_key text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT octet_length(p_operation) BETWEEN 1 AND pgfence._max_label_len()
           AND coalesce(octet_length(p_table) BETWEEN 1 AND pgfence._max_label_len(), true)
           AND coalesce(octet_length(p_key) BETWEEN 1 AND pgfence._max_holder_len(), true)
           AND (p_operation || coalesce(p_table, '') || coalesce(p_key, '')) ~ '^[ -~]+$'
$function$
