-- pgfence._cluster_problem as the migrations leave it; defined last in migrations/2026-11-30-000001_schema/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._cluster_problem(p_cluster text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT coalesce(pgfence._text_problem(p_cluster, pgfence._max_cluster_len()),
                               CASE WHEN pg_catalog.strpos(p_cluster, '/') OPERATOR(pg_catalog.>) 0
                                    THEN 'must not contain ''/''' END)
$function$
