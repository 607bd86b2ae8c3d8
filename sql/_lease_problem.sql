-- pgfence._lease_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._lease_problem(p_lease text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN p_lease IS NULL OR pg_catalog.strpos(p_lease, '/') OPERATOR(pg_catalog.=) 0
            THEN 'must be cluster-qualified: ''<cluster>/<name>'''
        ELSE coalesce(
            'cluster ' OPERATOR(pg_catalog.||) pgfence._cluster_problem(pg_catalog.split_part(p_lease, '/', 1)),
            'lease name ' OPERATOR(pg_catalog.||)
                pgfence._text_problem(pg_catalog.substr(p_lease, pg_catalog.strpos(p_lease, '/') OPERATOR(pg_catalog.+) 1),
                                      pgfence._max_name_len()))
    END
$function$
