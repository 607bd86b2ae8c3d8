//! The core invariant, proven by force: once a takeover (an acquisition, a release or a force-release) has
//! committed, no write presenting an epoch it ended commits — with stale writers of every write kind racing real
//! takeovers, ordered by barriers, over many iterations (`PGFENCE_RACE_ITERATIONS`, default 1000).
//!
//! The takeover runs on a raw connection as one message: `BEGIN; <old-epoch rows>; <guard lock holders>;
//! <takeover>; <old-epoch rows>; <guard lock waiters>; COMMIT`. Under READ COMMITTED the statement after the
//! takeover sees every write committed before it started; the takeover holds the lease's guard lock exclusive
//! from its acquisition to its commit, so no old-epoch write can commit after that statement, and the set it saw
//! must be the final set. Judging inside the takeover's own transaction leaves no window in which a late commit
//! could hide (reading after the call returns would count commits between the takeover's commit and that read
//! as "before").
//!
//! The run must also show that every write path raced the takeovers from both sides (writes past their check
//! when a takeover began, writes queued behind one); that evidence needs about 100 rounds or more.
//!
//! With `PGFENCE_TEST_NATIVE=1` every test database has the pgfence_native extension and the one-statement and
//! fenced writes go through its guard (`.ci/run` runs this suite both ways).
//!
//! Invariants checked: 3 (no stale write commits after a takeover), 4 (every refused write is a typed error,
//! wrote nothing, and has an audit row), 6 (every acknowledged write is present), 7 (the takeover waits for the
//! writes past their check, and writes arriving during it wait and are refused).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::tasks::{TaskState, TaskWrite};
use pgfence::{Epoch, Error, Fence, LossReason, Store};
use serde_json::json;
use tokio::sync::Barrier;
use tokio_postgres::SimpleQueryMessage;

const TTL: Duration = Duration::from_secs(60);
const CLUSTER: &str = "race";
const LEASE: &str = "L";
const QUALIFIED: &str = "race/L";
const WRITERS: usize = 3;
/// A writer stops after its first refusal or after this many writes.
const MAX_WRITES_PER_ROUND: usize = 40;

fn iterations() -> usize {
    std::env::var("PGFENCE_RACE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// The six guarded write paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    AppendEvent,
    CreateTask,
    ClaimTask,
    TransitionTask,
    Fenced,
    GuardedWrite,
}

const KINDS: [Kind; 6] = [
    Kind::AppendEvent,
    Kind::CreateTask,
    Kind::ClaimTask,
    Kind::TransitionTask,
    Kind::Fenced,
    Kind::GuardedWrite,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AppendEvent => "append_event",
            Kind::CreateTask => "create_task",
            Kind::ClaimTask => "claim_task",
            Kind::TransitionTask => "transition_task",
            Kind::Fenced => "fenced",
            Kind::GuardedWrite => "guarded_write",
        }
    }

    /// The kind of a committed row, from the event kind each write path records (`app_writes.via` for the
    /// application table).
    fn of_row(kind: &str) -> Kind {
        match kind {
            "tick" => Kind::AppendEvent,
            "created" => Kind::CreateTask,
            "claimed" => Kind::ClaimTask,
            "pending" => Kind::TransitionTask,
            "fenced" => Kind::Fenced,
            "guarded_write" => Kind::GuardedWrite,
            other => panic!("an old-epoch row of unknown kind {other}"),
        }
    }
}

/// A committed write row: a task event (every task write path appends one in its transaction) or a row the
/// fenced transaction inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Event(i64),
    App(i64),
}

struct WriterReport {
    acked: Vec<(Kind, Row)>,
    refused: Option<Kind>,
    /// Whether this writer's own task is claimed (it alternates pending -> claimed -> pending across rounds).
    claimed: bool,
}

fn event(write: TaskWrite) -> Row {
    Row::Event(write.event_id.expect("a task write appends an event"))
}

/// One guarded write: an event append, a task creation (new key), a claim or a transition of the writer's own
/// task (whichever its state allows), a one-statement guarded INSERT or a fenced transaction inserting into an
/// application table. Each path
/// writes through its own store (`stores[kind]`).
async fn write(
    stores: &Arc<BTreeMap<Kind, Store>>,
    fence: &Fence,
    (round, writer, k): (usize, usize, usize),
    claimed: &mut bool,
) -> (Kind, Result<Row, Error>) {
    let own = format!("own-{writer}");
    let store = |kind| &stores[&kind];
    match (round + writer + k) % 6 {
        0 => (
            Kind::AppendEvent,
            store(Kind::AppendEvent)
                .tasks()
                .append_event(fence, "shared", "tick", &json!({"round": round}))
                .await
                .map(event),
        ),
        1 => (
            Kind::CreateTask,
            store(Kind::CreateTask)
                .tasks()
                .create(fence, &format!("t-{round}-{writer}-{k}"), &json!({}))
                .await
                .map(event),
        ),
        2 | 3 if !*claimed => {
            let r = store(Kind::ClaimTask)
                .tasks()
                .claim(fence, &own, &format!("w{writer}"))
                .await
                .map(event);
            *claimed |= r.is_ok();
            (Kind::ClaimTask, r)
        }
        2 | 3 => {
            let r = store(Kind::TransitionTask)
                .tasks()
                .transition(
                    fence,
                    &own,
                    TaskState::Claimed,
                    TaskState::Pending,
                    &json!({}),
                )
                .await
                .map(event);
            *claimed &= r.is_err();
            (Kind::TransitionTask, r)
        }
        4 => {
            // One statement: the guard and the INSERT together. It returns no row of its own, so the writer
            // chooses the id (far above the sequence the fenced transactions draw from).
            let epoch = fence.epoch().get();
            let id =
                1_000_000_000_000 + (round as i64) * 1_000_000 + (writer as i64) * 1_000 + k as i64;
            let r = store(Kind::GuardedWrite)
                .guarded_write(
                    fence,
                    "app_write",
                    diesel::sql_query(
                        "INSERT INTO app_writes (id, epoch, via) SELECT $1, $2, 'guarded_write' \
                          WHERE (SELECT passed FROM pgfence_guard)",
                    )
                    .bind::<diesel::sql_types::BigInt, _>(id)
                    .bind::<diesel::sql_types::BigInt, _>(epoch),
                )
                .await;
            let r = match r {
                Ok(1) => Ok(Row::App(id)),
                Ok(n) => panic!("a guarded INSERT of one row wrote {n}"),
                Err(e) => Err(e),
            };
            (Kind::GuardedWrite, r)
        }
        _ => {
            let epoch = fence.epoch().get();
            let r = store(Kind::Fenced)
                .fenced(fence, "app_write", async move |conn| {
                    use diesel::sql_types::BigInt;
                    use diesel_async::RunQueryDsl;
                    #[derive(diesel::QueryableByName)]
                    struct Id {
                        #[diesel(sql_type = BigInt)]
                        id: i64,
                    }
                    let row: Id = diesel::sql_query(
                        "INSERT INTO app_writes (epoch, via) VALUES ($1, 'fenced') RETURNING id",
                    )
                    .bind::<BigInt, _>(epoch)
                    .get_result(conn)
                    .await?;
                    Ok::<_, Error>(Row::App(row.id))
                })
                .await;
            (Kind::Fenced, r)
        }
    }
}

/// Every committed row written with `epoch`, with its kind: a statement of the takeover's transaction or a
/// fresh read.
fn old_epoch_rows_sql(epoch: i64) -> String {
    format!(
        "SELECT 'e', id, kind FROM pgfence.task_events WHERE lease = '{QUALIFIED}' AND epoch = {epoch} \
         UNION ALL SELECT 'a', id, via FROM app_writes WHERE epoch = {epoch}"
    )
}

/// The guarded writes holding (`granted`) or waiting for (`NOT granted`) the lease's guard lock shared, by write
/// path: each path writes through a store of its own, whose connections carry its name as application_name.
fn guard_lockers_sql(granted: bool) -> String {
    format!(
        "SELECT coalesce(a.application_name, 'gone') \
           FROM pg_locks k LEFT JOIN pg_stat_activity a ON a.pid = k.pid \
          WHERE k.locktype = 'advisory' AND k.classid = {} AND k.objsubid = 2 AND k.mode = 'ShareLock' \
            AND k.granted = {granted} AND k.pid <> pg_backend_pid() \
            AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        pgfence::schema::GUARD_LOCK_CLASS
    )
}

/// Sends `sql` (several statements) as one message; the rows of each statement.
async fn statements(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Vec<Vec<tokio_postgres::SimpleQueryRow>> {
    let mut results = Vec::new();
    let mut current = Vec::new();
    for message in client.simple_query(sql).await.unwrap() {
        match message {
            SimpleQueryMessage::Row(row) => current.push(row),
            SimpleQueryMessage::CommandComplete(_) => results.push(std::mem::take(&mut current)),
            _ => {}
        }
    }
    results
}

/// The old epoch's committed rows and its audited refusals, read in one message after the writers are done.
async fn committed_and_audited(
    client: &tokio_postgres::Client,
    old_epoch: i64,
) -> (BTreeMap<Row, Kind>, i64) {
    let sql = format!(
        "{}; SELECT coalesce(sum(count), 0)::bigint FROM pgfence.rejections \
           WHERE lease = '{QUALIFIED}' AND presented_epoch = {old_epoch}",
        old_epoch_rows_sql(old_epoch)
    );
    let results = statements(client, &sql).await;
    assert_eq!(results.len(), 2, "one result per statement");
    let audited = results[1][0].get(0).unwrap().parse().unwrap();
    (rows(&results[0]), audited)
}

/// What the takeover's own transaction saw.
struct Takeover {
    /// The takeover function's (outcome, epoch).
    outcome: (String, i64),
    /// Old-epoch rows committed when the takeover's transaction began.
    at_start: BTreeMap<Row, Kind>,
    /// Guarded writes past their check (holding the guard lock) when the takeover began: it must wait for them.
    holding: Vec<Kind>,
    /// Old-epoch rows committed when the statement after the takeover started: the final set.
    at_commit: BTreeMap<Row, Kind>,
    /// Guarded writes queued for the guard lock behind the takeover: they must be refused.
    queued: Vec<Kind>,
    /// The (outcome, epoch) of the acquisition sent after the takeover's commit, if any.
    then: Option<(String, i64)>,
    /// The tenure secret the last acquisition returned.
    secret: String,
}

fn rows(result: &[tokio_postgres::SimpleQueryRow]) -> BTreeMap<Row, Kind> {
    result
        .iter()
        .map(|r| {
            let id: i64 = r.get(1).unwrap().parse().unwrap();
            let row = if r.get(0) == Some("e") {
                Row::Event(id)
            } else {
                Row::App(id)
            };
            (row, Kind::of_row(r.get(2).unwrap()))
        })
        .collect()
}

fn lockers(result: &[tokio_postgres::SimpleQueryRow]) -> Vec<Kind> {
    result
        .iter()
        .map(|r| match r.get(0).unwrap() {
            "append_event" => Kind::AppendEvent,
            "create_task" => Kind::CreateTask,
            "claim_task" => Kind::ClaimTask,
            "transition_task" => Kind::TransitionTask,
            "fenced" => Kind::Fenced,
            "guarded_write" => Kind::GuardedWrite,
            other => panic!("a guard lock held by an unexpected backend: {other}"),
        })
        .collect()
}

/// Runs `call` (a `SELECT outcome, epoch FROM pgfence.<takeover>(…)`) in one transaction, sent as one message,
/// with the old epoch's rows and the guard lock's holders read before it and after it; `then` (an acquisition)
/// runs in the same message after the commit, in a transaction of its own.
async fn take_over(
    client: &tokio_postgres::Client,
    call: &str,
    then: Option<&str>,
    old_epoch: i64,
) -> Takeover {
    let old_rows = old_epoch_rows_sql(old_epoch);
    // pg_stat_activity is read once per transaction and cached: clear it before reading it again.
    let sql = format!(
        "BEGIN; {old_rows}; {holding}; {call}; SELECT pg_stat_clear_snapshot(); {old_rows}; {queued}; COMMIT; {then}",
        holding = guard_lockers_sql(true),
        queued = guard_lockers_sql(false),
        then = then.unwrap_or_default(),
    );
    let results = statements(client, &sql).await;
    assert_eq!(
        results.len(),
        8 + usize::from(then.is_some()),
        "one result per statement"
    );
    let outcome = |r: &tokio_postgres::SimpleQueryRow| {
        (
            r.get(0).unwrap().to_owned(),
            r.get::<usize>(1).unwrap().parse::<i64>().unwrap(),
        )
    };
    let acquisition = if then.is_some() {
        &results[8][0]
    } else {
        &results[3][0]
    };
    Takeover {
        secret: acquisition
            .get(2)
            .expect("the acquisition returned a secret")
            .to_owned(),
        outcome: outcome(&results[3][0]),
        then: results.get(8).map(|r| outcome(&r[0])),
        at_start: rows(&results[1]),
        holding: lockers(&results[2]),
        at_commit: rows(&results[5]),
        queued: lockers(&results[6]),
    }
}

/// Per write path, over the whole run.
#[derive(Default, Debug)]
struct Tally {
    /// Old-epoch writes acknowledged.
    accepted: usize,
    /// Old-epoch writes refused as stale.
    refused: usize,
    /// Writes past their check when a takeover began (the takeover had to wait for them).
    holding: usize,
    /// Old-epoch writes that committed while a takeover's transaction ran, before it committed.
    committed_during: usize,
    /// Writes queued behind a takeover for the guard lock (refused once it committed).
    queued: usize,
}

/// A store per write path, each connection named after its path (so pg_locks tells the paths apart).
async fn stores_per_write_path(db: &TestDb) -> Arc<BTreeMap<Kind, Store>> {
    let mut stores = BTreeMap::new();
    for kind in KINDS {
        let config = db.config(CLUSTER).application_name(kind.name());
        stores.insert(kind, Store::connect(config).await.unwrap());
    }
    // With PGFENCE_TEST_NATIVE=1 the one-statement and fenced writes go through pgfence_native.fence: this run
    // then proves the native guard.
    for kind in [Kind::GuardedWrite, Kind::Fenced] {
        assert_eq!(
            stores[&kind].native_guard().await.unwrap(),
            common::native_everywhere(),
            "{kind:?}"
        );
    }
    Arc::new(stores)
}

/// Stale writer `writer` of round `round`: from `barrier` on (shared with the takeover), up to
/// `MAX_WRITES_PER_ROUND` writes under the old `fence` until the first refusal, which must be `Stale` for this
/// very epoch, superseded or released. `claimed`: whether its own task is claimed as the round starts.
async fn stale_writer(
    stores: &Arc<BTreeMap<Kind, Store>>,
    fence: &Fence,
    (round, writer): (usize, usize),
    claimed: bool,
    barrier: &Barrier,
) -> WriterReport {
    let mut report = WriterReport {
        acked: Vec::new(),
        refused: None,
        claimed,
    };
    barrier.wait().await;
    for k in 0..MAX_WRITES_PER_ROUND {
        match write(stores, fence, (round, writer, k), &mut report.claimed).await {
            (kind, Ok(row)) => report.acked.push((kind, row)),
            (
                kind,
                Err(Error::Stale {
                    presented, reason, ..
                }),
            ) => {
                assert_eq!(presented, fence.epoch());
                assert!(
                    matches!(reason, LossReason::Superseded | LossReason::Released),
                    "{reason}"
                );
                report.refused = Some(kind);
                break;
            }
            (kind, Err(other)) => {
                panic!(
                    "round {round}: unexpected error from {}: {other}",
                    kind.name()
                )
            }
        }
    }
    report
}

/// The takeover of round `round`, the three kinds in turn: the same holder acquiring again, the holder
/// releasing, an operator force-releasing; after the last two `next_holder` acquires. (what, the takeover's
/// statement, the acquisition after it).
fn takeover_of_round(
    round: usize,
    holder: &str,
    next_holder: &str,
    current: &Fence,
) -> (&'static str, String, Option<String>) {
    let old_epoch = current.epoch().get();
    let acquire = |holder: &str| {
        format!(
            "SELECT outcome, epoch, secret FROM pgfence.acquire('{QUALIFIED}', '{holder}', {})",
            TTL.as_millis()
        )
    };
    match round % 3 {
        0 => ("acquisition", acquire(holder), None),
        1 => (
            "release",
            format!(
                "SELECT outcome, epoch FROM pgfence.release('{QUALIFIED}', {old_epoch}, '{}')",
                current.secret().expose_secret()
            ),
            Some(acquire(next_holder)),
        ),
        _ => (
            "force-release",
            format!("SELECT outcome, epoch FROM pgfence.force_release('{QUALIFIED}')"),
            Some(acquire(next_holder)),
        ),
    }
}

/// After round `round`'s `what` ended `old_epoch`: the old epoch's committed rows are exactly those the
/// takeover's transaction saw at its commit (none committed after it) and exactly the acknowledged writes
/// (`acked`: none lost, none refused stored), and every refusal has exactly one audit count.
async fn round_commits_exactly_the_acknowledged_writes(
    client: &tokio_postgres::Client,
    (round, what, old_epoch): (usize, &str, i64),
    seen: &Takeover,
    acked: &BTreeMap<Row, Kind>,
    refused: &[Kind],
    run_started: Instant,
) {
    let (after, audited) = committed_and_audited(client, old_epoch).await;
    let late: Vec<_> = after
        .iter()
        .filter(|(row, _)| !seen.at_commit.contains_key(row))
        .collect();
    assert!(
        late.is_empty(),
        "round {round}, {:?} into the run: {} writes of epoch {old_epoch} committed after the {what} that \
         ended it, first {:?}",
        run_started.elapsed(),
        late.len(),
        &late[..late.len().min(5)]
    );
    let missing: Vec<_> = acked.keys().filter(|r| !after.contains_key(r)).collect();
    assert!(
        missing.is_empty(),
        "round {round}: acknowledged writes missing: {missing:?}"
    );
    let unacknowledged: BTreeSet<_> = after.keys().filter(|r| !acked.contains_key(r)).collect();
    assert!(
        unacknowledged.is_empty(),
        "round {round}: writes stored but not acknowledged (refused, or lost in the answer): {unacknowledged:?}"
    );
    assert_eq!(
        audited as usize,
        refused.len(),
        "round {round}: every refusal has exactly one audit count"
    );
}

/// Adds round's outcome to each write path's tally: accepted and refused writes, writes past their check when
/// the takeover began, writes queued behind it, and writes committed while it ran.
fn count_round(
    tally: &mut BTreeMap<Kind, Tally>,
    acked: &BTreeMap<Row, Kind>,
    refused: &[Kind],
    seen: &Takeover,
) {
    for kind in acked.values() {
        tally.get_mut(kind).unwrap().accepted += 1;
    }
    for kind in refused {
        tally.get_mut(kind).unwrap().refused += 1;
    }
    for kind in &seen.holding {
        tally.get_mut(kind).unwrap().holding += 1;
    }
    for kind in &seen.queued {
        tally.get_mut(kind).unwrap().queued += 1;
    }
    for (row, kind) in &seen.at_commit {
        if !seen.at_start.contains_key(row) {
            tally.get_mut(kind).unwrap().committed_during += 1;
        }
    }
}

/// Invariants 3, 4, 6 and 7 under real races: stale writers (three tasks, every write path: event append, task
/// creation, claim, transition, fenced transaction) start at the same barrier as a takeover — an acquisition by
/// the same holder, a release, or an operator's force-release, in turn. The takeover's own transaction records
/// the old epoch's committed rows after its takeover statement; once the writers are done the final set must be
/// exactly that (nothing of the old epoch committed after the takeover) and exactly the acknowledged writes
/// (no acknowledged write lost, no refused write stored), and every refusal must be counted in the audit. The run
/// must show races on every write path from both sides: writes past their check when a takeover began and
/// writes queued behind a takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_write_commits_after_a_takeover_commits() {
    let db = TestDb::new().await;
    let store = db.store(CLUSTER).await;
    let stores = stores_per_write_path(&db).await;
    let client = db.client().await;
    let taker = db.client().await;
    client
        .batch_execute("CREATE TABLE app_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL, via text NOT NULL)")
        .await
        .unwrap();
    let setup = store.acquire(LEASE, "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&setup.fence(), "shared", &json!({}))
        .await
        .unwrap();
    for writer in 0..WRITERS {
        store
            .tasks()
            .create(&setup.fence(), &format!("own-{writer}"), &json!({}))
            .await
            .unwrap();
    }
    // The rounds start from a tenure that has written nothing.
    let lease = store.acquire(LEASE, "pod-a", TTL).await.unwrap();
    let mut holder = lease.holder().to_owned();
    let mut current = lease.fence();

    let rounds = iterations();
    let run_started = Instant::now();
    let mut claimed = [false; WRITERS];
    let mut tally: BTreeMap<Kind, Tally> = KINDS.iter().map(|k| (*k, Tally::default())).collect();
    let mut slowest_takeover = Duration::ZERO;
    for round in 0..rounds {
        let old = current.clone();
        let old_epoch = old.epoch().get();
        let barrier = Arc::new(Barrier::new(WRITERS + 1));
        let mut writers = Vec::new();
        for (writer, claimed) in claimed.iter().copied().enumerate() {
            let (stores, fence, barrier) = (stores.clone(), old.clone(), barrier.clone());
            writers.push(tokio::spawn(async move {
                stale_writer(&stores, &fence, (round, writer), claimed, &barrier).await
            }));
        }

        barrier.wait().await;
        let started = Instant::now();
        let next_holder = if holder == "pod-a" { "pod-b" } else { "pod-a" };
        let (what, call, then) = takeover_of_round(round, &holder, next_holder, &current);
        let seen = take_over(&taker, &call, then.as_deref(), old_epoch).await;
        slowest_takeover = slowest_takeover.max(started.elapsed());
        if then.is_none() {
            assert_eq!(seen.outcome, ("acquired".to_owned(), old_epoch + 1));
            assert_eq!(seen.then, None);
        } else {
            assert_eq!(seen.outcome, ("released".to_owned(), old_epoch));
            assert_eq!(seen.then, Some(("acquired".to_owned(), old_epoch + 1)));
            holder = next_holder.to_owned();
        }
        current = Fence::new(
            QUALIFIED,
            Epoch::new(old_epoch + 1).unwrap(),
            pgfence::TenureSecret::parse(seen.secret.clone()).unwrap(),
        )
        .unwrap();

        let mut acked = BTreeMap::new();
        let mut refused = Vec::new();
        for (writer, handle) in writers.into_iter().enumerate() {
            let report = handle.await.unwrap();
            claimed[writer] = report.claimed;
            acked.extend(report.acked.iter().map(|(kind, row)| (*row, *kind)));
            refused.extend(report.refused);
        }
        round_commits_exactly_the_acknowledged_writes(
            &client,
            (round, what, old_epoch),
            &seen,
            &acked,
            &refused,
            run_started,
        )
        .await;

        count_round(&mut tally, &acked, &refused, &seen);
    }
    eprintln!(
        "{rounds} takeovers in {:?}, slowest {slowest_takeover:?}; per write path (accepted, refused, past its \
         check when a takeover began, committed during a takeover, queued behind a takeover):",
        run_started.elapsed()
    );
    for (kind, t) in &tally {
        eprintln!(
            "  {:<16} {:>5} {:>5} {:>5} {:>5} {:>5}",
            kind.name(),
            t.accepted,
            t.refused,
            t.holding,
            t.committed_during,
            t.queued
        );
    }
    for (kind, t) in &tally {
        assert!(
            t.accepted > 0 && t.refused > 0 && t.holding > 0 && t.queued > 0,
            "{} never raced a takeover from both sides: {t:?}",
            kind.name()
        );
    }
}

/// A takeover must not starve behind a leader that keeps writing: with writers of the current epoch taking the
/// guard lock shared back to back, an acquisition gets it exclusive without needing the grace (a starved
/// takeover would wait the whole grace and then terminate the writers; a writer's connection ended that way
/// fails the test too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_is_not_starved_by_a_busy_writer() {
    let db = TestDb::new().await;
    let store = db.store(CLUSTER).await;
    let grace = Duration::from_millis(
        db.scalar("SELECT takeover_grace_ms FROM pgfence.instance")
            .await as u64,
    );
    let lease = store.acquire(LEASE, "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&lease.fence(), "shared", &json!({}))
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
                    .tasks()
                    .create(&fence, &format!("busy-{w}-{n}"), &json!({}))
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
    let next = store.acquire(LEASE, "pod-a", TTL).await.unwrap();
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    eprintln!("takeover under 6 busy writers took {took:?} (grace {grace:?})");
    assert_eq!(next.epoch().get(), 2);
    assert!(
        took < grace,
        "the takeover took {took:?}, the whole grace: starved by writes that started after it"
    );
}
