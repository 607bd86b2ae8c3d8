-- Weakened copy: a takeover that does not take the exclusive guard lock (and a trigger that does not either).
CREATE OR REPLACE FUNCTION pgfence._take_guard_lock(p_lease text, p_lock_key integer) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RETURN; END; $$;
CREATE OR REPLACE FUNCTION pgfence._lease_change() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END; $$;
