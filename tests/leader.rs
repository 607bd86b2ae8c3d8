//! The leadership runtime against real PostgreSQL and, for the seed scenarios, against the in-memory double
//! too: one owner per name (two candidates contending), loss cancels the callback, a failed or panicking
//! callback is reported and released, a failed acquisition leaves the gauge false, stable lease keys; then
//! keepalive, the local deadline measured against the database's own expiry, release semantics, handover times,
//! the release listener's reconnection and backoff, batched renewal over a kept connection of its own, the
//! timing of polls, renewals and retries after each kind of failure, the re-campaign backoff and the metrics;
//! what the callback's `LeaderContext` tells it: whether the tenure is still believed held, and why it ended;
//! and the option checks. Every wait on a runtime signal is bounded ([`WAIT`]).
//!
//! Invariants checked: 2 (one holder per epoch), 5 (a holder stops trusting its lease by its own monotonic
//! clock, a safety margin before the database could grant a successor — measured from the database side).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::metrics_probe;
use common::proxy::{Proxy, HOLD_ALL};
use common::{RowLock, TestDb};
use pgfence::history::Overlap;
use pgfence::leader::{
    run_with_leadership, AcquisitionTurn, Backoff, Elector, Ended, Health, HeldLease,
    LeaderContext, LeadershipOptions, LeaseOptions, MemoryElector, PgElector, Supervisor,
    TenureEnd, Wakeups,
};
use pgfence::metrics::{
    METRIC_CALLBACKS_NOT_STOPPED, METRIC_GROUP_MEMBERS, METRIC_GROUP_NAMES_ASSIGNED,
    METRIC_GROUP_NAMES_LED, METRIC_HANDOVERS, METRIC_HANDOVER_GAP, METRIC_LEADER, METRIC_LOSSES,
    METRIC_RENEW_DURATION, METRIC_STALE_WRITES, METRIC_TRANSITIONS,
};
use pgfence::{Epoch, Error, LossReason, Next, Released};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The bound on every wait in this file for a signal from the runtime: a loss, a callback's start or end, a
/// message. A runtime that never signals fails its test here, naming what it waited for, instead of hanging the
/// test binary (the cargo-mutants sweep runs this binary once per mutant). Far above any wait the tests expect:
/// the longest is a takeover after a ttl of a few seconds.
const WAIT: Duration = Duration::from_secs(15);

/// [`WAIT`]'s bound on a future, panicking with what was awaited when it runs out.
trait Within: std::future::Future + Sized {
    async fn within(self, limit: Duration, what: &str) -> Self::Output {
        match tokio::time::timeout(limit, self).await {
            Ok(output) => output,
            Err(_) => panic!("{what}: nothing within {limit:?}"),
        }
    }
}

impl<F: std::future::Future> Within for F {}

/// Writes a seed scenario once, generic over the [`Backend`], and runs it as two tests that carry the
/// scenario's doc comment: the first on a fresh database's [`PgElector`], the second on a [`MemoryElector`], each
/// under its own lease name (distinct names keep the metrics' `lease` label unique across the binary's parallel
/// tests).
macro_rules! on_both_electors {
    (
        $pg:ident($pg_name:literal), $memory:ident($memory_name:literal):
        $(#[doc = $doc:expr])*
        async fn $scenario:ident<B: Backend>($($params:tt)*) $body:block
    ) => {
        $(#[doc = $doc])*
        async fn $scenario<B: Backend>($($params)*) $body

        $(#[doc = $doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $pg() {
            $scenario(Pg::new().await, $pg_name).await;
        }

        $(#[doc = $doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $memory() {
            $scenario(Memory::new(), $memory_name).await;
        }
    };
}

/// What a seed scenario needs from a backend besides the elector: inject a loss, and make a lease held by
/// "someone else".
trait Backend {
    type E: Elector;
    fn elector(&self) -> Self::E;
    async fn inject_loss(&self, name: &str);
    /// The cause the holder reports for a loss injected with [`inject_loss`](Self::inject_loss).
    fn injected_cause(&self) -> TenureEnd;
    async fn occupy(&self, name: &str, holder: &str);
    /// Who holds `name` now, as the backend's store sees it.
    async fn holder(&self, name: &str) -> Option<String>;
}

struct Pg {
    db: TestDb,
    elector: PgElector,
}

impl Pg {
    async fn new() -> Pg {
        let db = TestDb::new().await;
        // A cluster per test keeps the metrics' `lease` label unique across parallel tests.
        let store = db.store(&db.name).await;
        Pg {
            db,
            elector: PgElector::new(store),
        }
    }
}

impl Backend for Pg {
    type E = PgElector;
    fn elector(&self) -> PgElector {
        self.elector.clone()
    }
    async fn inject_loss(&self, name: &str) {
        // An operator override: the holder learns it at its next renewal, as a definitive loss.
        self.elector
            .store()
            .admin()
            .force_release(name)
            .await
            .unwrap();
    }
    fn injected_cause(&self) -> TenureEnd {
        TenureEnd::Lost {
            reason: LossReason::Released,
        }
    }
    async fn occupy(&self, name: &str, holder: &str) {
        self.elector
            .store()
            .acquire(name, holder, Duration::from_secs(60))
            .await
            .unwrap();
    }
    async fn holder(&self, name: &str) -> Option<String> {
        let status = self.elector.store().lease_status(name).await.unwrap()?;
        (status.state == pgfence::LeaseState::Held)
            .then_some(status.holder)
            .flatten()
    }
}

struct Memory {
    elector: MemoryElector,
}

impl Memory {
    fn new() -> Memory {
        Memory {
            elector: MemoryElector::new(),
        }
    }
}

impl Backend for Memory {
    type E = MemoryElector;
    fn elector(&self) -> MemoryElector {
        self.elector.clone()
    }
    async fn inject_loss(&self, name: &str) {
        assert!(self.elector.lose(name));
    }
    fn injected_cause(&self) -> TenureEnd {
        TenureEnd::Injected
    }
    async fn occupy(&self, name: &str, holder: &str) {
        self.elector.occupy(name, holder).unwrap();
    }
    async fn holder(&self, name: &str) -> Option<String> {
        self.elector.holder(name).map(|(holder, _)| holder)
    }
}

/// What one acquisition attempt returned.
#[derive(Debug, Clone)]
enum Outcome {
    Acquired(Epoch),
    /// Refused: another holder's tenure is live for `expires_in` more (as the backend computed it).
    Held {
        expires_in: Duration,
    },
    Failed(String),
}

/// One acquisition attempt, with when it began and when its answer arrived (monotonic clock).
#[derive(Debug, Clone)]
struct Attempt {
    holder: String,
    begun: Instant,
    answered: Instant,
    outcome: Outcome,
}

/// An elector that reports every acquisition attempt on a channel, so that a test learns that a candidate is
/// campaigning — it asked and was refused — instead of guessing with a sleep. Everything else is delegated.
#[derive(Clone)]
struct Watched<E> {
    inner: E,
    attempts: mpsc::UnboundedSender<Attempt>,
}

impl<E: Elector> Watched<E> {
    fn new(inner: E) -> (Watched<E>, mpsc::UnboundedReceiver<Attempt>) {
        let (attempts, rx) = mpsc::unbounded_channel();
        (Watched { inner, attempts }, rx)
    }
}

impl<E: Elector> Elector for Watched<E> {
    fn qualify(&self, name: &str) -> String {
        self.inner.qualify(name)
    }

    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        options: &LeaseOptions,
    ) -> pgfence::Result<HeldLease> {
        let begun = Instant::now();
        let result = self.inner.acquire(name, holder, options).await;
        let outcome = match &result {
            Ok(lease) => Outcome::Acquired(lease.epoch()),
            Err(Error::Held { expires_in, .. }) => Outcome::Held {
                expires_in: *expires_in,
            },
            Err(other) => Outcome::Failed(other.to_string()),
        };
        // The receiver may be gone once the test has seen what it waited for.
        let _ = self.attempts.send(Attempt {
            holder: holder.to_owned(),
            begun,
            answered: Instant::now(),
            outcome,
        });
        result
    }

    async fn acquisition_turn(&self) -> AcquisitionTurn {
        self.inner.acquisition_turn().await
    }

    fn wakeups(&self) -> Wakeups {
        self.inner.wakeups()
    }

    async fn health(&self) -> Health {
        self.inner.health().await
    }
    async fn join(
        &self,
        group: &str,
        member: &str,
        spec: &pgfence::groups::MemberSpec,
        options: &LeaseOptions,
    ) -> pgfence::Result<pgfence::leader::Membership> {
        self.inner.join(group, member, spec, options).await
    }

    async fn assigned(
        &self,
        membership: &pgfence::leader::Membership,
    ) -> pgfence::Result<pgfence::leader::Assigned> {
        self.inner.assigned(membership).await
    }

    async fn rebalance(
        &self,
        membership: &pgfence::leader::Membership,
    ) -> pgfence::Result<pgfence::groups::Rebalance> {
        self.inner.rebalance(membership).await
    }

    async fn in_doubt(&self, name: &str) -> pgfence::Result<Vec<pgfence::effects::InDoubt>> {
        self.inner.in_doubt(name).await
    }

    async fn handover_gap(&self, name: &str, epoch: pgfence::Epoch) -> Option<Duration> {
        self.inner.handover_gap(name, epoch).await
    }
}

/// How a run spawned in a task ended: within [`WAIT`], without a panic or an error.
async fn ended<Err: Send + 'static>(
    run: tokio::task::JoinHandle<pgfence::Result<Ended<Err>>>,
) -> Ended<Err> {
    run.within(WAIT, "the end of the run")
        .await
        .expect("the run panicked")
        .expect("the run failed")
}

/// The next acquisition attempt a [`Watched`] elector reports.
async fn next_attempt(attempts: &mut mpsc::UnboundedReceiver<Attempt>) -> Attempt {
    attempts
        .recv()
        .within(WAIT, "the next attempt")
        .await
        .expect("the candidate stopped campaigning")
}

/// Waits for the next attempt of `holder` that began at or after `since` and was refused because someone else
/// holds the lease.
async fn refused_attempt(
    attempts: &mut mpsc::UnboundedReceiver<Attempt>,
    holder: &str,
    since: Instant,
) -> Attempt {
    loop {
        let attempt = attempts
            .recv()
            .within(WAIT, "the next attempt")
            .await
            .expect("the candidate stopped campaigning");
        if attempt.holder != holder || attempt.begun < since {
            continue;
        }
        match &attempt.outcome {
            Outcome::Held { .. } => return attempt,
            Outcome::Failed(error) => panic!("the attempt failed: {error}"),
            Outcome::Acquired(epoch) => {
                panic!("acquired epoch {epoch} while another holder leads")
            }
        }
    }
}

fn options() -> LeadershipOptions {
    let mut options = LeadershipOptions::new(Duration::from_secs(3));
    options.lease.renew_every = Duration::from_millis(100);
    options.poll_every = Duration::from_millis(200);
    options.grace = Duration::from_secs(2);
    options
}

fn gauge<E: Elector>(elector: &E, name: &str) -> Option<f64> {
    metrics_probe::gauge(METRIC_LEADER, &[("lease", &elector.qualify(name))])
}

fn transitions<E: Elector>(elector: &E, name: &str) -> u64 {
    metrics_probe::counter(METRIC_TRANSITIONS, &[("lease", &elector.qualify(name))])
}

fn losses<E: Elector>(elector: &E, name: &str, cause: &str) -> u64 {
    metrics_probe::counter(
        METRIC_LOSSES,
        &[("lease", &elector.qualify(name)), ("cause", cause)],
    )
}

/// What the metrics say about one lease: the leader gauge, transitions, and losses by cause
/// `[definitive, deadline, injected]`.
type Metered = (Option<f64>, u64, [u64; 3]);

fn metered<E: Elector>(elector: &E, name: &str) -> Metered {
    (
        gauge(elector, name),
        transitions(elector, name),
        ["definitive", "deadline", "injected"].map(|cause| losses(elector, name, cause)),
    )
}

/// The thread that ends a tenure records its metrics just after it has woken the tenure's waiters (`lost()`,
/// the cancellation token), so a waiter may read them a moment early: waits until they read `expected`, failing
/// with what they read after 5 s.
async fn metrics_settle<E: Elector>(elector: &E, name: &str, expected: Metered) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = metered(elector, name);
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "metrics of {name}: {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Whether the database, at the moment it runs the query, would let another holder acquire `qualified`.
async fn database_would_grant(client: &tokio_postgres::Client, qualified: &str) -> bool {
    client
        .query_one(
            "SELECT state <> 'held' OR expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = $1",
            &[&qualified],
        )
        .await
        .unwrap()
        .get(0)
}

on_both_electors! {
    pg_one_owner_per_name("owner"), memory_one_owner_per_name("mem-owner"):
    /// Seed scenario: two candidates contend for one free name. Exactly one callback runs at a time: the other
    /// candidate is refused while the first leads — it is seen asking again after the first callback started — and
    /// its callback starts only after the first returned and released, with a larger epoch.
    async fn one_owner_per_name<B: Backend>(backend: B, name: &str) {
        metrics_probe::install();
        let (elector, mut attempts) = Watched::new(backend.elector());
        let shutdown = CancellationToken::new();
        let running = Arc::new(AtomicUsize::new(0));
        // (who, what, epoch, callbacks already running when it started)
        let (events, mut rx) = mpsc::unbounded_channel::<(&'static str, &'static str, Epoch, usize)>();
        let together = Arc::new(tokio::sync::Barrier::new(2));
        let mut stops = std::collections::HashMap::new();
        let mut runs = Vec::new();
        for who in ["pod-a", "pod-b"] {
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            stops.insert(who, stop_tx);
            let (elector, shutdown, events, running, together, name) = (
                elector.clone(),
                shutdown.clone(),
                events.clone(),
                running.clone(),
                together.clone(),
                name.to_owned(),
            );
            runs.push(tokio::spawn(async move {
                together.wait().await; // both campaign for the free lease at once
                run_with_leadership(
                    &elector,
                    &name,
                    who,
                    &options(),
                    &shutdown,
                    move |ctx| async move {
                        let others = running.fetch_add(1, Ordering::SeqCst);
                        events.send((who, "start", ctx.epoch(), others)).unwrap();
                        stop_rx
                            .within(WAIT, "the test's stop signal")
                            .await
                            .unwrap();
                        running.fetch_sub(1, Ordering::SeqCst);
                        events.send((who, "stop", ctx.epoch(), 0)).unwrap();
                        Ok::<_, Error>(())
                    },
                )
                .await
            }));
        }
        let (first, what, first_epoch, others) = rx
            .recv()
            .within(WAIT, "the next message on rx")
            .await
            .unwrap();
        let first_started = Instant::now();
        assert_eq!((what, others), ("start", 0));
        let second = if first == "pod-a" { "pod-b" } else { "pod-a" };
        // The other candidate is still campaigning while the first leads, and is refused — nothing else happens
        // meanwhile (a second callback starting would be two owners at once).
        tokio::select! {
            _ = refused_attempt(&mut attempts, second, first_started) => {}
            event = rx.recv() => panic!("while {first} leads: {event:?}"),
        }
        assert_eq!(metered(&elector, name), (Some(1.0), 1, [0, 0, 0]));
        stops.remove(first).unwrap().send(()).unwrap();
        assert_eq!(
            rx.recv()
                .within(WAIT, "the next message on rx")
                .await
                .unwrap(),
            (first, "stop", first_epoch, 0)
        );
        let (who, what, second_epoch, others) = rx
            .recv()
            .within(WAIT, "the next message on rx")
            .await
            .unwrap();
        assert_eq!((who, what), (second, "start"));
        assert_eq!(others, 0, "two callbacks ran at once");
        assert!(
            second_epoch > first_epoch,
            "the second tenure's epoch is larger"
        );
        stops.remove(second).unwrap().send(()).unwrap();
        for run in runs {
            assert!(matches!(ended(run).await, Ended::Returned));
        }
        // Every attempt of the second candidate before the first stopped was refused: none acquired.
        while let Ok(attempt) = attempts.try_recv() {
            if let Outcome::Acquired(epoch) = attempt.outcome {
                assert_eq!((attempt.holder.as_str(), epoch), (second, second_epoch));
            }
        }
        // Two tenures, each counted when it began and when it ended; neither lost.
        assert_eq!(metered(&elector, name), (Some(0.0), 4, [0, 0, 0]));
    }
}

on_both_electors! {
    pg_loss_cancels_the_callback("loss"), memory_loss_cancels_the_callback("mem-loss"):
    /// Seed scenario, ordered by channels: acquired → work started → loss injected → cancellation observed →
    /// leader gauge false, and the run reports the loss with the backend's cause, counted once under that cause.
    async fn loss_cancels_the_callback<B: Backend>(backend: B, name: &str) {
        metrics_probe::install();
        let elector = backend.elector();
        let shutdown = CancellationToken::new();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<i64>();
        let (cancelled_tx, cancelled_rx) = tokio::sync::oneshot::channel::<()>();
        let run = {
            let (elector, shutdown, name) = (elector.clone(), shutdown.clone(), name.to_owned());
            tokio::spawn(async move {
                run_with_leadership(
                    &elector,
                    &name,
                    "pod-a",
                    &options(),
                    &shutdown,
                    move |ctx| async move {
                        started_tx.send(ctx.epoch().get()).unwrap();
                        ctx.cancelled().await;
                        cancelled_tx.send(()).unwrap();
                        Ok::<_, Error>(())
                    },
                )
                .await
            })
        };
        started_rx
            .within(WAIT, "the callback's start")
            .await
            .unwrap();
        assert_eq!(metered(&elector, name), (Some(1.0), 1, [0, 0, 0]));
        backend.inject_loss(name).await;
        cancelled_rx
            .within(WAIT, "the callback's cancellation")
            .await
            .unwrap();
        let expected = backend.injected_cause();
        match ended(run).await {
            Ended::Lost {
                end,
                callback_stopped,
            } => {
                assert!(callback_stopped);
                assert_eq!(end, expected);
            }
            other => panic!("expected Lost, got {other:?}"),
        }
        let counted = match expected {
            TenureEnd::Lost { .. } => [1, 0, 0],
            TenureEnd::DeadlineExceeded { .. } => [0, 1, 0],
            TenureEnd::Injected => [0, 0, 1],
            other => panic!("unexpected cause {other:?}"),
        };
        metrics_settle(&elector, name, (Some(0.0), 2, counted)).await;
    }
}

on_both_electors! {
    pg_a_failed_or_panicking_callback_is_reported_and_released("failing"),
    memory_a_failed_or_panicking_callback_is_reported_and_released("mem-failing"):
    /// A callback that returns an error ends the run as `Failed` with that very error, one that panics as
    /// `Panicked` with its message; either way the tenure is released at once (the store has no holder, the gauge
    /// is false) — a failing controller never keeps the lease until its ttl runs out.
    async fn a_failed_or_panicking_callback_is_reported_and_released<B: Backend>(
        backend: B,
        name: &str,
    ) {
        metrics_probe::install();
        let elector = backend.elector();
        let shutdown = CancellationToken::new();
        let ended = run_with_leadership(
            &elector,
            name,
            "pod-a",
            &options(),
            &shutdown,
            |ctx| async move { Err::<(), String>(format!("reconcile failed at epoch {}", ctx.epoch())) },
        )
        .within(WAIT, "the end of run_with_leadership")
        .await
        .unwrap();
        match ended {
            Ended::Failed(error) => assert_eq!(error, "reconcile failed at epoch 1"),
            other => panic!("expected Failed, got {other:?}"),
        }
        assert_eq!(
            backend.holder(name).await,
            None,
            "released after the failure"
        );
        assert_eq!(metered(&elector, name), (Some(0.0), 2, [0, 0, 0]));

        let ended = run_with_leadership(
            &elector,
            name,
            "pod-a",
            &options(),
            &shutdown,
            |ctx| async move {
                if ctx.is_held() {
                    panic!("controller bug at epoch {}", ctx.epoch());
                }
                Ok::<(), String>(())
            },
        )
        .within(WAIT, "the end of run_with_leadership")
        .await
        .unwrap();
        match ended {
            Ended::Panicked(message) => assert_eq!(message, "controller bug at epoch 2"),
            other => panic!("expected Panicked, got {other:?}"),
        }
        assert_eq!(backend.holder(name).await, None, "released after the panic");
        assert_eq!(metered(&elector, name), (Some(0.0), 4, [0, 0, 0]));
    }
}

on_both_electors! {
    pg_failed_acquisition_leaves_the_gauge_false("busy"),
    memory_failed_acquisition_leaves_the_gauge_false("mem-busy"):
    /// Seed scenario: an acquisition that fails because someone else holds the lease leaves the gauge unset and
    /// counts no transition.
    async fn failed_acquisition_leaves_the_gauge_false<B: Backend>(backend: B, name: &str) {
        metrics_probe::install();
        let elector = backend.elector();
        backend.occupy(name, "someone-else").await;
        let result = elector.acquire(name, "pod-a", &options().lease).await;
        assert!(
            matches!(result, Err(Error::Held { ref holder, .. }) if holder == "someone-else"),
            "{result:?}"
        );
        assert_eq!(metered(&elector, name), (None, 0, [0, 0, 0]));
    }
}

on_both_electors! {
    pg_lease_keys_are_stable("keys"), memory_lease_keys_are_stable("mem-keys"):
    /// Seed scenario: lease keys are stable — the same name maps to the same qualified key in every tenure.
    async fn lease_keys_are_stable<B: Backend>(backend: B, name: &str) {
        let elector = backend.elector();
        let first = elector
            .acquire(name, "pod-a", &options().lease)
            .await
            .unwrap();
        let key = first.fence().lease().to_owned();
        assert_eq!(key, elector.qualify(name));
        let first_epoch = first.epoch();
        first.release().await.unwrap();
        let second = elector
            .acquire(name, "pod-b", &options().lease)
            .await
            .unwrap();
        assert_eq!(second.fence().lease(), key);
        assert!(second.epoch() > first_epoch);
    }
}

/// Polls `ready` (local state, or the database's through a query) every few milliseconds until it holds; fails
/// after 10 s with `what`.
async fn until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready().await {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The keepalive holds a lease far beyond its ttl: by the database's own clock the tenure has been renewed more
/// than twice its ttl after it was acquired, it was held by the same epoch at every look, and the holder still
/// trusts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_holds_the_lease_beyond_its_ttl() {
    let pg = Pg::new().await;
    let ttl = Duration::from_millis(600);
    let mut options = LeaseOptions::new(ttl);
    options.renew_every = Duration::from_millis(100);
    let lease = pg.elector.acquire("kept", "pod-a", &options).await.unwrap();
    let qualified = lease.qualified_name().to_owned();
    let client = pg.db.client().await;
    let ttl_ms = ttl.as_millis() as i64;
    let (client, qualified, lease_ref) = (&client, &qualified, &lease);
    until("renewed beyond twice the ttl", move || async move {
        let row = client
            .query_one(
                "SELECT state = 'held' AND expires_at > clock_timestamp(), epoch, \
                        renewed_at >= acquired_at + 2 * $2::bigint * interval '1 millisecond' \
                   FROM pgfence.leases WHERE name = $1",
                &[qualified, &ttl_ms],
            )
            .await
            .unwrap();
        assert!(row.get::<_, bool>(0), "the lease expired in the database");
        assert_eq!(row.get::<_, i64>(1), lease_ref.epoch().get());
        row.get(2)
    })
    .await;
    assert!(lease.is_held(), "{:?}", lease.end_cause());
}

/// Invariant 5, measured against the database's own expiry. A renewal is held up by a row lock (as a takeover
/// or another renewal in flight would), so it is *sent* well before the database runs it and reads its clock;
/// the next renewals are kept waiting behind another lock. The database's expiry is then located on this
/// process's monotonic clock by a query of its own (`expires_at - clock_timestamp()`, sent after the renewal
/// committed), and:
///
/// - the holder's local deadline (`trust_until`) is at least the safety margin before that expiry — it fails if
///   the deadline is computed from the renewal's *receive* time, or without the margin;
/// - the holder gives up no earlier than that deadline (renewals are retried until then), with the deadline
///   cause, counted once under `deadline`;
/// - when it gives up the database still holds the lease for it (no successor could have been granted yet), and
///   a rival acquires only once the database says the tenure expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_stops_trusting_a_margin_before_the_database_could_grant_a_successor() {
    metrics_probe::install();
    let pg = Pg::new().await;
    let (ttl, margin) = (Duration::from_millis(2000), Duration::from_millis(500));
    let mut options = LeaseOptions::new(ttl);
    options.renew_every = Duration::from_millis(300);
    options.safety_margin = margin;
    let lease = pg.elector.acquire("inv5", "pod-a", &options).await.unwrap();
    let qualified = lease.qualified_name().to_owned();
    let probe = pg.db.client().await;

    // The next renewal (due 300 ms after the acquisition was sent) waits for lock A; B queues behind it, so that
    // once A commits that renewal runs and every later one waits for B.
    let a = RowLock::take(&pg.db, &qualified).await;
    common::wait_until_blocked_on_lock(&pg.db, 1).await;
    let b = tokio::spawn({
        let (db, qualified) = (pg.db.clone(), qualified.clone());
        async move { RowLock::take(&db, &qualified).await }
    });
    common::wait_until_blocked_on_lock(&pg.db, 2).await;
    // The delay under test: between the renewal's send and the moment the database runs it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let trusted_before = lease.trust_until();
    a.release().await;
    let b = b.await.unwrap(); // the renewal has committed: B holds the row now
    let expires_not_before = common::database_expiry(&probe, &qualified).await.not_before;

    let cause = lease.lost().within(WAIT, "the loss of lease").await;
    let declared_at = Instant::now();
    // Sent after the loss was declared: the database still holds the lease for pod-a.
    assert!(
        !database_would_grant(&probe, &qualified).await,
        "the holder declared its loss only after the database could grant a successor"
    );
    let trusted_until = lease.trust_until();
    assert!(
        trusted_until > trusted_before,
        "the delayed renewal was not counted as good"
    );
    assert!(
        trusted_until + margin <= expires_not_before,
        "the local deadline is at most {:?} before the database's expiry, less than the margin {margin:?}",
        expires_not_before.saturating_duration_since(trusted_until)
    );
    assert!(
        declared_at >= trusted_until,
        "gave up {:?} before its deadline",
        trusted_until - declared_at
    );
    match &cause {
        TenureEnd::DeadlineExceeded {
            last_error: Some(_),
        } => {}
        other => panic!("expected a deadline loss with the renewal's fate, got {other:?}"),
    }
    assert!(!lease.is_held());
    metrics_settle(&pg.elector, "inv5", (Some(0.0), 2, [0, 1, 0])).await;

    let (probe_ref, qualified_ref) = (&probe, &qualified);
    until("the database expires the tenure", move || {
        database_would_grant(probe_ref, qualified_ref)
    })
    .await;
    let granted_from = Instant::now();
    assert!(granted_from >= expires_not_before);
    b.release().await;
    let successor = pg
        .elector
        .store()
        .acquire("inv5", "pod-b", ttl)
        .await
        .unwrap();
    assert_eq!(successor.epoch().get(), lease.epoch().get() + 1);
    assert!(!lease.is_held());
}

/// With the database unreachable (its server stopped), every renewal fails with a connection error. The holder
/// keeps retrying until its local deadline — it does not give up at the first error — and then declares the
/// loss with the last error as the cause. Its deadline is (send time of the last good renewal + ttl − margin),
/// and that renewal was sent before the server went away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_makes_the_holder_give_up_at_its_local_deadline() {
    let server = pgfence::embedded::EmbeddedServer::start().unwrap();
    let store = pgfence::Store::connect(
        pgfence::StoreConfig::new(server.url(), "c")
            .connect_timeout(Duration::from_millis(300))
            .checkout_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let elector = PgElector::new(store);
    let mut options = LeaseOptions::new(Duration::from_millis(1500));
    options.renew_every = Duration::from_millis(200);
    options.safety_margin = Duration::from_millis(200);
    let lease = elector.acquire("fragile", "pod-a", &options).await.unwrap();
    let acquired = lease.trust_until();
    let lease_ref = &lease;
    until("a renewal succeeds", move || async move {
        lease_ref.trust_until() > acquired
    })
    .await;
    tokio::task::block_in_place(|| server.stop()).unwrap();
    let stopped_at = Instant::now();
    let cause = lease.lost().within(WAIT, "the loss of lease").await;
    let declared_at = Instant::now();
    let trusted_until = lease.trust_until();
    match &cause {
        TenureEnd::DeadlineExceeded {
            last_error: Some(error),
        } => assert!(!error.is_empty()),
        other => panic!("expected a deadline loss with the last renewal error, got {other:?}"),
    }
    assert!(
        declared_at >= trusted_until,
        "gave up {:?} before its deadline",
        trusted_until - declared_at
    );
    assert!(
        trusted_until <= stopped_at + options.ttl - options.safety_margin,
        "a renewal counted as good after the server was gone"
    );
    assert!(!lease.is_held());
}

/// Dropping a held lease releases it promptly in the background: a successor acquires long before the ttl
/// (60 s) could have run out, woken by the release notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_lease_releases_it_in_the_background() {
    let pg = Pg::new().await;
    let client = pg.db.client().await;
    let long = LeaseOptions::new(Duration::from_secs(60));
    let lease = pg.elector.acquire("dropped", "pod-a", &long).await.unwrap();
    let (qualified, epoch) = (lease.qualified_name().to_owned(), lease.epoch());
    let mut wakeups = pg.elector.wakeups();
    listener_backend(&client, None).await;
    drop(lease);
    // A wakeup is a hint (the listener's first LISTEN wakes every waiter too): look, and wait again while held.
    let until = Instant::now() + Duration::from_secs(5);
    let next = loop {
        wakeups.wait(&qualified, Duration::from_secs(5)).await;
        match pg.elector.acquire("dropped", "pod-b", &long).await {
            Ok(next) => break next,
            Err(Error::Held { .. }) if Instant::now() < until => continue,
            Err(e) => panic!("not released in the background within 5 s of a 60 s ttl: {e}"),
        }
    };
    assert_eq!(next.epoch().get(), epoch.get() + 1);
}

/// Release after a definitive loss is a no-op that never touches the successor's tenure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_loss_never_touches_the_successor() {
    let pg = Pg::new().await;
    let mut options = LeaseOptions::new(Duration::from_secs(5));
    options.renew_every = Duration::from_millis(100);
    let a = pg
        .elector
        .acquire("handed", "pod-a", &options)
        .await
        .unwrap();
    pg.elector
        .store()
        .admin()
        .force_release("handed")
        .await
        .unwrap();
    let b = pg
        .elector
        .acquire("handed", "pod-b", &options)
        .await
        .unwrap();
    let cause = a.lost().within(WAIT, "the loss of a").await;
    assert!(matches!(cause, TenureEnd::Lost { .. }), "{cause:?}");
    assert_eq!(
        a.release().await.unwrap(),
        Released::NotHeld(LossReason::Released)
    );
    let status = pg
        .elector
        .store()
        .lease_status("handed")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.holder.as_deref(), Some("pod-b"));
    assert_eq!(status.epoch, Some(b.epoch()));
    assert!(b.is_held());
}

/// Waits until an elector's release listener is connected and LISTENing (a backend of this database whose last
/// statement, completed, is the LISTEN), other than backend `not` — observed in `pg_stat_activity`, not
/// guessed. Returns its backend pid.
async fn listener_backend(client: &tokio_postgres::Client, not: Option<i32>) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid = client
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                   AND query LIKE 'LISTEN pgfence_lease_free%' AND state = 'idle' AND pid <> $1",
                &[&not.unwrap_or(0)],
            )
            .await
            .unwrap();
        if let Some(row) = pid {
            return row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "no release listener LISTENing within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One graceful handover on `elector`: `old` holds `name`; a candidate campaigns through `run_with_leadership`
/// and is refused (from then on it waits for a release notification or its timer); the holder releases.
/// Returns the time from the release to the candidate's callback start. Fails — without waiting for the timer —
/// unless the candidate started before its timer could have fired (min(time left, poll interval) after the
/// refusal): only the release notification wakes it earlier.
async fn handover_after_release(
    elector: &PgElector,
    name: &str,
    options: LeadershipOptions,
    old: &str,
) -> Duration {
    let holder = elector.acquire(name, old, &options.lease).await.unwrap();
    let (candidate, mut attempts) = Watched::new(elector.clone());
    let (started_tx, started_rx) = oneshot::channel::<Instant>();
    let since = Instant::now();
    let run = tokio::spawn({
        let name = name.to_owned();
        async move {
            run_with_leadership(
                &candidate,
                &name,
                "new",
                &options,
                &CancellationToken::new(),
                move |_ctx| async move {
                    started_tx.send(Instant::now()).unwrap();
                    Ok::<_, Error>(())
                },
            )
            .await
        }
    });
    let refused = refused_attempt(&mut attempts, "new", since).await;
    let Outcome::Held { expires_in } = refused.outcome else {
        unreachable!()
    };
    let timer = refused.answered + expires_in.min(options.poll_every);
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let started = tokio::time::timeout_at(timer.into(), started_rx)
        .await
        .expect("the candidate was not woken by the release notification")
        .unwrap();
    assert!(started < timer);
    assert!(matches!(ended(run).await, Ended::Returned));
    started - released_at
}

/// Handover after a graceful release: a waiting candidate is woken by NOTIFY and acquires before its timer (the
/// poll interval, 10 s) could have woken it — every time. Prints the median of 10 handovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_release_hands_over_within_milliseconds() {
    let pg = Pg::new().await;
    let mut options = LeadershipOptions::new(Duration::from_secs(30));
    options.poll_every = Duration::from_secs(10);
    let _subscribed = pg.elector.wakeups();
    listener_backend(&pg.db.client().await, None).await;
    let mut samples = Vec::new();
    for round in 0..10 {
        samples.push(
            handover_after_release(&pg.elector, "handover", options, &format!("old-{round}")).await,
        );
    }
    samples.sort();
    eprintln!(
        "graceful handover: median {:?}, max {:?} (poll interval 10 s)",
        samples[samples.len() / 2],
        samples.last().unwrap()
    );
}

/// The elector's LISTEN connection dies (terminated by the server, as a restart or an idle-session killer
/// would): it reconnects on its own, LISTENs again, and a release still wakes a waiting candidate before its
/// timer could have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_listener_reconnects_after_its_connection_is_killed() {
    let pg = Pg::new().await;
    let admin = pg.db.client().await;
    let _subscribed = pg.elector.wakeups();
    let first = listener_backend(&admin, None).await;
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let second = listener_backend(&admin, Some(first)).await;
    assert_ne!(first, second);
    let mut options = LeadershipOptions::new(Duration::from_secs(60));
    options.poll_every = Duration::from_secs(5);
    let took = handover_after_release(&pg.elector, "relisten", options, "old").await;
    eprintln!("handover after the listener reconnected: {took:?} (poll interval 5 s)");
}

/// The release listener retries an unreachable database with its backoff (100 ms doubling to 1 s), not in a
/// tight loop: a server that is down, or a proxy that refuses, sees a handful of attempts, not thousands. It
/// does retry, and LISTENs again once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_listener_backs_off_while_the_database_is_unreachable() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let proxy = Proxy::start(&db.url).await;
    let store = store_through(&proxy, &db).await;
    let elector = PgElector::new(store);
    let _subscribed = elector.wakeups();
    let first = listener_backend(&admin, None).await;
    let before = proxy.accepted();
    proxy.redirect(common::unused_port()); // every new connection is refused
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let cut_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await; // the window observed, not a guess at an event
    let attempts = proxy.accepted() - before;
    let window = cut_at.elapsed();
    eprintln!("release listener: {attempts} connection attempts in {window:?} while unreachable");
    // Attempts 0.1, 0.3, 0.7, 1.5 and 2.5 s after the cut (100 ms doubling, at most 1 s apart): 4 or 5 in the
    // window. Room for a slow machine stretching it, none for a loop.
    assert!(
        (3..=10).contains(&attempts),
        "{attempts} connection attempts in {window:?} while the database was unreachable"
    );
    proxy.redirect(db_port(&db.url));
    let second = listener_backend(&admin, Some(first)).await;
    assert_ne!(first, second);
}

/// Campaigns for `name` as "pod-a" in a task of its own, with a callback that returns at once.
fn spawn_campaign<E: Elector + Send + Sync + 'static>(
    elector: E,
    name: &'static str,
    options: LeadershipOptions,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<pgfence::Result<Ended<Error>>> {
    tokio::spawn(async move {
        run_with_leadership(&elector, name, "pod-a", &options, &shutdown, |_| async {
            Ok::<_, Error>(())
        })
        .await
    })
}

/// Replaces the SQL function `signature` (returning `returns`) by one that counts its calls in the sequence
/// `public.<counter>` and raises `sqlstate`; [`calls`] reads the count.
async fn fail_counting(
    admin: &tokio_postgres::Client,
    signature: &str,
    returns: &str,
    counter: &str,
    sqlstate: &str,
) {
    admin
        .batch_execute(&format!(
            "CREATE SEQUENCE public.{counter};
             CREATE OR REPLACE FUNCTION {signature} RETURNS {returns} LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_catalog.nextval('public.{counter}');
                 RAISE EXCEPTION 'failed by the test' USING ERRCODE = '{sqlstate}';
             END $$;"
        ))
        .await
        .unwrap();
}

/// How many calls the sequence `public.<counter>` of [`fail_counting`] has counted.
async fn calls(admin: &tokio_postgres::Client, counter: &str) -> i64 {
    admin
        .query_one(
            &format!("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.{counter}"),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A store that reaches `db` through `proxy` and gives up on a connection or a pool checkout after 300 ms.
async fn store_through(proxy: &Proxy, db: &TestDb) -> pgfence::Store {
    pgfence::Store::connect(
        pgfence::StoreConfig::new(proxy.url(&db.name), "c")
            .connect_timeout(Duration::from_millis(300))
            .checkout_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap()
}

/// The port of a connection URL's server.
fn db_port(url: &str) -> u16 {
    let config: tokio_postgres::Config = url.parse().unwrap();
    config.get_ports()[0]
}

/// Dropping the last handle of an elector stops its release listener and closes the listener's connection:
/// an elector created per request, or per test, leaves no session behind on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_elector_closes_its_release_listener() {
    let pg = Pg::new().await;
    let admin = pg.db.client().await;
    let elector = PgElector::new(pg.elector.store().clone());
    let wakeups = elector.wakeups();
    let listener = listener_backend(&admin, None).await;
    drop(wakeups);
    drop(elector);
    let deadline = Instant::now() + WAIT;
    loop {
        let alive: bool = admin
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)",
                &[&listener],
            )
            .await
            .unwrap()
            .get(0);
        if !alive {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the listener's session {listener} outlived its elector by {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The keepalive renews over a connection of its own that it keeps: while the application holds every
/// connection of its pool for longer than the ttl, the lease stays held and believed, and a single backend runs
/// every renewal (no reconnect per tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepalive_renews_over_its_own_kept_connection_while_the_pool_is_busy() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let store = pgfence::Store::connect(db.config("c").pool_size(1))
        .await
        .unwrap();
    let elector = PgElector::new(store.clone());
    let mut options = LeaseOptions::new(Duration::from_millis(600));
    options.renew_every = Duration::from_millis(100);
    let lease = elector.acquire("kept", "pod-a", &options).await.unwrap();
    let busy = store.admin().conn().await.unwrap(); // the pool's only connection, held by the application
    let qualified = lease.qualified_name().to_owned();
    let mut renewers = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_millis(1500); // 2.5 ttl, 15 renewal periods
    while Instant::now() < until {
        for row in admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                   AND query LIKE '%renew_many%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
        {
            renewers.insert(row.get::<_, i32>(0));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        lease.is_held(),
        "lost while the pool was busy: {:?}",
        lease.end_cause()
    );
    let expiry = common::database_expiry(&admin, &qualified).await;
    assert!(
        expiry.not_after > Instant::now(),
        "the database let it expire"
    );
    assert_eq!(renewers.len(), 1, "renewals ran on backends {renewers:?}");
    drop(busy);
    lease.release().await.unwrap();
}

/// A renewal statement that fails — refused (42501, not transient) or transiently (40001) — waits `retry_every`
/// before the next attempt, even when that is past the local deadline: the holder neither hammers the database
/// until its deadline nor sends a last attempt at it, and it declares the loss at the deadline with the
/// failure as its cause. `renew_many` is replaced by a function that counts its calls and raises the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_waits_its_retry_period_and_the_loss_names_the_failure() {
    let pg = Pg::new().await;
    let admin = pg.db.client().await;
    let mut options = LeaseOptions::new(Duration::from_secs(2));
    options.renew_every = Duration::from_millis(300);
    options.safety_margin = Duration::from_millis(200);
    options.retry_every = Duration::from_secs(5);
    for (name, sqlstate) in [("refused", "42501"), ("transient", "40001")] {
        let lease = pg.elector.acquire(name, "pod-a", &options).await.unwrap();
        fail_counting(
            &admin,
            "pgfence.renew_many(p_leases text[], p_epochs bigint[], p_secrets text[], \
             p_ttl_ms bigint)",
            "TABLE (lease text, outcome text, reason text, epoch bigint)",
            &format!("renew_calls_{name}"),
            sqlstate,
        )
        .await;
        let cause = lease.lost().within(WAIT, "the loss of lease").await;
        let declared_at = Instant::now();
        match &cause {
            TenureEnd::DeadlineExceeded {
                last_error: Some(error),
            } if error.contains("failed by the test") => {}
            other => panic!("{name}: expected a deadline loss naming the failure, got {other:?}"),
        }
        assert!(declared_at >= lease.trust_until(), "{name}");
        let calls = calls(&admin, &format!("renew_calls_{name}")).await;
        assert_eq!(
            calls, 1,
            "{name}: renewal attempts between the failure and the loss (retry_every 5 s, deadline 1.8 s)"
        );
    }
}

/// A release whose connection dies under it (the server terminates the session: 57P01, transient) is retried
/// once on a fresh connection: the tenure ends in the database at once, and a successor need not wait for its
/// ttl. The release is held on the lease row's lock while its session is terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_session_is_terminated_is_retried_on_a_fresh_connection() {
    let pg = Pg::new().await;
    let admin = pg.db.client().await;
    let lease = pg
        .elector
        .acquire(
            "retried",
            "pod-a",
            &LeaseOptions::new(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let qualified = lease.qualified_name().to_owned();
    let row = RowLock::take(&pg.db, &qualified).await;
    let mut release = tokio::spawn(lease.release());
    common::wait_until_blocked_on_lock(&pg.db, 1).await;
    let terminated: i64 = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, 1, "the release was not waiting on the row");
    // The retry queues on the same row; one sent on the dead session would fail at once instead.
    tokio::select! {
        _ = common::wait_until_blocked_on_lock(&pg.db, 1) => {}
        ended = &mut release => panic!("the release ended without a retry on a live session: {ended:?}"),
    }
    row.release().await;
    let released = release.within(WAIT, "the release").await.unwrap();
    assert_eq!(released.unwrap(), Released::Released);
    let status = pg
        .elector
        .store()
        .lease_status("retried")
        .await
        .unwrap()
        .unwrap();
    assert_ne!(status.state, pgfence::LeaseState::Held, "{status:?}");
}

/// After an attempt cut off at one member's deadline, the group waits `retry_every` before renewing the members
/// that are still held: A's renewal hangs on A's row until A's deadline; B joined the group meanwhile (same holder
/// and timing); B's next renewal is sent a retry period after A's deadline, not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_cut_off_attempt_the_group_waits_its_retry_period() {
    let pg = Pg::new().await;
    let mut options = LeaseOptions::new(Duration::from_secs(2));
    options.renew_every = Duration::from_millis(300);
    options.safety_margin = Duration::from_millis(200);
    options.retry_every = Duration::from_millis(200);
    let a = pg
        .elector
        .acquire("cut-a", "pod-a", &options)
        .await
        .unwrap();
    let row = RowLock::take(&pg.db, a.qualified_name()).await;
    common::wait_until_blocked_on_lock(&pg.db, 1).await; // A's renewal is in flight, waiting on the row
    let b = pg
        .elector
        .acquire("cut-b", "pod-a", &options)
        .await
        .unwrap();
    let b_acquired_trust = b.trust_until();
    let end = a.lost().within(WAIT, "the loss of a").await;
    assert!(end.is_loss(), "{end:?}");
    let a_deadline = a.trust_until();
    let deadline = Instant::now() + WAIT;
    while b.trust_until() == b_acquired_trust {
        assert!(
            Instant::now() < deadline,
            "B was not renewed within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(b.is_held());
    // A renewal sent at `sent` sets the deadline to sent + ttl - margin.
    let sent = b.trust_until() - (options.ttl - options.safety_margin);
    assert!(
        sent >= a_deadline + options.retry_every,
        "B's renewal was sent {:?} after A's deadline, within the retry period {:?}",
        sent.saturating_duration_since(a_deadline),
        options.retry_every
    );
    row.release().await;
    b.release().await.unwrap();
}

/// The runtime's release is retried once only when the failure is transient: a release the database refuses
/// (42501) is sent once — a second would only be refused again, and counted again by the audit of a denial —
/// while one failing with 40001 is sent twice. `pgfence.release` is replaced by a function that counts its calls
/// and raises the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_is_sent_once_and_a_transient_failure_twice() {
    let pg = Pg::new().await;
    let admin = pg.db.client().await;
    for (name, sqlstate, sent) in [("refused", "42501", 1), ("transient", "40001", 2)] {
        let lease = pg
            .elector
            .acquire(name, "pod-a", &LeaseOptions::new(Duration::from_secs(60)))
            .await
            .unwrap();
        fail_counting(
            &admin,
            "pgfence.release(p_lease text, p_epoch bigint, p_secret text)",
            "pgfence.lease_result",
            &format!("release_calls_{name}"),
            sqlstate,
        )
        .await;
        let error = lease.release().await.unwrap_err();
        assert_eq!(
            error.sqlstate().map(|s| s.to_string()).as_deref(),
            Some(sqlstate),
            "{name}: {error}"
        );
        let calls = calls(&admin, &format!("release_calls_{name}")).await;
        assert_eq!(calls, sent, "{name}: release statements sent");
    }
}

/// Renewals keep their period from the start: the first comes one period after the acquisition was sent, not at
/// once (a renewal per acquisition would double the statements of a campaign), and moves the database's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_renewal_comes_one_period_after_the_acquisition() {
    let pg = Pg::new().await;
    let admin = pg.db.client().await;
    let mut options = LeaseOptions::new(Duration::from_secs(6));
    options.renew_every = Duration::from_secs(1);
    let sent = Instant::now();
    let lease = pg
        .elector
        .acquire("paced", "pod-a", &options)
        .await
        .unwrap();
    let read = || async {
        admin
            .query_one(
                "SELECT expires_at::text FROM pgfence.leases WHERE name = $1",
                &[&lease.qualified_name()],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    let acquired = read().await;
    let deadline = Instant::now() + WAIT;
    while read().await == acquired {
        assert!(Instant::now() < deadline, "no renewal within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = sent.elapsed();
    assert!(
        first >= options.renew_every,
        "the first renewal came {first:?} after the acquisition's send, before its period {:?}",
        options.renew_every
    );
    lease.release().await.unwrap();
}

/// Handover after a crash (no release): the holder's process stops being heard (nothing it sends reaches the
/// database from the crash on), and the successor's callback starts within ttl + one poll interval of the crash
/// — the bound the README states — and never before the database's expiry (at least the acquisition's send
/// time + ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_is_succeeded_within_ttl_plus_one_poll() {
    let db = TestDb::new().await;
    let proxy = Proxy::start(&db.url).await;
    let crashing = PgElector::new(store_through(&proxy, &db).await);
    let successor = PgElector::new(db.store("c").await);
    let mut options = LeadershipOptions::new(Duration::from_millis(1000));
    options.poll_every = Duration::from_millis(250);
    let sent = Instant::now();
    let holder = crashing
        .acquire("crash", "old", &options.lease)
        .await
        .unwrap();
    let crashed_at = Instant::now();
    proxy.set(HOLD_ALL);
    let (started_tx, started_rx) = oneshot::channel::<Instant>();
    let ended = run_with_leadership(
        &successor,
        "crash",
        "new",
        &options,
        &CancellationToken::new(),
        move |_ctx| async move {
            started_tx.send(Instant::now()).unwrap();
            Ok::<_, Error>(())
        },
    )
    .within(WAIT, "the end of run_with_leadership")
    .await
    .unwrap();
    assert!(matches!(ended, Ended::Returned), "{ended:?}");
    let started = started_rx
        .within(WAIT, "the callback's start")
        .await
        .unwrap();
    let took = started - crashed_at;
    eprintln!("crash handover: {took:?} (ttl 1 s, poll 250 ms)");
    assert!(
        started >= sent + options.lease.ttl,
        "the successor led {:?} before the database's expiry",
        (sent + options.lease.ttl) - started
    );
    assert!(
        took < options.lease.ttl + options.poll_every,
        "{took:?} is not within ttl + one poll"
    );
    assert!(!holder.is_held());
}

/// A callback that ignores cancellation is reported and aborted after the grace period, not left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_that_ignores_cancellation_is_reported() {
    metrics_probe::install();
    let elector = MemoryElector::new();
    let shutdown = CancellationToken::new();
    let mut options = options();
    options.grace = Duration::from_millis(200);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        tokio::spawn(async move {
            run_with_leadership(
                &elector,
                "stubborn",
                "pod-a",
                &options,
                &shutdown,
                move |_ctx| async move {
                    started_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                    Ok::<_, Error>(())
                },
            )
            .await
        })
    };
    started_rx
        .within(WAIT, "the callback's start")
        .await
        .unwrap();
    elector.lose("stubborn");
    match ended(run).await {
        Ended::Lost {
            callback_stopped, ..
        } => assert!(!callback_stopped),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        metrics_probe::counter(
            pgfence::metrics::METRIC_CALLBACKS_NOT_STOPPED,
            &[("lease", "memory/stubborn")]
        ),
        1
    );
}

/// The supervisor runs independent controllers: one process leads `scheduler` while another leads `rollout`;
/// after a loss it re-campaigns; shutdown stops everything and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_runs_independent_controllers_and_recampaigns() {
    let pg = Pg::new().await;
    let (events_tx, mut events) = mpsc::unbounded_channel::<(String, String, i64)>();
    let make = |holder: &'static str, names: &[&'static str]| {
        let mut supervisor = Supervisor::new(pg.elector.clone(), holder);
        for name in names {
            let events = events_tx.clone();
            supervisor = supervisor.controller(*name, options(), move |ctx| {
                let events = events.clone();
                async move {
                    events
                        .send((
                            holder.to_owned(),
                            ctx.fence().lease().to_owned(),
                            ctx.epoch().get(),
                        ))
                        .unwrap();
                    ctx.cancelled().await;
                    Ok(())
                }
            });
        }
        supervisor
    };
    // Process 1 takes `scheduler` first; process 2 then takes `rollout`.
    let p1 = make("p1", &["scheduler"]);
    let p1_status = p1.status();
    let p1_shutdown = CancellationToken::new();
    let p1_task = tokio::spawn(p1.run(p1_shutdown.clone()));
    let first = events
        .recv()
        .within(WAIT, "the next message on events")
        .await
        .unwrap();
    assert_eq!(first.0, "p1");
    let p2 = make("p2", &["scheduler", "rollout"]);
    let p2_status = p2.status();
    let p2_shutdown = CancellationToken::new();
    let p2_task = tokio::spawn(p2.run(p2_shutdown.clone()));
    let second = events
        .recv()
        .within(WAIT, "the next message on events")
        .await
        .unwrap();
    assert_eq!(second.0, "p2");
    assert!(second.1.ends_with("/rollout"));
    assert_eq!(p1_status.leading().get("scheduler"), Some(&true));
    assert_eq!(p2_status.leading().get("scheduler"), Some(&false));
    assert_eq!(p2_status.leading().get("rollout"), Some(&true));
    let readiness = p2_status.readiness().await;
    assert!(readiness.store.database_reachable && readiness.store.primary == Some(true));

    // p1 loses `scheduler`; p2 is campaigning for it too, so one of them takes it with a larger epoch.
    pg.inject_loss("scheduler").await;
    let third = events
        .recv()
        .within(WAIT, "the next message on events")
        .await
        .unwrap();
    assert!(third.1.ends_with("/scheduler"));
    assert!(third.2 > first.2);

    p1_shutdown.cancel();
    p2_shutdown.cancel();
    p1_task
        .within(WAIT, "the end of p1")
        .await
        .unwrap()
        .unwrap();
    p2_task
        .within(WAIT, "the end of p2")
        .await
        .unwrap()
        .unwrap();
    for lease in pg.elector.store().admin().leases().await.unwrap() {
        assert_ne!(
            lease.state,
            pgfence::LeaseState::Held,
            "{} still held after shutdown",
            lease.name
        );
    }
}

/// Many leases, cheap: one process holding N leases renews them all with one statement per tick. The database
/// logs every UPDATE statement on the lease table (a statement-level trigger of this test's database: when, and
/// how many lease rows of which cluster it changed), so the count is exact and no other test's renewals can
/// blur it: in the window, every renewal statement renewed all N leases, and there were no more statements than
/// whole renewal periods fit in the time the window took on this process's clock, + 1 (the statements are sent
/// at least one period apart). Prints the statement latency for 1, 100 and 1,000 leases (from the renewal
/// histogram, which other tests of this binary feed too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_renew_with_one_statement_per_tick() {
    metrics_probe::install();
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "CREATE TABLE public.lease_updates (at timestamptz NOT NULL, cluster text NOT NULL, leases bigint NOT NULL);
             CREATE FUNCTION public.log_lease_updates() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO public.lease_updates
                 SELECT pg_catalog.clock_timestamp(), pg_catalog.split_part(name, '/', 1), pg_catalog.count(*)
                   FROM changed GROUP BY 2;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER log_lease_updates AFTER UPDATE ON pgfence.leases REFERENCING NEW TABLE AS changed
                 FOR EACH STATEMENT EXECUTE FUNCTION public.log_lease_updates();",
        )
        .await
        .unwrap();
    let period = Duration::from_millis(300);
    for n in [1usize, 100, 1000] {
        let cluster = format!("shards{n}");
        let store = db.store(&cluster).await;
        let elector = PgElector::new(store.clone());
        let mut options = LeaseOptions::new(Duration::from_secs(20));
        options.renew_every = period;
        let mut leases = Vec::with_capacity(n);
        for shard in 0..n {
            leases.push(
                elector
                    .acquire(&format!("shard-{shard}"), "sharded", &options)
                    .await
                    .unwrap(),
            );
        }
        let before = metrics_probe::histogram(METRIC_RENEW_DURATION, &[]).len();
        // The window opens at the first renewal statement the database runs after this mark: that statement may
        // have been sent before the last acquisition returned (so it may renew fewer than N), every later one
        // was sent after it was answered — after all N leases were held.
        let window_sent = Instant::now();
        let mark: String = admin
            .query_one("SELECT clock_timestamp()::text", &[])
            .await
            .unwrap()
            .get(0);
        let logged_after = |after: String| {
            let (admin, cluster) = (&admin, &cluster);
            async move {
                admin
                    .query(
                        "SELECT at::text, leases FROM public.lease_updates \
                          WHERE cluster = $1 AND at > $2::text::timestamptz ORDER BY at",
                        &[cluster, &after],
                    )
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1)))
                    .collect::<Vec<_>>()
            }
        };
        let mut logged = Vec::new();
        while logged.len() < 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            logged = logged_after(mark.clone()).await;
            assert!(
                window_sent.elapsed() < Duration::from_secs(20),
                "renewals stopped: {logged:?}"
            );
        }
        let window = window_sent.elapsed();
        // The statements the database ran after the opening one.
        let per_statement: Vec<i64> = logged[1..].iter().map(|(_, leases)| *leases).collect();
        let statements = per_statement.len();
        let ticks = (window.as_nanos() / period.as_nanos()) as usize;
        let mut latencies: Vec<f64> =
            metrics_probe::histogram(METRIC_RENEW_DURATION, &[])[before..].to_vec();
        latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
        eprintln!(
            "{n} leases: {statements} renewal statements in {window:?} ({ticks} whole ticks), median statement {:.2} ms",
            latencies.get(latencies.len() / 2).copied().unwrap_or(0.0) * 1000.0
        );
        assert!(statements >= 3);
        assert!(
            per_statement.iter().all(|&renewed| renewed == n as i64),
            "a renewal statement did not renew all {n} leases: {per_statement:?}"
        );
        // Sent one renewal period apart at least, all within the window: at most one per whole tick, + 1.
        assert!(
            statements <= ticks + 1,
            "{statements} renewal statements in {window:?}: more than one per tick of {period:?}"
        );
        assert!(leases.iter().all(|l| l.end_cause().is_none()));
        for lease in leases {
            lease.release().await.unwrap();
        }
    }
}

/// Two tenures of one lease in one renewal group (the same holder acquired again): the batched renewal tells
/// them apart by position, so the old one is declared superseded at the next tick, and the new one stays held —
/// the database records a renewal of it after the old one's loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_tenure_in_the_same_renewal_group_is_declared_lost() {
    let pg = Pg::new().await;
    let mut options = LeaseOptions::new(Duration::from_secs(5));
    options.renew_every = Duration::from_millis(100);
    let old = pg
        .elector
        .acquire("twice", "pod-a", &options)
        .await
        .unwrap();
    let new = pg
        .elector
        .acquire("twice", "pod-a", &options)
        .await
        .unwrap();
    assert_eq!(new.epoch().get(), old.epoch().get() + 1);
    let cause = tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the old tenure was never declared lost");
    assert_eq!(
        cause,
        TenureEnd::Lost {
            reason: LossReason::Superseded
        }
    );
    let client = pg.db.client().await;
    let qualified = new.qualified_name().to_owned();
    let renewed_at = || async {
        let row = client
            .query_one(
                "SELECT renewed_at::text, epoch FROM pgfence.leases WHERE name = $1",
                &[&qualified],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(1), new.epoch().get());
        row.get::<_, String>(0)
    };
    let at_loss = renewed_at().await;
    until("a renewal of the new tenure after the loss", || async {
        renewed_at().await != at_loss
    })
    .await;
    assert!(new.is_held(), "{:?}", new.end_cause());
}

// ------------------------------------------------------------------------------------------------------------
// What the callback's context tells it: whether the tenure is still believed held, and why it ended.

/// What a callback's context said when its token was cancelled.
#[derive(Debug)]
struct Observed {
    is_held: bool,
    end_cause: Option<TenureEnd>,
}

type Run = tokio::task::JoinHandle<pgfence::Result<Ended<Error>>>;

/// Leads `name` as `pod-a` with a callback that hands a clone of its context out, waits for its token, reports
/// what the context said then and returns.
fn lead_and_observe<E: Elector>(
    elector: &E,
    name: &str,
    options: LeadershipOptions,
    shutdown: &CancellationToken,
) -> (
    Run,
    oneshot::Receiver<LeaderContext>,
    oneshot::Receiver<Observed>,
) {
    let (ctx_tx, ctx_rx) = oneshot::channel();
    let (seen_tx, seen_rx) = oneshot::channel();
    let (elector, name, shutdown) = (elector.clone(), name.to_owned(), shutdown.clone());
    let run = tokio::spawn(async move {
        run_with_leadership(
            &elector,
            &name,
            "pod-a",
            &options,
            &shutdown,
            move |ctx| async move {
                ctx_tx.send(ctx.clone()).unwrap();
                ctx.cancelled().await;
                seen_tx
                    .send(Observed {
                        is_held: ctx.is_held(),
                        end_cause: ctx.end_cause(),
                    })
                    .unwrap();
                Ok::<_, Error>(())
            },
        )
        .await
    });
    (run, ctx_rx, seen_rx)
}

on_both_electors! {
    pg_the_context_reports_the_loss_cause("ctx-loss"),
    memory_the_context_reports_the_loss_cause("mem-ctx-loss"):
    /// Invariant 5, as the callback sees it: after a loss its context no longer believes it holds the tenure, and
    /// the end cause is the loss cause — the same one the run reports — from the moment the token is cancelled.
    async fn the_context_reports_the_loss_cause<B: Backend>(backend: B, name: &str) {
        let elector = backend.elector();
        let shutdown = CancellationToken::new();
        let (run, ctx, seen) = lead_and_observe(&elector, name, options(), &shutdown);
        let ctx = ctx.await.unwrap();
        assert!(ctx.is_held());
        assert_eq!(ctx.end_cause(), None);
        backend.inject_loss(name).await;
        let seen = seen.within(WAIT, "what the callback saw").await.unwrap();
        let cause = match ended(run).await {
            Ended::Lost {
                end,
                callback_stopped,
            } => {
                assert!(callback_stopped);
                end
            }
            other => panic!("expected Lost, got {other:?}"),
        };
        assert!(!seen.is_held, "{seen:?}");
        assert_eq!(seen.end_cause, Some(cause.clone()));
        assert!(!ctx.is_held());
        assert_eq!(ctx.end_cause(), Some(cause));
    }
}

on_both_electors! {
    pg_the_context_reports_shutdown_after_an_orderly_stop("ctx-stop"),
    memory_the_context_reports_shutdown_after_an_orderly_stop("mem-ctx-stop"):
    /// An orderly stop is not a loss, and the context does not claim one: once the parent is cancelled the end cause
    /// is `Shutdown` while the tenure is still held (the lease is released only after the callback returned, so work
    /// in flight may finish with its fence); after the release the context no longer believes it holds the tenure
    /// (invariant 5) and still says `Shutdown`, and the store has no holder.
    async fn the_context_reports_shutdown_after_an_orderly_stop<B: Backend>(backend: B, name: &str) {
        let elector = backend.elector();
        let shutdown = CancellationToken::new();
        let (run, ctx, seen) = lead_and_observe(&elector, name, options(), &shutdown);
        let ctx = ctx.await.unwrap();
        assert_eq!(backend.holder(name).await.as_deref(), Some("pod-a"));
        shutdown.cancel();
        let seen = seen.within(WAIT, "what the callback saw").await.unwrap();
        assert!(
            seen.is_held,
            "still held until the callback returns: {seen:?}"
        );
        assert_eq!(seen.end_cause, Some(TenureEnd::Shutdown));
        match ended(run).await {
            Ended::Cancelled { callback_stopped } => assert!(callback_stopped),
            other => panic!("expected Cancelled, got {other:?}"),
        }
        assert!(!ctx.is_held());
        assert_eq!(ctx.end_cause(), Some(TenureEnd::Shutdown));
        assert_eq!(backend.holder(name).await, None);
    }
}

/// Invariant 5: when renewals stop getting through (a partition that holds every byte), a callback that asks
/// `is_held` before each write never gets "held" at or past its local deadline, stops at that deadline — while
/// the database, asked directly, still holds the lease for it, so no successor could have been granted — and is
/// told the deadline loss as its end cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_stops_believing_at_the_local_deadline_when_renewals_stop() {
    let db = TestDb::new().await;
    let proxy = Proxy::start(&db.url).await;
    let store = store_through(&proxy, &db).await;
    let elector = PgElector::new(store);
    let margin = Duration::from_millis(300);
    let mut options = options();
    options.lease = LeaseOptions::new(Duration::from_millis(1500));
    options.lease.renew_every = Duration::from_millis(200);
    options.lease.safety_margin = margin;
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (report_tx, report_rx) = oneshot::channel();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(async move {
        run_with_leadership(
            &elector,
            "partitioned",
            "pod-a",
            &options,
            &shutdown,
            move |ctx| async move {
                started_tx.send(()).unwrap();
                let mut believed_past_deadline = 0;
                // The writer's loop: one "write" per answer "held".
                loop {
                    let asked_at = Instant::now();
                    if !ctx.is_held() {
                        break;
                    }
                    // "Held" means its clock read was before the deadline, and the deadline only moves later.
                    if asked_at >= ctx.trust_until() {
                        believed_past_deadline += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let stopped_at = Instant::now();
                report_tx
                    .send((
                        believed_past_deadline,
                        stopped_at,
                        ctx.trust_until(),
                        ctx.end_cause(),
                    ))
                    .unwrap();
                Ok::<_, Error>(())
            },
        )
        .await
    });
    started_rx
        .within(WAIT, "the callback's start")
        .await
        .unwrap();
    proxy.set(HOLD_ALL);
    let (believed_past_deadline, stopped_at, trust_until, end_cause) =
        tokio::time::timeout(Duration::from_secs(10), report_rx)
            .await
            .expect("the writer never stopped believing")
            .unwrap();
    assert_eq!(believed_past_deadline, 0);
    assert!(
        stopped_at >= trust_until,
        "stopped believing {:?} before the local deadline",
        trust_until - stopped_at
    );
    // Asked directly (not through the partition), after the writer stopped: the database still holds the lease
    // for pod-a, so no successor could have been granted while the writer believed.
    assert!(
        !database_would_grant(&db.client().await, "c/partitioned").await,
        "the writer stopped only after the database could grant a successor"
    );
    let Some(cause @ TenureEnd::DeadlineExceeded { .. }) = end_cause else {
        panic!("expected a deadline loss, got {end_cause:?}");
    };
    match ended(run).await {
        Ended::Lost { end: reported, .. } => assert_eq!(reported, cause),
        other => panic!("expected Lost, got {other:?}"),
    }
}

/// Invariant 5 with a starved runtime: while the only runtime thread is blocked past the local deadline, the
/// renewal task can neither renew nor fire its deadline timer; the first `is_held` afterwards is false all the
/// same, the end cause is the deadline loss, and a renewal that runs later does not revive the tenure.
#[tokio::test] // one thread: blocking the test blocks the renewal task too
async fn a_starved_runtime_never_believes_past_the_local_deadline() {
    let pg = Pg::new().await;
    let mut options = options();
    options.lease = LeaseOptions::new(Duration::from_millis(1000));
    options.lease.renew_every = Duration::from_millis(200);
    options.lease.safety_margin = Duration::from_millis(200);
    let shutdown = CancellationToken::new();
    let (run, ctx, _seen) = lead_and_observe(&pg.elector, "starved", options, &shutdown);
    let ctx = ctx.await.unwrap();
    assert!(ctx.is_held());
    let deadline = ctx.trust_until();
    std::thread::sleep(
        deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(20),
    );
    // Nothing else has run since the deadline passed.
    assert!(!ctx.is_held());
    let end_cause = ctx.end_cause();
    assert!(
        matches!(end_cause, Some(TenureEnd::DeadlineExceeded { .. })),
        "{end_cause:?}"
    );
    match ended(run).await {
        Ended::Lost { end, .. } => assert_eq!(Some(end), end_cause),
        other => panic!("expected Lost, got {other:?}"),
    }
    // The renewal task has run by now (a renewal in flight may even have succeeded): the belief stays ended.
    assert!(!ctx.is_held());
    assert_eq!(ctx.end_cause(), end_cause);
}

/// Invariants 2 and 5 through a failover: a tenure whose renewal is refused with `failover` (granted before the
/// server's last promotion) ends at once with that definitive cause — the callback's context stops believing and
/// says why — and the supervisor campaigns again without any operator action, leading with a larger epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loss_is_reported_and_the_supervisor_campaigns_again() {
    let elector = MemoryElector::new();
    let (started_tx, mut started) = mpsc::unbounded_channel::<LeaderContext>();
    let supervisor = Supervisor::new(elector.clone(), "pod-a")
        .backoff({
            let mut backoff = Backoff::default();
            backoff.initial = Duration::from_millis(10);
            backoff.max = Duration::from_millis(100);
            backoff
        })
        .controller("scheduler", options(), move |ctx| {
            let started = started_tx.clone();
            async move {
                started.send(ctx.clone()).unwrap();
                ctx.cancelled().await;
                Ok(())
            }
        });
    let status = supervisor.status();
    let shutdown = CancellationToken::new();
    let supervisor = tokio::spawn(supervisor.run(shutdown.clone()));

    let first = started
        .recv()
        .within(WAIT, "the next message on started")
        .await
        .unwrap();
    assert!(elector.lose_because("scheduler", LossReason::Failover));
    let failover = Some(TenureEnd::Lost {
        reason: LossReason::Failover,
    });
    assert!(!first.is_held());
    assert_eq!(first.end_cause(), failover);

    let second = started
        .recv()
        .within(WAIT, "the next message on started")
        .await
        .unwrap();
    assert!(second.epoch() > first.epoch());
    assert!(second.is_held());
    assert_eq!(second.end_cause(), None);
    assert_eq!(
        elector.holder("scheduler"),
        Some(("pod-a".to_owned(), second.epoch()))
    );
    assert_eq!(status.leading().get("scheduler"), Some(&true));

    shutdown.cancel();
    supervisor.await.unwrap().unwrap();
    assert!(!second.is_held());
    assert_eq!(second.end_cause(), Some(TenureEnd::Shutdown));
    assert_eq!(first.end_cause(), failover, "an end is never rewritten");
    assert_eq!(elector.holder("scheduler"), None);
}

/// Invariant 5 for work a callback leaves behind: once the callback has returned and the tenure was released, a
/// task still holding a clone of the context is cancelled, no longer believes it holds the tenure, and is told
/// that the tenure was released — not lost, not shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_left_running_after_the_callback_returned_is_told_of_the_release() {
    let elector = MemoryElector::new();
    let shutdown = CancellationToken::new();
    let (seen_tx, seen_rx) = oneshot::channel();
    let ended = run_with_leadership(
        &elector,
        "left-behind",
        "pod-a",
        &options(),
        &shutdown,
        move |ctx| async move {
            tokio::spawn(async move {
                ctx.cancelled().await;
                seen_tx
                    .send(Observed {
                        is_held: ctx.is_held(),
                        end_cause: ctx.end_cause(),
                    })
                    .unwrap();
            });
            Ok::<_, Error>(())
        },
    )
    .within(WAIT, "the end of run_with_leadership")
    .await
    .unwrap();
    assert!(matches!(ended, Ended::Returned), "{ended:?}");
    let seen = seen_rx.within(WAIT, "what the callback saw").await.unwrap();
    assert!(!seen.is_held);
    assert_eq!(seen.end_cause, Some(TenureEnd::Released));
}

// ------------------------------------------------------------------------------------------------------------
// Re-campaign backoff and metrics.

/// A backoff with these settings.
fn backoff_with(initial: Duration, max: Duration, multiplier: f64) -> Backoff {
    let mut backoff = Backoff::default();
    backoff.initial = initial;
    backoff.max = max;
    backoff.multiplier = multiplier;
    backoff
}

/// `Backoff::delay` draws equal jitter: uniformly between half and all of the capped exponential
/// (initial × multiplier^failures, at most `max`) — never below half, so a controller that fails at once never
/// retries at once, and reaching both ends of that range over many draws. Degenerate settings neither spin nor
/// shrink.
#[test]
fn backoff_draws_equal_jitter_between_half_and_all_of_the_capped_exponential() {
    let backoff = backoff_with(Duration::from_millis(100), Duration::from_secs(1), 2.0);
    let one_ns = Duration::from_nanos(1); // float rounding of the draw
    for failures in 0..8u32 {
        let cap = (Duration::from_millis(100) * 2u32.pow(failures)).min(Duration::from_secs(1));
        let draws: Vec<Duration> = (0..2000).map(|_| backoff.delay(failures)).collect();
        let (lowest, highest) = (*draws.iter().min().unwrap(), *draws.iter().max().unwrap());
        assert!(
            lowest + one_ns >= cap / 2 && highest <= cap + one_ns,
            "failures {failures}: draws in [{lowest:?}, {highest:?}], expected within [{:?}, {cap:?}]",
            cap / 2
        );
        // Uniform over [cap/2, cap]: 2,000 draws miss either outer 5 % with probability 0.95^2000 ≈ 1e-45.
        assert!(
            lowest < cap.mul_f64(0.55) && highest > cap.mul_f64(0.95),
            "failures {failures}: draws in [{lowest:?}, {highest:?}] do not spread over [{:?}, {cap:?}]",
            cap / 2
        );
    }
    // A zero initial delay still waits (at least 1 ms before jitter), a multiplier below 1 never shrinks the
    // delay, and a cap below the initial delay is the initial delay.
    let zero = backoff_with(Duration::ZERO, Duration::ZERO, 0.0);
    for failures in [0, 1, 30] {
        let delay = zero.delay(failures);
        assert!(
            delay + one_ns >= Duration::from_micros(500)
                && delay <= Duration::from_millis(1) + one_ns,
            "{delay:?}"
        );
    }
    let shrinking = backoff_with(Duration::from_millis(100), Duration::from_millis(10), 0.5);
    for failures in [0, 1, 10] {
        let delay = shrinking.delay(failures);
        assert!(
            delay + one_ns >= Duration::from_millis(50)
                && delay <= Duration::from_millis(100) + one_ns,
            "{delay:?}"
        );
    }
}

/// A controller that keeps failing — returning an error, panicking, or never getting its campaign going (a lease
/// name the store refuses) — is re-run after the supervisor's backoff, which grows with each failure in a row:
/// the fourth wait is at least half of initial × 2⁴ (320 ms here), where a backoff stuck at its first step would
/// wait at most `initial` (40 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_controllers_are_rerun_after_a_growing_backoff() {
    let backoff = backoff_with(Duration::from_millis(40), Duration::from_secs(2), 2.0);
    let (tx, mut starts) = mpsc::unbounded_channel::<(&'static str, Instant)>();
    let failing = Supervisor::new(MemoryElector::new(), "pod-a")
        .backoff(backoff)
        .controller("failing", options(), {
            let tx = tx.clone();
            move |_ctx| {
                let tx = tx.clone();
                async move {
                    tx.send(("failing", Instant::now())).unwrap();
                    Err("always".into())
                }
            }
        });
    let panicking = Supervisor::new(MemoryElector::new(), "pod-a")
        .backoff(backoff)
        .controller("panicking", options(), move |_ctx| {
            let tx = tx.clone();
            async move {
                tx.send(("panicking", Instant::now())).unwrap();
                panic!("always");
            }
        });
    let (watched, mut attempts) = Watched::new(MemoryElector::new());
    // Not spread: a spreading supervisor refuses an invalid name before anything runs (spread::); this one
    // campaigns, and the store refuses every attempt.
    let refused = Supervisor::new(watched, "pod-a")
        .no_spread()
        .backoff(backoff)
        .controller("", options(), |_ctx| async { Ok(()) });
    let shutdown = CancellationToken::new();
    let runs = [
        tokio::spawn(failing.run(shutdown.clone())),
        tokio::spawn(panicking.run(shutdown.clone())),
        tokio::spawn(refused.run(shutdown.clone())),
    ];
    let mut series: std::collections::BTreeMap<&str, Vec<Instant>> = Default::default();
    async {
        while series.values().filter(|s| s.len() >= 5).count() < 2 {
            let (kind, at) = starts.recv().await.unwrap();
            series.entry(kind).or_default().push(at);
        }
    }
    .within(WAIT, "five starts of each failing controller")
    .await;
    for _ in 0..5 {
        let attempt = next_attempt(&mut attempts).await;
        assert!(matches!(attempt.outcome, Outcome::Failed(_)), "{attempt:?}");
        series.entry("refused").or_default().push(attempt.begun);
    }
    shutdown.cancel();
    for run in runs {
        run.within(WAIT, "the end of the run")
            .await
            .unwrap()
            .unwrap();
    }
    for (kind, times) in series {
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).take(4).collect();
        assert!(
            gaps[3] >= Duration::from_millis(320),
            "{kind}: waits {gaps:?} did not grow"
        );
    }
}

/// The metrics an operator alerts on, counted exactly for one lease: the leader gauge, transitions (+1 when a
/// tenure begins, +1 when it ends, whatever the end), losses by cause (a release is not a loss; an operator's
/// force-release is a definitive one), and stale writes (a write presenting the lost tenure's fence, refused by
/// the database; a current fence's write is not counted). The `deadline` and `injected` causes are counted in
/// `the_holder_stops_trusting_a_margin_before_the_database_could_grant_a_successor` and
/// `memory_loss_cancels_the_callback`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_transitions_losses_by_cause_and_stale_writes() {
    metrics_probe::install();
    let pg = Pg::new().await;
    let (elector, store) = (&pg.elector, pg.elector.store());
    let lease_label = elector.qualify("metered");
    let stale = || metrics_probe::counter(METRIC_STALE_WRITES, &[("lease", &lease_label)]);
    let mut options = LeaseOptions::new(Duration::from_secs(5));
    options.renew_every = Duration::from_millis(100);

    let first = elector.acquire("metered", "pod-a", &options).await.unwrap();
    assert_eq!(metered(elector, "metered"), (Some(1.0), 1, [0, 0, 0]));
    assert_eq!(first.release().await.unwrap(), Released::Released);
    assert_eq!(
        metered(elector, "metered"),
        (Some(0.0), 2, [0, 0, 0]),
        "a release is not a loss"
    );

    let second = elector.acquire("metered", "pod-a", &options).await.unwrap();
    assert_eq!(metered(elector, "metered"), (Some(1.0), 3, [0, 0, 0]));
    store.admin().force_release("metered").await.unwrap();
    assert_eq!(
        second.lost().within(WAIT, "the loss of second").await,
        TenureEnd::Lost {
            reason: LossReason::Released
        }
    );
    metrics_settle(elector, "metered", (Some(0.0), 4, [1, 0, 0])).await;

    assert_eq!(stale(), 0);
    match store
        .tasks()
        .create(&second.fence(), "after-loss", &serde_json::json!({}))
        .await
    {
        Err(Error::Stale { presented, .. }) => assert_eq!(presented, second.epoch()),
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(stale(), 1);
    let third = elector.acquire("metered", "pod-b", &options).await.unwrap();
    store
        .tasks()
        .create(&third.fence(), "current", &serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(stale(), 1, "a current fence's write is not a stale write");
    assert_eq!(metered(elector, "metered"), (Some(1.0), 5, [1, 0, 0]));
    drop(third);
    assert_eq!(metered(elector, "metered"), (Some(0.0), 6, [1, 0, 0]));
}

/// `metrics::describe` gives every metric pgfence records its kind, unit and help text, and the names follow
/// Prometheus conventions: a `pgfence_` prefix, `_total` on counters, the base unit on the duration histogram.
#[test]
fn describe_metrics_gives_every_metric_its_kind_unit_and_help_text() {
    use metrics::Unit;
    metrics_probe::install();
    pgfence::metrics::describe();
    for (name, kind, unit) in [
        (METRIC_LEADER, "gauge", Unit::Count),
        (METRIC_TRANSITIONS, "counter", Unit::Count),
        (METRIC_LOSSES, "counter", Unit::Count),
        (METRIC_RENEW_DURATION, "histogram", Unit::Seconds),
        (METRIC_CALLBACKS_NOT_STOPPED, "counter", Unit::Count),
        (METRIC_STALE_WRITES, "counter", Unit::Count),
        (METRIC_GROUP_MEMBERS, "gauge", Unit::Count),
        (METRIC_GROUP_NAMES_ASSIGNED, "gauge", Unit::Count),
        (METRIC_GROUP_NAMES_LED, "gauge", Unit::Count),
        (METRIC_HANDOVERS, "counter", Unit::Count),
        (METRIC_HANDOVER_GAP, "histogram", Unit::Seconds),
    ] {
        let (described, described_unit, help) =
            metrics_probe::description(name).unwrap_or_else(|| panic!("{name} was not described"));
        assert_eq!((described, described_unit), (kind, Some(unit)), "{name}");
        assert!(!help.is_empty(), "{name} has no help text");
        assert!(name.starts_with("pgfence_"), "{name}");
        match kind {
            "counter" => assert!(name.ends_with("_total"), "{name}"),
            "histogram" => assert!(name.ends_with("_duration_seconds"), "{name}"),
            _ => {}
        }
    }
}

/// A `run_with_leadership` future dropped while leading (the losing branch of a `select!`) stops its callback
/// too — aborted at its next await, even one that ignores its token — and releases the lease: the context says
/// `Released`, and the lease is free for the next candidate.
#[tokio::test]
async fn dropping_a_run_while_leading_aborts_the_callback_and_releases_the_lease() {
    /// Reports when the callback's future is dropped (which an abort does).
    struct OnDrop(Option<oneshot::Sender<()>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let elector = MemoryElector::new();
    let mut wakeups = elector.wakeups();
    let (started_tx, started) = oneshot::channel::<LeaderContext>();
    let (dropped_tx, dropped) = oneshot::channel();
    let (options, parent) = (options(), CancellationToken::new());
    let run = run_with_leadership(
        &elector,
        "dropped",
        "pod-a",
        &options,
        &parent,
        move |ctx| async move {
            let _on_drop = OnDrop(Some(dropped_tx));
            started_tx.send(ctx).unwrap();
            std::future::pending::<()>().await;
            Ok::<_, Error>(())
        },
    );
    let ctx = tokio::select! {
        ended = run => panic!("the run ended on its own: {ended:?}"),
        ctx = started.within(WAIT, "the callback's start") => ctx.unwrap(),
    };
    dropped
        .within(WAIT, "the drop of the callback's future")
        .await
        .expect("the callback's future was dropped");
    assert!(ctx.cancellation_token().is_cancelled());
    assert!(!ctx.is_held());
    assert_eq!(ctx.end_cause(), Some(TenureEnd::Released));
    // Released in the background: the elector announces it.
    wakeups
        .wait(&elector.qualify("dropped"), Duration::from_secs(10))
        .await;
    assert_eq!(elector.holder("dropped"), None);
}

/// `abandon`, the crash the failure tests stage: the holder stops renewing and reports no end of its belief, as a
/// killed process would. The database lets the lease expire after its ttl, a successor acquires it, and the
/// review of the abandoned tenure has a successor but no end report: `Unknown`, never a reported end that would
/// make the overlap look ruled out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_expires_without_an_end_report() {
    let pg = Pg::new().await;
    let options = LeaseOptions::new(Duration::from_secs(1));
    let sent = Instant::now();
    let lease = pg
        .elector
        .acquire("abandoned", "pod-a", &options)
        .await
        .unwrap();
    let epoch = lease.epoch();
    lease.abandon();
    let store = pg.elector.store();
    let deadline = Instant::now() + WAIT;
    let successor = loop {
        match store
            .acquire("abandoned", "pod-b", Duration::from_secs(60))
            .await
        {
            Ok(successor) => break successor,
            Err(Error::Held { .. }) => {}
            Err(e) => panic!("the successor's acquisition failed: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned lease is still held after {WAIT:?}: it is being renewed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        sent.elapsed() >= options.ttl,
        "acquired before the abandoned tenure's ttl"
    );
    assert_eq!(successor.epoch().get(), epoch.get() + 1);
    let reviews = store.history().review("abandoned").await.unwrap();
    let old = reviews
        .iter()
        .find(|r| r.tenure.epoch == epoch)
        .expect("the abandoned tenure is reviewed");
    assert_eq!(
        old.successor.as_ref().map(|s| s.epoch),
        Some(successor.epoch())
    );
    assert_eq!(old.tenure.belief.until, None, "no end of belief reported");
    assert_eq!(old.overlap, Overlap::Unknown);
}

/// The in-memory double keeps PostgreSQL's fencing of releases (invariant 2, one holder per epoch): a release
/// sent for an ended tenure — here the background release of a dropped lease, overtaken by the same holder's next
/// acquisition — never frees its successor. And a memory lease does not expire by time: its local deadline is
/// decades away.
// current_thread: the dropped lease's background release runs exactly when this test yields.
#[tokio::test]
async fn memory_a_late_release_never_frees_the_successor() {
    let elector = MemoryElector::new();
    let options = LeaseOptions::new(Duration::from_secs(5));
    let old = elector.acquire("late", "pod-a", &options).await.unwrap();
    let decades = Duration::from_secs(50 * 365 * 24 * 3600);
    assert!(old.trust_until() > Instant::now() + decades);
    drop(old); // its release is spawned, not run yet
    let new = elector.acquire("late", "pod-a", &options).await.unwrap();
    tokio::task::yield_now().await; // the old tenure's release runs now
    assert_eq!(
        elector.holder("late"),
        Some(("pod-a".to_owned(), new.epoch())),
        "the old tenure's release freed its successor"
    );
    assert!(matches!(
        elector.acquire("late", "pod-b", &options).await,
        Err(Error::Held { .. })
    ));
    assert_eq!(new.release().await.unwrap(), Released::Released);
    assert_eq!(elector.holder("late"), None);
}

/// Bad timing gets a typed error naming the setting, from either elector, and acquires nothing. Each rule of
/// `LeaseOptions::validate` is taken at its edge: the last accepted value and the first refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_options_are_checked_at_their_edges_before_anything_is_acquired() {
    let pg = Pg::new().await;
    let memory = MemoryElector::new();
    let ms = Duration::from_millis;
    let base = LeaseOptions::new(Duration::from_secs(3));
    let with = |change: &dyn Fn(&mut LeaseOptions)| {
        let mut options = base;
        change(&mut options);
        options
    };
    let cases: Vec<(&str, LeaseOptions, Option<&str>)> = vec![
        (
            "ttl at MIN_TTL",
            LeaseOptions::new(pgfence::limits::MIN_TTL),
            None,
        ),
        (
            "ttl under MIN_TTL",
            LeaseOptions::new(pgfence::limits::MIN_TTL - ms(1)),
            Some("ttl"),
        ),
        (
            "ttl at MAX_TTL",
            LeaseOptions::new(pgfence::limits::MAX_TTL),
            None,
        ),
        (
            "ttl over MAX_TTL",
            LeaseOptions::new(pgfence::limits::MAX_TTL + ms(1)),
            Some("ttl"),
        ),
        (
            "margin just under ttl",
            with(&|o| {
                o.safety_margin = o.ttl - ms(1);
                o.renew_every = Duration::from_micros(999);
            }),
            None,
        ),
        (
            "margin equal to ttl",
            with(&|o| o.safety_margin = o.ttl),
            Some("safety_margin"),
        ),
        (
            "renew_every zero",
            with(&|o| o.renew_every = Duration::ZERO),
            Some("renew_every"),
        ),
        (
            "renew_every just under ttl - margin",
            with(&|o| o.renew_every = o.ttl - o.safety_margin - ms(1)),
            None,
        ),
        (
            "renew_every at ttl - margin",
            with(&|o| o.renew_every = o.ttl - o.safety_margin),
            Some("renew_every"),
        ),
        (
            "retry_every at 10 ms",
            with(&|o| o.retry_every = ms(10)),
            None,
        ),
        (
            "retry_every under 10 ms",
            with(&|o| o.retry_every = Duration::from_micros(9_999)),
            Some("retry_every"),
        ),
    ];
    for (case, options, refused) in cases {
        match refused {
            None => {
                options.validate().unwrap_or_else(|e| panic!("{case}: {e}"));
                let held = memory.acquire("timed", "pod-a", &options).await.unwrap();
                held.release().await.unwrap();
            }
            Some(setting) => {
                let by_pg = pg.elector.acquire("timed", "pod-a", &options).await;
                let by_memory = memory.acquire("timed", "pod-a", &options).await;
                for (elector, result) in
                    [("pg", by_pg.map(|_| ())), ("memory", by_memory.map(|_| ()))]
                {
                    match result {
                        Err(Error::InvalidInput { field, .. }) => {
                            assert_eq!(field, setting, "{case} ({elector})")
                        }
                        other => {
                            panic!("{case} ({elector}): expected {setting} refused, got {other:?}")
                        }
                    }
                }
                assert!(options.validate().is_err(), "{case}");
            }
        }
    }
    assert!(
        pg.elector
            .store()
            .lease_status("timed")
            .await
            .unwrap()
            .is_none(),
        "a refused acquisition wrote a lease row"
    );
    assert_eq!(memory.holder("timed"), None);
}

/// A refused candidate asks again every `poll_every` (the holder's time left being longer): never sooner, at most
/// 10 % later — the jitter that keeps candidates woken together from stampeding, and the waits do differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_candidate_asks_again_every_poll_interval_with_up_to_ten_percent_jitter() {
    let elector = MemoryElector::new();
    elector.occupy("polled", "someone-else").unwrap();
    let (watched, mut attempts) = Watched::new(elector.clone());
    let mut options = options();
    options.lease = LeaseOptions::new(Duration::from_secs(60));
    options.poll_every = Duration::from_millis(300);
    let shutdown = CancellationToken::new();
    let run = spawn_campaign(watched, "polled", options, shutdown.clone());
    let mut begun = Vec::new();
    for _ in 0..6 {
        let attempt = next_attempt(&mut attempts).await;
        assert!(
            matches!(attempt.outcome, Outcome::Held { .. }),
            "{attempt:?}"
        );
        begun.push(attempt.begun);
    }
    shutdown.cancel();
    assert!(matches!(ended(run).await, Ended::Cancelled { .. }));
    let gaps: Vec<Duration> = begun.windows(2).map(|w| w[1] - w[0]).collect();
    let (least, most) = (options.poll_every, options.poll_every.mul_f64(1.1));
    // Timers fire late, never early; 60 ms of room for a loaded machine.
    for gap in &gaps {
        assert!(
            *gap >= least && *gap <= most + Duration::from_millis(60),
            "waits {gaps:?}, expected {least:?} to {most:?}"
        );
    }
    let spread = gaps
        .iter()
        .max()
        .unwrap()
        .saturating_sub(*gaps.iter().min().unwrap());
    assert!(
        spread >= Duration::from_millis(2),
        "no jitter: waits {gaps:?}"
    );
}

/// A campaign rides out an unreachable database: a transient acquisition error (the connection refused) is
/// retried every `poll_every`, and leadership starts once the database is back. An error that asking again
/// cannot fix (a malformed lease name) ends the run at once with that error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_retries_transient_errors_and_returns_the_others() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let proxy = Proxy::start(&db.url).await;
    let store = store_through(&proxy, &db).await;
    let (elector, mut attempts) = Watched::new(PgElector::new(store));
    proxy.redirect(common::unused_port());
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE datname = current_database() AND pid <> pg_backend_pid() \
                AND backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap();
    let mut options = options();
    options.poll_every = Duration::from_millis(100);
    let shutdown = CancellationToken::new();
    let run = spawn_campaign(elector.clone(), "unreachable", options, shutdown);
    for _ in 0..2 {
        let attempt = next_attempt(&mut attempts).await;
        assert!(matches!(attempt.outcome, Outcome::Failed(_)), "{attempt:?}");
    }
    proxy.redirect(db_port(&db.url));
    assert!(matches!(ended(run).await, Ended::Returned));

    let refused = run_with_leadership(
        &elector,
        "",
        "pod-a",
        &options,
        &CancellationToken::new(),
        |_| async { Ok::<_, Error>(()) },
    )
    .within(WAIT, "the end of run_with_leadership")
    .await;
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
}

/// Leadership options with a zero poll interval or a zero grace are refused with a typed error before anything
/// is acquired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_options_without_a_poll_interval_or_grace_are_refused() {
    let elector = MemoryElector::new();
    let shutdown = CancellationToken::new();
    for (case, change) in [
        (
            "poll_every",
            &(|o: &mut LeadershipOptions| o.poll_every = Duration::ZERO) as &dyn Fn(&mut _),
        ),
        ("grace", &|o: &mut LeadershipOptions| {
            o.grace = Duration::ZERO
        }),
    ] {
        let mut options = options();
        change(&mut options);
        let result =
            run_with_leadership(&elector, "unset", "pod-a", &options, &shutdown, |_| async {
                Ok::<_, Error>(())
            })
            .await;
        assert!(
            matches!(result, Err(Error::InvalidInput { .. })),
            "{case}: {result:?}"
        );
        assert_eq!(elector.holder("unset"), None, "{case}");
    }
}

/// A supervisor's `Debug` names its holder and its controllers, in the order they were added.
#[test]
fn a_supervisor_shows_its_holder_and_controllers() {
    let supervisor = Supervisor::new(MemoryElector::new(), "pod-a")
        .controller("scheduler", options(), |_ctx| async { Ok(()) })
        .controller("rollout", options(), |_ctx| async { Ok(()) });
    let shown = format!("{supervisor:?}");
    assert!(
        shown.contains(r#"holder: "pod-a""#) && shown.contains(r#"["scheduler", "rollout"]"#),
        "{shown}"
    );
}

/// How a tenure's end reads in logs and in what a callback reports, and what it tells the caller to do: a loss
/// reads as what happened and says campaign again (stop, when the database denied the role); an end in order
/// says stop.
#[test]
fn tenure_ends_say_what_happened() {
    for (end, text, next) in [
        (
            TenureEnd::Lost {
                reason: LossReason::Superseded,
            },
            "superseded",
            Next::Recampaign,
        ),
        (
            TenureEnd::Lost {
                reason: LossReason::NoGrant,
            },
            "no_grant",
            Next::Stop,
        ),
        (
            TenureEnd::DeadlineExceeded { last_error: None },
            "no renewal before the local deadline",
            Next::Recampaign,
        ),
        (TenureEnd::Injected, "loss injected", Next::Recampaign),
        (TenureEnd::Shutdown, "shut down", Next::Stop),
        (TenureEnd::Released, "released by this process", Next::Stop),
        (
            TenureEnd::Handover,
            "handed over to another replica",
            Next::Stop,
        ),
    ] {
        assert_eq!(end.to_string(), text);
        assert_eq!(end.next(), next, "{end:?}");
    }
}

/// A release wakes the waiters of that lease only: a waiter for another lease sleeps on to its own deadline, so
/// a release does not send every candidate of the cluster campaigning. Its own lease's release, heard earlier,
/// wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiters_of_that_lease_only() {
    let elector = MemoryElector::new();
    let mut wakeups = elector.wakeups();
    let options = LeaseOptions::new(Duration::from_secs(5));
    let other = elector.acquire("other", "pod-a", &options).await.unwrap();
    other.release().await.unwrap();
    let max_wait = Duration::from_millis(300);
    let begun = Instant::now();
    wakeups.wait(&elector.qualify("mine"), max_wait).await;
    let waited = begun.elapsed();
    assert!(
        waited >= max_wait,
        "woken by another lease's release after {waited:?}"
    );

    let mine = elector.acquire("mine", "pod-a", &options).await.unwrap();
    mine.release().await.unwrap();
    let begun = Instant::now();
    wakeups.wait(&elector.qualify("mine"), WAIT).await;
    let waited = begun.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "its own release woke it only after {waited:?}"
    );
}

/// A held lease answers with its own names (the bare one it was asked for, and the cluster-qualified one) and a
/// fence of its epoch; its `Debug` names its lease, epoch and standing, and never its tenure secret: a held lease
/// can be logged without handing out the capability its fence carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_answers_with_its_names_and_shows_no_secret() {
    let pg = Pg::new().await;
    let held = pg
        .elector
        .acquire("shown", "pod-a", &LeaseOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(held.name(), "shown");
    assert_eq!(held.qualified_name(), pg.elector.qualify("shown"));
    assert_ne!(
        held.name(),
        held.qualified_name(),
        "the test's cluster qualifies"
    );
    assert_eq!(held.fence().epoch(), held.epoch());
    let shown = format!("{held:?}");
    for part in [
        pg.elector.qualify("shown"),
        format!("epoch: {:?}", held.epoch()),
        format!("ended: {:?}", held.end_cause()),
    ] {
        assert!(shown.contains(&part), "{part} not in {shown}");
    }
    assert!(
        !shown.contains(held.fence().secret().expose_secret()),
        "{shown}"
    );
    held.release().await.unwrap();
}

/// The spreading supervisor's metrics say what its status says: the group's live members, the names assigned to
/// this replica and the names it leads (equal once settled), and one handover counted per name it gave up when a
/// second replica joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spreading_metrics_count_members_assigned_led_and_handovers() {
    metrics_probe::install();
    let elector = MemoryElector::new();
    let group = "metrics-group";
    let start = |holder: &'static str| {
        let mut supervisor =
            Supervisor::new(elector.clone(), holder).spread(pgfence::leader::Spread::new(group));
        for name in ["m-1", "m-2", "m-3", "m-4"] {
            supervisor = supervisor.controller(name, options(), |ctx| async move {
                ctx.cancelled().await;
                Ok(())
            });
        }
        let (status, shutdown) = (supervisor.status(), CancellationToken::new());
        (
            status,
            shutdown.clone(),
            tokio::spawn(supervisor.run(shutdown)),
        )
    };
    let leads = |status: &pgfence::leader::SupervisorStatus<MemoryElector>| {
        status.leading().values().filter(|l| **l).count()
    };
    let (a, a_stop, a_run) = start("a");
    let until = Instant::now() + WAIT;
    while leads(&a) < 4 {
        assert!(Instant::now() < until, "a alone never led its 4 names");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (b, b_stop, b_run) = start("b");
    while leads(&a) != 2 || leads(&b) != 2 {
        assert!(Instant::now() < until, "a and b never split the 4 names");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The gauges are shared by the two replicas of this process (one label: the group); the last to publish
    // wrote them, and each replica has 2 of 2 members, 2 assigned, 2 led.
    let labels = [("group", group)];
    while metrics_probe::gauge(METRIC_GROUP_MEMBERS, &labels) != Some(2.0) {
        assert!(Instant::now() < until, "the members gauge never said 2");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        metrics_probe::gauge(METRIC_GROUP_NAMES_ASSIGNED, &labels),
        Some(2.0)
    );
    assert_eq!(
        metrics_probe::gauge(METRIC_GROUP_NAMES_LED, &labels),
        Some(2.0)
    );
    assert_eq!(metrics_probe::counter(METRIC_HANDOVERS, &labels), 2);
    assert_eq!(a.group().unwrap().handovers, 2);
    let readiness = b.readiness().await;
    let group_status = readiness.group.unwrap();
    assert_eq!(group_status.assigned, group_status.leading);
    assert!(group_status.generation >= 2, "{group_status:?}");
    a_stop.cancel();
    b_stop.cancel();
    a_run.await.unwrap().unwrap();
    b_run.await.unwrap().unwrap();
}
