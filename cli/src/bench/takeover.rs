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

use super::workload::{Workload, Writer, HOLDER, TTL};
use super::{db_error, new_histogram, Failure};

/// Busy writers per takeover measurement.
pub(super) const WRITERS: usize = 6;
/// The row of the zombie writes (the writers write rows 0 to [`WRITERS`] − 1).
pub(super) const ZOMBIE_ROW: usize = WRITERS;
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
    setup: &super::WriteSetup,
    admin: &tokio_postgres::Client,
    server: &super::Server,
    selected: &[Workload],
    takeovers: u32,
) -> Result<Vec<TakeoverCost>, Failure> {
    let mut out = Vec::new();
    for guard in GUARDS.into_iter().filter(|g| selected.contains(g)) {
        out.push(one_guard(&setup.store_for(guard), admin, server, guard, takeovers).await?);
    }
    Ok(out)
}

async fn one_guard(
    store: &Store,
    admin: &tokio_postgres::Client,
    server: &super::Server,
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
    let mut lease = store.acquire(&name, HOLDER, TTL).await?;
    let (tx, rx) = tokio::sync::watch::channel(lease.fence());
    let stop = Arc::new(AtomicBool::new(false));
    // Accepted writes per writer and the epoch of each writer's latest accepted write.
    let accepted: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let accepted_epoch: Arc<Vec<AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let first_error: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let (store, mut rx, stop) = (store.clone(), rx.clone(), stop.clone());
        let (accepted, accepted_epoch) = (accepted.clone(), accepted_epoch.clone());
        let (errors, first_error) = (errors.clone(), first_error.clone());
        tasks.push(tokio::spawn(async move {
            let mut writer = Writer::new(guard, i, 1, store, rx.borrow().clone(), None, 0);
            let mut refused = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let fence = rx.borrow_and_update().clone();
                let epoch = fence.epoch().get() as u64;
                writer.set_fence(fence);
                match writer.attempt().await {
                    Ok(true) => {
                        accepted[i].fetch_add(1, Ordering::Relaxed);
                        accepted_epoch[i].fetch_max(epoch, Ordering::Relaxed);
                    }
                    Ok(false) => refused += 1,
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let mut first = first_error.lock().expect("not poisoned");
                        first.get_or_insert_with(|| e.message.clone());
                    }
                }
            }
            refused
        }));
    }
    let settle = |epoch: u64| {
        let accepted_epoch = accepted_epoch.clone();
        let name = name.clone();
        let first_error = first_error.clone();
        async move {
            let deadline = Instant::now() + SETTLE;
            while accepted_epoch
                .iter()
                .any(|e| e.load(Ordering::Relaxed) < epoch)
            {
                if Instant::now() >= deadline {
                    let first = first_error.lock().expect("not poisoned").clone();
                    return Err(Failure::new(
                        1,
                        format!(
                            "takeovers of {name}: the writers were not accepted under epoch {epoch} within \
                             {SETTLE:?} (first writer error: {})",
                            first.as_deref().unwrap_or("none")
                        ),
                    ));
                }
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(())
        }
    };
    let result = async {
        settle(lease.epoch().get() as u64).await?;
        let before = server.counters().await?;
        let mut took: Histogram<u64> = new_histogram();
        let (mut failed, mut first_failure, mut zombies_accepted) = (0u32, None, 0u32);
        for _ in 0..takeovers {
            let ended = lease.fence();
            let t = Instant::now();
            match store.acquire(lease.name(), HOLDER, TTL).await {
                Ok(next) => {
                    took.saturating_record(t.elapsed().as_micros().max(1) as u64);
                    lease = next;
                    tx.send_replace(lease.fence());
                }
                Err(e) => {
                    took.saturating_record(t.elapsed().as_micros().max(1) as u64);
                    failed += 1;
                    first_failure.get_or_insert_with(|| e.to_string());
                    continue;
                }
            }
            let mut zombie = Writer::new(guard, ZOMBIE_ROW, 1, store.clone(), ended, None, 0);
            if zombie.attempt().await? {
                zombies_accepted += 1;
            }
            settle(lease.epoch().get() as u64).await?;
        }
        let after = server.counters().await?;
        Ok::<_, Failure>((
            took,
            failed,
            first_failure,
            zombies_accepted,
            after.0 - before.0,
        ))
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut refused = 0;
    for task in tasks {
        refused += task
            .await
            .map_err(|e| Failure::new(1, format!("a takeover writer panicked: {e}")))?;
    }
    let (took, failed, first_failure, zombies_accepted, multixacts) = result?;
    let first_writer_error = first_error.lock().expect("not poisoned").clone();
    let ms = |q: f64| took.value_at_quantile(q) as f64 / 1000.0;
    Ok(TakeoverCost {
        guard: guard.name(),
        writers: WRITERS,
        takeovers,
        failed,
        first_failure,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: took.max() as f64 / 1000.0,
        accepted: accepted.iter().map(|a| a.load(Ordering::Relaxed)).sum(),
        refused,
        writer_errors: errors.load(Ordering::Relaxed),
        first_writer_error,
        zombies_accepted,
        multixacts,
    })
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
