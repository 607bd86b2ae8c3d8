//! Takeovers under busy writers, per guard: how long a new tenure takes to begin while six writers keep writing
//! under the ending one, and whether a write of the ended tenure still lands afterwards.
//!
//! For each guard workload (pgfence's `fenced` and `guarded-update`, and the peers), on a lease of its own:
//! [`WRITERS`] writers write back to back, each presenting the newest fence it was handed; the measurement
//! takes the lease over `takeovers` times (`Store::acquire` by the holder: a new epoch, the takeover every
//! guard must respect) and times each acquisition. After each one, a **zombie** write presents the ended
//! tenure's fence on a row no writer touches — what a paused old leader does when it wakes — and is counted if
//! the guard accepts it. The next takeover starts once every writer has had a write accepted under the new
//! tenure, so each one meets writers in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pgfence::Store;
use serde::Serialize;

use super::workload::{Workload, Writer, HOLDER, TAKEOVER_WRITERS as WRITERS, TTL, ZOMBIE_ROW};
use super::{db_error, new_histogram, Failure};

/// The guards measured, when selected.
pub(super) const GUARDS: [Workload; 7] = [
    Workload::Fenced,
    Workload::FencedNative,
    Workload::GuardedUpdate,
    Workload::GuardedUpdateNative,
    Workload::PeerForShare,
    Workload::PeerForShareUpdate,
    Workload::PeerRowFence,
];
/// How long the next takeover waits at most for every writer to be accepted under the new tenure.
const SETTLE: Duration = Duration::from_secs(10);

/// What the takeovers of one guard cost and let through.
#[derive(Debug, Clone, Serialize)]
pub(super) struct TakeoverCost {
    pub(super) guard: &'static str,
    pub(super) writers: usize,
    pub(super) takeovers: u32,
    /// Takeovers that failed (the error of the first is kept).
    pub(super) failed: u32,
    pub(super) first_failure: Option<String>,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
    /// Writes of the busy writers accepted and refused over the whole measurement.
    pub(super) accepted: u64,
    pub(super) refused: u64,
    /// Writes of the busy writers that failed (an error other than a refusal; the first is kept). A takeover
    /// ends a guarded transaction still open after its grace, so some may be expected under heavy load.
    pub(super) writer_errors: u64,
    pub(super) first_writer_error: Option<String>,
    /// Zombie writes (the ended tenure's fence, after the takeover returned) the guard accepted.
    pub(super) zombies_accepted: u32,
    pub(super) multixacts: u64,
}

/// Measures `takeovers` takeovers for each guard of [`GUARDS`] in `selected`.
pub(super) async fn measure(
    setup: &super::writes::WriteSetup,
    admin: &tokio_postgres::Client,
    server: &super::server::Server,
    selected: &[Workload],
    takeovers: u32,
) -> Result<Vec<TakeoverCost>, Failure> {
    let mut out = Vec::new();
    for guard in GUARDS.into_iter().filter(|g| selected.contains(g)) {
        out.push(one_guard(&setup.store_for(guard), admin, server, guard, takeovers).await?);
    }
    Ok(out)
}

/// What one busy writer has done so far, read by the measurement while it writes.
#[derive(Default)]
struct WriterState {
    accepted: AtomicU64,
    refused: AtomicU64,
    /// The epoch of the writer's latest accepted write.
    accepted_epoch: AtomicU64,
    /// When the write in flight began (milliseconds since the writers started, plus one), or 0 between writes.
    in_write_since: AtomicU64,
}

/// The busy writers of one guard: each writes back to back under the newest fence it was handed.
struct Writers {
    states: Arc<Vec<WriterState>>,
    started: Instant,
    stop: Arc<AtomicBool>,
    errors: Arc<AtomicU64>,
    first_error: Arc<std::sync::Mutex<Option<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    fn spawn(
        guard: Workload,
        store: &Store,
        fences: &tokio::sync::watch::Receiver<pgfence::Fence>,
    ) -> Writers {
        let mut writers = Writers {
            states: Arc::new((0..WRITERS).map(|_| WriterState::default()).collect()),
            started: Instant::now(),
            stop: Arc::default(),
            errors: Arc::default(),
            first_error: Arc::default(),
            tasks: Vec::new(),
        };
        for i in 0..WRITERS {
            let (store, mut fences, stop) = (store.clone(), fences.clone(), writers.stop.clone());
            let (states, started) = (writers.states.clone(), writers.started);
            let (errors, first_error) = (writers.errors.clone(), writers.first_error.clone());
            writers.tasks.push(tokio::spawn(async move {
                let state = &states[i];
                let mut writer = Writer::new(guard, i, 1, store, fences.borrow().clone(), None, 0);
                while !stop.load(Ordering::Relaxed) {
                    let fence = fences.borrow_and_update().clone();
                    let epoch = fence.epoch().get() as u64;
                    writer.set_fence(fence);
                    state
                        .in_write_since
                        .store(started.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                    let outcome = writer.attempt().await;
                    state.in_write_since.store(0, Ordering::Relaxed);
                    match outcome {
                        Ok(true) => {
                            state.accepted.fetch_add(1, Ordering::Relaxed);
                            state.accepted_epoch.fetch_max(epoch, Ordering::Relaxed);
                        }
                        Ok(false) => {
                            state.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            let mut first = first_error.lock().expect("not poisoned");
                            first.get_or_insert_with(|| e.message.clone());
                        }
                    }
                }
            }));
        }
        writers
    }

    /// Waits until every writer had a write accepted under `epoch`, at most [`SETTLE`]; past it, the error
    /// names each writer still behind and what it is doing (in one write since when, or refused how often).
    async fn settle(&self, name: &str, epoch: u64) -> Result<(), Failure> {
        let deadline = Instant::now() + SETTLE;
        let behind = || {
            self.states
                .iter()
                .enumerate()
                .filter(|(_, s)| s.accepted_epoch.load(Ordering::Relaxed) < epoch)
        };
        while behind().next().is_some() {
            if Instant::now() >= deadline {
                let now = self.started.elapsed().as_millis() as u64;
                let said: Vec<String> = behind()
                    .map(|(i, s)| {
                        let since = s.in_write_since.load(Ordering::Relaxed);
                        format!(
                            "writer {i}: last accepted at epoch {}, {} refusals, {}",
                            s.accepted_epoch.load(Ordering::Relaxed),
                            s.refused.load(Ordering::Relaxed),
                            if since == 0 {
                                "between writes".to_owned()
                            } else {
                                format!("in one write for {} ms", (now + 1).saturating_sub(since))
                            }
                        )
                    })
                    .collect();
                let first = self.first_error.lock().expect("not poisoned").clone();
                return Err(Failure::new(
                    1,
                    format!(
                        "takeovers of {name}: the writers were not accepted under epoch {epoch} within {SETTLE:?} \
                         ({}; first writer error: {})",
                        said.join("; "),
                        first.as_deref().unwrap_or("none")
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Stops the writers and waits for their last writes.
    async fn stop(&mut self) -> Result<(), Failure> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks.drain(..) {
            task.await
                .map_err(|e| Failure::new(1, format!("a takeover writer panicked: {e}")))?;
        }
        Ok(())
    }

    fn total(&self, count: impl Fn(&WriterState) -> &AtomicU64) -> u64 {
        self.states
            .iter()
            .map(|s| count(s).load(Ordering::Relaxed))
            .sum()
    }
}

/// What the takeovers measured (the busy writers' counts are read afterwards).
struct Takeovers {
    took: Histogram<u64>,
    failed: u32,
    first_failure: Option<String>,
    zombies_accepted: u32,
    multixacts: u64,
}

async fn one_guard(
    store: &Store,
    admin: &tokio_postgres::Client,
    server: &super::server::Server,
    guard: Workload,
    takeovers: u32,
) -> Result<TakeoverCost, Failure> {
    let name = format!("takeover-{}", guard.name());
    // The rows' own fences start from nothing for each guard (only peer-row-fence reads them).
    admin
        .execute(
            "UPDATE pgfence_bench.rows SET fence = 0 WHERE id <= $1",
            &[&(ZOMBIE_ROW as i64)],
        )
        .await
        .map_err(|e| db_error("resetting the rows' fences", e))?;
    let lease = store.acquire(&name, HOLDER, TTL).await?;
    let (tx, rx) = tokio::sync::watch::channel(lease.fence());
    let mut writers = Writers::spawn(guard, store, &rx);
    let result = take_over(store, server, guard, takeovers, lease, &tx, &writers).await;
    writers.stop().await?;
    let t = result?;
    let ms = |q: f64| t.took.value_at_quantile(q) as f64 / 1000.0;
    let first_writer_error = writers.first_error.lock().expect("not poisoned").clone();
    Ok(TakeoverCost {
        guard: guard.name(),
        writers: WRITERS,
        takeovers,
        failed: t.failed,
        first_failure: t.first_failure,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: t.took.max() as f64 / 1000.0,
        accepted: writers.total(|s| &s.accepted),
        refused: writers.total(|s| &s.refused),
        writer_errors: writers.errors.load(Ordering::Relaxed),
        first_writer_error,
        zombies_accepted: t.zombies_accepted,
        multixacts: t.multixacts,
    })
}

/// The takeovers themselves, each followed by a zombie write of the ended tenure and a wait for every writer
/// to be accepted under the new one.
async fn take_over(
    store: &Store,
    server: &super::server::Server,
    guard: Workload,
    takeovers: u32,
    mut lease: pgfence::Lease,
    fences: &tokio::sync::watch::Sender<pgfence::Fence>,
    writers: &Writers,
) -> Result<Takeovers, Failure> {
    writers
        .settle(lease.name(), lease.epoch().get() as u64)
        .await?;
    let before = server.counters().await?;
    let mut t = Takeovers {
        took: new_histogram(),
        failed: 0,
        first_failure: None,
        zombies_accepted: 0,
        multixacts: 0,
    };
    for _ in 0..takeovers {
        let ended = lease.fence();
        let started = Instant::now();
        let next = store.acquire(lease.name(), HOLDER, TTL).await;
        t.took
            .saturating_record(started.elapsed().as_micros().max(1) as u64);
        match next {
            Ok(next) => {
                lease = next;
                fences.send_replace(lease.fence());
            }
            Err(e) => {
                t.failed += 1;
                t.first_failure.get_or_insert_with(|| e.to_string());
                continue;
            }
        }
        let mut zombie = Writer::new(guard, ZOMBIE_ROW, 1, store.clone(), ended, None, 0);
        if zombie.attempt().await? {
            t.zombies_accepted += 1;
        }
        writers
            .settle(lease.name(), lease.epoch().get() as u64)
            .await?;
    }
    t.multixacts = server.counters().await?.0 - before.0;
    Ok(t)
}

/// The table on stdout.
pub(super) fn print(costs: &[TakeoverCost]) {
    if costs.is_empty() {
        return;
    }
    println!();
    println!(
        "Takeovers under {WRITERS} busy writers (Store::acquire of a new epoch; a zombie write of the ended tenure \
         after each)"
    );
    let table: Vec<Vec<String>> = costs
        .iter()
        .map(|c| {
            vec![
                c.guard.to_owned(),
                c.takeovers.to_string(),
                c.failed.to_string(),
                format!("{:.2}", c.p50_ms),
                format!("{:.2}", c.p99_ms),
                format!("{:.2}", c.max_ms),
                format!("{}/{}", c.zombies_accepted, c.takeovers - c.failed),
                format!(
                    "{:.2}",
                    c.multixacts as f64 / (c.accepted + c.refused).max(1) as f64
                ),
                c.writer_errors.to_string(),
            ]
        })
        .collect();
    super::super::table::print(
        &[
            "GUARD",
            "TAKEOVERS",
            "FAILED",
            "P50 MS",
            "P99 MS",
            "MAX MS",
            "ZOMBIES IN",
            "MXID/WRITE",
            "WRITER ERRORS",
        ],
        &table,
    );
    for c in costs {
        if let Some(e) = &c.first_failure {
            println!(
                "  {}: first failed takeover: {}",
                c.guard,
                super::super::table::escape(e, super::super::table::MESSAGE_CHARS)
            );
        }
        if let Some(e) = &c.first_writer_error {
            println!(
                "  {}: first writer error: {}",
                c.guard,
                super::super::table::escape(e, super::super::table::MESSAGE_CHARS)
            );
        }
    }
}
