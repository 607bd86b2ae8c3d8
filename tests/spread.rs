//! Leaders spread across replicas, in one process against the suite's real server: supervisors that join one
//! group split their controllers evenly, a replica joining takes exactly its share and nothing else moves, and a
//! name handed over stays fenced — a drained leader that keeps writing through the handover is refused once its
//! successor acquired (invariant 3), and every refusal is audited (invariant 4). The same runtime with the
//! in-memory elector (the users' test double) behaves alike. The figures against real OS processes are
//! `spread_processes` (cli/tests).

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::leader::{
    Elector, LeaderContext, LeadershipOptions, MemoryElector, PgElector, Spread, Supervisor,
    SupervisorStatus, TenureEnd,
};
use pgfence::{Error, Store};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

fn options(ttl: Duration) -> LeadershipOptions {
    let mut options = LeadershipOptions::new(ttl);
    options.grace = Duration::from_millis(500);
    options
}

/// A supervised replica of `names`, each controller waiting for its context's cancellation.
struct Replica<E: Elector> {
    status: SupervisorStatus<E>,
    shutdown: CancellationToken,
    task: JoinHandle<pgfence::Result<()>>,
}

fn start<E: Elector>(
    elector: E,
    holder: &str,
    names: &[String],
    ttl: Duration,
    spread: Spread,
) -> Replica<E> {
    let mut supervisor = Supervisor::new(elector, holder).spread(spread);
    for name in names {
        supervisor = supervisor.controller(name.clone(), options(ttl), |ctx| async move {
            ctx.cancelled().await;
            Ok(())
        });
    }
    let (status, shutdown) = (supervisor.status(), CancellationToken::new());
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    Replica {
        status,
        shutdown,
        task,
    }
}

impl<E: Elector> Replica<E> {
    fn leading(&self) -> usize {
        self.status.leading().values().filter(|l| **l).count()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Waits (bounded) until every replica leads the count given for it; returns how long it took.
async fn converge<E: Elector>(
    replicas: &[&Replica<E>],
    want: &[usize],
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let have: Vec<usize> = replicas.iter().map(|r| r.leading()).collect();
        if have == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "replicas lead {have:?} after {within:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Epoch of every lease of cluster `c`, by name.
async fn epochs(db: &TestDb) -> BTreeMap<String, i64> {
    db.client()
        .await
        .query("SELECT name, epoch FROM pgfence.leases ORDER BY name", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("controller-{i:02}")).collect()
}

async fn pg(db: &TestDb) -> PgElector {
    PgElector::new(db.store("c").await)
}

/// Invariant (balance and minimal movement): 3 replicas of 12 controllers lead 4 each within 2 ttl of the last
/// start; a 4th joining takes exactly 3 names (one from each) and no other tenure changes; the replicas leave
/// in order at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_lead_four_each_and_a_fourth_takes_exactly_three() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(2);
    let all = names(12);
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(start(
            pg(&db).await,
            &format!("r{i}"),
            &all,
            ttl,
            Spread::new("g"),
        ));
    }
    // Bounds with room for a loaded machine (the suite runs its tests in parallel): the targets themselves are
    // measured with real processes in tests/spread_processes.rs.
    let took = converge(&replicas.iter().collect::<Vec<_>>(), &[4, 4, 4], 4 * ttl).await;
    eprintln!("3 replicas x 12 controllers: 4/4/4 after {took:?}");
    let before = epochs(&db).await;
    assert_eq!(before.len(), 12);
    let handovers_before: u64 = replicas
        .iter()
        .map(|r| r.status.group().unwrap().handovers)
        .sum();

    replicas.push(start(pg(&db).await, "r3", &all, ttl, Spread::new("g")));
    let took = converge(
        &replicas.iter().collect::<Vec<_>>(),
        &[3, 3, 3, 3],
        2 * ttl + Duration::from_secs(1),
    )
    .await;
    eprintln!("a 4th replica joined: 3/3/3/3 after {took:?}");
    let after = epochs(&db).await;
    let moved: Vec<&String> = after.keys().filter(|n| after[*n] != before[*n]).collect();
    assert_eq!(moved.len(), 3, "exactly the minimum moves: {moved:?}");
    assert!(
        moved.iter().all(|n| after[*n] == before[*n] + 1),
        "one handover each"
    );
    let group = replicas[3].status.group().unwrap();
    assert_eq!(group.assigned.len(), 3);
    assert_eq!(group.leading, group.assigned);
    assert!(group.generation >= 2, "assigned at least twice: {group:?}");
    let handovers: u64 = replicas
        .iter()
        .map(|r| r.status.group().unwrap().handovers)
        .sum();
    assert_eq!(handovers - handovers_before, 3);

    for replica in replicas {
        replica.stop().await;
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.group_members WHERE live")
            .await,
        0,
        "all left"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.leases WHERE state = 'held'")
            .await,
        0,
        "all released"
    );
}

/// The overrunning drain of [`a_drained_leader_that_keeps_writing_is_refused_once_its_successor_acquired`]: work
/// handed the tenure's `fence` that writes a task every 2 ms, noting each write's outcome (accepted, or refused
/// as stale) and when, until 20 writes were refused; then it notes the end cause its context reports and
/// cancels `writes_done`.
async fn overrunning_writes(
    store: Store,
    fence: pgfence::Fence,
    ctx: LeaderContext,
    outcomes: Arc<Mutex<Vec<(bool, Instant)>>>,
    end_seen: Arc<Mutex<Option<TenureEnd>>>,
    writes_done: CancellationToken,
) {
    let mut refused = 0;
    for i in 0.. {
        let result = store
            .tasks()
            .create(&fence, &format!("t{i}"), &json!({}))
            .await;
        let ok = match result {
            Ok(_) => true,
            Err(Error::Stale { .. }) => false,
            Err(e) => panic!("{e}"),
        };
        outcomes.lock().unwrap().push((ok, Instant::now()));
        if !ok {
            refused += 1;
            if refused == 20 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    *end_seen.lock().unwrap() = ctx.end_cause();
    writes_done.cancel();
}

/// Invariant 3 through a handover: a drained leader whose work keeps writing with its fence after it was told
/// to stop (a drain that overruns) commits nothing once its successor acquired — every such write is refused
/// with `superseded` and audited — and the callback saw `TenureEnd::Handover`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_leader_that_keeps_writing_is_refused_once_its_successor_acquired() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(5);
    let store = db.store("c").await;
    let outcomes: Arc<Mutex<Vec<(bool, Instant)>>> = Arc::default();
    let end_seen: Arc<Mutex<Option<TenureEnd>>> = Arc::default();
    let writes_done = CancellationToken::new();

    let old = {
        let (store, outcomes, end_seen, writes_done) = (
            store.clone(),
            outcomes.clone(),
            end_seen.clone(),
            writes_done.clone(),
        );
        let supervisor = Supervisor::new(pg(&db).await, "old")
            .spread(Spread::new("g"))
            .controller("scheduler", options(ttl), move |ctx| {
                let (store, outcomes, end_seen, writes_done) = (
                    store.clone(),
                    outcomes.clone(),
                    end_seen.clone(),
                    writes_done.clone(),
                );
                async move {
                    // The overrunning drain: work handed the fence keeps writing after the callback returned.
                    let fence = ctx.fence();
                    tokio::spawn(overrunning_writes(
                        store,
                        fence,
                        ctx.clone(),
                        outcomes,
                        end_seen,
                        writes_done,
                    ));
                    ctx.cancelled().await;
                    Ok(())
                }
            });
        let (status, shutdown) = (supervisor.status(), CancellationToken::new());
        Replica {
            status,
            shutdown: shutdown.clone(),
            task: tokio::spawn(supervisor.run(shutdown)),
        }
    };
    converge(&[&old], &[1], ttl).await;
    while outcomes.lock().unwrap().len() < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A replica that pins the name joins: the assignment moves it, the old leader drains and releases.
    let new = start(
        pg(&db).await,
        "new",
        &["scheduler".to_owned()],
        ttl,
        Spread::new("g").pin(["scheduler"]),
    );
    converge(&[&old, &new], &[0, 1], ttl + Duration::from_secs(1)).await;
    writes_done.cancelled().await;

    let client = db.client().await;
    let successor = client
        .query_one(
            "SELECT epoch, acquired_at FROM pgfence.tenures WHERE lease = 'c/scheduler' ORDER BY epoch DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap();
    let successor_epoch: i64 = successor.get(0);
    assert_eq!(successor_epoch, 2);
    let late: i64 = client
        .query_one(
            "SELECT count(*) FROM pgfence.tasks t WHERE t.lease = 'c/scheduler' AND t.fence = 1 \
               AND t.created_at >= (SELECT acquired_at FROM pgfence.tenures WHERE lease = 'c/scheduler' AND epoch = 2)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        late, 0,
        "no write of the old epoch committed after the successor's acquisition"
    );
    let (ok, refused) = {
        let outcomes = outcomes.lock().unwrap();
        (
            outcomes.iter().filter(|o| o.0).count() as i64,
            outcomes.iter().filter(|o| !o.0).count() as i64,
        )
    };
    assert_eq!(refused, 20);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.tasks WHERE fence = 1")
            .await,
        ok
    );
    assert_eq!(
        db.scalar("SELECT coalesce(sum(count), 0)::bigint FROM pgfence.rejections WHERE presented_epoch = 1").await,
        refused,
        "every refusal audited"
    );
    assert_eq!(*end_seen.lock().unwrap(), Some(TenureEnd::Handover));
    assert_eq!(old.status.group().unwrap().handovers, 1);
    old.stop().await;
    new.stop().await;
}

/// The same runtime on the in-memory elector (the users' test double): two replicas split four names, and the
/// names of a replica whose membership expires move to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_elector_spreads_and_moves_names_when_a_member_expires() {
    let elector = MemoryElector::new();
    let ttl = Duration::from_secs(1);
    let all = names(4);
    let a = start(elector.clone(), "a", &all, ttl, Spread::new("g"));
    let b = start(elector.clone(), "b", &all, ttl, Spread::new("g"));
    converge(&[&a, &b], &[2, 2], Duration::from_secs(5)).await;
    assert!(elector.expire_member("g", "a"));
    // `a` hands its names over (it is no member any more) and joins again; the split comes back.
    converge(&[&a, &b], &[2, 2], Duration::from_secs(5)).await;
    a.stop().await;
    converge(&[&b], &[4], Duration::from_secs(5)).await;
    b.stop().await;
}

/// Invariant (sharded work): 100 shards of one controller over 5 replicas: each leads exactly 20, and each
/// shard's callback gets its own shard and fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_shards_over_five_replicas_lead_twenty_each() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(3);
    let mut replicas = Vec::new();
    let seen: Arc<Mutex<BTreeMap<u32, String>>> = Arc::default();
    for i in 0..5 {
        let seen = seen.clone();
        let supervisor = Supervisor::new(pg(&db).await, format!("r{i}"))
            .spread(Spread::new("shards"))
            .sharded("reconciler", 100, options(ttl), move |shard, ctx| {
                let seen = seen.clone();
                async move {
                    assert_eq!(shard.count, 100);
                    assert!(ctx
                        .fence()
                        .lease()
                        .ends_with(&format!("reconciler/{}", shard.index)));
                    seen.lock()
                        .unwrap()
                        .insert(shard.index, ctx.fence().lease().to_owned());
                    ctx.cancelled().await;
                    Ok(())
                }
            })
            .unwrap();
        let (status, shutdown) = (supervisor.status(), CancellationToken::new());
        replicas.push(Replica {
            status,
            shutdown: shutdown.clone(),
            task: tokio::spawn(supervisor.run(shutdown)),
        });
    }
    let took = converge(
        &replicas.iter().collect::<Vec<_>>(),
        &[20; 5],
        Duration::from_secs(30),
    )
    .await;
    eprintln!("100 shards over 5 replicas: 20 each after {took:?}");
    assert_eq!(seen.lock().unwrap().len(), 100);
    for replica in replicas {
        replica.stop().await;
    }
}

/// Invariant (liveness: a replica's own campaigns queue for a turn, not at the pool): a replica given 2,000
/// shards at once, on a pool of 2 connections with a 1 s checkout timeout, leads every one of them at its first
/// attempt — one tenure each, no acquisition failed at the pool and retried a poll period (here 120 s) later. At
/// ~1 ms per acquisition the shards' queue is seconds long, far past the checkout timeout: queued at the pool, the
/// back of it failed ("no database connection … within 1s") and waited out the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_names_campaigning_at_once_queue_for_a_turn_not_at_the_pool() {
    const SHARDS: u32 = 2_000;
    let db = TestDb::new().await;
    let store = Store::connect(
        db.config("c")
            .pool_size(2)
            .checkout_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let mut options = options(Duration::from_secs(60));
    options.poll_every = Duration::from_secs(120);
    let supervisor = Supervisor::new(PgElector::new(store), "r0")
        .spread(Spread::new("turns"))
        .sharded("shard", SHARDS, options, |_, ctx| async move {
            ctx.cancelled().await;
            Ok(())
        })
        .unwrap();
    let (status, shutdown) = (supervisor.status(), CancellationToken::new());
    let replica = Replica {
        status,
        shutdown: shutdown.clone(),
        task: tokio::spawn(supervisor.run(shutdown)),
    };
    // Bounded far below the poll period: a shard whose acquisition failed at the pool is not retried before it.
    let took = converge(&[&replica], &[SHARDS as usize], Duration::from_secs(60)).await;
    eprintln!("{SHARDS} shards on a pool of 2: all led after {took:?}");
    let tenures: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM pgfence.tenures", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tenures,
        i64::from(SHARDS),
        "one tenure per shard, none retried"
    );
    replica.stop().await;
}

/// Bad input to the spreading supervisor is a typed error before anything runs, and writes nothing: a shard
/// count of 0 or above the limit, an invalid group or weight, a pin that is not a controller, the same
/// controller twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_spread_input_is_refused_before_anything_runs() {
    let db = TestDb::new().await;
    let elector = pg(&db).await;
    let ttl = Duration::from_secs(2);
    for shards in [0, pgfence::limits::MAX_SHARDS + 1] {
        let built = Supervisor::new(elector.clone(), "r").sharded(
            "s",
            shards,
            options(ttl),
            |_, ctx| async move {
                ctx.cancelled().await;
                Ok(())
            },
        );
        assert!(
            matches!(
                built,
                Err(Error::InvalidInput {
                    field: "shards",
                    ..
                })
            ),
            "{shards}"
        );
    }
    let one = ["x".to_owned()];
    for (spread, field) in [
        (Spread::new("g").weight(0), "weight"),
        (
            Spread::new("g").weight(pgfence::limits::MAX_WEIGHT + 1),
            "weight",
        ),
        (Spread::new(""), "group"),
        (Spread::new("g").pin(["y"]), "pin"),
    ] {
        let replica = start(elector.clone(), "r", &one, ttl, spread.clone());
        match replica.task.await.unwrap() {
            Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field, "{spread:?}"),
            other => panic!("{spread:?}: {other:?}"),
        }
    }
    let twice = Supervisor::new(elector.clone(), "r")
        .controller("x", options(ttl), |ctx| async move {
            ctx.cancelled().await;
            Ok(())
        })
        .controller("x", options(ttl), |ctx| async move {
            ctx.cancelled().await;
            Ok(())
        });
    assert!(matches!(
        twice.run(CancellationToken::new()).await,
        Err(Error::InvalidInput {
            field: "controller",
            ..
        })
    ));
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.members").await, 0);
    let _: &Store = elector.store();
}

/// Cancel safety: a spreading supervisor whose `run` future is dropped (aborted) leaves nothing behind — its
/// leases are released and its membership left in the background, so the others take its names at once rather
/// than after a ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_spreading_supervisor_leaves_its_group_and_releases_its_names() {
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(30);
    let all = names(2);
    let a = start(pg(&db).await, "a", &all, ttl, Spread::new("g"));
    converge(&[&a], &[2], Duration::from_secs(5)).await;
    a.task.abort();
    let started = Instant::now();
    // The bound is half the ttl: what this proves is that the membership and the leases end in the background at
    // once (about 50 ms here), not by expiring after the ttl; a loaded machine may delay the background tasks.
    let bound = ttl / 2;
    loop {
        let (members, held) = (
            db.scalar("SELECT count(*) FROM pgfence.group_members WHERE live")
                .await,
            db.scalar("SELECT count(*) FROM pgfence.leases WHERE state = 'held'")
                .await,
        );
        if members == 0 && held == 0 {
            break;
        }
        assert!(
            started.elapsed() < bound,
            "after {bound:?} (ttl {ttl:?}): {members} live members, {held} held leases"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("left and released {:?} after the abort", started.elapsed());
}
