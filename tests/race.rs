//! The core invariant, proven by force: once an acquisition of epoch n+1 has returned, no write presenting an
//! epoch <= n commits afterwards — with stale writers racing real acquisitions, ordered by barriers, over many
//! iterations (`PGFENCE_RACE_ITERATIONS`, default 1000).
//!
//! Invariants checked: 3 (no stale write commits after a takeover), 4 (every refused write is a typed error and
//! an audit row), 6 (every acknowledged write is present).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::{Error, Fence, LossReason, Store};
use serde_json::json;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(60);
const WRITERS: usize = 3;
/// A writer stops after its first refusal or after this many writes.
const MAX_WRITES_PER_ROUND: usize = 40;

fn iterations() -> usize {
    std::env::var("PGFENCE_RACE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// An acknowledged write: which table and which row.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ack {
    Event(i64),
    App(i64),
}

#[derive(Default)]
struct WriterReport {
    acked: Vec<Ack>,
    stale: usize,
}

/// One guarded write of kind `k`: an event append, a task creation (new key) or a fenced transaction on an
/// application table.
async fn write(
    store: &Store,
    fence: &Fence,
    round: usize,
    writer: usize,
    k: usize,
) -> Result<Ack, Error> {
    match (round + writer + k) % 3 {
        0 => store
            .append_event(
                fence,
                "shared",
                "tick",
                &json!({"round": round, "writer": writer}),
            )
            .await
            .map(|w| Ack::Event(w.event_id.expect("an appended event"))),
        1 => store
            .create_task(fence, &format!("t-{round}-{writer}-{k}"), &json!({}))
            .await
            .map(|w| Ack::Event(w.event_id.expect("a created task has its event"))),
        _ => {
            let epoch = fence.epoch().get();
            store
                .fenced(fence, "app_write", move |conn| {
                    Box::pin(async move {
                        use diesel::sql_types::BigInt;
                        use diesel_async::RunQueryDsl;
                        #[derive(diesel::QueryableByName)]
                        struct Id {
                            #[diesel(sql_type = BigInt)]
                            id: i64,
                        }
                        let row: Id = diesel::sql_query(
                            "INSERT INTO app_writes (epoch) VALUES ($1) RETURNING id",
                        )
                        .bind::<BigInt, _>(epoch)
                        .get_result(conn)
                        .await?;
                        Ok::<_, Error>(Ack::App(row.id))
                    })
                })
                .await
        }
    }
}

/// Every committed write row carrying `epoch`, read in a fresh snapshot.
async fn committed_with_epoch(
    client: &tokio_postgres::Client,
    lease: &str,
    epoch: i64,
) -> BTreeSet<Ack> {
    let mut out = BTreeSet::new();
    for row in client
        .query(
            "SELECT id FROM pgfence.task_events WHERE lease = $1 AND epoch = $2",
            &[&lease, &epoch],
        )
        .await
        .unwrap()
    {
        out.insert(Ack::Event(row.get(0)));
    }
    for row in client
        .query("SELECT id FROM app_writes WHERE epoch = $1", &[&epoch])
        .await
        .unwrap()
    {
        out.insert(Ack::App(row.get(0)));
    }
    out
}

/// Invariants 3, 4 and 6 under real races: stale writers (three tasks, all three write kinds) start at the
/// same barrier as a takeover. After the takeover returns we snapshot every committed write of the old epoch;
/// once the writers are done the set must be unchanged (nothing of the old epoch committed after the takeover),
/// must contain every acknowledged write, and every refusal must have exactly one audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_write_commits_after_a_takeover_returns() {
    let db = TestDb::new().await;
    let store = db.store("race").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE app_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL)")
        .await
        .unwrap();
    let mut lease = store.acquire("L", "pod-a", TTL).await.unwrap();
    store
        .create_task(&lease.fence(), "shared", &json!({}))
        .await
        .unwrap();

    let rounds = iterations();
    let (mut accepted_in_race, mut refused, mut slowest_takeover) =
        (0usize, 0usize, Duration::ZERO);
    for round in 0..rounds {
        let old = lease.fence();
        let barrier = Arc::new(Barrier::new(WRITERS + 1));
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let (store, fence, barrier) = (store.clone(), old.clone(), barrier.clone());
            writers.push(tokio::spawn(async move {
                let mut report = WriterReport::default();
                barrier.wait().await;
                for k in 0..MAX_WRITES_PER_ROUND {
                    match write(&store, &fence, round, writer, k).await {
                        Ok(ack) => report.acked.push(ack),
                        Err(Error::Stale {
                            presented, reason, ..
                        }) => {
                            assert_eq!(presented, fence.epoch());
                            assert!(
                                matches!(reason, LossReason::Superseded | LossReason::Released),
                                "{reason}"
                            );
                            report.stale += 1;
                            break;
                        }
                        Err(other) => panic!("round {round}: unexpected error {other}"),
                    }
                }
                report
            }));
        }

        barrier.wait().await;
        let started = Instant::now();
        // Alternate the two kinds of takeover: the same holder re-acquiring, and an operator force-release
        // followed by another holder's acquisition.
        lease = if round % 2 == 0 {
            store.acquire("L", lease.holder(), TTL).await.unwrap()
        } else {
            store.force_release("L").await.unwrap();
            let next = if lease.holder() == "pod-a" {
                "pod-b"
            } else {
                "pod-a"
            };
            store.acquire("L", next, TTL).await.unwrap()
        };
        slowest_takeover = slowest_takeover.max(started.elapsed());
        assert_eq!(lease.epoch().get(), old.epoch().get() + 1);
        let at_takeover = committed_with_epoch(&client, old.lease(), old.epoch().get()).await;

        let mut stale = 0;
        let mut acked = Vec::new();
        for handle in writers {
            let report = handle.await.unwrap();
            stale += report.stale;
            acked.extend(report.acked);
        }
        let after = committed_with_epoch(&client, old.lease(), old.epoch().get()).await;
        assert_eq!(
            at_takeover,
            after,
            "round {round}: a write with epoch {} committed after epoch {} was acquired",
            old.epoch(),
            lease.epoch()
        );
        for ack in &acked {
            assert!(
                after.contains(ack),
                "round {round}: acknowledged write {ack:?} is missing"
            );
        }
        let audited: i64 = client
            .query_one(
                "SELECT coalesce(sum(count), 0)::bigint FROM pgfence.rejections WHERE lease = $1 AND presented_epoch = $2",
                &[&old.lease(), &old.epoch().get()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            audited as usize, stale,
            "round {round}: every refusal has exactly one audit row"
        );
        accepted_in_race += acked.len();
        refused += stale;
    }
    eprintln!(
        "{rounds} takeovers: {accepted_in_race} old-epoch writes accepted before them, {refused} refused after; \
         slowest takeover {slowest_takeover:?}"
    );
    assert!(
        refused > 0 && accepted_in_race > 0,
        "the writers never raced the takeovers"
    );
}

/// A takeover must not starve behind a leader that keeps writing: with writers of the current epoch holding
/// the lease row's share lock back to back, an acquisition still completes promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_is_not_starved_by_a_busy_writer() {
    let db = TestDb::new().await;
    let store = db.store("race").await;
    let lease = store.acquire("L", "pod-a", TTL).await.unwrap();
    store
        .create_task(&lease.fence(), "shared", &json!({}))
        .await
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..6 {
        let (store, fence, stop) = (store.clone(), lease.fence(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match store
                    .create_task(&fence, &format!("busy-{w}-{n}"), &json!({}))
                    .await
                {
                    Ok(_) => n += 1,
                    Err(Error::Stale { .. }) => break,
                    Err(other) => panic!("{other}"),
                }
            }
            n
        }));
    }
    // Let the writers reach full speed: wait until they have committed a few hundred writes.
    while db.scalar("SELECT count(*) FROM pgfence.tasks").await < 300 {
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    let next = store.acquire("L", "pod-a", TTL).await.unwrap();
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    eprintln!("takeover under 6 busy writers took {took:?}");
    assert_eq!(next.epoch().get(), 2);
    assert!(
        took < Duration::from_secs(5),
        "takeover starved for {took:?}"
    );
}
