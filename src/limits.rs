//! The limits of every input pgfence accepts, checked before anything is sent (the database checks the same
//! ones: its `pgfence._max_*_len()` constants, compared with these by the repository's `tests/sql_source.rs`),
//! and the defaults of [`StoreConfig`](crate::StoreConfig). The bottom of the module graph: it imports nothing
//! from pgfence.

use std::time::Duration;

/// Shortest accepted ttl.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Longest accepted ttl.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Longest accepted cluster name, in characters.
pub const MAX_CLUSTER_LEN: usize = 63;

/// Longest accepted lease name, in characters (the cluster prefix is not counted).
pub const MAX_NAME_LEN: usize = 200;

/// Longest accepted holder (and assignee, task key) in characters.
pub const MAX_HOLDER_LEN: usize = 256;

/// Length of a tenure secret in characters (hexadecimal).
pub const SECRET_LEN: usize = 64;

/// The longest accepted operation label (as in `pgfence.rejections.operation`).
pub const MAX_OPERATION_LEN: usize = 64;

/// Longest accepted event kind.
pub const MAX_KIND_LEN: usize = 64;

/// Largest accepted payload (task or event), serialized.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// Deepest accepted payload nesting.
pub const MAX_PAYLOAD_DEPTH: usize = 64;

/// Longest accepted group name, in characters (the cluster prefix is not counted): a lease name's limit.
pub const MAX_GROUP_LEN: usize = MAX_NAME_LEN;

/// The most names, pins and exclusions one member may declare in all: 131,072 (128 Ki), the most history shards
/// a Temporal cluster runs. A group's names are stored once however many members declare them, and each member
/// reads only its own assignment, so the cost that grows with this number is the rebalance (once per change of
/// the group, by one member) and the join that first declares a set; docs/leadership.md ("Fleets") gives the
/// measured figures up to 100,000 names.
pub const MAX_GROUP_NAMES: usize = 131_072;

/// The most shards one sharded controller may have (its shards are names of the group, within
/// [`MAX_GROUP_NAMES`]).
pub const MAX_SHARDS: u32 = 131_072;

/// The largest accepted member weight (capacity); the smallest is 1.
pub const MAX_WEIGHT: u32 = 1000;

/// How long [`Store::migrate`](crate::Store::migrate) waits for the migration lock unless
/// [`StoreConfig::migration_lock_wait`](crate::StoreConfig::migration_lock_wait) says otherwise.
pub const DEFAULT_MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(30);
