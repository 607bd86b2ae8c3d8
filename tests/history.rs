//! The history checker: a randomized, seedable run of several contenders for one lease under faults, judged
//! against the database's own commit order (invariant 3 judged against *acquisition* commits).
//!
//! Proven against weakened protocols (the SQL mutations of `tests/mutation/gate.py`, written out by
//! `python3 tests/mutation/gate.py --emit target/mutants/sql` and applied after the migration by
//! `PGFENCE_MUTANT_SQL`), each at the default duration (20 s) with seeds 1, 2 and 3, from the repository root:
//! `PGFENCE_MUTANT_SQL=target/mutants/sql/<mutation>.sql PGFENCE_HISTORY_SEED=<n> cargo test --test history -- --nocapture`
//! (the real protocol: the same without `PGFENCE_MUTANT_SQL`). "First violation": commit time of the earliest
//! violating write, in seconds after the run started, for seeds 1 / 2 / 3 (a replayed seed repeats the faults'
//! schedule, not every race, so times and counts vary from run to run).
//!
//! | protocol (gate mutation) | seeds caught | first violation (s) | violating rows | test time |
//! |---|---|---|---|---|
//! | real protocol (none) | none to catch: 0 violations, every check passes | – | 0 / 0 / 0 | 21.0–21.5 s |
//! | guard without its lock (`guard-without-lock`) | 1, 2, 3 | 1.14 / 2.59 / 1.10 | 26 / 20 / 35 | 21.5–21.8 s |
//! | acquisition without its exclusive lock (`takeover-without-exclusive-lock`) | 1, 2, 3 | 0.64 / 2.39 / 0.96 | 27 / 26 / 20 | 21.0–21.8 s |
//! | superseded check off by one (`superseded-off-by-one`) | 1, 2, 3 | 0.06 / 0.26 / 0.10 | 531 / 551 / 449 | 21.1–21.3 s |
//!
//! Every mutant failed "no write commits after a newer acquisition" on every seed, with violating rows in all
//! three tables (task events, task rows, ledger rows); the off-by-one also failed "no guard admits a superseded
//! epoch" on seeds 2 and 3. No other check failed. Earlier runs of the same matrix, while the workload was being
//! tuned, caught every mutant on every seed too.
//!
//! The run: four contenders (one behind a proxy) with random pauses (a holder that stops renewing but keeps
//! writing when it wakes), holders that pause *inside* a fenced transaction — after its check, before its commit —
//! while a takeover is in flight (a second incarnation acquiring, or a successor taking over the lease when it
//! expires; the takeover waits for the open transaction, and ends it after the 2 s grace), dropped connections,
//! partitions, operator force-releases and second incarnations under the same holder name racing the first.
//!
//! Every acquisition and write attempt is recorded with its outcome. The contenders make three kinds of guarded
//! writes: `create_task` and `append_event` (each appends a `pgfence.task_events` row and writes a
//! `pgfence.tasks` row) and `Store::fenced` transactions that insert into an application table,
//! `history_ledger`, whose rows record the epoch they were written under. The server runs with
//! `track_commit_timestamp = on`, so every row's commit time is known: a write's is its row's xmin (event and
//! ledger rows are never updated; a task row's xmin is its last writer, whose epoch is the row's `fence`), and a
//! tenure's *acquisition* commit is that of `pgfence.tenures.acquired_xid` (not the tenure row's xmin, which names
//! the transaction that ended the tenure). Checked:
//! - no epoch was granted to two contenders, and every epoch a contender was granted is a tenure of its holder;
//! - every acquisition has a commit time, and in acquisition-commit order epochs strictly increase (no two
//!   acquisitions share a commit time);
//! - invariant 3: no write of epoch e commits after the acquisition of any epoch > e commits — judged for every
//!   task event, every task row and every ledger row, each of which must also carry an epoch that was granted;
//! - no guard admits a superseded epoch: no write is refused by a task row's fence (only a newer epoch raises it);
//! - every refusal has its audit row (counted per presented epoch);
//! - every acknowledged write is present, with the epoch its writer presented;
//! - the run meant something: handovers, refusals, acknowledged writes of every kind, fenced transactions held
//!   open across a takeover, and writes judged against newer acquisitions.
//!
//! All failed checks are reported together, with the seed and the minimal offending sub-history.
//! `PGFENCE_HISTORY_SECS` (default 20) bounds the run; `PGFENCE_HISTORY_SEED` replays one.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proxy::{Proxy, HOLD_ALL, PASS};
use diesel::sql_types::{BigInt, Integer, Text};
use pgfence::embedded::{EmbeddedOptions, EmbeddedServer};
use pgfence::leader::{Elector, LeaseOptions, PgElector};
use pgfence::{Error, Fence, LossReason, Store, StoreConfig};
use serde_json::json;

/// The lease every contender wants, cluster-qualified.
const LEASE: &str = "h/L";
/// The application table the fenced transactions write (one row per acknowledged write, with its epoch).
const LEDGER_DDL: &str = "CREATE TABLE public.history_ledger (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    epoch     bigint NOT NULL,
    contender integer NOT NULL,
    key       text NOT NULL UNIQUE
)";

/// Which guarded write a contender made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// `Tasks::create` (a new task and its 'created' event).
    CreateTask,
    /// `Tasks::append_event` on the one task every leader appends to.
    AppendEvent,
    /// `Store::fenced`: a transaction inserting into `history_ledger`.
    Fenced,
}

/// How a fenced transaction held open after its check meets a takeover.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Takeover {
    /// A second incarnation under the same holder name acquires while the transaction is open.
    Twin,
    /// The holder stops renewing and stays paused inside the transaction past the ttl: another contender takes
    /// over the expired lease (or the operator force-releases it).
    Expiry,
}

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
    /// The next write is a fenced transaction that stays open `for_ms` after its check and its insert.
    HeldOpen {
        contender: usize,
        epoch: i64,
        for_ms: u64,
        takeover: Takeover,
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
        kind: Kind,
        outcome: Outcome,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Accepted: the id of its `task_events` row (task writes) or `history_ledger` row (fenced writes).
    Acked(i64),
    /// Refused as stale (and audited), with the reason the caller was given.
    Stale(LossReason),
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

#[derive(diesel::QueryableByName)]
struct LedgerId {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// A fenced transaction writing one ledger row with the fence's epoch; it stays open `hold` after the insert
/// (a holder paused between its check and its commit).
async fn fenced_write(
    store: &Store,
    fence: &Fence,
    contender: usize,
    key: &str,
    hold: Duration,
) -> pgfence::Result<i64> {
    let (epoch, key) = (fence.epoch().get(), key.to_owned());
    store
        .fenced(fence, "ledger", async move |conn| {
            use diesel_async::RunQueryDsl;
            let row: LedgerId = diesel::sql_query(
                "INSERT INTO public.history_ledger (epoch, contender, key) VALUES ($1, $2, $3) RETURNING id",
            )
            .bind::<BigInt, _>(epoch)
            .bind::<Integer, _>(contender as i32)
            .bind::<Text, _>(key)
            .get_result(conn)
            .await?;
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            Ok::<_, Error>(row.id)
        })
        .await
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
            // One connection for a transaction held open, one for renewals, one for a second incarnation.
            .pool_size(3)
            .connect_timeout(Duration::from_millis(500))
            .checkout_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let elector = PgElector::new(store.clone());
    let mut options = LeaseOptions::new(Duration::from_millis(600));
    options.renew_every = Duration::from_millis(120);
    let mut n = 0u64;
    // Fenced transactions this contender held open across a takeover; the first is forced (below) if chance has
    // not brought one by 1.5 + id seconds into the run, so that every run holds some open.
    let mut held_open = 0usize;
    let first_hold_due = started + Duration::from_millis(1500 + 1000 * id as u64);
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
            let now = Instant::now();
            if now >= until {
                break;
            }
            // No fault outlasts the run by much (pauses, partitions and holds are cut to what is left of it).
            let left_ms = (until - now).as_millis() as u64;
            // Set by the faults that hold the next write's fenced transaction open.
            let mut hold = Duration::ZERO;
            let roll = if held_open == 0 && twin.is_none() && now >= first_hold_due {
                180
            } else {
                rng.u32(0..1000)
            };
            // Faults: a pause longer than the ttl (renewals stop, the writes resume afterwards with the old
            // fence), or this contender's connections terminated by the database.
            match roll {
                0..=39 => {
                    let for_ms = rng.u64(700..1500).min(left_ms);
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
                70..=149 if twin.is_none() => {
                    let (store, holder) = (store.clone(), format!("c{id}"));
                    twin = Some(tokio::spawn(async move {
                        store
                            .acquire("L", &holder, Duration::from_millis(600))
                            .await
                    }));
                }
                // A partition between this contender and the database (only the one behind the proxy).
                150..=179 if proxy.is_some() => {
                    let for_ms = rng.u64(700..1500).min(left_ms);
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
                40..=69 => {
                    record(&history, started, Event::Dropped { contender: id });
                    if let Ok(mut conn) = store.admin().conn().await {
                        use diesel_async::RunQueryDsl;
                        let _ = diesel::sql_query(format!(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                              WHERE application_name = 'contender-{id}' AND pid <> pg_backend_pid()"
                        ))
                        .execute(&mut *conn)
                        .await;
                    }
                }
                // The holder pauses inside a fenced transaction, past its check, while a second incarnation
                // acquires: the takeover is in flight when the holder resumes and commits. The protocol makes the
                // takeover wait for the open transaction (and end it after the 2 s grace, the longer holds).
                180..=182 if twin.is_none() => {
                    let for_ms = if rng.u32(0..6) == 0 {
                        rng.u64(2200..2700)
                    } else {
                        rng.u64(80..400)
                    }
                    .min(left_ms + 200);
                    record(
                        &history,
                        started,
                        Event::HeldOpen {
                            contender: id,
                            epoch,
                            for_ms,
                            takeover: Takeover::Twin,
                        },
                    );
                    let (store, holder, delay) = (store.clone(), format!("c{id}"), rng.u64(5..30));
                    twin = Some(tokio::spawn(async move {
                        // After the fenced transaction's check, as a rule.
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        store
                            .acquire("L", &holder, Duration::from_millis(600))
                            .await
                    }));
                    hold = Duration::from_millis(for_ms);
                    held_open += 1;
                }
                // The holder freezes inside a fenced transaction and stops renewing: the lease expires and
                // another contender (or the operator) takes it over while the transaction is open.
                183..=185 => {
                    let for_ms = if rng.u32(0..6) == 0 {
                        rng.u64(2200..2700)
                    } else {
                        rng.u64(750..1200)
                    }
                    .min(left_ms + 200);
                    record(
                        &history,
                        started,
                        Event::HeldOpen {
                            contender: id,
                            epoch,
                            for_ms,
                            takeover: Takeover::Expiry,
                        },
                    );
                    if let Some(l) = lease.take() {
                        l.abandon();
                    }
                    hold = Duration::from_millis(for_ms);
                    held_open += 1;
                }
                _ => {}
            }
            let key = format!("w{id}-{n}");
            n += 1;
            let kind = if !hold.is_zero() {
                Kind::Fenced
            } else {
                match n % 3 {
                    0 => Kind::CreateTask,
                    1 => Kind::AppendEvent,
                    _ => Kind::Fenced,
                }
            };
            let event_id = |write: pgfence::tasks::TaskWrite| {
                write
                    .event_id
                    .expect("every accepted task write appends an event")
            };
            let result = match kind {
                Kind::CreateTask => store
                    .tasks()
                    .create(&fence, &key, &json!({"c": id}))
                    .await
                    .map(event_id),
                Kind::AppendEvent => store
                    .tasks()
                    .append_event(&fence, "shared", "tick", &json!({"c": id, "k": key}))
                    .await
                    .map(event_id),
                Kind::Fenced => fenced_write(&store, &fence, id, &key, hold).await,
            };
            let outcome = match result {
                Ok(id) => Outcome::Acked(id),
                Err(Error::Stale { reason, .. }) => Outcome::Stale(reason),
                Err(e) => Outcome::Failed(e.to_string()),
            };
            let stale = matches!(outcome, Outcome::Stale(_));
            record(
                &history,
                started,
                Event::Write {
                    contender: id,
                    epoch,
                    key,
                    kind,
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
        let mut options = EmbeddedOptions::default();
        options.extra_settings = vec![("track_commit_timestamp".into(), "on".into())];
        EmbeddedServer::start_with(options)
    })
    .await
    .unwrap()
    .unwrap();
    let admin = Store::connect(StoreConfig::new(server.url(), "h"))
        .await
        .unwrap();
    admin.migrate().await.unwrap();
    // A weakened protocol, when a proof asks for one (PGFENCE_MUTANT_SQL).
    common::apply_mutant(&server.url()).await;
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client.batch_execute(LEDGER_DDL).await.unwrap();
    // The shared task every leader appends to.
    let seed_lease = admin
        .acquire("L", "setup", Duration::from_millis(500))
        .await
        .unwrap();
    admin
        .tasks()
        .create(&seed_lease.fence(), "shared", &json!({}))
        .await
        .unwrap();
    admin.release(&seed_lease).await.unwrap();

    let history: Shared = Arc::default();
    // The run's start by the database clock, in microseconds since 1970 (commit timestamps are compared to it).
    let run_start_us: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
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
                    admin.admin().force_release("L").await
                {
                    record(&history, started, Event::Forced { epoch: epoch.get() });
                }
            }
        })
    };
    // Contender 3 reaches the database through a proxy that can partition it.
    let proxy = Proxy::start(&server.url()).await;
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
    check(&client, &events, seed, run_start_us).await;
    drop(admin);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

/// Whether an event belongs to the minimal sub-history of a violation by a write of epoch `epoch`: everything
/// of that epoch, and what ended it and began the two after it (their writes left out).
fn involves(event: &Event, epoch: i64) -> bool {
    match event {
        Event::Write { epoch: e, .. } => *e == epoch,
        Event::Acquired { epoch: e, .. }
        | Event::Lost { epoch: e, .. }
        | Event::Paused { epoch: e, .. }
        | Event::HeldOpen { epoch: e, .. }
        | Event::Forced { epoch: e } => (epoch..=epoch + 2).contains(e),
        Event::Dropped { .. } | Event::Partitioned { .. } => false,
    }
}

/// A tenure of the lease with the commit time of the transaction that granted it.
#[derive(Debug)]
struct Tenure {
    epoch: i64,
    holder: String,
    /// `pg_xact_commit_timestamp(acquired_xid)` in microseconds since 1970; `None` when the server has none.
    acquired_us: Option<i64>,
    acquired_at: String,
    end_reason: Option<String>,
}

/// A committed guarded write found in the database.
#[derive(Debug)]
struct Row {
    /// 'task_events', 'tasks' or 'history_ledger'.
    table: String,
    id: i64,
    epoch: i64,
    /// Commit time of the row's xmin, microseconds since 1970.
    committed_us: Option<i64>,
    committed_at: String,
}

/// Microseconds since 1970 of a commit timestamp expression, and the timestamp as text.
macro_rules! commit_ts {
    ($xid:literal) => {
        concat!(
            "(extract(epoch FROM pg_xact_commit_timestamp(",
            $xid,
            ")) * 1000000)::bigint, pg_xact_commit_timestamp(",
            $xid,
            ")::text"
        )
    };
}

async fn check(
    client: &tokio_postgres::Client,
    events: &[(Duration, Event)],
    seed: u64,
    run_start_us: i64,
) {
    // Every failed check, reported together at the end.
    let mut failures = Failures::default();
    let since_start = |us: i64| (us - run_start_us) as f64 / 1e6;

    let tenures: Vec<Tenure> = client
        .query(
            concat!(
                "SELECT epoch, holder, end_reason, ",
                commit_ts!("acquired_xid::xid"),
                " FROM pgfence.tenures WHERE lease = $1 ORDER BY epoch"
            ),
            &[&LEASE],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Tenure {
            epoch: r.get(0),
            holder: r.get(1),
            end_reason: r.get(2),
            acquired_us: r.get(3),
            acquired_at: r.get::<_, Option<String>>(4).unwrap_or_default(),
        })
        .collect();
    let by_epoch: HashMap<i64, &Tenure> = tenures.iter().map(|t| (t.epoch, t)).collect();
    let show = |t: &Tenure| {
        format!(
            "tenure epoch {} holder {} acquisition committed {} ({:.3} s into the run), ended {:?}",
            t.epoch,
            t.holder,
            t.acquired_at,
            t.acquired_us.map(since_start).unwrap_or(f64::NAN),
            t.end_reason
        )
    };

    // No epoch granted to two contenders, and each grant is the tenure the database recorded for its holder.
    let mut granted: HashMap<i64, usize> = HashMap::new();
    for (at, event) in events {
        if let Event::Acquired { contender, epoch } = event {
            if let Some(other) = granted.insert(*epoch, *contender) {
                failures.add(
                    "no epoch granted twice",
                    format!("epoch {epoch} granted to contenders {other} and {contender}"),
                    vec![format!("{at:?} {event:?}")],
                );
            }
            match by_epoch.get(epoch) {
                Some(t) if t.holder == format!("c{contender}") => {}
                other => failures.add(
                    "grants match tenures",
                    format!("contender {contender} was granted epoch {epoch}, not a tenure of its holder"),
                    vec![
                        format!("{at:?} {event:?}"),
                        other.map_or("no such tenure".into(), |t| show(t)),
                    ],
                ),
            }
        }
    }

    // In acquisition-commit order, epochs strictly increase: with tenures in epoch order, their acquisitions'
    // commit times strictly increase (a tie would leave the order undecided).
    if let Some(t) = tenures.iter().find(|t| t.acquired_us.is_none()) {
        failures.add(
            "acquisitions have commit times",
            "a tenure's acquisition has no commit timestamp (is track_commit_timestamp on?)".into(),
            vec![show(t)],
        );
    }
    for pair in tenures.windows(2) {
        if let (Some(a), Some(b)) = (pair[0].acquired_us, pair[1].acquired_us) {
            if b <= a {
                failures.add(
                    "epochs increase in acquisition-commit order",
                    "epochs do not strictly increase in acquisition-commit order".into(),
                    vec![show(&pair[0]), show(&pair[1])],
                );
            }
        }
    }

    // Every committed guarded write, with its epoch and commit time.
    let rows: Vec<Row> = client
        .query(
            concat!(
                "SELECT 'task_events', id, epoch, ",
                commit_ts!("xmin"),
                " FROM pgfence.task_events WHERE lease = $1 \
                 UNION ALL SELECT 'tasks', id, fence, ",
                commit_ts!("xmin"),
                " FROM pgfence.tasks WHERE lease = $1 \
                 UNION ALL SELECT 'history_ledger', id, epoch, ",
                commit_ts!("xmin"),
                " FROM public.history_ledger"
            ),
            &[&LEASE],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Row {
            table: r.get(0),
            id: r.get(1),
            epoch: r.get(2),
            committed_us: r.get(3),
            committed_at: r.get::<_, Option<String>>(4).unwrap_or_default(),
        })
        .collect();

    // Invariant 3: a write of epoch e must commit before the acquisition of every epoch > e. `first_newer[i]` is
    // the tenure with the earliest acquisition commit among tenures[i..] (suffix minimum, epoch order).
    let mut first_newer: Vec<Option<&Tenure>> = vec![None; tenures.len() + 1];
    for i in (0..tenures.len()).rev() {
        let t = &tenures[i];
        first_newer[i] = match first_newer[i + 1] {
            Some(m) if m.acquired_us <= t.acquired_us => Some(m),
            _ if t.acquired_us.is_some() => Some(t),
            m => m,
        };
    }
    let mut violations: Vec<(&Row, &Tenure)> = Vec::new();
    let mut closest_us: Option<i64> = None;
    let mut judged = 0usize;
    for row in &rows {
        let Some(committed) = row.committed_us else {
            failures.add(
                "writes have commit times",
                format!("{} row {} has no commit timestamp", row.table, row.id),
                vec![format!("{row:?}")],
            );
            continue;
        };
        if !by_epoch.contains_key(&row.epoch) {
            failures.add(
                "writes carry granted epochs",
                format!(
                    "{} row {} was written under epoch {}, which was never granted",
                    row.table, row.id, row.epoch
                ),
                vec![format!("{row:?}")],
            );
        }
        let newer = tenures.partition_point(|t| t.epoch <= row.epoch);
        if let Some(next) = first_newer[newer] {
            judged += 1;
            let acquired = next.acquired_us.expect("only tenures with a commit time");
            if committed > acquired {
                violations.push((row, next));
            } else {
                let margin = acquired - committed;
                closest_us = Some(closest_us.map_or(margin, |c| c.min(margin)));
            }
        }
    }
    violations.sort_by_key(|(row, _)| row.committed_us);
    let first_violation = violations
        .first()
        .map(|(row, _)| since_start(row.committed_us.unwrap()));
    if let Some((row, next)) = violations.first() {
        let mut by_table: BTreeMap<&str, usize> = BTreeMap::new();
        for (r, _) in &violations {
            *by_table.entry(r.table.as_str()).or_default() += 1;
        }
        let mut context = vec![
            format!("violations by table: {by_table:?}; the first one:"),
            format!(
                "{} row {} of epoch {} committed {} ({:.3} s into the run), after a newer acquisition committed:",
                row.table,
                row.id,
                row.epoch,
                row.committed_at,
                since_start(row.committed_us.unwrap())
            ),
        ];
        context.extend(
            tenures
                .iter()
                .filter(|t| t.epoch == row.epoch || t.epoch == next.epoch)
                .map(show),
        );
        context.extend(
            events
                .iter()
                .filter(|(_, e)| involves(e, row.epoch))
                .map(|(t, e)| format!("{t:?} {e:?}")),
        );
        failures.add(
            "no write commits after a newer acquisition",
            format!(
                "{} stale write(s) committed after a newer epoch's acquisition (first {:.3} s into the run)",
                violations.len(),
                first_violation.unwrap()
            ),
            context,
        );
    }

    // Every acknowledged write is present with the epoch its writer presented; every refusal is audited.
    let epoch_of: HashMap<(&str, i64), i64> = rows
        .iter()
        .map(|r| ((r.table.as_str(), r.id), r.epoch))
        .collect();
    let mut refused: BTreeMap<i64, i64> = BTreeMap::new();
    let mut acked: BTreeMap<Kind, usize> = BTreeMap::new();
    let mut failed = 0;
    for (at, event) in events {
        let Event::Write {
            epoch,
            outcome,
            contender,
            key,
            kind,
        } = event
        else {
            continue;
        };
        match outcome {
            Outcome::Acked(id) => {
                *acked.entry(*kind).or_default() += 1;
                let table = if *kind == Kind::Fenced {
                    "history_ledger"
                } else {
                    "task_events"
                };
                match epoch_of.get(&(table, *id)) {
                    Some(e) if e == epoch => {}
                    found => failures.add(
                        "acknowledged writes present",
                        format!(
                            "acknowledged write lost or changed: {table} row {id}, epoch {found:?}"
                        ),
                        vec![format!("{at:?} {event:?} (contender {contender}, {key})")],
                    ),
                }
            }
            Outcome::Stale(_) => *refused.entry(*epoch).or_default() += 1,
            Outcome::Failed(_) => failed += 1,
        }
    }
    // Per presented epoch in tenure-scope rows; a refusal of an epoch that was no longer one of the lease's 16
    // newest tenures is counted in the role's row for its reason instead (the audit's bound, docs/security.md),
    // so per epoch the tenure rows count at most the refusals, and in all exactly.
    let audited: BTreeMap<i64, i64> = client
        .query(
            "SELECT presented_epoch, sum(count)::bigint FROM pgfence.rejections \
              WHERE lease = $1 AND scope = 'tenure' GROUP BY 1",
            &[&LEASE],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let audited_by_role: i64 = client
        .query_one(
            "SELECT coalesce(sum(count), 0)::bigint FROM pgfence.rejections \
              WHERE scope = 'role' AND (lease = $1 OR last_lease = $1)",
            &[&LEASE],
        )
        .await
        .unwrap()
        .get(0);
    let within = audited
        .iter()
        .all(|(epoch, n)| refused.get(epoch).is_some_and(|r| n <= r));
    if !within || refused.values().sum::<i64>() != audited.values().sum::<i64>() + audited_by_role {
        failures.add(
            "every refusal audited",
            "refusals and audit rows differ".into(),
            vec![
                format!("refused by epoch {refused:?}"),
                format!("audited {audited:?}, and {audited_by_role} in role rows"),
            ],
        );
    }

    // Why the database refused, as its callers were told. A 'row_fence' refusal is a violation too: only a guarded
    // write of a newer epoch raises a task row's fence, so a write refused by the row's fence was *admitted by
    // the guard* with an epoch below the current one.
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for (at, event) in events {
        let Event::Write {
            epoch,
            outcome: Outcome::Stale(reason),
            ..
        } = event
        else {
            continue;
        };
        *reasons.entry(reason.as_str()).or_default() += 1;
        if *reason == LossReason::RowFence {
            let mut context = vec![format!("{at:?} {event:?}")];
            context.extend(
                events
                    .iter()
                    .filter(|(_, e)| involves(e, *epoch))
                    .map(|(t, e)| format!("{t:?} {e:?}")),
            );
            failures.add(
                "no guard admits a superseded epoch",
                format!("a write of epoch {epoch} passed the guard and was refused only by a task row's fence"),
                context,
            );
        }
    }

    let count = |f: fn(&Event) -> bool| events.iter().filter(|(_, e)| f(e)).count();
    let pauses = count(|e| matches!(e, Event::Paused { .. }));
    let held_open = count(|e| matches!(e, Event::HeldOpen { .. }));
    let drops = count(|e| matches!(e, Event::Dropped { .. }));
    let losses = count(|e| matches!(e, Event::Lost { .. }));
    let forced = count(|e| matches!(e, Event::Forced { .. }));
    let cuts = count(|e| matches!(e, Event::Partitioned { .. }));
    let refusals = refused.values().sum::<i64>();
    // What became of the fenced transactions held open across a takeover: committed before it (the takeover
    // waited), ended by it after the grace (failed), or refused at their check.
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    let mut holding: HashSet<usize> = HashSet::new();
    for (_, event) in events {
        match event {
            Event::HeldOpen { contender, .. } => {
                holding.insert(*contender);
            }
            Event::Write {
                contender, outcome, ..
            } if holding.remove(contender) => {
                let what = match outcome {
                    Outcome::Acked(_) => "committed",
                    Outcome::Stale(_) => "refused",
                    Outcome::Failed(_) => "failed",
                };
                *held.entry(what).or_default() += 1;
            }
            _ => {}
        }
    }
    eprintln!(
        "history checked: {} tenures, acknowledged writes {acked:?} ({} rows judged against newer acquisitions, \
         closest {:.1} ms before one), {refusals} refused {reasons:?}, {failed} failed on faults; {pauses} pauses, \
         {held_open} fenced transactions held open across a takeover {held:?}, {drops} connection drops, {cuts} \
         partitions, {forced} force-releases, {losses} losses; {} violation(s){}",
        tenures.len(),
        judged,
        closest_us.unwrap_or(-1) as f64 / 1e3,
        violations.len(),
        first_violation
            .map(|s| format!(", first {s:.3} s into the run"))
            .unwrap_or_default(),
    );

    // The run meant something (a run that exercised nothing must not pass as a proof).
    if tenures.len() <= 3 {
        failures.add(
            "the run meant something",
            "too few handovers to mean anything".into(),
            vec![],
        );
    }
    if refusals == 0 {
        failures.add(
            "the run meant something",
            "no stale writer was ever refused: the faults did not bite".into(),
            vec![],
        );
    }
    for kind in [Kind::CreateTask, Kind::AppendEvent, Kind::Fenced] {
        if acked.get(&kind).copied().unwrap_or(0) == 0 {
            failures.add(
                "the run meant something",
                format!("no {kind:?} write was ever acknowledged"),
                vec![],
            );
        }
    }
    if held_open == 0 {
        failures.add(
            "the run meant something",
            "no fenced transaction was held open across a takeover".into(),
            vec![],
        );
    }
    if judged == 0 {
        failures.add(
            "the run meant something",
            "no write was judged against a newer acquisition".into(),
            vec![],
        );
    }

    failures.report(seed);
}

/// One failure of a check: what failed, and the sub-history that shows it.
type Failure = (String, Vec<String>);

/// Failed checks, grouped by check, in the order first seen.
#[derive(Default)]
struct Failures(Vec<(&'static str, Vec<Failure>)>);

impl Failures {
    fn add(&mut self, check: &'static str, what: String, context: Vec<String>) {
        match self.0.iter_mut().find(|(c, _)| *c == check) {
            Some((_, found)) => found.push((what, context)),
            None => self.0.push((check, vec![(what, context)])),
        }
    }

    /// Panics with every failed check (its first three failures in full) when there is any.
    fn report(&self, seed: u64) {
        if self.0.is_empty() {
            return;
        }
        let mut report = String::new();
        for (check, found) in &self.0 {
            report.push_str(&format!("\n* {check}: {} failure(s)", found.len()));
            for (what, context) in found.iter().take(3) {
                report.push_str(&format!("\n  - {what}"));
                for line in context {
                    report.push_str(&format!("\n      {line}"));
                }
            }
        }
        panic!(
            "history violation (seed {seed}, replay with PGFENCE_HISTORY_SEED={seed}): {} check(s) failed{report}",
            self.0.len()
        );
    }
}
