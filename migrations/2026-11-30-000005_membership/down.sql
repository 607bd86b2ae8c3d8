-- Undoes 000005_membership: drops its functions, view, type and table (the members go with it).
DROP FUNCTION pgfence.leave_group(text, text, bigint, text);
DROP FUNCTION pgfence.heartbeat(text, text, bigint, text, bigint);
DROP FUNCTION pgfence._member_call(text, text, bigint, text, text);
DROP FUNCTION pgfence._member_loss(pgfence.members, bigint, text, timestamptz);
DROP FUNCTION pgfence.join_group(text, text, integer, text[], text[], text[], bigint);
DROP FUNCTION pgfence._settle_delay(integer, bigint);
DROP FUNCTION pgfence._flaps_after(pgfence.members, timestamptz);
DROP FUNCTION pgfence._roster_digest(text);
DROP FUNCTION pgfence.roster(text);
DROP VIEW pgfence.group_members;
DROP FUNCTION pgfence._deny_member_call(text, text);
DROP TYPE pgfence.member_result;
DROP FUNCTION pgfence._member_lockers();
DROP FUNCTION pgfence._member_problem(text, text, integer, text[], text[], text[]);
DROP TABLE pgfence.members;
DROP FUNCTION pgfence._max_group_names();
DROP FUNCTION pgfence._max_member_weight();
