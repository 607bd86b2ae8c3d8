#![doc = include_str!("../README.md")]
//!
//! # Architecture
//!
//! Modules depend only on the ones above them in this list:
//!
//! | module | owns | SQL it calls (`migrations/`) |
//! |---|---|---|
//! | `types` | the shared value types ([`Epoch`], [`LossReason`], [`TaskState`]) and input limits | — |
//! | `error` | [`Error`], its codes ([`Error::sqlstate`]) and which are retryable | — |
//! | `validate` | input checks applied before anything is sent, fallible constructors | the same rules in `pgfence._text_problem` |
//! | `tls`, `pooler` | [`Connector`] (connection strings, TLS, several hosts), [`PoolerMode`] | — |
//! | `store` | [`Store`]: the pool, database identity, migrations | — |
//! | `lease` | [`Lease`], acquire / renew / release / force-release, status and history reads | `pgfence.acquire`, `renew`, `release`, `force_release` |
//! | `fence` | [`Fence`], the guard, [`Store::fenced`], [`Store::guarded_write`], the audit, enforcement, grants | `pgfence.fence`, `pgfence._guard`, `pgfence._reject`, `pgfence.grant_*` |
//! | `tasks` | the guarded task and event writes | `pgfence.create_task`, `claim_task`, `transition_task`, `append_event` |
//! | [`leader`] | the leadership runtime, one file per concern | `pgfence.renew_many` |
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
mod store;
mod tasks;
mod tls;
mod types;
mod validate;

pub use error::{is_retryable_sqlstate, DenyReason, Error, Result};
pub use fence::{
    fence_passed, guarded_write_sql, Cached, Enforcement, Fence, Rejection, RejectionFilter,
    FENCE_PASSED, MAX_OPERATION_LEN, METRIC_STALE_WRITES,
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
