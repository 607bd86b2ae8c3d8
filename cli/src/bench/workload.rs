//! The workloads of `pgfence bench` and the writers that run them.
//!
//! Every workload writes the same thing in every path, so that a ratio between two of them isolates one cost:
//!
//! * **user table** (`update`, `tx`, `fenced`, `raw-*`, `pgbench-fenced`): `batch` rows of
//!   `pgfence_bench.rows`, the range `[writer × batch, (writer + 1) × batch)`, so writers never touch each
//!   other's rows;
//! * **task** (`append`, `append-unguarded`, `claim-transition`, `append-own-lease`, `raw-append`,
//!   `pgbench-append`): the writer's own task row and one appended event;
//! * **lease** (`acquire`, `renew`): one lease row in a table of `lease_rows` leases.
//!
//! The **peers** (`peer-*`) are the guards a user would otherwise pick, on the same rows through the same pool:
//! a share lock on the lease row held to the commit (`peer-for-share`, as a transaction; `peer-for-share-update`,
//! in one statement) and the row's own fence column (`peer-row-fence`). See [`Workload::peer`].

use std::sync::Arc;
use std::time::Duration;

use diesel::pg::sql_types::Jsonb;
use diesel::sql_types::{BigInt, Text};
use pgfence::{Fence, Lease, Store, TaskState};
use serde_json::json;
use tokio_postgres::types::Json;
use tokio_postgres::Statement;

use super::{db_error, Failure};

/// Which client stack a workload goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// pgfence's bb8/diesel-async pool (the public API, or the application's own statements on its pool).
    Pool,
    /// tokio-postgres, one connection per writer, statements prepared once.
    Raw,
    /// `pgbench -M prepared`, one process per round.
    Pgbench,
}

impl Path {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Path::Pool => "pool",
            Path::Raw => "raw",
            Path::Pgbench => "pgbench",
        }
    }
}

/// One thing the benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Workload {
    Update,
    UpdatePing,
    Tx,
    Fenced,
    FencedNative,
    RawFenced,
    RawPipelined,
    RawGuardedUpdate,
    RawGuardedUpdateNative,
    GuardedUpdate,
    GuardedUpdateNative,
    RawAdvisoryUpdate,
    PeerForShare,
    PeerForShareUpdate,
    PeerRowFence,
    PgbenchFenced,
    Append,
    AppendUnguarded,
    ClaimTransition,
    AppendOwnLease,
    RawAppend,
    PgbenchAppend,
    Acquire,
    Renew,
}

/// The write workloads, in the order each round runs them.
pub(super) const WRITES: [Workload; 22] = [
    Workload::Update,
    Workload::UpdatePing,
    Workload::Tx,
    Workload::Fenced,
    Workload::FencedNative,
    Workload::RawFenced,
    Workload::RawPipelined,
    Workload::RawGuardedUpdate,
    Workload::RawGuardedUpdateNative,
    Workload::GuardedUpdate,
    Workload::GuardedUpdateNative,
    Workload::RawAdvisoryUpdate,
    Workload::PeerForShare,
    Workload::PeerForShareUpdate,
    Workload::PeerRowFence,
    Workload::PgbenchFenced,
    Workload::Append,
    Workload::AppendUnguarded,
    Workload::ClaimTransition,
    Workload::AppendOwnLease,
    Workload::RawAppend,
    Workload::PgbenchAppend,
];

/// The lease workloads, in the order each round runs them (for every lease table size).
pub(super) const LEASES: [Workload; 2] = [Workload::Acquire, Workload::Renew];

impl Workload {
    pub(super) fn all() -> impl Iterator<Item = Workload> {
        WRITES.into_iter().chain(LEASES)
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Workload::Update => "update",
            Workload::UpdatePing => "update-ping",
            Workload::Tx => "tx",
            Workload::Fenced => "fenced",
            Workload::FencedNative => "fenced-native",
            Workload::RawFenced => "raw-fenced",
            Workload::RawPipelined => "raw-fenced-pipelined",
            Workload::RawGuardedUpdate => "raw-guarded-update",
            Workload::RawGuardedUpdateNative => "raw-guarded-update-native",
            Workload::GuardedUpdate => "guarded-update",
            Workload::GuardedUpdateNative => "guarded-update-native",
            Workload::RawAdvisoryUpdate => "raw-advisory-update",
            Workload::PeerForShare => "peer-for-share",
            Workload::PeerForShareUpdate => "peer-for-share-update",
            Workload::PeerRowFence => "peer-row-fence",
            Workload::PgbenchFenced => "pgbench-fenced",
            Workload::Append => "append",
            Workload::AppendUnguarded => "append-unguarded",
            Workload::ClaimTransition => "claim-transition",
            Workload::AppendOwnLease => "append-own-lease",
            Workload::RawAppend => "raw-append",
            Workload::PgbenchAppend => "pgbench-append",
            Workload::Acquire => "acquire",
            Workload::Renew => "renew",
        }
    }

    pub(super) fn parse(name: &str) -> Option<Workload> {
        Workload::all().find(|w| w.name() == name)
    }

    pub(super) fn description(self) -> &'static str {
        match self {
            Workload::Update => {
                "unguarded UPDATE of the rows, autocommit, prepared once per connection (pgfence::Cached), through \
                 the pool (the baseline)"
            }
            Workload::UpdatePing => {
                "as update, through a pool that tests every connection at check-out (ping_on_checkout(true))"
            }
            Workload::Tx => {
                "the same UPDATE in a transaction (BEGIN; UPDATE; COMMIT: 3 round trips) through the pool"
            }
            Workload::Fenced => {
                "Store::fenced: BEGIN and the guard pipelined; the same UPDATE; COMMIT (3 round trips); the portable \
                 guard (pgfence.fence)"
            }
            Workload::FencedNative => {
                "as fenced, through a store using the native guard (pgfence_native.fence, the extension in native/)"
            }
            Workload::RawFenced => {
                "tokio-postgres, prepared: BEGIN; SELECT * FROM pgfence.fence(..); UPDATE; COMMIT"
            }
            Workload::RawPipelined => {
                "as raw-fenced with BEGIN and the guard pipelined in one round trip (a proposed library path)"
            }
            Workload::RawGuardedUpdate => {
                "tokio-postgres, prepared: the statement Store::guarded_write sends (pgfence::guarded_write_sql)"
            }
            Workload::RawGuardedUpdateNative => {
                "tokio-postgres, prepared: the statement of guarded-update-native (pgfence::native_guarded_write_sql)"
            }
            Workload::GuardedUpdate => {
                "Store::guarded_write: the guard and the same UPDATE in one statement, one round trip; the portable \
                 guard (pgfence.fence)"
            }
            Workload::GuardedUpdateNative => {
                "as guarded-update, through a store using the native guard (pgfence_native.fence)"
            }
            Workload::RawAdvisoryUpdate => {
                "as raw-guarded-update with the floor of a plpgsql guard: advisory lock and fresh epoch read only \
                 (no grant, secret, timeline or audit; a yardstick, not safe)"
            }
            Workload::PeerForShare => {
                "peer: BEGIN and SELECT epoch FROM pgfence.leases WHERE name = $1 FOR SHARE pipelined; the same \
                 UPDATE if the epoch is the writer's; COMMIT (3 round trips, as fenced). A share lock on the lease \
                 row to the commit: no secret, grant, audit or takeover bound; a MultiXact when writers overlap"
            }
            Workload::PeerForShareUpdate => {
                "peer: the same share lock and the same UPDATE in one statement (a CTE), one round trip, as \
                 guarded-update"
            }
            Workload::PeerRowFence => {
                "peer: only the rows' own fence, UPDATE .. SET fence = $epoch WHERE .. AND fence <= $epoch (one \
                 statement): a stale writer is refused only on rows a newer epoch already wrote"
            }
            Workload::PgbenchFenced => "pgbench -M prepared, the SQL of raw-fenced",
            Workload::Append => "Store::append_event on the hot lease: guard + task row fence + event, one statement",
            Workload::AppendUnguarded => "the same task UPDATE and event INSERT in one prepared call, without the guard",
            Workload::ClaimTransition => "Store::claim_task and Store::transition_task (back to pending), alternating",
            Workload::AppendOwnLease => "Store::append_event, every writer on a lease of its own",
            Workload::RawAppend => "tokio-postgres, prepared: SELECT * FROM pgfence.append_event(..)",
            Workload::PgbenchAppend => "pgbench -M prepared: SELECT * FROM pgfence.append_event(..)",
            Workload::Acquire => "Store::acquire of a random lease (a new epoch each time)",
            Workload::Renew => "Store::renew of the writer's lease",
        }
    }

    pub(super) fn path(self) -> Path {
        match self {
            Workload::RawFenced
            | Workload::RawPipelined
            | Workload::RawGuardedUpdate
            | Workload::RawGuardedUpdateNative
            | Workload::RawAdvisoryUpdate
            | Workload::RawAppend => Path::Raw,
            Workload::PgbenchFenced | Workload::PgbenchAppend => Path::Pgbench,
            _ => Path::Pool,
        }
    }

    /// Whether the workload writes `batch` rows per round trip (the others write one task or lease).
    pub(super) fn batches(self) -> bool {
        matches!(
            self,
            Workload::Update
                | Workload::UpdatePing
                | Workload::Tx
                | Workload::Fenced
                | Workload::FencedNative
                | Workload::RawFenced
                | Workload::RawPipelined
                | Workload::RawGuardedUpdate
                | Workload::RawGuardedUpdateNative
                | Workload::GuardedUpdate
                | Workload::GuardedUpdateNative
                | Workload::RawAdvisoryUpdate
                | Workload::PeerForShare
                | Workload::PeerForShareUpdate
                | Workload::PeerRowFence
                | Workload::PgbenchFenced
        )
    }

    /// Whether the workload goes through the native guard (a store of its own that uses `pgfence_native.fence`).
    pub(super) fn native(self) -> bool {
        matches!(
            self,
            Workload::FencedNative
                | Workload::GuardedUpdateNative
                | Workload::RawGuardedUpdateNative
        )
    }

    /// Whether the workload is a peer: a guard a user would otherwise pick, measured beside pgfence's (it
    /// presents an epoch, but none of pgfence's guarantees are claimed for it).
    pub(super) fn peer(self) -> bool {
        matches!(
            self,
            Workload::PeerForShare | Workload::PeerForShareUpdate | Workload::PeerRowFence
        )
    }

    /// Whether every write presents a fence.
    pub(super) fn guarded(self) -> bool {
        !matches!(
            self,
            Workload::Update | Workload::UpdatePing | Workload::Tx | Workload::AppendUnguarded
        )
    }

    /// The unguarded workload that writes the same rows through the same pool with the same statements:
    /// what the ratio to it isolates is the guard. (`update-ping` is compared with `update` too: what a test
    /// query per check-out costs.)
    pub(super) fn unguarded(self) -> Option<Workload> {
        match self {
            Workload::GuardedUpdate
            | Workload::GuardedUpdateNative
            | Workload::UpdatePing
            | Workload::PeerForShareUpdate
            | Workload::PeerRowFence => Some(Workload::Update),
            Workload::Fenced | Workload::FencedNative | Workload::PeerForShare => {
                Some(Workload::Tx)
            }
            Workload::Append | Workload::ClaimTransition | Workload::AppendOwnLease => {
                Some(Workload::AppendUnguarded)
            }
            _ => None,
        }
    }

    /// The peer of the same shape (round trips, transaction) that pgfence's guarded workload is compared with.
    pub(super) fn peer_of_same_shape(self) -> Option<Workload> {
        match self {
            Workload::Fenced | Workload::FencedNative => Some(Workload::PeerForShare),
            Workload::GuardedUpdate | Workload::GuardedUpdateNative => {
                Some(Workload::PeerForShareUpdate)
            }
            _ => None,
        }
    }

    /// The raw tokio-postgres workload that sends the same guarded statement on a connection of its own: what
    /// the ratio to it isolates is the library's client path.
    pub(super) fn raw(self) -> Option<Workload> {
        match self {
            Workload::GuardedUpdate => Some(Workload::RawGuardedUpdate),
            Workload::GuardedUpdateNative => Some(Workload::RawGuardedUpdateNative),
            Workload::Fenced => Some(Workload::RawFenced),
            Workload::Append => Some(Workload::RawAppend),
            _ => None,
        }
    }

    /// The pgbench workload that sends the same guarded SQL.
    pub(super) fn pgbench(self) -> Option<Workload> {
        match self {
            Workload::Fenced | Workload::RawFenced | Workload::RawPipelined => {
                Some(Workload::PgbenchFenced)
            }
            Workload::Append | Workload::RawAppend => Some(Workload::PgbenchAppend),
            _ => None,
        }
    }
}

/// The lease every writer of the hot-lease workloads presents, and the per-writer leases of
/// `append-own-lease`.
pub(super) const HOT_LEASE: &str = "hot";
/// The holder of every lease the benchmark takes.
pub(super) const HOLDER: &str = "bench";
/// The operation label of guarded writes (as recorded in an audit row).
pub(super) const OPERATION: &str = "bench";
/// Long enough for a full run: the benchmark never loses its leases to expiry.
pub(super) const TTL: Duration = Duration::from_secs(3 * 3600);

pub(super) fn own_lease(writer: usize) -> String {
    format!("own-{writer}")
}

/// The task of writer `w` under the hot lease for `append`; pgbench uses `:client_id`, the same number.
pub(super) fn append_key(writer: usize) -> String {
    writer.to_string()
}

pub(super) fn claim_key(writer: usize) -> String {
    format!("ct{writer}")
}

/// The schema the benchmark adds next to pgfence's: the user table and the unguarded twin of
/// `pgfence.append_event`.
pub(super) fn schema_sql(rows: i64) -> String {
    format!(
        "CREATE SCHEMA pgfence_bench;
-- fence: the highest epoch that wrote the row (peer-row-fence only; the other workloads leave it alone).
CREATE TABLE pgfence_bench.rows (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0,
                                 fence bigint NOT NULL DEFAULT 0);
INSERT INTO pgfence_bench.rows (id) SELECT generate_series(0, {last});
CREATE TYPE pgfence_bench.write_result AS (
    outcome text, reason text, current_epoch bigint, current_holder text, task_id bigint, task_key text,
    task_state text, assignee text, payload jsonb, fence bigint, version bigint, created boolean, event_id bigint);
-- pgfence.append_event without the guard (and without its input checks): the same row UPDATE and event INSERT,
-- called the same way (one prepared SELECT of a plpgsql function), returning a result of the same shape.
CREATE FUNCTION pgfence_bench.append_event_unguarded(p_lease text, p_epoch bigint, p_key text, p_kind text,
                                                     p_payload jsonb)
RETURNS pgfence_bench.write_result
LANGUAGE plpgsql AS $$
DECLARE
    t pgfence.tasks;
    ev bigint;
BEGIN
    UPDATE pgfence.tasks SET fence = p_epoch, updated_at = clock_timestamp()
     WHERE lease = p_lease AND key = p_key AND fence <= p_epoch
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN ROW('not_found', NULL, p_epoch, NULL, NULL, p_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
               ::pgfence_bench.write_result;
    END IF;
    INSERT INTO pgfence.task_events (task_id, lease, epoch, kind, payload)
    VALUES (t.id, p_lease, p_epoch, p_kind, coalesce(p_payload, '{{}}')) RETURNING id INTO ev;
    RETURN ROW('ok', NULL, p_epoch, NULL, t.id, t.key, t.state, t.assignee, t.payload, t.fence, t.version, false,
               ev)::pgfence_bench.write_result;
END;
$$;
-- The floor of a plpgsql guard (not pgfence's guard, and not safe: pgfence's takeovers take the exclusive lock
-- on another key): a shared transaction-level advisory lock, then the epoch read in a fresh snapshot (a new
-- statement of a VOLATILE function) — without the grant, secret, timeline and isolation checks, the unlocked
-- pre-check and the audit of pgfence.fence. What pgfence.fence costs above it is the price of those.
CREATE FUNCTION pgfence_bench.fence_advisory(p_lease text, p_epoch bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    l pgfence.leases;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_lease, 0));
    SELECT * INTO l FROM pgfence.leases WHERE name = p_lease;
    IF l.epoch = p_epoch AND l.state = 'held' AND l.expires_at > clock_timestamp() THEN
        RETURN 'ok';
    END IF;
    RETURN 'refused';
END;
$$;",
        last = rows - 1
    )
}

/// The guarded SQL of the raw and pgbench paths (pgbench substitutes `:name` variables with parameters): the
/// statements the library sends, a pgfence function's row read by column name.
pub(super) mod sql {
    pub(in super::super) const BEGIN: &str = "BEGIN";
    pub(in super::super) const COMMIT: &str = "COMMIT";
    pub(in super::super) const FENCE: &str =
        "SELECT * FROM pgfence.fence($1, $2, $3, $4, NULL, NULL)";
    pub(in super::super) const UPDATE: &str =
        "UPDATE pgfence_bench.rows SET v = v + 1 WHERE id >= $1 AND id < $2";
    /// [`UPDATE`] gated on the guard's verdict, for `Store::guarded_write`; the raw path sends what the library
    /// makes of it ([`pgfence::guarded_write_sql`]).
    pub(in super::super) const GATED_UPDATE: &str =
        "UPDATE pgfence_bench.rows SET v = v + 1 WHERE id >= $1 AND id < $2 AND (SELECT passed FROM pgfence_guard)";
    /// As [`GUARDED_UPDATE`] with the prototype advisory-lock guard.
    pub(in super::super) const ADVISORY_UPDATE: &str =
        "WITH g AS (SELECT pgfence_bench.fence_advisory($3, $4) AS outcome), \
              u AS (UPDATE pgfence_bench.rows SET v = v + 1 \
                     WHERE id >= $1 AND id < $2 AND (SELECT outcome FROM g) = 'ok' RETURNING 1) \
         SELECT (SELECT outcome FROM g) AS outcome, (SELECT count(*) FROM u) AS written";
    /// `peer-for-share`'s check, inside its transaction.
    pub(in super::super) const FOR_SHARE: &str =
        "SELECT epoch FROM pgfence.leases WHERE name = $1 FOR SHARE";
    /// `peer-for-share-update`: the share lock and the UPDATE in one statement.
    pub(in super::super) const FOR_SHARE_UPDATE: &str =
        "WITH l AS (SELECT 1 FROM pgfence.leases WHERE name = $3 AND epoch = $4 FOR SHARE) \
         UPDATE pgfence_bench.rows SET v = v + 1 WHERE id >= $1 AND id < $2 AND EXISTS (SELECT FROM l)";
    /// `peer-row-fence`: the rows' own fence.
    pub(in super::super) const ROW_FENCE_UPDATE: &str =
        "UPDATE pgfence_bench.rows SET v = v + 1, fence = $3 WHERE id >= $1 AND id < $2 AND fence <= $3";
    pub(in super::super) const APPEND_UNGUARDED: &str =
        "SELECT * FROM pgfence_bench.append_event_unguarded($1, $2, $3, $4, $5)";
    pub(in super::super) const APPEND: &str =
        "SELECT * FROM pgfence.append_event($1, $2, $6, $3, $4, $5)";
}

/// The outcome of a write function's row, by column name.
#[derive(diesel::QueryableByName)]
struct Verdict {
    #[diesel(sql_type = Text)]
    outcome: String,
}

/// A write's answer: accepted, refused by pgfence's guard (stale or denied), or a failure.
fn refused_or(result: Result<bool, pgfence::Error>) -> Result<bool, Failure> {
    match result {
        Ok(accepted) => Ok(accepted),
        Err(pgfence::Error::Stale { .. } | pgfence::Error::Denied { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The epoch `peer-for-share` reads under its share lock.
#[derive(diesel::QueryableByName)]
struct EpochRow {
    #[diesel(sql_type = BigInt)]
    epoch: i64,
}

/// The statements [`RawClient::probe`] runs: a label and how `pg_stat_statements` shows the statement's start.
pub(super) const PROBES: [(&str, &str); 6] = [
    (
        "guard alone: SELECT * FROM pgfence.fence(..)",
        "SELECT * FROM pgfence.fence(",
    ),
    ("UPDATE of 1 row, unguarded", "UPDATE pgfence_bench.rows"),
    (
        "guard + UPDATE of 1 row in one statement (Store::guarded_write)",
        "WITH RECURSIVE pgfence_write AS (UPDATE pgfence_bench.rows",
    ),
    (
        "the floor of a plpgsql guard (lock + fresh read) + UPDATE of 1 row",
        "WITH g AS (SELECT pgfence_bench.fence_advisory(",
    ),
    (
        "SELECT * FROM pgfence.append_event(..)",
        "SELECT * FROM pgfence.append_event(",
    ),
    (
        "append-unguarded: the same writes without the guard",
        "SELECT * FROM pgfence_bench.append_event_unguarded(",
    ),
];

/// One tokio-postgres connection with every statement of the raw workloads prepared once.
pub(super) struct RawClient {
    client: tokio_postgres::Client,
    begin: Statement,
    commit: Statement,
    fence: Statement,
    update: Statement,
    guarded_update: Statement,
    /// The native guard's statement, when the server has pgfence_native.
    guarded_update_native: Option<Statement>,
    advisory_update: Statement,
    append: Statement,
    append_unguarded: Statement,
}

impl RawClient {
    pub(super) fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Runs each statement of [`PROBES`] `iterations` times, interleaved, one at a time, as writer 0.
    pub(super) async fn probe(&self, fence: &Fence, iterations: u32) -> Result<(), Failure> {
        let (lease, epoch) = (fence.lease().to_owned(), fence.epoch().get());
        let secret = fence.secret().expose_secret().to_owned();
        let (lo, hi) = (0i64, 1i64);
        let key = append_key(0);
        let payload = Json(json!({}));
        let c = &self.client;
        let err = |e| db_error("probing server time", e);
        for _ in 0..iterations {
            c.query_one(&self.fence, &[&lease, &epoch, &secret, &OPERATION])
                .await
                .map_err(err)?;
            c.execute(&self.update, &[&lo, &hi]).await.map_err(err)?;
            c.query_one(
                &self.guarded_update,
                &[&lo, &hi, &lease, &epoch, &secret, &OPERATION],
            )
            .await
            .map_err(err)?;
            c.query_one(&self.advisory_update, &[&lo, &hi, &lease, &epoch])
                .await
                .map_err(err)?;
            c.query_one(
                &self.append,
                &[&lease, &epoch, &key, &OPERATION, &payload, &secret],
            )
            .await
            .map_err(err)?;
            {
                let statement = &self.append_unguarded;
                c.query_one(statement, &[&lease, &epoch, &key, &OPERATION, &payload])
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    pub(super) async fn connect(connector: &pgfence::Connector) -> Result<RawClient, Failure> {
        let (client, connection) = connector.connect().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(target: "pgfence", error = %e, "raw benchmark connection ended");
            }
        });
        let prepare = |sql: &'static str| {
            let client = &client;
            async move {
                client
                    .prepare(sql)
                    .await
                    .map_err(|e| db_error(&format!("preparing {sql}"), e))
            }
        };
        Ok(RawClient {
            begin: prepare(sql::BEGIN).await?,
            commit: prepare(sql::COMMIT).await?,
            fence: prepare(sql::FENCE).await?,
            update: prepare(sql::UPDATE).await?,
            guarded_update: client
                .prepare(&pgfence::guarded_write_sql(sql::GATED_UPDATE, 2))
                .await
                .map_err(|e| db_error("preparing the guarded UPDATE", e))?,
            guarded_update_native: client
                .prepare(&pgfence::native_guarded_write_sql(sql::GATED_UPDATE, 2))
                .await
                .ok(),
            advisory_update: prepare(sql::ADVISORY_UPDATE).await?,
            append: prepare(sql::APPEND).await?,
            append_unguarded: prepare(sql::APPEND_UNGUARDED).await?,
            client,
        })
    }
}

/// What one writer does, step after step.
pub(super) struct Writer {
    workload: Workload,
    index: usize,
    batch: i64,
    store: Store,
    fence: Fence,
    raw: Option<Arc<RawClient>>,
    /// `claim-transition`: whether the task is claimed now (the next step moves it back to pending).
    claimed: bool,
    /// `acquire`: how many leases there are to pick from.
    lease_rows: u32,
    /// `renew`: the lease to renew, taken before each round.
    lease: Option<Lease>,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        workload: Workload,
        index: usize,
        batch: u32,
        store: Store,
        fence: Fence,
        raw: Option<Arc<RawClient>>,
        lease_rows: u32,
    ) -> Writer {
        Writer {
            workload,
            index,
            batch: i64::from(batch),
            store,
            fence,
            raw,
            claimed: false,
            lease_rows,
            lease: None,
        }
    }

    /// The fence the next write presents (the takeover measurement hands each tenure to its writers).
    pub(super) fn set_fence(&mut self, fence: Fence) {
        self.fence = fence;
    }

    pub(super) fn set_claimed(&mut self, claimed: bool) {
        self.claimed = claimed;
    }

    pub(super) fn set_lease(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    fn raw(&self) -> &RawClient {
        self.raw.as_deref().expect("raw workloads get a raw client")
    }

    fn stale(&self, outcome: &str) -> Result<(), Failure> {
        if outcome == "ok" {
            return Ok(());
        }
        Err(Failure::new(
            1,
            format!(
                "{}: the guard answered {outcome:?} for {} epoch {}",
                self.workload.name(),
                self.fence.lease(),
                self.fence.epoch()
            ),
        ))
    }

    /// The writer's rows of the user table: ids `[lo, hi)`.
    fn rows(&self) -> (i64, i64) {
        let lo = self.index as i64 * self.batch;
        (lo, lo + self.batch)
    }

    /// One write of the guard workloads (pgfence's `fenced` and `guarded-update`, and the peers): whether the
    /// guard accepted it. A refusal is an answer here, not a failure (the takeover measurement counts them).
    pub(super) async fn attempt(&mut self) -> Result<bool, Failure> {
        use diesel_async::RunQueryDsl;
        let (lo, hi) = self.rows();
        let batch = self.batch;
        let update = move || {
            // Prepared once per connection, like the raw path's statements: the ratios isolate the guard.
            pgfence::Cached::new(
                diesel::sql_query(sql::UPDATE)
                    .bind::<BigInt, _>(lo)
                    .bind::<BigInt, _>(hi),
            )
        };
        let lease = self.fence.lease().to_owned();
        let epoch = self.fence.epoch().get();
        match self.workload {
            Workload::Fenced | Workload::FencedNative => {
                let written = self
                    .store
                    .fenced(&self.fence, OPERATION, async move |conn| {
                        update().execute(conn).await?;
                        Ok::<_, pgfence::Error>(())
                    })
                    .await;
                refused_or(written.map(|()| true))
            }
            Workload::GuardedUpdate | Workload::GuardedUpdateNative => {
                let written = self
                    .store
                    .guarded_write(
                        &self.fence,
                        OPERATION,
                        diesel::sql_query(sql::GATED_UPDATE)
                            .bind::<BigInt, _>(lo)
                            .bind::<BigInt, _>(hi),
                    )
                    .await;
                refused_or(written.map(|n| n as i64 == batch))
            }
            Workload::PeerForShare => {
                use diesel_async::SimpleAsyncConnection;
                let conn = self.store.conn().await?;
                let c: &diesel_async::AsyncPgConnection = &conn;
                let (mut begin_conn, mut check_conn) = (c, c);
                // BEGIN and the check pipelined, as Store::fenced does with its guard.
                let (begun, current) = tokio::join!(
                    begin_conn.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
                    pgfence::Cached::new(diesel::sql_query(sql::FOR_SHARE).bind::<Text, _>(lease))
                        .get_result::<EpochRow>(&mut check_conn)
                );
                begun.map_err(pgfence::Error::from)?;
                let current = current.map_err(pgfence::Error::from)?.epoch;
                let mut conn_ref = c;
                if current == epoch {
                    update()
                        .execute(&mut conn_ref)
                        .await
                        .map_err(pgfence::Error::from)?;
                }
                conn_ref
                    .batch_execute("COMMIT")
                    .await
                    .map_err(pgfence::Error::from)?;
                Ok(current == epoch)
            }
            Workload::PeerForShareUpdate | Workload::PeerRowFence => {
                let mut conn = self.store.conn().await?;
                let written = if self.workload == Workload::PeerForShareUpdate {
                    pgfence::Cached::new(
                        diesel::sql_query(sql::FOR_SHARE_UPDATE)
                            .bind::<BigInt, _>(lo)
                            .bind::<BigInt, _>(hi)
                            .bind::<Text, _>(lease)
                            .bind::<BigInt, _>(epoch),
                    )
                    .execute(&mut *conn)
                    .await
                } else {
                    pgfence::Cached::new(
                        diesel::sql_query(sql::ROW_FENCE_UPDATE)
                            .bind::<BigInt, _>(lo)
                            .bind::<BigInt, _>(hi)
                            .bind::<BigInt, _>(epoch),
                    )
                    .execute(&mut *conn)
                    .await
                }
                .map_err(pgfence::Error::from)?;
                Ok(written as i64 == batch)
            }
            other => unreachable!("{} is not a guard workload", other.name()),
        }
    }

    /// One round trip's worth of work (one transaction; for `claim-transition` one of its two writes).
    pub(super) async fn step(&mut self) -> Result<(), Failure> {
        use diesel_async::RunQueryDsl;
        let (lo, hi) = self.rows();
        let update = move || {
            // Prepared once per connection, like the raw path's statements: the ratios isolate the guard.
            pgfence::Cached::new(
                diesel::sql_query(sql::UPDATE)
                    .bind::<BigInt, _>(lo)
                    .bind::<BigInt, _>(hi),
            )
        };
        let lease = self.fence.lease().to_owned();
        let epoch = self.fence.epoch().get();
        let secret = self.fence.secret().expose_secret().to_owned();
        match self.workload {
            Workload::Update | Workload::UpdatePing => {
                let mut conn = self.store.conn().await?;
                update()
                    .execute(&mut *conn)
                    .await
                    .map_err(pgfence::Error::from)?;
            }
            Workload::Tx => {
                let mut conn = self.store.conn().await?;
                (*conn)
                    .build_transaction()
                    .read_committed()
                    .run(async move |conn: &mut diesel_async::AsyncPgConnection| {
                        update().execute(conn).await
                    })
                    .await
                    .map_err(pgfence::Error::from)?;
            }
            Workload::Fenced
            | Workload::FencedNative
            | Workload::GuardedUpdate
            | Workload::GuardedUpdateNative
            | Workload::PeerForShare
            | Workload::PeerForShareUpdate
            | Workload::PeerRowFence => {
                let accepted = self.attempt().await?;
                self.stale(if accepted { "ok" } else { "refused" })?;
            }
            Workload::RawFenced | Workload::RawPipelined => {
                let raw = self.raw();
                let c = &raw.client;
                let fence_params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&lease, &epoch, &secret, &OPERATION];
                let verdict = if self.workload == Workload::RawPipelined {
                    // tokio-postgres pipelines requests that are in flight together on one connection.
                    let (_, row) = tokio::try_join!(
                        c.execute(&raw.begin, &[]),
                        c.query_one(&raw.fence, &fence_params)
                    )
                    .map_err(|e| db_error("raw fenced", e))?;
                    row
                } else {
                    c.execute(&raw.begin, &[])
                        .await
                        .map_err(|e| db_error("BEGIN", e))?;
                    c.query_one(&raw.fence, &fence_params)
                        .await
                        .map_err(|e| db_error("guard", e))?
                };
                let outcome: String = verdict
                    .try_get("outcome")
                    .map_err(|e| db_error("guard", e))?;
                if outcome == "ok" {
                    c.execute(&raw.update, &[&lo, &hi])
                        .await
                        .map_err(|e| db_error("UPDATE", e))?;
                }
                c.execute(&raw.commit, &[])
                    .await
                    .map_err(|e| db_error("COMMIT", e))?;
                self.stale(&outcome)?;
            }
            Workload::RawGuardedUpdate => {
                let raw = self.raw();
                let row = raw
                    .client
                    .query_one(
                        &raw.guarded_update,
                        &[&lo, &hi, &lease, &epoch, &secret, &OPERATION],
                    )
                    .await
                    .map_err(|e| db_error("guarded UPDATE", e))?;
                let outcome: String = row.try_get(0).map_err(|e| db_error("guard", e))?;
                self.stale(&outcome)?;
            }
            Workload::RawGuardedUpdateNative => {
                let raw = self.raw();
                let statement = raw
                    .guarded_update_native
                    .as_ref()
                    .expect("native workloads run only where pgfence_native is installed");
                let row = raw
                    .client
                    .query_one(statement, &[&lo, &hi, &lease, &epoch, &secret, &OPERATION])
                    .await
                    .map_err(|e| db_error("native guarded UPDATE", e))?;
                let outcome: String = row.try_get(0).map_err(|e| db_error("guard", e))?;
                self.stale(&outcome)?;
            }
            Workload::RawAdvisoryUpdate => {
                let raw = self.raw();
                let row = raw
                    .client
                    .query_one(&raw.advisory_update, &[&lo, &hi, &lease, &epoch])
                    .await
                    .map_err(|e| db_error("advisory guarded UPDATE", e))?;
                let outcome: String = row.try_get(0).map_err(|e| db_error("guard", e))?;
                self.stale(&outcome)?;
            }
            Workload::Append | Workload::AppendOwnLease => {
                self.store
                    .append_event(
                        &self.fence,
                        &append_key(if self.workload == Workload::Append {
                            self.index
                        } else {
                            0
                        }),
                        OPERATION,
                        &json!({}),
                    )
                    .await?;
            }
            Workload::AppendUnguarded => {
                let mut conn = self.store.conn().await?;
                let row: Verdict = pgfence::Cached::new(
                    diesel::sql_query(sql::APPEND_UNGUARDED)
                        .bind::<Text, _>(lease)
                        .bind::<BigInt, _>(epoch)
                        .bind::<Text, _>(append_key(self.index))
                        .bind::<Text, _>(OPERATION)
                        .bind::<Jsonb, _>(json!({})),
                )
                .get_result(&mut *conn)
                .await
                .map_err(pgfence::Error::from)?;
                self.stale(&row.outcome)?;
            }
            Workload::ClaimTransition => {
                let key = claim_key(self.index);
                if self.claimed {
                    self.store
                        .transition_task(
                            &self.fence,
                            &key,
                            TaskState::Claimed,
                            TaskState::Pending,
                            &json!({}),
                        )
                        .await?;
                } else {
                    self.store.claim_task(&self.fence, &key, HOLDER).await?;
                }
                self.claimed = !self.claimed;
            }
            Workload::RawAppend => {
                let raw = self.raw();
                let payload = Json(json!({}));
                let row = raw
                    .client
                    .query_one(
                        &raw.append,
                        &[
                            &lease,
                            &epoch,
                            &append_key(self.index),
                            &OPERATION,
                            &payload,
                            &secret,
                        ],
                    )
                    .await
                    .map_err(|e| db_error("append_event", e))?;
                let outcome: String = row
                    .try_get("outcome")
                    .map_err(|e| db_error("append_event", e))?;
                self.stale(&outcome)?;
            }
            Workload::Acquire => {
                let n = fastrand::u32(1..=self.lease_rows.max(1));
                self.store.acquire(&format!("l{n}"), HOLDER, TTL).await?;
            }
            Workload::Renew => {
                let lease = self
                    .lease
                    .as_mut()
                    .expect("renew writers get their lease before each round");
                self.store.renew(lease).await?;
            }
            Workload::PgbenchFenced | Workload::PgbenchAppend => {
                unreachable!("pgbench workloads run in pgbench")
            }
        }
        Ok(())
    }
}
