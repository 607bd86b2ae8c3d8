//! The overlap investigation against real PostgreSQL and a real frozen process: the holder's belief reports,
//! the server's view of each acquiring connection, the write marks of every kind of guarded write, and the
//! review that places a belief on the database's time line.
//!
//! Invariants checked: 3 (no write of an epoch commits after a successor's acquisition committed — here read
//! back from the review: zero accepted writes inside an overlap, and the refusals the audit shows instead);
//! the review's own: a belief that outlived its successor's acquisition is reported as an overlap, a report that
//! never arrived is unknown and never invented, reports are authenticated by the tenure's secret, and the last
//! accepted write of every write kind is recorded (at most one second early) while a rolled-back one is not.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixture, TestDb};
use pgfence::history::{BeliefEnd, Overlap};
use pgfence::leader::{Elector, LeaseOptions, PgElector};
use pgfence::tasks::TaskState;
use pgfence::{Error, Lease, Store};

/// The ttl of the leases these tests hold by hand (the frozen child's comes from its options).
const TTL: Duration = Duration::from_secs(30);

/// The environment variable that turns [`frozen_leader_child`] into the child process.
const CHILD_ENV: &str = "PGFENCE_OVERLAP_CHILD";
const LEDGER_DDL: &str = "CREATE TABLE public.overlap_ledger (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    epoch bigint NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp())";

/// The child process of [`a_frozen_leader_s_overlap_is_reported_with_no_accepted_write_and_its_refusals`]: a
/// leader (the leadership runtime's elector, reporting its beliefs) that writes through `fenced` every 10 ms
/// without looking at its own loss signal — as a process paused between its check and its write would — until
/// the database refuses a write. It prints `CHILD <event>` lines; the parent freezes it with SIGSTOP. Ignored
/// unless the parent runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of an overlap test; the test runs it itself"]
async fn frozen_leader_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (url, cluster) = spec.split_once(' ').expect("url and cluster");
    let store = Store::connect(pgfence::StoreConfig::new(url, cluster))
        .await
        .expect("child connects");
    let elector = PgElector::new(store.clone());
    let options = LeaseOptions::new(Duration::from_secs(1));
    let held = elector
        .acquire("frozen", "child", &options)
        .await
        .expect("child acquires");
    println!("CHILD acquired {}", held.epoch());
    let fence = held.fence();
    let mut n = 0u64;
    loop {
        let epoch = fence.epoch().get();
        let written = store
            .fenced(&fence, "ledger_insert", async |conn| {
                use diesel::sql_types::BigInt;
                use diesel_async::RunQueryDsl;
                diesel::sql_query("INSERT INTO public.overlap_ledger (epoch) VALUES ($1)")
                    .bind::<BigInt, _>(epoch)
                    .execute(conn)
                    .await?;
                Ok::<_, Error>(())
            })
            .await;
        match written {
            Ok(()) => {
                n += 1;
                println!("CHILD wrote {n}");
            }
            Err(Error::Stale { reason, .. }) => {
                println!("CHILD refused {reason}");
                break;
            }
            // Frozen inside a fenced transaction, the takeover ended its backend after the grace.
            Err(e) if e.is_transient() => println!("CHILD error {e}"),
            Err(e) => panic!("child write failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The runtime reported the end of the belief when it noticed the loss; wait until it landed.
    let started = Instant::now();
    loop {
        let tenures = store
            .history()
            .tenures("frozen")
            .await
            .expect("child reads");
        let mine = tenures
            .iter()
            .find(|t| t.epoch == fence.epoch())
            .expect("own tenure");
        if mine.belief.end_received_at.is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "end never reported"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
    println!("CHILD done");
}

/// Kills the child on drop, so a failed assertion does not leave a stopped process behind.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = signal(&self.0, "CONT");
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, name: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
}

/// Reads the child's `CHILD …` lines (other output of the test harness is skipped) until one starts with
/// `prefix`.
fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            // The harness prints `test <name> ... ` without a line break before the test's own output.
            Ok(line) => match line.find("CHILD ").map(|at| &line[at..]) {
                Some(own) if own.starts_with(prefix) => return own.to_owned(),
                _ => continue,
            },
            Err(e) => panic!("the child never printed {prefix:?}: {e}"),
        }
    }
}

/// The [`frozen_leader_child`] process, leading `frozen` on `db`'s cluster c1, and its stdout's lines as they come.
fn spawn_frozen_leader(db: &TestDb) -> (ChildGuard, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "overlap::frozen_leader_child",
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{} c1", db.url))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("child stdout");
    let child = ChildGuard(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

/// The successor of the frozen tenure (epoch `old_epoch`): it acquires `frozen` once the database says the
/// frozen tenure expired, reports its belief's start and writes to the ledger.
async fn successor_takes_over_and_writes(store: &Store, old_epoch: i64) -> Lease {
    // The successor takes over once the database says the frozen tenure expired (its ttl is 1 s): each refusal
    // names the time left by the database clock, which is how long to wait.
    let successor = loop {
        match store.acquire("frozen", "successor", TTL).await {
            Ok(lease) => break lease,
            Err(Error::Held { expires_in, .. }) => tokio::time::sleep(expires_in).await,
            Err(e) => panic!("successor: {e}"),
        }
    };
    assert!(successor.epoch().get() > old_epoch);
    store
        .history()
        .report_belief_start(&successor)
        .await
        .expect("the successor reports its start");
    store
        .guarded_write(
            &successor.fence(),
            "ledger_insert",
            diesel::sql_query(format!(
                "INSERT INTO public.overlap_ledger (epoch) SELECT {} WHERE (SELECT passed FROM pgfence_guard)",
                successor.epoch(),
            )),
        )
        .await
        .expect("the successor writes");
    successor
}

/// The scenario, with a real process: a leader writing through the fence is frozen (SIGSTOP) past its
/// ttl, a successor acquires and writes, the old leader resumes and writes again. The review must show the old
/// holder's belief outliving the successor's acquisition (an overlap, certain), no write of the old epoch
/// accepted inside it (the ledger agrees: no row of that epoch written after the acquisition), the refusal the
/// audit recorded, the belief's start and end as the holder reported them, and both sides' view of the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_s_overlap_is_reported_with_no_accepted_write_and_its_refusals() {
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute(LEDGER_DDL)
        .await
        .expect("ledger table");
    let store = db.store("c1").await;

    let (child, lines) = spawn_frozen_leader(&db);
    let acquired = wait_for_line(&lines, "CHILD acquired ");
    let old_epoch: i64 = acquired["CHILD acquired ".len()..].parse().expect("epoch");
    // A few accepted writes first, then the freeze.
    wait_for_line(&lines, "CHILD wrote 3");
    assert!(signal(&child.0, "STOP").expect("kill -STOP").success());

    let successor = successor_takes_over_and_writes(&store, old_epoch).await;

    assert!(signal(&child.0, "CONT").expect("kill -CONT").success());
    let refused = wait_for_line(&lines, "CHILD refused ");
    assert_eq!(refused, "CHILD refused superseded");
    wait_for_line(&lines, "CHILD done");

    let reviews = store.history().review("frozen").await.expect("review");
    let old = reviews
        .iter()
        .find(|r| r.tenure.epoch.get() == old_epoch)
        .expect("the frozen tenure");
    let next = old.successor.as_ref().expect("a successor");
    assert_eq!(next.epoch, successor.epoch());
    // The belief, as the frozen holder reported it: started, and ended after it resumed.
    assert!(old.tenure.belief.from.is_some(), "start reported");
    assert!(old.tenure.belief.until.is_some(), "end reported");
    assert!(old
        .tenure
        .belief
        .endpoint
        .as_deref()
        .is_some_and(|e| e.ends_with(&format!("/{}", db.name))));
    assert!(
        !old.tenure.belief.endpoint.as_deref().unwrap().contains('@'),
        "no credentials"
    );
    // The server's side: which server and which connection.
    assert!(old.tenure.server.system_identifier.is_some());
    assert!(old.tenure.server.instance_id.is_some());
    assert!(old.tenure.server.client_addr.is_some());
    assert_eq!(
        old.tenure.server.application_name.as_deref(),
        Some("pgfence")
    );
    // The overlap: proved by the refusal the audit recorded after the successor's acquisition…
    let Overlap::Certain {
        refused_write_at: Some(refused_at),
    } = old.overlap
    else {
        panic!(
            "expected a certain overlap proved by a refusal, got {:?}",
            old.overlap
        );
    };
    assert!(refused_at > next.acquired_at);
    assert!(old
        .refusals_after_successor
        .iter()
        .any(|r| r.reason == "superseded" && r.operation == "ledger_insert"));
    // …and by the reported end, placed on the database's time line, whose latest placement is after it too.
    let end = old
        .believed_until_db
        .expect("the end placed on the database's time line");
    assert!(end.latest > next.acquired_at);
    // No write of the old epoch accepted inside the overlap, by the review and by the ledger itself.
    assert_eq!(old.accepted_after_successor, None);
    let last_write = old
        .tenure
        .last_write_at
        .expect("the frozen leader's writes were accepted before");
    assert!(last_write < next.acquired_at);
    let late: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM public.overlap_ledger WHERE epoch = {old_epoch} \
               AND written_at >= '{}'::timestamptz",
            next.acquired_at.to_rfc3339()
        ))
        .await;
    assert_eq!(
        late, 0,
        "a write of the frozen epoch committed after the takeover"
    );
    // The successor's own tenure: no successor yet.
    let current = reviews.last().unwrap();
    assert_eq!(current.overlap, Overlap::NoSuccessor);
    assert!(current.tenure.belief.from.is_some());
    drop(child);
}

/// Reports are authenticated by the tenure's secret (a forged one is refused and audited) also after the
/// tenure was superseded; the first report of each kind stands; the report's times are the holder's, the
/// arrival the database's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn belief_reports_are_authenticated_and_the_first_of_each_kind_stands() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let first = fixture::lease(&store, "reported").ttl(TTL).await;
    store.history().report_belief_start(&first).await.unwrap();
    store.history().report_belief_start(&first).await.unwrap();
    // Superseded by the same holder's next acquisition: its secret is gone from the guard, not from the record.
    let second = fixture::lease(&store, "reported").ttl(TTL).await;
    // The database keeps microseconds.
    let ended = chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 6);
    store
        .history()
        .report_belief_end(
            &first,
            ended,
            BeliefEnd::Lost(pgfence::LossReason::Superseded),
        )
        .await
        .unwrap();
    store
        .history()
        .report_belief_end(
            &first,
            ended + chrono::Duration::seconds(5),
            BeliefEnd::Released,
        )
        .await
        .unwrap();
    let tenures = store.history().tenures("reported").await.unwrap();
    let t = &tenures[0];
    assert_eq!(t.belief.from, Some(first.believed_from()));
    assert_eq!(t.belief.until, Some(ended), "the first end report stands");
    assert_eq!(t.belief.end_cause.as_deref(), Some("lost"));
    assert_eq!(t.belief.end_detail.as_deref(), Some("superseded"));
    assert!(t.belief.start_received_at.is_some() && t.belief.end_received_at.is_some());
    assert_eq!(tenures[1].belief.from, None, "never reported: unknown");

    // A forged secret: refused, audited, nothing recorded.
    let client = db.client().await;
    let outcome: String = client
        .query_one(
            "SELECT outcome || ':' || reason FROM pgfence.report_belief('c1/reported', $1, $2, 'end', now(), now(), \
             NULL, 'released', NULL)",
            &[&second.epoch().get(), &"0".repeat(64)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "refused:bad_secret");
    let audited: i64 = db
        .scalar("SELECT count(*) FROM pgfence.rejections WHERE operation = 'report_belief' AND reason = 'bad_secret'")
        .await;
    assert_eq!(audited, 1);
    assert_eq!(
        store.history().tenures("reported").await.unwrap()[1]
            .belief
            .until,
        None
    );
}

/// Bad report arguments are typed errors that write nothing, through SQL (22023) and Rust (InvalidInput).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_belief_reports_are_refused_and_write_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let lease = fixture::lease(&store, "malformed").ttl(TTL).await;
    let secret = lease.fence().secret().expose_secret().to_owned();
    let client = db.client().await;
    for (args, field) in [
        ("'begin', now(), now(), NULL, NULL, NULL", "belief event"),
        (
            "'end', 'infinity', now(), NULL, 'released', NULL",
            "belief time",
        ),
        ("'end', now(), NULL, NULL, 'released', NULL", "belief time"),
        ("'end', now(), now(), NULL, 'crashed', NULL", "belief cause"),
        ("'end', now(), now(), NULL, NULL, NULL", "belief cause"),
        (
            "'start', now(), now(), NULL, 'released', NULL",
            "belief cause",
        ),
        (
            "'start', now(), now(), E'db\\u0007:5432/x', NULL, NULL",
            "endpoint",
        ),
        (
            "'start', now(), now(), repeat('h', 513), NULL, NULL",
            "endpoint",
        ),
        (
            "'end', now(), now(), NULL, 'lost', E'\\u001b[2J'",
            "belief detail",
        ),
    ] {
        let sql = format!(
            "SELECT pgfence.report_belief('c1/malformed', {}, $1, {args})",
            lease.epoch()
        );
        let err = client.query_one(&sql, &[&secret]).await.unwrap_err();
        let db_err = err.as_db_error().expect("a server error");
        assert_eq!(db_err.code().code(), "22023", "{args}");
        assert!(
            db_err
                .message()
                .starts_with(&format!("pgfence: invalid {field}: ")),
            "{args}: {}",
            db_err.message()
        );
    }
    let t = &store.history().tenures("malformed").await.unwrap()[0];
    assert_eq!(
        (t.belief.from, t.belief.until),
        (None, None),
        "nothing written"
    );
}

/// The SQL guard in the caller's own transaction, twice in one second, marks once: the first write's mark,
/// at most a second (the mark's resolution) before the second write.
async fn the_sql_guard_marks_its_first_write_of_a_second(
    store: &Store,
    client: &tokio_postgres::Client,
) {
    let lease = fixture::lease(store, "sql").ttl(TTL).await;
    let secret = lease.fence().secret().expose_secret().to_owned();
    let epoch = lease.epoch().get();
    let mut times = Vec::new();
    for _ in 0..2 {
        let row = client
            .query_one(
                "WITH g AS (SELECT outcome FROM pgfence.fence('c1/sql', $1, $2, 'fenced_transaction', NULL, NULL)) \
                 SELECT (SELECT outcome FROM g), clock_timestamp()",
                &[&epoch, &secret],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "ok");
        times.push(chrono::DateTime::<chrono::Utc>::from(
            row.get::<_, std::time::SystemTime>(1),
        ));
    }
    let mark = store.history().tenures("sql").await.unwrap()[0]
        .last_write_at
        .expect("SQL guard marked");
    assert!(
        mark <= times[1]
            && times[1] - mark
                <= chrono::Duration::from_std(pgfence::history::WRITE_MARK_RESOLUTION).unwrap()
                    + chrono::Duration::milliseconds(1)
    );
}

/// Every kind of guarded write leaves its tenure's last accepted write (a fenced transaction, a one-statement
/// guarded write, the SQL guard in a caller's transaction: a write mark at most one second early; a task write:
/// its event, exactly, and no mark); a guarded transaction rolled back leaves none; a refused write leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guarded_write_kind_records_its_last_accepted_write() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE public.marked (epoch bigint)")
        .await
        .unwrap();

    let last_write = |name: &'static str| {
        let store = store.clone();
        async move { store.history().tenures(name).await.unwrap()[0].last_write_at }
    };

    // A fenced transaction rolled back: no mark. Then one that commits: a mark at its guard.
    let lease = fixture::lease(&store, "fenced").ttl(TTL).await;
    let rolled_back = store
        .fenced(&lease.fence(), "rolled_back", async |_conn| {
            Err::<(), Error>(Error::InvalidInput {
                field: "test",
                reason: "roll back".into(),
            })
        })
        .await;
    assert!(rolled_back.is_err());
    assert_eq!(
        last_write("fenced").await,
        None,
        "a rolled-back write left a mark"
    );
    let before = db_now(&client).await;
    store
        .fenced(&lease.fence(), "insert", async |conn| {
            use diesel_async::RunQueryDsl;
            diesel::sql_query("INSERT INTO public.marked VALUES (1)")
                .execute(conn)
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    let after = db_now(&client).await;
    let at = last_write("fenced").await.expect("fenced write marked");
    assert!(before <= at && at <= after);

    // The one-statement guarded write.
    let lease = fixture::lease(&store, "one").ttl(TTL).await;
    store
        .guarded_write(
            &lease.fence(),
            "insert",
            diesel::sql_query(
                "INSERT INTO public.marked SELECT 1 WHERE (SELECT passed FROM pgfence_guard)",
            ),
        )
        .await
        .unwrap();
    assert!(last_write("one").await.is_some(), "guarded_write marked");

    the_sql_guard_marks_its_first_write_of_a_second(&store, &client).await;

    // A task write (its event is exact) and a refused write of a superseded epoch (no mark).
    let lease = fixture::lease(&store, "tasks").ttl(TTL).await;
    let task = store
        .tasks()
        .create(&lease.fence(), "t1", &serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(task.task.state, TaskState::Pending);
    let t = &store.history().tenures("tasks").await.unwrap()[0];
    assert!(t.last_event_at.is_some() && t.last_write_at == t.last_event_at);
    assert_eq!(
        t.last_mark_at, None,
        "a task write is known by its event, not a mark"
    );
    // Superseded: a refused write of the old epoch, from a session that never marked, leaves no mark.
    fixture::lease(&store, "tasks").ttl(TTL).await;
    let marked_before = store.history().tenures("tasks").await.unwrap()[0].last_mark_at;
    let fresh = db.client().await;
    let row = fresh
        .query_one(
            "SELECT outcome FROM pgfence.fence('c1/tasks', $1, $2, 'fenced_transaction', NULL, NULL)",
            &[
                &lease.epoch().get(),
                &lease.fence().secret().expose_secret(),
            ],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "refused");
    assert_eq!(
        store.history().tenures("tasks").await.unwrap()[0].last_mark_at,
        marked_before
    );
}

/// A write mark stands for a write that happened: a task write that wrote nothing — `not_found`, `conflict`, a
/// `create_task` retry that found its task — leaves no mark, so the tenure's last write stays the last one that
/// wrote (its event, exact), in a session that marks nothing else (each call its own transaction, one second
/// apart, so a mark of the first second could not hide a later one). Fails on a guard that marks before the task
/// write (the old code: a mark at the refused claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_write_that_writes_nothing_leaves_no_mark() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let lease = fixture::lease(&store, "nothing").ttl(TTL).await;
    let fence = lease.fence();
    let created = store
        .tasks()
        .create(&fence, "t1", &serde_json::json!({}))
        .await
        .unwrap();
    assert!(created.created);
    let tenure =
        |store: Store| async move { store.history().tenures("nothing").await.unwrap()[0].clone() };
    let after_create = tenure(store.clone()).await;
    let created_at = after_create.last_event_at.expect("the create's event");
    assert_eq!(after_create.last_write_at, Some(created_at));

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let missing = store
        .tasks()
        .claim(&fence, "nobody", "w1")
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::TaskNotFound { .. }), "{missing}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let wrong_state = store
        .tasks()
        .transition(
            &fence,
            "t1",
            TaskState::Running,
            TaskState::Succeeded,
            &serde_json::json!({}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(wrong_state, Error::Conflict { .. }),
        "{wrong_state}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let missing = store
        .tasks()
        .append_event(&fence, "nobody", "note", &serde_json::json!({}))
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::TaskNotFound { .. }), "{missing}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = store
        .tasks()
        .create(&fence, "t1", &serde_json::json!({}))
        .await
        .unwrap();
    assert!(!retry.created && retry.event_id.is_none());

    let t = tenure(store.clone()).await;
    assert_eq!(
        (t.last_write_at, t.last_event_at),
        (Some(created_at), Some(created_at)),
        "a task write that wrote nothing moved the tenure's last write (mark {:?})",
        t.last_mark_at
    );
    // Task writes are known by their events alone: no mark at all.
    assert_eq!(t.last_mark_at, None);
    // The review agrees: nothing was written after the create.
    let events = store.tasks().events("nothing", "t1").await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
}

async fn db_now(client: &tokio_postgres::Client) -> chrono::DateTime<chrono::Utc> {
    let now: std::time::SystemTime = client
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    now.into()
}

/// The leadership runtime reports by itself: the start when it acquires, the end when the tenure ends — here a
/// release (`released`) and a takeover noticed by the renewal (`lost`, `superseded`); and not at all with
/// `report_beliefs` off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leadership_runtime_reports_each_belief_s_start_and_end() {
    let db = TestDb::new().await;
    let store = db.store("c1").await;
    let elector = PgElector::new(store.clone());
    let options = LeaseOptions::new(Duration::from_secs(2));

    let held = elector.acquire("runtime", "pod-a", &options).await.unwrap();
    let epoch = held.epoch();
    held.release().await.unwrap();
    let t = wait_for_end(&store, "runtime", epoch).await;
    assert!(t.belief.from.is_some() && t.belief.endpoint.is_some());
    assert_eq!(t.belief.end_cause.as_deref(), Some("released"));

    let held = elector.acquire("runtime", "pod-a", &options).await.unwrap();
    let epoch = held.epoch();
    store.admin().force_release("runtime").await.unwrap();
    assert!(held.lost().await.is_loss());
    let t = wait_for_end(&store, "runtime", epoch).await;
    assert_eq!(t.belief.end_cause.as_deref(), Some("lost"));
    assert!(t.belief.end_detail.is_some(), "the loss reason");

    let mut quiet = options;
    quiet.report_beliefs = false;
    let held = elector.acquire("runtime", "pod-a", &quiet).await.unwrap();
    let epoch = held.epoch();
    held.release().await.unwrap();
    // A report would have been sent before release returned; give a sent one time to land, then: nothing.
    let marker = elector.acquire("runtime", "pod-b", &options).await.unwrap();
    let marker_epoch = marker.epoch();
    drop(marker);
    wait_for_end(&store, "runtime", marker_epoch).await;
    let t = tenure(&store, "runtime", epoch).await;
    assert_eq!((t.belief.from, t.belief.until), (None, None));
}

/// Tenure `epoch` of `name` as the record shows it now.
async fn tenure(store: &Store, name: &str, epoch: pgfence::Epoch) -> pgfence::history::Tenure {
    store
        .history()
        .tenures(name)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.epoch == epoch)
        .unwrap()
}

async fn wait_for_end(
    store: &Store,
    name: &str,
    epoch: pgfence::Epoch,
) -> pgfence::history::Tenure {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = tenure(store, name, epoch).await;
        // Both reports: the runtime sends them independently, so the end may land before the start.
        if t.belief.end_received_at.is_some() && t.belief.start_received_at.is_some() {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "the start and end of epoch {epoch} were never both reported"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The record is read through `pgfence.tenure_history` only, per cluster: a role granted another cluster sees
/// none of this cluster's tenures, and no role but the owner reads the belief and mark tables (whose rows hold
/// a hash of each tenure's secret) directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beliefs_and_marks_are_read_per_cluster_through_the_history_only() {
    let db = TestDb::new().await;
    let owner = db.store("c1").await;
    let lease = owner.acquire("private", "pod-a", TTL).await.unwrap();
    owner.history().report_belief_start(&lease).await.unwrap();
    let mine = common::fixture::app_role(&db, &owner, "mine", Some("c1")).await;
    let other = common::fixture::app_role(&db, &owner, "other", Some("c2")).await;
    for (role, visible) in [(&mine, 1i64), (&other, 0)] {
        let client = common::client_as(&db, role).await;
        let seen: i64 = client
            .query_one(
                "SELECT count(*) FROM pgfence.tenure_history WHERE lease = 'c1/private' \
                   AND believed_from IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, visible, "{role}");
        for table in ["pgfence.beliefs", "pgfence.write_marks"] {
            let err = client
                .query(&format!("SELECT * FROM {table}"), &[])
                .await
                .unwrap_err();
            assert_eq!(
                err.code(),
                Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
            );
        }
    }
}

/// A belief report that fails is logged and counted in `pgfence_belief_reports_failed_total` (the review then
/// shows that belief as unknown), and the tenure is untouched by it: with `pgfence.report_belief` renamed away
/// on this throwaway database, the start and the end report both fail while the lease is acquired and released
/// as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_belief_report_is_counted_and_the_tenure_goes_on() {
    common::metrics_probe::install();
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute("ALTER FUNCTION pgfence.report_belief RENAME TO report_belief_gone")
        .await
        .unwrap();
    let store = db.store("c1").await;
    let elector = PgElector::new(store.clone());
    let options = LeaseOptions::new(Duration::from_secs(2));
    let held = elector.acquire("unheard", "pod-a", &options).await.unwrap();
    let epoch = held.epoch();
    held.release().await.unwrap();
    let failed = || {
        common::metrics_probe::counter(
            pgfence::metrics::METRIC_BELIEF_REPORTS_FAILED,
            &[("lease", "c1/unheard")],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while failed() < 2 {
        assert!(
            Instant::now() < deadline,
            "{} of the 2 failed reports counted",
            failed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = tenure(&store, "unheard", epoch).await;
    assert_eq!((t.belief.from, t.belief.until), (None, None));
    assert_eq!(t.end_reason.as_deref(), Some("released"), "{t:?}");
    elector.acquire("unheard", "pod-b", &options).await.unwrap();
}
