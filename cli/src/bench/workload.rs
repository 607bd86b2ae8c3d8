//! The workloads of `pgfence bench` and the writers that run them.
//!
//! Every workload writes the same thing in every path, so that a ratio between two of them isolates one cost:
//!
//! * **user table** (`update`, `tx`, `fenced`, `raw-*`, `pgbench-fenced`): `batch` rows of
//!   `pgfence_bench.rows`, the range `[writer × batch, (writer + 1) × batch)`, so writers never touch each
//!   other's rows;
//! * **task** (`append`, `append-unguarded`, `claim-transition`, `append-own-lease`, `raw-append`,
//!   `pgbench-append`): the writer's own task row and one appended event;
//! * **effect ledger** (`effect-pair`, `event-pair`): the writer's own task, two guarded writes per transaction
//!   counted — an intent and its outcome (`Effects::intend`, `record_outcome`), or two `append_event`s;
//! * **lease** (`acquire`, `renew`): one lease row in a table of `lease_rows` leases.
//!
//! The **peers** (`peer-*`) are the guards a user would otherwise pick, on the same rows through the same pool:
//! a share lock on the lease row held to the commit (`peer-for-share`, as a transaction; `peer-for-share-update`,
//! in one statement) and the row's own fence column (`peer-row-fence`). See [`Workload::peer`].

mod raw;
mod writer;

use std::time::Duration;

pub(super) use self::raw::{RawClient, PROBES};
pub(super) use self::writer::Writer;

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
    EffectPair,
    EventPair,
    Acquire,
    Renew,
}

/// The write workloads, in the order each round runs them.
pub(super) const WRITES: [Workload; 24] = [
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
    Workload::EffectPair,
    Workload::EventPair,
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
            Workload::EffectPair => "effect-pair",
            Workload::EventPair => "event-pair",
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
                "unguarded UPDATE of the rows, autocommit, prepared once per connection (pgfence::guard::Cached), through \
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
                "tokio-postgres, prepared: the statement Store::guarded_write sends (pgfence::guard::guarded_write_sql)"
            }
            Workload::RawGuardedUpdateNative => {
                "tokio-postgres, prepared: the statement of guarded-update-native (pgfence::guard::guarded_write_sql with native)"
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
            Workload::Append => "Tasks::append_event on the hot lease: guard + task row fence + event, one statement",
            Workload::AppendUnguarded => "the same task UPDATE and event INSERT in one prepared call, without the guard",
            Workload::ClaimTransition => "Tasks::claim and Tasks::transition (back to pending), alternating",
            Workload::AppendOwnLease => "Tasks::append_event, every writer on a lease of its own",
            Workload::RawAppend => "tokio-postgres, prepared: SELECT * FROM pgfence.append_event(..)",
            Workload::PgbenchAppend => "pgbench -M prepared: SELECT * FROM pgfence.append_event(..)",
            Workload::EffectPair => {
                "the effect ledger around one external call (none made): Effects::intend under a new effect key, \
                 then Effects::record_outcome(Done) — two guarded writes, counted as one transaction"
            }
            Workload::EventPair => {
                "two Tasks::append_event on the same task, counted as one transaction: what effect-pair is \
                 compared with"
            }
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

    /// The workload of the same number of guarded writes on the same task that the effect ledger's pair is
    /// compared with: what the ratio to it isolates is the ledger's cost beyond a guarded event.
    pub(super) fn events(self) -> Option<Workload> {
        match self {
            Workload::EffectPair => Some(Workload::EventPair),
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
/// Busy writers per takeover measurement.
pub(super) const TAKEOVER_WRITERS: usize = 6;
/// Connections a takeover measurement holds at once: the writers', the zombie write's and the acquisition's.
pub(super) const TAKEOVER_CONNECTIONS: u32 = TAKEOVER_WRITERS as u32 + 2;
/// The row of the takeover measurement's zombie writes (its writers write rows 0 to [`TAKEOVER_WRITERS`] − 1).
pub(super) const ZOMBIE_ROW: usize = TAKEOVER_WRITERS;

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
    /// makes of it ([`pgfence::guard::guarded_write_sql`]).
    pub(in super::super) const GATED_UPDATE: &str =
        "UPDATE pgfence_bench.rows SET v = v + 1 WHERE id >= $1 AND id < $2 AND (SELECT passed FROM pgfence_guard)";
    /// As [`GATED_UPDATE`] with the prototype advisory-lock guard.
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
