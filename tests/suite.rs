//! The integration suites that can share one throwaway PostgreSQL server, built as one test binary: one server
//! and one template database per `cargo test` run instead of one per file, and one link instead of thirteen. Each
//! file is a module (`cargo test --test suite guard::` runs one). Suites that install process-wide state (a
//! global tracing subscriber or metrics recorder) or that time themselves against the whole machine stay
//! binaries of their own (see `[[test]]` in Cargo.toml).

mod common;

#[path = "acquire_many.rs"]
mod acquire_many;
#[path = "effects.rs"]
mod effects;
#[path = "embedded.rs"]
mod embedded;
#[path = "guard.rs"]
mod guard;
#[path = "guard_shapes.rs"]
mod guard_shapes;
#[path = "hardening.rs"]
mod hardening;
#[path = "hostile.rs"]
mod hostile;
#[path = "layout.rs"]
mod layout;
#[path = "lease.rs"]
mod lease;
#[path = "ledger_races.rs"]
mod ledger_races;
#[path = "membership.rs"]
mod membership;
#[path = "migrations.rs"]
mod migrations;
#[path = "multihost.rs"]
mod multihost;
#[path = "native.rs"]
mod native;
#[path = "overlap.rs"]
mod overlap;
#[path = "privileges.rs"]
mod privileges;
#[path = "regress.rs"]
mod regress;
#[path = "spread.rs"]
mod spread;
#[path = "sql_source.rs"]
mod sql_source;
#[path = "sqlstate.rs"]
mod sqlstate;
#[path = "standby.rs"]
mod standby;
#[path = "store.rs"]
mod store;
#[path = "takeover.rs"]
mod takeover;
#[path = "tls.rs"]
mod tls;
#[path = "trust.rs"]
mod trust;
