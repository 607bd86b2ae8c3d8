//! The history checker: a randomized, seedable run of several contenders for one lease, with random pauses
//! (a holder that stops renewing but keeps writing when it wakes), dropped connections, partitions through a
//! proxy, operator force-releases and second incarnations under the same holder name racing the first, checked
//! against the database's own commit order.
//!
//! Every acquisition and write attempt is recorded with its outcome. The server runs with
//! `track_commit_timestamp = on`, so each tenure row and each event row carries the commit time of the
//! transaction that wrote it: the database's commit order. Checked:
//! - no epoch has two holders (no two contenders were ever granted the same epoch);
//! - epochs strictly increase in commit order;
//! - no write commits with an epoch lower than the one current at its commit;
//! - every refusal has its audit row (counted, aggregated);
//! - every acknowledged write is present.
//!
//! `PGFENCE_HISTORY_SECS` (default 20) bounds the run; `PGFENCE_HISTORY_SEED` replays one. A violation prints
//! the seed and the minimal offending sub-history (the write and the two tenures around it).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proxy::{Proxy, HOLD_ALL, PASS};
use pgfence::embedded::{EmbeddedOptions, EmbeddedServer};
use pgfence::leader::{Elector, LeaseOptions, PgElector};
use pgfence::{Error, Store, StoreConfig};
use serde_json::json;

/// One step of the history. Every field is printed (through `Debug`) when a violation shows its sub-history.
#[derive(Debug, Clone)]
#[allow(dead_code)]
enum Event {
    Acquired {
        contender: usize,
        epoch: i64,
    },
    Lost {
        contender: usize,
        epoch: i64,
    },
    Paused {
        contender: usize,
        epoch: i64,
        for_ms: u64,
    },
    Dropped {
        contender: usize,
    },
    Forced {
        epoch: i64,
    },
    Partitioned {
        contender: usize,
        for_ms: u64,
    },
    Write {
        contender: usize,
        epoch: i64,
        key: String,
        outcome: Outcome,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Acked(i64),
    Stale,
    Failed(String),
}

#[derive(Default)]
struct History {
    events: Vec<(Duration, Event)>,
}

type Shared = Arc<Mutex<History>>;

fn record(history: &Shared, started: Instant, event: Event) {
    history
        .lock()
        .unwrap()
        .events
        .push((started.elapsed(), event));
}

async fn contender(
    id: usize,
    url: String,
    proxy: Option<Proxy>,
    seed: u64,
    until: Instant,
    started: Instant,
    history: Shared,
) {
    let mut rng = fastrand::Rng::with_seed(seed ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let app = format!("contender-{id}");
    let store = Store::connect(
        StoreConfig::new(url, "h")
            .application_name(app)
            .pool_size(2)
            .connect_timeout(Duration::from_millis(500))
            .checkout_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let elector = PgElector::new(store.clone());
    let mut options = LeaseOptions::new(Duration::from_millis(600));
    options.renew_every = Some(Duration::from_millis(120));
    let mut n = 0u64;
    while Instant::now() < until {
        let lease = match elector.acquire("L", &format!("c{id}"), &options).await {
            Ok(lease) => lease,
            Err(Error::Held { expires_in, .. }) => {
                tokio::time::sleep(expires_in.min(Duration::from_millis(rng.u64(10..150)))).await;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let epoch = lease.epoch().get();
        record(
            &history,
            started,
            Event::Acquired {
                contender: id,
                epoch,
            },
        );
        let fence = lease.fence();
        let writes = rng.usize(3..30);
        let mut lease = Some(lease);
        let mut twin: Option<tokio::task::JoinHandle<pgfence::Result<pgfence::Lease>>> = None;
        for _ in 0..writes {
            if Instant::now() >= until {
                break;
            }
            // Faults: a pause longer than the ttl (renewals stop, the writes resume afterwards with the old
            // fence), or this contender's connections terminated by the database.
            match rng.u32(0..100) {
                0..=3 => {
                    let for_ms = rng.u64(700..1500);
                    record(
                        &history,
                        started,
                        Event::Paused {
                            contender: id,
                            epoch,
                            for_ms,
                        },
                    );
                    if let Some(l) = lease.take() {
                        l.abandon();
                    }
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                }
                // A second incarnation under the same holder name (a restarted pod) acquires while this one
                // keeps writing with its old fence: writes of epoch n race the acquisition of n + 1.
                7..=14 if twin.is_none() => {
                    let (store, holder) = (store.clone(), format!("c{id}"));
                    twin = Some(tokio::spawn(async move {
                        store
                            .acquire("L", &holder, Duration::from_millis(600))
                            .await
                    }));
                }
                // A partition between this contender and the database (only the one behind the proxy).
                15..=17 if proxy.is_some() => {
                    let for_ms = rng.u64(700..1500);
                    record(
                        &history,
                        started,
                        Event::Partitioned {
                            contender: id,
                            for_ms,
                        },
                    );
                    let proxy = proxy.clone().unwrap();
                    proxy.set(HOLD_ALL);
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(for_ms)).await;
                        proxy.set(PASS);
                    });
                }
                4..=6 => {
                    record(&history, started, Event::Dropped { contender: id });
                    if let Ok(mut conn) = store.conn().await {
                        use diesel_async::RunQueryDsl;
                        let _ = diesel::sql_query(format!(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                              WHERE application_name = 'contender-{id}' AND pid <> pg_backend_pid()"
                        ))
                        .execute(&mut *conn)
                        .await;
                    }
                }
                _ => {}
            }
            let key = format!("w{id}-{n}");
            n += 1;
            let outcome = match if n % 2 == 0 {
                store.create_task(&fence, &key, &json!({"c": id})).await
            } else {
                store
                    .append_event(&fence, "shared", "tick", &json!({"c": id, "k": key}))
                    .await
            } {
                Ok(write) => Outcome::Acked(
                    write
                        .event_id
                        .expect("every accepted write appends an event"),
                ),
                Err(Error::Stale { .. }) => Outcome::Stale,
                Err(e) => Outcome::Failed(e.to_string()),
            };
            let stale = outcome == Outcome::Stale;
            record(
                &history,
                started,
                Event::Write {
                    contender: id,
                    epoch,
                    key,
                    outcome,
                },
            );
            if stale {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(0..3))).await;
        }
        if let Some(twin) = twin {
            if let Ok(Ok(bumped)) = twin.await {
                record(
                    &history,
                    started,
                    Event::Acquired {
                        contender: id,
                        epoch: bumped.epoch().get(),
                    },
                );
                let _ = store.release(&bumped).await;
            }
        }
        match lease {
            Some(l) if l.is_held() && rng.bool() => {
                let _ = l.release().await;
            }
            Some(l) if !l.is_held() => {
                record(
                    &history,
                    started,
                    Event::Lost {
                        contender: id,
                        epoch,
                    },
                );
            }
            other => drop(other),
        }
    }
}

/// The randomized run and its checks (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_history_has_no_violations() {
    let seed: u64 = std::env::var("PGFENCE_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let secs: u64 = std::env::var("PGFENCE_HISTORY_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    eprintln!("history checker: seed {seed}, {secs} s (replay with PGFENCE_HISTORY_SEED={seed})");
    let server = tokio::task::spawn_blocking(|| {
        EmbeddedServer::start_with(EmbeddedOptions {
            extra_settings: vec![("track_commit_timestamp".into(), "on".into())],
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .unwrap();
    let admin = Store::connect(StoreConfig::new(server.url(), "h"))
        .await
        .unwrap();
    admin.migrate().await.unwrap();
    // The shared task every leader appends to.
    let seed_lease = admin
        .acquire("L", "setup", Duration::from_millis(500))
        .await
        .unwrap();
    admin
        .create_task(&seed_lease.fence(), "shared", &json!({}))
        .await
        .unwrap();
    admin.release(&seed_lease).await.unwrap();

    let history: Shared = Arc::default();
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    // An operator who force-releases at random moments: takeovers then land while the leader is mid-write,
    // the hardest interleaving for the guard.
    let operator = {
        let (admin, history) = (admin.clone(), history.clone());
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(rng.u64(20..250))).await;
                if let Ok(pgfence::ForceReleased::Ended { epoch, .. }) =
                    admin.force_release("L").await
                {
                    record(&history, started, Event::Forced { epoch: epoch.get() });
                }
            }
        })
    };
    // Contender 3 reaches the database through a proxy that can partition it.
    let proxy = Proxy::start(server.port()).await;
    for id in 0..4 {
        let (url, proxy) = if id == 3 {
            (proxy.url("postgres"), Some(proxy.clone()))
        } else {
            (server.url(), None)
        };
        tasks.push(tokio::spawn(contender(
            id,
            url,
            proxy,
            seed,
            until,
            started,
            history.clone(),
        )));
    }
    for t in tasks {
        t.await.unwrap();
    }
    operator.await.unwrap();
    let events = std::mem::take(&mut history.lock().unwrap().events);
    check(&server, &events, seed).await;
    drop(admin);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

/// Whether an event belongs to epoch `epoch` or the one after it (the minimal sub-history of a violation).
fn involves(event: &Event, epoch: i64) -> bool {
    match event {
        Event::Acquired { epoch: e, .. }
        | Event::Lost { epoch: e, .. }
        | Event::Paused { epoch: e, .. }
        | Event::Write { epoch: e, .. }
        | Event::Forced { epoch: e } => *e == epoch || *e == epoch + 1,
        Event::Dropped { .. } | Event::Partitioned { .. } => false,
    }
}

async fn check(server: &EmbeddedServer, events: &[(Duration, Event)], seed: u64) {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let fail = |what: String, context: Vec<String>| -> ! {
        panic!(
            "history violation (seed {seed}, replay with PGFENCE_HISTORY_SEED={seed}): {what}\n  {}",
            context.join("\n  ")
        )
    };

    // No epoch granted to two contenders.
    let mut granted: HashMap<i64, usize> = HashMap::new();
    for (_, event) in events {
        if let Event::Acquired { contender, epoch } = event {
            if let Some(other) = granted.insert(*epoch, *contender) {
                fail(
                    format!("epoch {epoch} granted to contenders {other} and {contender}"),
                    vec![],
                );
            }
        }
    }

    // Tenures in commit order: epochs strictly increase.
    let tenures: Vec<(i64, String, String)> = client
        .query(
            "SELECT epoch, holder, pg_xact_commit_timestamp(xmin)::text FROM pgfence.tenures \
              WHERE lease = 'h/L' ORDER BY pg_xact_commit_timestamp(xmin), epoch",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    for pair in tenures.windows(2) {
        if pair[1].0 <= pair[0].0 {
            fail(
                "epochs not increasing in commit order".into(),
                vec![format!("{:?}", pair[0]), format!("{:?}", pair[1])],
            );
        }
    }

    // No write commits with an epoch lower than the one current at its commit: an event of epoch e must commit
    // before the tenure e+1 commits.
    let violations: Vec<(i64, i64, String, String, String)> = client
        .query(
            "SELECT e.id, e.epoch, e.kind, pg_xact_commit_timestamp(e.xmin)::text, \
                    pg_xact_commit_timestamp(t.xmin)::text \
               FROM pgfence.task_events e JOIN pgfence.tenures t ON t.lease = e.lease AND t.epoch > e.epoch \
              WHERE e.lease = 'h/L' AND pg_xact_commit_timestamp(e.xmin) > pg_xact_commit_timestamp(t.xmin)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    if let Some((id, epoch, kind, at, newer_at)) = violations.first() {
        let around: Vec<String> = tenures
            .iter()
            .filter(|t| t.0 == *epoch || t.0 == epoch + 1)
            .map(|t| format!("tenure epoch {} holder {} committed {}", t.0, t.1, t.2))
            .collect();
        let mut context = vec![format!("event {id} ({kind}) with epoch {epoch} committed at {at}, after a newer tenure committed at {newer_at}")];
        context.extend(around);
        context.extend(
            events
                .iter()
                .filter(|(_, e)| involves(e, *epoch))
                .map(|(t, e)| format!("{t:?} {e:?}")),
        );
        fail(
            format!(
                "{} stale write(s) committed after a takeover",
                violations.len()
            ),
            context,
        );
    }

    // Every acknowledged write is present; every refusal is audited.
    let present: std::collections::HashSet<i64> = client
        .query("SELECT id FROM pgfence.task_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut refused: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut acked, mut failed) = (0, 0);
    for (at, event) in events {
        if let Event::Write {
            epoch,
            outcome,
            contender,
            key,
        } = event
        {
            match outcome {
                Outcome::Acked(id) => {
                    acked += 1;
                    if !present.contains(id) {
                        fail(
                            format!("acknowledged write lost: event {id}"),
                            vec![format!("{at:?} contender {contender} epoch {epoch} {key}")],
                        );
                    }
                }
                Outcome::Stale => *refused.entry(*epoch).or_default() += 1,
                Outcome::Failed(_) => failed += 1,
            }
        }
    }
    let audited: BTreeMap<i64, i64> = client
        .query(
            "SELECT presented_epoch, sum(count)::bigint FROM pgfence.rejections WHERE lease = 'h/L' GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if refused != audited {
        fail(
            "refusals and audit rows differ".into(),
            vec![
                format!("refused by epoch {refused:?}"),
                format!("audited {audited:?}"),
            ],
        );
    }
    let pauses = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Paused { .. }))
        .count();
    let drops = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Dropped { .. }))
        .count();
    let losses = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Lost { .. }))
        .count();
    let forced = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Forced { .. }))
        .count();
    let cuts = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Partitioned { .. }))
        .count();
    eprintln!(
        "history checked: {} tenures, {acked} acknowledged writes, {} refused, {failed} failed on faults; \
         {pauses} pauses, {drops} connection drops, {cuts} partitions, {forced} force-releases, \
         {losses} losses; 0 violations",
        tenures.len(),
        refused.values().sum::<i64>(),
    );
    assert!(tenures.len() > 3, "too few handovers to mean anything");
    assert!(
        refused.values().sum::<i64>() > 0,
        "no stale writer was ever refused: the faults did not bite"
    );
}
