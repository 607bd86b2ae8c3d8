-- Undoes 000001_schema, and with it everything: dropping the schema destroys every epoch ever issued. pgfence
-- never runs this itself: epochs must increase forever, so a revert is an explicit operator decision.
DROP SCHEMA IF EXISTS pgfence CASCADE;
