-- pgfence._tenure_reason_slot as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._tenure_reason_slot(p_reason text)
 RETURNS smallint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT (15 OPERATOR(pg_catalog.+) pg_catalog.array_position(
               ARRAY['superseded', 'expired', 'released', 'failover', 'holder_mismatch', 'bad_secret', 'row_fence',
                     'delete_refused', 'lease_change', 'lease_mismatch']::text[], p_reason))::smallint
$function$
