//! The leadership runtime against real PostgreSQL and, for the seed scenarios, against the in-memory double
//! too: one owner per name, loss cancels the callback, a failed acquisition leaves the gauge false, stable lease
//! keys; then keepalive, local-deadline loss, release semantics, handover times and batched renewal; and what the
//! callback's `LeaderContext` tells it: whether the tenure is still believed held, and why it ended.
//!
//! Invariants checked: 2 (one holder per epoch), 5 (a holder stops trusting its lease by its own monotonic
//! clock before the database could grant a successor).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::metrics_probe;
use common::proxy::{Proxy, HOLD_ALL};
use common::TestDb;
use pgfence::leader::{
    run_with_leadership, Backoff, Elector, Ended, LeaderContext, LeadershipOptions, LeaseOptions,
    LossCause, MemoryElector, PgElector, Standing, Supervisor, TenureEnd, METRIC_LEADER,
    METRIC_RENEW_SECONDS,
};
use pgfence::{Error, LossReason, Released};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// What a seed scenario needs from a backend besides the elector: inject a loss, and make a lease held by
/// "someone else".
trait Backend {
    type E: Elector;
    fn elector(&self) -> Self::E;
    async fn inject_loss(&self, name: &str);
    async fn occupy(&self, name: &str, holder: &str);
    /// Who holds `name` now, as the backend's store sees it.
    async fn holder(&self, name: &str) -> Option<String>;
}

struct Pg {
    elector: PgElector,
}

impl Pg {
    async fn new() -> Pg {
        let db = TestDb::new().await;
        // A cluster per test keeps the leader gauge's `lease` label unique across parallel tests.
        let store = db.store(&db.name).await;
        Pg {
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
        self.elector.store().force_release(name).await.unwrap();
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

impl Backend for Memory {
    type E = MemoryElector;
    fn elector(&self) -> MemoryElector {
        self.elector.clone()
    }
    async fn inject_loss(&self, name: &str) {
        assert!(self.elector.lose(name));
    }
    async fn occupy(&self, name: &str, holder: &str) {
        self.elector.occupy(name, holder).unwrap();
    }
    async fn holder(&self, name: &str) -> Option<String> {
        self.elector.holder(name).map(|(holder, _)| holder)
    }
}

fn options() -> LeadershipOptions {
    let mut options = LeadershipOptions::new(Duration::from_secs(3));
    options.lease.renew_every = Some(Duration::from_millis(100));
    options.poll_every = Duration::from_millis(200);
    options.grace = Duration::from_secs(2);
    options
}

fn gauge<E: Elector>(elector: &E, name: &str) -> Option<f64> {
    metrics_probe::gauge(METRIC_LEADER, &[("lease", &elector.qualify(name))])
}

/// Seed scenario: two candidates for one name; only one callback runs at a time, the other starts only after the
/// first returned and released, with a larger epoch.
async fn one_owner_per_name<B: Backend>(backend: B, name: &str) {
    metrics_probe::install();
    let elector = backend.elector();
    let shutdown = CancellationToken::new();
    let (events, mut rx) = mpsc::unbounded_channel::<(&'static str, &'static str, i64)>();
    let (release_a, release_a_rx) = tokio::sync::oneshot::channel::<()>();
    let a = {
        let (elector, shutdown, events, name) = (
            elector.clone(),
            shutdown.clone(),
            events.clone(),
            name.to_owned(),
        );
        tokio::spawn(async move {
            run_with_leadership(
                &elector,
                &name,
                "pod-a",
                &options(),
                &shutdown,
                move |ctx| async move {
                    events.send(("a", "start", ctx.epoch().get())).unwrap();
                    release_a_rx.await.unwrap();
                    events.send(("a", "stop", ctx.epoch().get())).unwrap();
                    Ok::<_, Error>(())
                },
            )
            .await
        })
    };
    assert_eq!(rx.recv().await.unwrap().0, "a");
    let b = {
        let (elector, shutdown, events, name) = (
            elector.clone(),
            shutdown.clone(),
            events.clone(),
            name.to_owned(),
        );
        tokio::spawn(async move {
            run_with_leadership(
                &elector,
                &name,
                "pod-b",
                &options(),
                &shutdown,
                move |ctx| async move {
                    events.send(("b", "start", ctx.epoch().get())).unwrap();
                    Ok::<_, Error>(())
                },
            )
            .await
        })
    };
    // b campaigns while a leads; nothing from b may arrive before a stops.
    release_a.send(()).unwrap();
    let order: Vec<_> = [rx.recv().await.unwrap(), rx.recv().await.unwrap()].to_vec();
    assert_eq!((order[0].0, order[0].1), ("a", "stop"));
    assert_eq!((order[1].0, order[1].1), ("b", "start"));
    assert!(order[1].2 > order[0].2, "b's epoch is larger");
    assert!(matches!(a.await.unwrap().unwrap(), Ended::Returned));
    assert!(matches!(b.await.unwrap().unwrap(), Ended::Returned));
    assert_eq!(gauge(&elector, name), Some(0.0));
}

/// Seed scenario, ordered by channels: acquired → work started → loss injected → cancellation observed →
/// leader gauge false, and the run reports the loss.
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
    started_rx.await.unwrap();
    assert_eq!(gauge(&elector, name), Some(1.0));
    backend.inject_loss(name).await;
    cancelled_rx.await.unwrap();
    match run.await.unwrap().unwrap() {
        Ended::Lost {
            cause,
            callback_stopped,
        } => {
            assert!(callback_stopped);
            assert!(
                matches!(
                    cause,
                    LossCause::Injected
                        | LossCause::Definitive {
                            reason: LossReason::Released
                        }
                ),
                "{cause:?}"
            );
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(gauge(&elector, name), Some(0.0));
}

/// Seed scenario: an acquisition that fails because someone else holds the lease leaves the gauge unset.
async fn failed_acquisition_leaves_the_gauge_false<B: Backend>(backend: B, name: &str) {
    metrics_probe::install();
    let elector = backend.elector();
    backend.occupy(name, "someone-else").await;
    let result = elector.acquire(name, "pod-a", &options().lease).await;
    assert!(
        matches!(result, Err(Error::Held { ref holder, .. }) if holder == "someone-else"),
        "{result:?}"
    );
    assert_ne!(gauge(&elector, name), Some(1.0));
}

/// Seed scenario: lease keys are stable — the same name maps to the same qualified key in every tenure.
async fn lease_keys_are_stable<B: Backend>(backend: B, name: &str) {
    let elector = backend.elector();
    let first = elector
        .acquire(name, "pod-a", &options().lease)
        .await
        .unwrap();
    let key = first.fence().lease().to_owned();
    assert_eq!(key, elector.qualify(name));
    first.release().await.unwrap();
    let second = elector
        .acquire(name, "pod-b", &options().lease)
        .await
        .unwrap();
    assert_eq!(second.fence().lease(), key);
    assert!(
        second.epoch()
            > Some(second.epoch())
                .map(|_| pgfence::Epoch::new(1).unwrap())
                .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_one_owner_per_name() {
    one_owner_per_name(Pg::new().await, "owner").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_one_owner_per_name() {
    one_owner_per_name(
        Memory {
            elector: MemoryElector::new(),
        },
        "mem-owner",
    )
    .await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_loss_cancels_the_callback() {
    loss_cancels_the_callback(Pg::new().await, "loss").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_loss_cancels_the_callback() {
    loss_cancels_the_callback(
        Memory {
            elector: MemoryElector::new(),
        },
        "mem-loss",
    )
    .await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_failed_acquisition_leaves_the_gauge_false() {
    failed_acquisition_leaves_the_gauge_false(Pg::new().await, "busy").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_failed_acquisition_leaves_the_gauge_false() {
    failed_acquisition_leaves_the_gauge_false(
        Memory {
            elector: MemoryElector::new(),
        },
        "mem-busy",
    )
    .await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_keys_are_stable() {
    lease_keys_are_stable(Pg::new().await, "keys").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_lease_keys_are_stable() {
    lease_keys_are_stable(
        Memory {
            elector: MemoryElector::new(),
        },
        "mem-keys",
    )
    .await;
}

/// The keepalive holds a lease far beyond its ttl: the database still reports it held by the same epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_holds_the_lease_beyond_its_ttl() {
    let pg = Pg::new().await;
    let mut options = LeaseOptions::new(Duration::from_millis(1500));
    options.renew_every = Some(Duration::from_millis(200));
    let lease = pg.elector.acquire("kept", "pod-a", &options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(lease.is_held(), "{:?}", lease.standing());
    let status = pg
        .elector
        .store()
        .lease_status("kept")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, pgfence::LeaseState::Held);
    assert_eq!(status.epoch, Some(lease.epoch()));
}

/// Invariant 5: with the database unreachable, the holder declares itself lost by its own monotonic clock before
/// the database's expiry (last successful renewal's send time + ttl), with the renewal error as the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_makes_the_holder_give_up_before_expiry() {
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
    options.renew_every = Some(Duration::from_millis(200));
    options.safety_margin = Some(Duration::from_millis(200));
    let lease = elector.acquire("fragile", "pod-a", &options).await.unwrap();
    // Let a few renewals succeed, then take the database away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let trusted_until_before_stop = lease.trust_until();
    let stopped_at = Instant::now();
    tokio::task::block_in_place(|| server.stop()).unwrap();
    let cause = lease.lost().await.expect("a loss, not a release");
    let declared_at = Instant::now();
    assert!(
        matches!(cause, LossCause::DeadlineExceeded { .. }),
        "{cause:?}"
    );
    // The deadline is at most ttl − margin after the last good renewal, which happened before the stop.
    assert!(
        declared_at <= stopped_at + options.ttl + Duration::from_millis(500),
        "declared {:?} after the stop",
        declared_at - stopped_at
    );
    assert!(
        declared_at >= trusted_until_before_stop.min(declared_at),
        "never before the trusted time"
    );
    assert!(lease.trust_until() <= declared_at + Duration::from_millis(50));
}

/// Dropping a held lease releases it promptly in the background: a successor acquires without waiting for the
/// ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_lease_releases_it_in_the_background() {
    let pg = Pg::new().await;
    let long = LeaseOptions::new(Duration::from_secs(60));
    let lease = pg.elector.acquire("dropped", "pod-a", &long).await.unwrap();
    let epoch = lease.epoch();
    drop(lease);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match pg.elector.acquire("dropped", "pod-b", &long).await {
            Ok(next) => {
                assert_eq!(next.epoch().get(), epoch.get() + 1);
                break;
            }
            Err(Error::Held { .. }) if Instant::now() < deadline => tokio::task::yield_now().await,
            Err(other) => panic!("{other}"),
        }
    }
}

/// Release after a definitive loss is a no-op that never touches the successor's tenure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_loss_never_touches_the_successor() {
    let pg = Pg::new().await;
    let mut options = LeaseOptions::new(Duration::from_secs(5));
    options.renew_every = Some(Duration::from_millis(100));
    let a = pg
        .elector
        .acquire("handed", "pod-a", &options)
        .await
        .unwrap();
    pg.elector.store().force_release("handed").await.unwrap();
    let b = pg
        .elector
        .acquire("handed", "pod-b", &options)
        .await
        .unwrap();
    let cause = a.lost().await.unwrap();
    assert!(matches!(cause, LossCause::Definitive { .. }), "{cause:?}");
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

/// Handover after a graceful release: a waiting candidate is woken by NOTIFY and acquires within milliseconds,
/// far sooner than its poll interval. Prints the median of several handovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_release_hands_over_within_milliseconds() {
    let pg = Pg::new().await;
    let mut options = options();
    options.poll_every = Duration::from_secs(10);
    let mut samples = Vec::new();
    for round in 0..10 {
        let holder = pg
            .elector
            .acquire("handover", &format!("old-{round}"), &options.lease)
            .await
            .unwrap();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<Instant>();
        let (waiting_tx, waiting_rx) = tokio::sync::oneshot::channel::<()>();
        let elector = pg.elector.clone();
        let candidate = tokio::spawn(async move {
            let shutdown = CancellationToken::new();
            let mut waiting = Some(waiting_tx);
            // Report "waiting" from inside the campaign: the first attempt fails with Held.
            let probe = elector.acquire("handover", "probe", &options.lease).await;
            assert!(matches!(probe, Err(Error::Held { .. })));
            waiting.take().unwrap().send(()).unwrap();
            run_with_leadership(
                &elector,
                "handover",
                "new",
                &options,
                &shutdown,
                move |_ctx| async move {
                    started_tx.send(Instant::now()).unwrap();
                    Ok::<_, Error>(())
                },
            )
            .await
            .unwrap()
        });
        waiting_rx.await.unwrap();
        // Give the candidate's first attempt time to fail and start waiting on its wakeups.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released_at = Instant::now();
        holder.release().await.unwrap();
        let started = started_rx.await.unwrap();
        samples.push(started - released_at);
        candidate.await.unwrap();
    }
    samples.sort();
    let median = samples[samples.len() / 2];
    eprintln!(
        "graceful handover: median {median:?}, max {:?} (poll interval 10 s)",
        samples.last().unwrap()
    );
    assert!(median < Duration::from_secs(1), "median {median:?}");
}

/// Handover after a crash (no release): the successor acquires within ttl + one poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_is_succeeded_within_ttl_plus_one_poll() {
    let pg = Pg::new().await;
    let mut options = LeadershipOptions::new(Duration::from_millis(1000));
    options.poll_every = Duration::from_millis(250);
    let holder = pg
        .elector
        .acquire("crash", "old", &options.lease)
        .await
        .unwrap();
    let crashed_at = Instant::now();
    holder.abandon();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<Instant>();
    let shutdown = CancellationToken::new();
    run_with_leadership(
        &pg.elector,
        "crash",
        "new",
        &options,
        &shutdown,
        move |_ctx| async move {
            started_tx.send(Instant::now()).unwrap();
            Ok::<_, Error>(())
        },
    )
    .await
    .unwrap();
    let took = started_rx.await.unwrap() - crashed_at;
    eprintln!("crash handover: {took:?} (ttl 1 s, poll 250 ms)");
    assert!(
        took >= Duration::from_millis(900),
        "acquired before the ttl ran out: {took:?}"
    );
    assert!(
        took < options.lease.ttl + options.poll_every + Duration::from_millis(1500),
        "{took:?}"
    );
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
    started_rx.await.unwrap();
    elector.lose("stubborn");
    match run.await.unwrap().unwrap() {
        Ended::Lost {
            callback_stopped, ..
        } => assert!(!callback_stopped),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        metrics_probe::counter(
            pgfence::leader::METRIC_CALLBACKS_NOT_STOPPED,
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
    let first = events.recv().await.unwrap();
    assert_eq!(first.0, "p1");
    let p2 = make("p2", &["scheduler", "rollout"]);
    let p2_status = p2.status();
    let p2_shutdown = CancellationToken::new();
    let p2_task = tokio::spawn(p2.run(p2_shutdown.clone()));
    let second = events.recv().await.unwrap();
    assert_eq!(second.0, "p2");
    assert!(second.1.ends_with("/rollout"));
    assert_eq!(p1_status.leading().get("scheduler"), Some(&true));
    assert_eq!(p2_status.leading().get("scheduler"), Some(&false));
    assert_eq!(p2_status.leading().get("rollout"), Some(&true));
    let readiness = p2_status.readiness().await;
    assert!(readiness.store.database_reachable && readiness.store.primary == Some(true));

    // p1 loses `scheduler`; p2 is campaigning for it too, so one of them takes it with a larger epoch.
    pg.inject_loss("scheduler").await;
    let third = events.recv().await.unwrap();
    assert!(third.1.ends_with("/scheduler"));
    assert!(third.2 > first.2);

    p1_shutdown.cancel();
    p2_shutdown.cancel();
    p1_task.await.unwrap();
    p2_task.await.unwrap();
    for lease in pg.elector.store().leases().await.unwrap() {
        assert_ne!(
            lease.state,
            pgfence::LeaseState::Held,
            "{} still held after shutdown",
            lease.name
        );
    }
}

/// Many leases, cheap: one process holding N leases renews them all with one statement per tick. Counts renewal
/// statements through the renewal-latency histogram (one observation per statement) and checks in the database
/// that every lease was renewed; prints the statement latency for 1, 100 and 1,000 leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_renew_with_one_statement_per_tick() {
    metrics_probe::install();
    let db = TestDb::new().await;
    for n in [1usize, 100, 1000] {
        let store = db.store(&format!("shards{n}")).await;
        let elector = PgElector::new(store.clone());
        let mut options = LeaseOptions::new(Duration::from_secs(20));
        options.renew_every = Some(Duration::from_millis(500));
        let mut leases = Vec::with_capacity(n);
        for shard in 0..n {
            leases.push(
                elector
                    .acquire(&format!("shard-{shard}"), "sharded", &options)
                    .await
                    .unwrap(),
            );
        }
        let before = metrics_probe::histogram(METRIC_RENEW_SECONDS, &[]).len();
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let elapsed = started.elapsed();
        let observations = metrics_probe::histogram(METRIC_RENEW_SECONDS, &[]);
        let statements = observations.len() - before;
        let ticks = (elapsed.as_millis() / 500) as usize;
        let renewed = db
            .scalar(&format!(
                "SELECT count(*) FROM pgfence.leases WHERE name LIKE 'shards{n}/%' AND renewed_at > acquired_at"
            ))
            .await;
        let mut latencies: Vec<f64> = observations[before..].to_vec();
        latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
        eprintln!(
            "{n} leases: {statements} renewal statements in {elapsed:?} (~{ticks} ticks), median statement {:.2} ms",
            latencies.get(latencies.len() / 2).copied().unwrap_or(0.0) * 1000.0
        );
        assert_eq!(renewed as usize, n, "every lease renewed");
        // Other tests in this binary renew too and share the histogram: bound, don't pin.
        assert!(
            statements <= ticks + 1 + 40,
            "{statements} statements for {n} leases in {ticks} ticks"
        );
        assert!(leases.iter().all(|l| l.standing() == Standing::Held));
        for lease in leases {
            lease.release().await.unwrap();
        }
    }
    let _ = Arc::new(());
}

/// Two tenures of one lease in one renewal group (the same holder acquired again): the batched renewal tells
/// them apart by position, so the old one is declared superseded at the next tick and the new one stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_tenure_in_the_same_renewal_group_is_declared_lost() {
    let pg = Pg::new().await;
    let mut options = LeaseOptions::new(Duration::from_secs(5));
    options.renew_every = Some(Duration::from_millis(100));
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
        .expect("the old tenure was never declared lost")
        .expect("a loss, not a release");
    assert_eq!(
        cause,
        LossCause::Definitive {
            reason: LossReason::Superseded
        }
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // a few more ticks
    assert!(new.is_held(), "{:?}", new.standing());
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
    let seen = seen.await.unwrap();
    let cause = match run.await.unwrap().unwrap() {
        Ended::Lost {
            cause,
            callback_stopped,
        } => {
            assert!(callback_stopped);
            cause
        }
        other => panic!("expected Lost, got {other:?}"),
    };
    assert!(!seen.is_held, "{seen:?}");
    assert_eq!(seen.end_cause, Some(TenureEnd::Lost(cause.clone())));
    assert!(!ctx.is_held());
    assert_eq!(ctx.end_cause(), Some(TenureEnd::Lost(cause)));
}

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
    let seen = seen.await.unwrap();
    assert!(
        seen.is_held,
        "still held until the callback returns: {seen:?}"
    );
    assert_eq!(seen.end_cause, Some(TenureEnd::Shutdown));
    match run.await.unwrap().unwrap() {
        Ended::Cancelled { callback_stopped } => assert!(callback_stopped),
        other => panic!("expected Cancelled, got {other:?}"),
    }
    assert!(!ctx.is_held());
    assert_eq!(ctx.end_cause(), Some(TenureEnd::Shutdown));
    assert_eq!(backend.holder(name).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_the_context_reports_the_loss_cause() {
    the_context_reports_the_loss_cause(Pg::new().await, "ctx-loss").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_the_context_reports_the_loss_cause() {
    the_context_reports_the_loss_cause(
        Memory {
            elector: MemoryElector::new(),
        },
        "mem-ctx-loss",
    )
    .await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_the_context_reports_shutdown_after_an_orderly_stop() {
    the_context_reports_shutdown_after_an_orderly_stop(Pg::new().await, "ctx-stop").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_the_context_reports_shutdown_after_an_orderly_stop() {
    the_context_reports_shutdown_after_an_orderly_stop(
        Memory {
            elector: MemoryElector::new(),
        },
        "mem-ctx-stop",
    )
    .await;
}

/// Invariant 5: when renewals stop getting through (a partition that holds every byte), a callback that asks
/// `is_held` before each write never gets "held" at or past its local deadline, stops no later than (send time
/// of the last good renewal + ttl) — the earliest the database could grant a successor — and is told the
/// deadline loss as its end cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_stops_believing_at_the_local_deadline_when_renewals_stop() {
    let db = TestDb::new().await;
    let proxy = Proxy::start(db.port()).await;
    let store = pgfence::Store::connect(
        pgfence::StoreConfig::new(proxy.url(&db.name), "c")
            .connect_timeout(Duration::from_millis(300))
            .checkout_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let elector = PgElector::new(store);
    let margin = Duration::from_millis(300);
    let mut options = options();
    options.lease = LeaseOptions::new(Duration::from_millis(1500));
    options.lease.renew_every = Some(Duration::from_millis(200));
    options.lease.safety_margin = Some(margin);
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
    started_rx.await.unwrap();
    proxy.set(HOLD_ALL);
    let (believed_past_deadline, stopped_at, trust_until, end_cause) =
        tokio::time::timeout(Duration::from_secs(10), report_rx)
            .await
            .expect("the writer never stopped believing")
            .unwrap();
    assert_eq!(believed_past_deadline, 0);
    // trust_until = send time of the last good renewal + ttl − margin; the database's expiry is later than
    // that send time + ttl.
    assert!(
        stopped_at < trust_until + margin,
        "stopped {:?} after the local deadline",
        stopped_at - trust_until
    );
    let Some(TenureEnd::Lost(cause @ LossCause::DeadlineExceeded { .. })) = end_cause else {
        panic!("expected a deadline loss, got {end_cause:?}");
    };
    match run.await.unwrap().unwrap() {
        Ended::Lost {
            cause: reported, ..
        } => assert_eq!(reported, cause),
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
    options.lease.renew_every = Some(Duration::from_millis(200));
    options.lease.safety_margin = Some(Duration::from_millis(200));
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
        matches!(
            end_cause,
            Some(TenureEnd::Lost(LossCause::DeadlineExceeded { .. }))
        ),
        "{end_cause:?}"
    );
    match run.await.unwrap().unwrap() {
        Ended::Lost { cause, .. } => assert_eq!(Some(TenureEnd::Lost(cause)), end_cause),
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
        .backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
            multiplier: 2.0,
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

    let first = started.recv().await.unwrap();
    assert!(elector.lose_because("scheduler", LossReason::Failover));
    let failover = Some(TenureEnd::Lost(LossCause::Definitive {
        reason: LossReason::Failover,
    }));
    assert!(!first.is_held());
    assert_eq!(first.end_cause(), failover);

    let second = started.recv().await.unwrap();
    assert!(second.epoch() > first.epoch());
    assert!(second.is_held());
    assert_eq!(second.end_cause(), None);
    assert_eq!(
        elector.holder("scheduler"),
        Some(("pod-a".to_owned(), second.epoch()))
    );
    assert_eq!(status.leading().get("scheduler"), Some(&true));

    shutdown.cancel();
    supervisor.await.unwrap();
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
    .await
    .unwrap();
    assert!(matches!(ended, Ended::Returned), "{ended:?}");
    let seen = seen_rx.await.unwrap();
    assert!(!seen.is_held);
    assert_eq!(seen.end_cause, Some(TenureEnd::Released));
}
