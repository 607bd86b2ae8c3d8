-- pgfence._last_attempt as the migrations leave it; defined last in migrations/2026-11-30-000004_tasks/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence._last_attempt(p_lease text, p_effect_key text)
 RETURNS SETOF pgfence.effects
 LANGUAGE sql
 STABLE
AS $function$
    SELECT e.* FROM pgfence.effects e WHERE e.lease = p_lease AND e.effect_key = p_effect_key
     ORDER BY e.attempt DESC LIMIT 1
$function$
