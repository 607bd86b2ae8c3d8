#![doc = include_str!("../README.md")]
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

pub use error::{is_retryable_sqlstate, DenyReason, Error, Result};
pub use fence::{
    fence_passed, guarded_write_sql, Cached, Enforcement, Fence, FencedFuture, Rejection,
    RejectionFilter, TenureSecret, FENCE_PASSED, MAX_OPERATION_LEN, METRIC_STALE_WRITES,
    SECRET_LEN,
};
pub use lease::{
    Epoch, ForceReleased, Lease, LeaseState, LeaseStatus, LossReason, Released, Tenure,
    MAX_CLUSTER_LEN, MAX_HOLDER_LEN, MAX_NAME_LEN, MAX_TTL, MIN_TTL,
};
pub use pooler::PoolerMode;
pub use store::{
    redact, DatabaseIdentity, ExpectedIdentity, Pool, PooledConnection, Store, StoreConfig,
    MIGRATIONS,
};
pub use tasks::{
    Task, TaskEvent, TaskState, TaskWrite, MAX_KIND_LEN, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH,
};
pub use tls::{Connection, Connector, SslMode, TlsStream};

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
