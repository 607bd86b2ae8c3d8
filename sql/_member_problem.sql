-- pgfence._member_problem as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._member_problem(p_group text, p_member text, p_weight integer, p_names text[], p_pinned text[], p_excluded text[], p_known boolean)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT coalesce(
        'invalid group: ' || pgfence._lease_problem(p_group),
        pgfence._arg_problem('member'::text, p_member, pgfence._max_holder_len()),
        CASE WHEN p_weight IS NULL OR p_weight < 1 OR p_weight > pgfence._max_member_weight()
             THEN format('invalid weight: must be between 1 and %s, got %s', pgfence._max_member_weight(),
                         coalesce(p_weight::text, 'NULL')) END,
        CASE WHEN p_names IS NULL OR p_pinned IS NULL OR p_excluded IS NULL
             THEN 'invalid names: the names, pins and exclusions must be arrays (empty for none)' END,
        CASE WHEN cardinality(p_names) = 0 THEN 'invalid names: a member leads at least one name' END,
        CASE WHEN cardinality(p_names) + cardinality(p_pinned) + cardinality(p_excluded) > pgfence._max_group_names()
             THEN format('invalid names: at most %s names, pins and exclusions in all, got %s',
                         pgfence._max_group_names(),
                         cardinality(p_names) + cardinality(p_pinned) + cardinality(p_excluded)) END,
        (SELECT format('invalid %s %s of %s: %s', k.kind, n.ord, cardinality(k.arr),
                       CASE WHEN n.name IS NULL THEN 'must not be NULL'
                            ELSE pgfence._text_problem(n.name, pgfence._max_name_len()) END)
           FROM (VALUES ('name', CASE WHEN p_known THEN '{}'::text[] ELSE p_names END), ('pin', p_pinned),
                        ('exclusion', p_excluded)) AS k(kind, arr),
                unnest(k.arr) WITH ORDINALITY AS n(name, ord)
          WHERE n.name IS NULL OR pgfence._text_problem(n.name, pgfence._max_name_len()) IS NOT NULL
          LIMIT 1),
        (SELECT format('invalid %s: %s is listed twice', k.kind, pgfence._printable(d.name))
           FROM (VALUES ('names', CASE WHEN p_known THEN '{}'::text[] ELSE p_names END), ('pins', p_pinned),
                        ('exclusions', p_excluded)) AS k(kind, arr),
                LATERAL (SELECT n.name FROM unnest(k.arr) AS n(name) GROUP BY n.name HAVING count(*) > 1
                          LIMIT 1) d
          LIMIT 1),
        (SELECT format('invalid pin: %s is not one of the member''s names', pgfence._printable(p.name))
           FROM unnest(p_pinned) AS p(name) WHERE NOT p.name = ANY (p_names) LIMIT 1),
        (SELECT format('invalid pin: %s is also excluded', pgfence._printable(p.name))
           FROM unnest(p_pinned) AS p(name) WHERE p.name = ANY (p_excluded) LIMIT 1))
$function$
