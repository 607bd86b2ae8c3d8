-- pgfence.assign_group as the migrations leave it; defined last in migrations/2026-11-30-000005_membership/up.sql.
-- Generated from the database (see README.md): edit the migrations, then bless.
CREATE OR REPLACE FUNCTION pgfence.assign_group(p_group text, p_member text, p_incarnation bigint, p_secret text, p_version bigint, p_generation bigint, p_names text[], p_owners text[], p_removed text[], p_counted text[])
 RETURNS pgfence.rebalance_result
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET lock_timeout TO '10min'
AS $function$
DECLARE
    refused pgfence.member_result;
    g pgfence.groups;
    gone text;
    wait_ms bigint := pgfence._lock_wait_ms();
BEGIN
    IF p_version IS NULL OR p_version < 0 THEN
        RAISE EXCEPTION 'pgfence: invalid version: must be at least 0' USING ERRCODE = '22023', COLUMN = 'version';
    END IF;
    IF p_generation IS NULL OR p_generation < 0 THEN
        RAISE EXCEPTION 'pgfence: invalid generation: must be at least 0'
            USING ERRCODE = '22023', COLUMN = 'generation';
    END IF;
    IF p_names IS NULL OR p_owners IS NULL OR p_removed IS NULL OR p_counted IS NULL
       OR cardinality(p_names) <> cardinality(p_owners)
       OR array_position(p_names, NULL) IS NOT NULL OR array_position(p_owners, NULL) IS NOT NULL
       OR array_position(p_removed, NULL) IS NOT NULL OR array_position(p_counted, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: invalid assignment: names and owners are arrays of one length, and no array holds NULL'
            USING ERRCODE = '22023', COLUMN = 'assignment';
    END IF;
    refused := pgfence._member_call(p_group, p_member, p_incarnation, p_secret, 'assign_group'::text);
    IF refused.outcome IS NOT NULL THEN
        RETURN ROW(refused.outcome, refused.reason, NULL, NULL, NULL)::pgfence.rebalance_result;
    END IF;
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        SELECT * INTO g FROM pgfence.groups x WHERE x.grp = p_group FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgfence: assignment of group % waited % ms for its row lock; blocked by %',
            pgfence._printable(p_group), wait_ms, pgfence._describe_backends(pgfence._member_lockers())
            USING ERRCODE = 'PF003';
    END;
    IF g.claimed_by IS DISTINCT FROM p_member OR g.claimed_until <= clock_timestamp() THEN
        RETURN ROW('refused', 'not_claimed', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    IF g.generation <> p_generation OR p_version > g.version THEN
        RETURN ROW('stale', 'generation', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    -- Every member named must count now (live; settled, or counted before).
    SELECT o.member INTO gone
      FROM (SELECT DISTINCT u.member FROM unnest(p_owners || p_counted) AS u(member)) o
     WHERE NOT EXISTS (SELECT 1 FROM pgfence.members m
                        WHERE m.grp = p_group AND m.member = o.member AND m.left_at IS NULL
                          AND m.expires_at > clock_timestamp() AND (m.settled_at IS NOT NULL OR m.counted))
     LIMIT 1;
    IF gone IS NOT NULL THEN
        RETURN ROW('stale', 'member_gone', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    -- And every member counted by the stored assignment that is live now must be counted by this one: a member
    -- the claimant read as expired may have joined again since (a counted member's rejoin changes no version),
    -- and a computation without it would move its names away only for the next one to move them back.
    SELECT m.member INTO gone
      FROM pgfence.members m
     WHERE m.grp = p_group AND m.counted AND m.left_at IS NULL AND m.expires_at > clock_timestamp()
       AND m.member <> ALL (p_counted)
     LIMIT 1;
    IF gone IS NOT NULL THEN
        RETURN ROW('stale', 'member_back', g.version, g.generation, NULL)::pgfence.rebalance_result;
    END IF;
    DELETE FROM pgfence.assignments a WHERE a.grp = p_group AND a.name = ANY (p_removed);
    INSERT INTO pgfence.assignments AS a (grp, name, member)
    SELECT p_group, w.name, w.member FROM unnest(p_names, p_owners) AS w(name, member)
    ON CONFLICT (grp, name) DO UPDATE SET member = EXCLUDED.member WHERE a.member <> EXCLUDED.member;
    UPDATE pgfence.members m SET counted = (m.member = ANY (p_counted))
     WHERE m.grp = p_group AND m.counted <> (m.member = ANY (p_counted));
    UPDATE pgfence.groups x
       SET generation = x.generation + 1, assigned_version = p_version, assigned_at = clock_timestamp(),
           pending_since = CASE WHEN x.version > p_version THEN x.pending_since END,
           urgent = x.urgent AND x.version > p_version, claimed_by = NULL, claimed_until = NULL
     WHERE x.grp = p_group
    RETURNING * INTO g;
    PERFORM pg_notify(g.channel, 'assigned ' || g.generation);
    RETURN ROW('assigned', NULL, g.version, g.generation, NULL)::pgfence.rebalance_result;
END;
$function$
