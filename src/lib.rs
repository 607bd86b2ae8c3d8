#![doc = include_str!("../README.md")]
//!
//! # Architecture
//!
//! Modules depend only on the ones above them in this list:
//!
//! | module | owns | SQL it calls (`migrations/2026-11-30-…/up.sql`) |
//! |---|---|---|
//! | `types` | the shared value types ([`Epoch`], [`LossReason`], [`TaskState`]) and input limits | — |
//! | `error` | [`Error`], its codes ([`Error::sqlstate`]) and which are retryable | — |
//! | `validate` | input checks applied before anything is sent, fallible constructors | the same rules in `pgfence._text_problem` (`000001_schema`) |
//! | `reply` | how a pgfence SQL function's answer is read: `SELECT * FROM pgfence.f(…)` by column name, the shared reasons, the error for an answer it does not know | — |
//! | `tls`, `pooler` | [`Connector`] (connection strings, TLS, several hosts), [`PoolerMode`] | — |
//! | `store` | [`Store`]: the pool, database identity, migrations | applies every migration; `pgfence.identity` (`000001_schema`) |
//! | `lease` | [`Lease`], acquire / renew / release / force-release, status and history reads | `000002_lease_protocol`: `pgfence.acquire`, `renew`, `release`, `force_release`, `tenure_history` |
//! | `fence` | [`Fence`], the guard, [`Store::fenced`], [`Store::guarded_write`], the audit, enforcement, grants | `000003_guard`: `pgfence.fence`, `_guard`, `ungated_write`, enforcement, `prune_rejections`; `000005_roles`: `pgfence.grant_*`, `revoke` |
//! | `tasks` | the guarded task and event writes | `000004_tasks`: `pgfence.create_task`, `claim_task`, `transition_task`, `append_event` |
//! | [`leader`] | the leadership runtime, one file per concern | `000002_lease_protocol`: `pgfence.renew_many` |
//! | `embedded` | a throwaway PostgreSQL server (feature `testing`, Unix) | — |
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

#[cfg(all(unix, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(all(unix, feature = "testing"))))]
pub mod embedded;
mod error;
mod fence;
pub mod leader;
mod lease;
mod pooler;
mod reply;
mod store;
mod tasks;
mod tls;
mod types;
mod validate;
mod wire;

pub use error::{is_retryable_sqlstate, DenyReason, Error, Result};
pub use fence::{
    fence_passed, guarded_write_sql, Cached, Enforcement, Fence, FencedFuture, Rejection,
    RejectionFilter, FENCE_PASSED, MAX_OPERATION_LEN, METRIC_STALE_WRITES,
};
pub use lease::{
    ForceReleased, Lease, LeaseState, LeaseStatus, Released, Tenure, TenureSecret, SECRET_LEN,
};
pub use pooler::PoolerMode;
pub use store::{
    DatabaseIdentity, ExpectedIdentity, Pool, PooledConnection, Store, StoreConfig, MIGRATIONS,
};
pub use tasks::{Task, TaskEvent, TaskWrite, MAX_KIND_LEN, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH};
pub use tls::{redact, Connection, Connector, SslMode, TlsStream};
pub use types::{
    Epoch, LossReason, TaskState, MAX_CLUSTER_LEN, MAX_HOLDER_LEN, MAX_NAME_LEN, MAX_TTL, MIN_TTL,
};
pub use wire::WireStream;

/// The driver crates pgfence is built on, re-exported so that fenced-transaction code uses the same versions.
pub mod reexports {
    pub use diesel;
    pub use diesel_async;
    /// rustls, for [`StoreConfig::tls`](crate::StoreConfig::tls).
    #[cfg(feature = "tls")]
    pub use rustls;
    pub use tokio_postgres;
    pub use tokio_util;
}
