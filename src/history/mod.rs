//! The record of every tenure, from both sides, and the overlap review built on it.
//!
//! The database's side is exact and by its clock: when each tenure was granted and ended
//! (`pgfence.tenures`), the connection that acquired it as the server saw it, the last write it accepted under
//! the epoch (task events exactly, other guarded writes by the guard's write marks, at most one second early)
//! and every refused write (`pgfence.rejections`). The holder's side is what it reports, best effort
//! ([`History::report_belief_start`], [`History::report_belief_end`]; the leadership runtime does it by
//! itself):
//! when it started and stopped believing it led, by its own wall clock, and the endpoint it used.
//!
//! The two clocks are never compared directly. Each report carries the holder's clock when it was sent and gets
//! the database's clock when it arrived; the acquisition reply went the other way. Messages take a non-negative
//! time to travel, so these bound the offset between the clocks from both sides (as NTP does), and a holder's
//! belief is placed on the database's time line as an interval, not a point: [`History::review`] says an overlap
//! with the successor is [`Overlap::Certain`] only when even the earliest placement is after the successor's
//! acquisition, and a refused write after it is proof by the database's clock alone. SQL:
//! `migrations/2026-11-30-000002_lease_protocol` (`pgfence.report_belief`, `pgfence.tenure_history`), the write
//! marks in `000003_guard` (`pgfence._guard`).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::audit::Rejection;
use crate::store::Store;
use crate::types::{Epoch, LossReason};

mod calls;
pub(crate) mod queue;
mod review;

/// The record of a [`Store`]'s leases ([`Store::history`]): the holders' belief reports, every tenure of a
/// lease, and the overlap review.
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    store: &'a Store,
}

impl Store {
    /// The record of every tenure: the holder's belief reports, the tenures of a lease and their review (see
    /// [`History`]).
    pub fn history(&self) -> History<'_> {
        History { store: self }
    }
}

/// How far apart the holder's and the database's clocks may drift per second of a tenure, in parts per million,
/// when the clock offset measured at the acquisition is applied to the end of a belief: 200 ppm, well above the
/// rate error of an undisciplined quartz clock (tens of ppm).
pub const CLOCK_DRIFT_PPM: i64 = 200;

/// The resolution of the write marks: the last guarded write a tenure accepted is at most this long after its
/// latest mark ([`Tenure::last_mark_at`]). Task events are exact.
pub const WRITE_MARK_RESOLUTION: std::time::Duration = std::time::Duration::from_secs(1);

/// One issued epoch: how the database saw its tenure, what its holder reported believing, and its last
/// accepted write.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Tenure {
    /// The cluster-qualified name.
    pub lease: String,
    /// The epoch of this tenure.
    pub epoch: Epoch,
    /// Who held it.
    pub holder: String,
    /// When it began (database clock, UTC).
    pub acquired_at: DateTime<Utc>,
    /// When it ended (database clock); `None` while current.
    pub ended_at: Option<DateTime<Utc>>,
    /// `released`, `expired`, `forced`, `reacquired` or `failover` (granted before a promotion, ended after it);
    /// `None` while current.
    pub end_reason: Option<String>,
    /// The last write accepted under this epoch (database clock): the later of
    /// [`last_event_at`](Self::last_event_at) and [`last_mark_at`](Self::last_mark_at).
    pub last_write_at: Option<DateTime<Utc>>,
    /// The newest task event of this epoch (exact).
    pub last_event_at: Option<DateTime<Utc>>,
    /// The newest write mark of this epoch: the last guarded write of any kind (a fenced transaction, a
    /// one-statement guarded write, the SQL guard, a task write) it accepted is at most
    /// [`WRITE_MARK_RESOLUTION`] later.
    pub last_mark_at: Option<DateTime<Utc>>,
    /// The acquiring connection, as the server saw it.
    pub server: ServerView,
    /// What the holder reported believing.
    pub belief: Belief,
}

/// The connection that acquired a tenure, as the server saw it when it granted the tenure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServerView {
    /// The server's system identifier (`None` when the schema owner may not read it).
    pub system_identifier: Option<String>,
    /// The pgfence instance id (see [`DatabaseIdentity`](crate::DatabaseIdentity)).
    pub instance_id: Option<String>,
    /// The WAL timeline the tenure was granted on.
    pub timeline: Option<i64>,
    /// The server's address and port for that connection (`None` over a Unix socket).
    pub server_addr: Option<String>,
    /// The client's address and port (a pooler's, when one is in between; `None` over a Unix socket).
    pub client_addr: Option<String>,
    /// The session's `application_name`. Chosen by the client: escape it before printing.
    pub application_name: Option<String>,
}

/// What a holder reported believing about its tenure: every time is its own wall clock (UTC) except the
/// `*_received_at` ones (the database's clock when the report arrived). `None` where no report arrived — a
/// killed process never reports its end, and that stays unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Belief {
    /// The endpoint the holder used, as it saw it (`host:port[,host:port…]/dbname`, no credentials).
    pub endpoint: Option<String>,
    /// When it received the acquisition's reply (holder clock).
    pub from: Option<DateTime<Utc>>,
    /// When it sent the start report (holder clock).
    pub start_sent_at: Option<DateTime<Utc>>,
    /// When the start report arrived (database clock).
    pub start_received_at: Option<DateTime<Utc>>,
    /// When it stopped believing (holder clock).
    pub until: Option<DateTime<Utc>>,
    /// Why: `released`, `lost`, `deadline`, `write_refused` or `shutdown` ([`BeliefEnd::cause`]).
    pub end_cause: Option<String>,
    /// The detail of the cause (the loss reason, …).
    pub end_detail: Option<String>,
    /// When it sent the end report (holder clock).
    pub end_sent_at: Option<DateTime<Utc>>,
    /// When the end report arrived (database clock).
    pub end_received_at: Option<DateTime<Utc>>,
}

/// Why a holder stopped believing it led a tenure, as [`History::report_belief_end`](crate::history::History::report_belief_end) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cause", content = "reason")]
#[non_exhaustive]
pub enum BeliefEnd {
    /// It released the tenure.
    Released,
    /// The database said the tenure was over (a renewal answered it).
    Lost(LossReason),
    /// Its local deadline passed without a renewal.
    Deadline,
    /// A guarded write of it was refused (the reason, when it was a stale epoch).
    WriteRefused(Option<LossReason>),
    /// It shut down while leading.
    Shutdown,
}

impl BeliefEnd {
    /// The cause as stored: `released`, `lost`, `deadline`, `write_refused` or `shutdown`.
    pub fn cause(self) -> &'static str {
        match self {
            BeliefEnd::Released => "released",
            BeliefEnd::Lost(_) => "lost",
            BeliefEnd::Deadline => "deadline",
            BeliefEnd::WriteRefused(_) => "write_refused",
            BeliefEnd::Shutdown => "shutdown",
        }
    }

    fn detail(self) -> Option<&'static str> {
        match self {
            BeliefEnd::Lost(reason) | BeliefEnd::WriteRefused(Some(reason)) => {
                Some(reason.as_str())
            }
            _ => None,
        }
    }
}

impl fmt::Display for BeliefEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.detail() {
            Some(detail) => write!(f, "{} ({detail})", self.cause()),
            None => f.write_str(self.cause()),
        }
    }
}

/// A tenure with what the review concludes about it: its successor, the clock offset its holder's reports
/// allow, where its belief's end lies on the database's time line, and whether its holder believed it led
/// after the successor's acquisition committed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TenureReview {
    /// The tenure.
    pub tenure: Tenure,
    /// The next tenure of the lease, if any.
    pub successor: Option<Successor>,
    /// The bounds on (database clock − holder clock) that the holder's reports allow; `None` without a report,
    /// or when the reports contradict each other (the holder's clock was stepped).
    pub clock_offset: Option<OffsetBounds>,
    /// The end of the holder's belief placed on the database's time line: the earliest and latest database
    /// time it can have been. `None` without an end report or an offset.
    pub believed_until_db: Option<Interval>,
    /// Whether the holder believed it led after the successor's acquisition committed.
    pub overlap: Overlap,
    /// A write of this epoch accepted at or after the successor's acquisition (database clock). The guard makes
    /// this impossible; `Some` is a broken fence, and the report says so.
    pub accepted_after_successor: Option<DateTime<Utc>>,
    /// The audit's refusals of this epoch's writes last seen at or after the successor's acquisition: what
    /// the holder tried while it (or a write in flight) still believed.
    pub refusals_after_successor: Vec<Rejection>,
}

/// The tenure that followed another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Successor {
    /// Its epoch.
    pub epoch: Epoch,
    /// Its holder.
    pub holder: String,
    /// When its acquisition committed (database clock).
    pub acquired_at: DateTime<Utc>,
}

/// Bounds on (database clock − holder clock), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OffsetBounds {
    /// At least this (from the acquisition reply: the database's clock when it granted, minus the holder's
    /// when the reply arrived). `None` without a start report.
    pub min_us: Option<i64>,
    /// At most this (from a report: the database's clock when it arrived, minus the holder's when it was sent).
    pub max_us: i64,
}

/// A closed interval of database time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Interval {
    /// The earliest it can have been (`None`: unbounded, no start report).
    pub earliest: Option<DateTime<Utc>>,
    /// The latest it can have been.
    pub latest: DateTime<Utc>,
}

/// Whether a holder believed it led after its successor's acquisition committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "overlap")]
#[non_exhaustive]
pub enum Overlap {
    /// The tenure has no successor (yet).
    NoSuccessor,
    /// Its belief ended before the successor's acquisition, even at the latest placement.
    None,
    /// The placements allow both: the clock bounds are too wide to tell.
    Possible,
    /// It did: the database's refusal of a write it sent after the successor's acquisition proves it by the
    /// database clock alone (`refused_write_at`), or its reported end lies after it at the earliest placement.
    Certain {
        /// The latest refusal of its writes (database clock), when that is the proof.
        refused_write_at: Option<DateTime<Utc>>,
    },
    /// No end report arrived (the process was killed, or reporting is off) and no refusal proves it.
    Unknown,
}
